//! Reading repositories in-process with gitoxide: refs, trees, files, blobs and
//! commits. Diffs (text and numbers) come from `git diff`, which also finds
//! renames. Every function is synchronous: callers run them on the blocking
//! pool (`spawn_blocking`).

use std::collections::BTreeMap;
use std::path::Path;

use gix::bstr::ByteSlice;
use gix::objs::tree::EntryKind;

use super::error::RepositoryError;

/// Most tree entries one listing walks (a recursive tree of a huge repository
/// stops here).
pub const MAX_TREE_ENTRIES: usize = 100_000;
/// Most commits one log walks looking for matches.
pub const MAX_LOG_WALK: usize = 50_000;

fn read_err(e: impl std::fmt::Display) -> RepositoryError {
    RepositoryError::Read(e.to_string())
}

/// Bytes of decoded objects one opened repository keeps: history walks
/// decode each commit's trees again as the next commit's parent.
const OBJECT_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// How many opened repositories each blocking thread keeps (the most
/// recently used).
const OPENED_KEPT_PER_THREAD: usize = 8;

thread_local! {
    /// Repositories this thread opened recently, by path. Opening one reads
    /// its config and lists its packs, which costs more than most of the
    /// reads that follow; a kept handle still sees new refs (read from disk
    /// on every lookup) and new packs (looked for when an object is
    /// missing). Per thread because gitoxide's handles are not `Send` here,
    /// and the blocking pool reuses its threads.
    static OPENED: std::cell::RefCell<lru::LruCache<std::path::PathBuf, gix::Repository>> =
        std::cell::RefCell::new(lru::LruCache::new(
            std::num::NonZeroUsize::new(OPENED_KEPT_PER_THREAD)
                .unwrap_or(std::num::NonZeroUsize::MIN),
        ));
}

pub fn open(path: &Path) -> Result<gix::Repository, RepositoryError> {
    let kept = OPENED.with_borrow_mut(|opened| opened.get(path).cloned());
    match kept {
        // A repository removed since it was kept is not found, as before.
        Some(repo) if path.exists() => Ok(repo),
        _ => {
            let mut repo = gix::open(path)
                .map_err(|e| RepositoryError::NotFound(format!("repository: {e}")))?;
            repo.object_cache_size_if_unset(OBJECT_CACHE_BYTES);
            OPENED.with_borrow_mut(|opened| opened.put(path.to_path_buf(), repo.clone()));
            Ok(repo)
        }
    }
}

/// Branch and tag names with the commits they point at (annotated tags peeled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refs {
    pub branches: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
}

impl Refs {
    /// Full ref names (`refs/heads/x`, `refs/tags/y`) with their targets.
    pub fn full(&self) -> BTreeMap<String, String> {
        self.branches
            .iter()
            .map(|(k, v)| (format!("refs/heads/{k}"), v.clone()))
            .chain(
                self.tags
                    .iter()
                    .map(|(k, v)| (format!("refs/tags/{k}"), v.clone())),
            )
            .collect()
    }
}

pub fn refs(path: &Path) -> Result<Refs, RepositoryError> {
    let repo = open(path)?;
    let platform = repo.references().map_err(read_err)?;
    let mut out = Refs::default();
    for reference in platform.all().map_err(read_err)? {
        let mut reference = reference.map_err(read_err)?;
        let name = reference.name().as_bstr().to_string();
        let Ok(id) = reference.peel_to_id() else {
            continue;
        };
        let id = id.detach().to_string();
        if let Some(branch) = name.strip_prefix("refs/heads/") {
            out.branches.insert(branch.to_owned(), id);
        } else if let Some(tag) = name.strip_prefix("refs/tags/") {
            out.tags.insert(tag.to_owned(), id);
        }
    }
    Ok(out)
}

/// Whether the repository has no commits at all.
pub fn is_empty(path: &Path) -> Result<bool, RepositoryError> {
    Ok(refs(path)?.branches.is_empty())
}

/// A revision a user may name: a branch, a tag, or a commit id (full or at
/// least 7 hex digits). A name that is both a branch and a tag is ambiguous.
pub fn resolve(path: &Path, rev: &str) -> Result<String, RepositoryError> {
    let rev = rev.trim();
    if rev.is_empty()
        || rev.len() > 255
        || rev.contains(['\0', ' ', '~', '^', ':', '\\'])
        || rev.contains("..")
    {
        return Err(RepositoryError::NotFound("ref".into()));
    }
    let refs = refs(path)?;
    let branch = refs.branches.get(rev);
    let tag = refs.tags.get(rev);
    match (branch, tag) {
        (Some(_), Some(_)) => {
            return Err(RepositoryError::Invalid(format!(
                "{rev} is ambiguous: it names a branch and a tag"
            )));
        }
        (Some(id), None) | (None, Some(id)) => return Ok(id.clone()),
        (None, None) => {}
    }
    if let Some(full) = rev
        .strip_prefix("refs/heads/")
        .and_then(|b| refs.branches.get(b))
    {
        return Ok(full.clone());
    }
    if let Some(full) = rev
        .strip_prefix("refs/tags/")
        .and_then(|t| refs.tags.get(t))
    {
        return Ok(full.clone());
    }
    if rev.len() >= 7 && rev.len() <= 40 && rev.chars().all(|c| c.is_ascii_hexdigit()) {
        let repo = open(path)?;
        if let Ok(id) = repo.rev_parse_single(rev)
            && let Ok(commit) = repo.find_commit(id.detach())
        {
            return Ok(commit.id().to_string());
        }
    }
    Err(RepositoryError::NotFound("ref".into()))
}

/// The commit a full ref name points at (any namespace, hidden ones such
/// as `refs/workloads/<id>` included); `None` when the ref does not exist.
pub fn ref_target(path: &Path, full_name: &str) -> Result<Option<String>, RepositoryError> {
    let repo = open(path)?;
    let Some(mut reference) = repo.try_find_reference(full_name).map_err(read_err)? else {
        return Ok(None);
    };
    let id = reference.peel_to_id().map_err(read_err)?;
    Ok(Some(id.detach().to_string()))
}

/// One entry of a tree listing, in GitLab's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub id: String,
    pub name: String,
    /// `blob`, `tree` or `commit` (a submodule).
    pub kind: &'static str,
    pub path: String,
    pub mode: String,
}

/// A tree entry's mode as git prints it (`040000` for trees, not gix's `40000`).
fn mode_text(kind: EntryKind) -> String {
    match kind {
        EntryKind::Tree => "040000".to_owned(),
        other => other.as_octal_str().to_string(),
    }
}

fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::Tree => "tree",
        EntryKind::Commit => "commit",
        _ => "blob",
    }
}

/// A repository-relative path made safe: no `..`, no absolute paths, no NUL,
/// no empty segments. `""` is the root.
pub fn clean_path(path: &str) -> Result<String, RepositoryError> {
    let trimmed = path.trim_matches('/');
    if path.contains('\0') {
        return Err(RepositoryError::Invalid(
            "path contains a NUL character".into(),
        ));
    }
    if path.starts_with('/') && !trimmed.is_empty() && path.starts_with("//") {
        return Err(RepositoryError::Invalid("path must be relative".into()));
    }
    let mut parts = Vec::new();
    for part in trimmed.split('/') {
        match part {
            "" if trimmed.is_empty() => {}
            "" | "." => return Err(RepositoryError::Invalid("path has an empty segment".into())),
            ".." => return Err(RepositoryError::Invalid("path must not contain ..".into())),
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// The entries of the tree at `dir` in `commit` (all below it when
/// `recursive`), in git's order, directories first within a level as GitLab
/// lists them.
pub fn tree(
    path: &Path,
    commit: &str,
    dir: &str,
    recursive: bool,
) -> Result<Vec<TreeEntry>, RepositoryError> {
    let repo = open(path)?;
    let commit_id = gix::ObjectId::from_hex(commit.as_bytes()).map_err(read_err)?;
    let root = repo
        .find_commit(commit_id)
        .map_err(read_err)?
        .tree()
        .map_err(read_err)?;
    let dir = clean_path(dir)?;
    let start = if dir.is_empty() {
        root.id
    } else {
        let entry = root
            .lookup_entry_by_path(&dir)
            .map_err(read_err)?
            .ok_or_else(|| RepositoryError::NotFound("Tree".into()))?;
        if EntryKind::from(entry.mode()) != EntryKind::Tree {
            return Err(RepositoryError::NotFound("Tree".into()));
        }
        entry.object_id()
    };
    let mut out = Vec::new();
    let mut queue = std::collections::VecDeque::from([(start, dir)]);
    while let Some((tree_id, prefix)) = queue.pop_front() {
        let tree = repo.find_tree(tree_id).map_err(read_err)?;
        let decoded = tree.decode().map_err(read_err)?;
        let mut level: Vec<TreeEntry> = Vec::with_capacity(decoded.entries.len());
        for entry in &decoded.entries {
            let name = entry.filename.to_str_lossy().into_owned();
            let full = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let kind = EntryKind::from(entry.mode);
            if recursive && kind == EntryKind::Tree {
                queue.push_back((entry.oid.to_owned(), full.clone()));
            }
            level.push(TreeEntry {
                id: entry.oid.to_string(),
                name,
                kind: kind_name(kind),
                path: full,
                mode: mode_text(kind),
            });
        }
        // GitLab lists trees before blobs, each by name.
        level.sort_by(|a, b| (a.kind != "tree", &a.name).cmp(&(b.kind != "tree", &b.name)));
        out.extend(level);
        if out.len() > MAX_TREE_ENTRIES {
            out.truncate(MAX_TREE_ENTRIES);
            break;
        }
    }
    Ok(out)
}

/// A file of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBlob {
    pub blob_id: String,
    pub size: u64,
    pub mode: String,
    pub content: Vec<u8>,
}

/// The file at `file_path` in `commit`; `NotFound` when absent or a directory;
/// `TooLarge` (as `Invalid`) past `max_bytes`.
pub fn file(
    path: &Path,
    commit: &str,
    file_path: &str,
    max_bytes: u64,
) -> Result<FileBlob, RepositoryError> {
    let repo = open(path)?;
    let commit_id = gix::ObjectId::from_hex(commit.as_bytes()).map_err(read_err)?;
    let root = repo
        .find_commit(commit_id)
        .map_err(read_err)?
        .tree()
        .map_err(read_err)?;
    let file_path = clean_path(file_path)?;
    if file_path.is_empty() {
        return Err(RepositoryError::NotFound("File".into()));
    }
    let entry = root
        .lookup_entry_by_path(&file_path)
        .map_err(read_err)?
        .ok_or_else(|| RepositoryError::NotFound("File".into()))?;
    let kind = EntryKind::from(entry.mode());
    if matches!(kind, EntryKind::Tree | EntryKind::Commit) {
        return Err(RepositoryError::NotFound("File".into()));
    }
    let blob = blob(path, &entry.object_id().to_string(), max_bytes)?;
    Ok(FileBlob {
        blob_id: entry.object_id().to_string(),
        size: blob.len() as u64,
        mode: kind.as_octal_str().to_string(),
        content: blob,
    })
}

/// For each of `paths`, the blob id and mode at that path in `commit` (absent
/// paths, directories and submodules are left out). `None` as the commit: an
/// empty repository, where nothing exists.
pub fn entries_at(
    path: &Path,
    commit: Option<&str>,
    paths: &[String],
) -> Result<std::collections::HashMap<String, (String, String)>, RepositoryError> {
    let mut out = std::collections::HashMap::new();
    let Some(commit) = commit else {
        return Ok(out);
    };
    let repo = open(path)?;
    let commit_id = gix::ObjectId::from_hex(commit.as_bytes()).map_err(read_err)?;
    let root = repo
        .find_commit(commit_id)
        .map_err(read_err)?
        .tree()
        .map_err(read_err)?;
    for wanted in paths {
        let Some(entry) = root.lookup_entry_by_path(wanted).map_err(read_err)? else {
            continue;
        };
        let kind = EntryKind::from(entry.mode());
        if matches!(kind, EntryKind::Tree | EntryKind::Commit) {
            continue;
        }
        out.insert(
            wanted.clone(),
            (
                entry.object_id().to_string(),
                kind.as_octal_str().to_string(),
            ),
        );
    }
    Ok(out)
}

/// A blob's content by id.
pub fn blob(path: &Path, sha: &str, max_bytes: u64) -> Result<Vec<u8>, RepositoryError> {
    let repo = open(path)?;
    let id = gix::ObjectId::from_hex(sha.as_bytes())
        .map_err(|_| RepositoryError::NotFound("Blob".into()))?;
    let header = repo
        .find_header(id)
        .map_err(|_| RepositoryError::NotFound("Blob".into()))?;
    if header.kind() != gix::object::Kind::Blob {
        return Err(RepositoryError::NotFound("Blob".into()));
    }
    if header.size() > max_bytes {
        return Err(RepositoryError::Invalid(format!(
            "the file is larger than {max_bytes} bytes"
        )));
    }
    let blob = repo.find_blob(id).map_err(read_err)?;
    Ok(blob.data.clone())
}

/// A commit as GitLab shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    pub id: String,
    pub parent_ids: Vec<String>,
    pub title: String,
    pub message: String,
    pub author_name: String,
    pub author_email: String,
    pub authored_date: chrono::DateTime<chrono::FixedOffset>,
    pub committer_name: String,
    pub committer_email: String,
    pub committed_date: chrono::DateTime<chrono::FixedOffset>,
}

fn when(time: gix::date::Time) -> chrono::DateTime<chrono::FixedOffset> {
    use chrono::Offset as _;
    let offset = chrono::FixedOffset::east_opt(time.offset).unwrap_or(chrono::Utc.fix());
    chrono::DateTime::from_timestamp(time.seconds, 0)
        .unwrap_or_default()
        .with_timezone(&offset)
}

fn commit_info(commit: &gix::Commit<'_>) -> Result<CommitInfo, RepositoryError> {
    let message = commit
        .message_raw()
        .map_err(read_err)?
        .to_str_lossy()
        .into_owned();
    let title = message.lines().next().unwrap_or_default().to_owned();
    let author = commit.author().map_err(read_err)?;
    let committer = commit.committer().map_err(read_err)?;
    let author_time = author.time().map_err(read_err)?;
    let committer_time = committer.time().map_err(read_err)?;
    Ok(CommitInfo {
        id: commit.id().to_string(),
        parent_ids: commit.parent_ids().map(|p| p.to_string()).collect(),
        title,
        message,
        author_name: author.name.to_str_lossy().trim().to_owned(),
        author_email: author.email.to_str_lossy().trim().to_owned(),
        authored_date: when(author_time),
        committer_name: committer.name.to_str_lossy().trim().to_owned(),
        committer_email: committer.email.to_str_lossy().trim().to_owned(),
        committed_date: when(committer_time),
    })
}

pub fn commit(path: &Path, sha: &str) -> Result<CommitInfo, RepositoryError> {
    let repo = open(path)?;
    let id = gix::ObjectId::from_hex(sha.as_bytes())
        .map_err(|_| RepositoryError::NotFound("Commit".into()))?;
    let commit = repo
        .find_commit(id)
        .map_err(|_| RepositoryError::NotFound("Commit".into()))?;
    commit_info(&commit)
}

/// What a commit log is asked for.
#[derive(Debug, Clone, Default)]
pub struct LogQuery {
    pub path: Option<String>,
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub skip: usize,
    pub limit: usize,
}

/// The commits reachable from `start`, newest first, that touch `path` (when
/// given) and fall between `since` and `until`; `skip` and `limit` page them.
/// Also tells whether more matched after the page.
pub fn log(
    path: &Path,
    start: &str,
    query: &LogQuery,
) -> Result<(Vec<CommitInfo>, bool), RepositoryError> {
    let repo = open(path)?;
    let start_id = gix::ObjectId::from_hex(start.as_bytes()).map_err(read_err)?;
    let filter = query.path.as_deref().map(clean_path).transpose()?;
    let walk = repo
        .rev_walk([start_id])
        .sorting(gix::revision::walk::Sorting::ByCommitTime(
            Default::default(),
        ))
        .all()
        .map_err(read_err)?;
    let mut matched = 0usize;
    let mut out = Vec::new();
    let mut entries = EntryMemo::default();
    for (walked, info) in walk.enumerate() {
        if walked >= MAX_LOG_WALK {
            break;
        }
        let info = info.map_err(read_err)?;
        let commit = repo.find_commit(info.id).map_err(read_err)?;
        let seconds = commit.time().map_err(read_err)?.seconds;
        if query.until.is_some_and(|u| seconds > u) {
            continue;
        }
        if query.since.is_some_and(|s| seconds < s) {
            continue;
        }
        if let Some(filter) = filter.as_deref().filter(|f| !f.is_empty())
            && !touches(&repo, &commit, filter, &mut entries)?
        {
            continue;
        }
        matched += 1;
        if matched <= query.skip {
            continue;
        }
        if out.len() == query.limit {
            return Ok((out, true));
        }
        out.push(commit_info(&commit)?);
    }
    Ok((out, false))
}

/// What is at the filtered path in each commit seen by one walk: in a linear
/// history every commit is looked up twice (itself, then as a parent).
#[derive(Default)]
struct EntryMemo(std::collections::HashMap<gix::ObjectId, Option<gix::ObjectId>>);

impl EntryMemo {
    fn at(
        &mut self,
        repo: &gix::Repository,
        commit: gix::ObjectId,
        path: &str,
    ) -> Result<Option<gix::ObjectId>, RepositoryError> {
        if let Some(known) = self.0.get(&commit) {
            return Ok(*known);
        }
        let found = repo
            .find_commit(commit)
            .map_err(read_err)?
            .tree()
            .map_err(read_err)?
            .lookup_entry_by_path(path)
            .map_err(read_err)?
            .map(|e| e.object_id());
        self.0.insert(commit, found);
        Ok(found)
    }
}

/// Whether the commit changed what is at `path` compared with its first parent.
fn touches(
    repo: &gix::Repository,
    commit: &gix::Commit<'_>,
    path: &str,
    entries: &mut EntryMemo,
) -> Result<bool, RepositoryError> {
    let mine = entries.at(repo, commit.id, path)?;
    let parent = match commit.parent_ids().next() {
        Some(p) => entries.at(repo, p.detach(), path)?,
        None => None,
    };
    Ok(mine != parent)
}

/// The newest commit reachable from `start` that changed `file_path` (`None`
/// when none did within the walk's bound).
pub fn last_commit_for_path(
    path: &Path,
    start: &str,
    file_path: &str,
) -> Result<Option<String>, RepositoryError> {
    let query = LogQuery {
        path: Some(file_path.to_owned()),
        limit: 1,
        ..Default::default()
    };
    Ok(log(path, start, &query)?.0.into_iter().next().map(|c| c.id))
}

/// The best common ancestor of two commits (`None` when they share none).
pub async fn merge_base(path: &Path, a: &str, b: &str) -> Result<Option<String>, RepositoryError> {
    let dir = path.display().to_string();
    match super::git::git(&["--git-dir", &dir, "merge-base", a, b]).await {
        Ok(out) => Ok(Some(String::from_utf8_lossy(&out).trim().to_owned())),
        // git answers 1 with no output when there is no common ancestor.
        Err(RepositoryError::Git(msg)) if msg.is_empty() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Commits reachable from `to` but not from `from`, newest first, at most `limit`.
pub async fn commits_between(
    path: &Path,
    from: &str,
    to: &str,
    limit: usize,
) -> Result<Vec<CommitInfo>, RepositoryError> {
    let dir = path.display().to_string();
    let range = format!("{from}..{to}");
    let max = format!("--max-count={limit}");
    let out = super::git::git(&["--git-dir", &dir, "rev-list", &max, &range, "--"]).await?;
    let ids: Vec<String> = String::from_utf8_lossy(&out)
        .lines()
        .map(str::to_owned)
        .collect();
    let p = path.to_owned();
    tokio::task::spawn_blocking(move || ids.iter().map(|id| commit(&p, id)).collect())
        .await
        .map_err(read_err)?
}

/// One file's change in GitLab's diff shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    pub old_path: String,
    pub new_path: String,
    pub a_mode: String,
    pub b_mode: String,
    pub new_file: bool,
    pub renamed_file: bool,
    pub deleted_file: bool,
    pub diff: String,
    pub additions: u64,
    pub deletions: u64,
}

/// git's empty tree: what a root commit is compared with.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// Lines added and removed from `from` to `to` (`from` `None`: the root
/// commit's content) over every file, binary files counting nothing: one
/// `git diff --numstat`, without the patches.
pub async fn diff_stats(
    path: &Path,
    from: Option<&str>,
    to: &str,
) -> Result<(u64, u64), RepositoryError> {
    let git_dir = path.display().to_string();
    let out = super::git::git(&[
        "--git-dir",
        &git_dir,
        "diff",
        "--no-color",
        "--no-ext-diff",
        "-M",
        "--numstat",
        from.unwrap_or(EMPTY_TREE),
        to,
    ])
    .await?;
    // One line per file: "<added>\t<deleted>\t<path>" ("-" for binary files).
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .fold((0, 0), |(added, deleted), line| {
            let mut fields = line.split('\t');
            let mut count = || {
                fields
                    .next()
                    .and_then(|f| f.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (a, d) = (count(), count());
            (added + a, deleted + d)
        }))
}

/// The changes from `from` to `to` (`from` `None`: the root commit's content),
/// computed by `git diff` (renames found), each file's patch without its
/// `diff --git` header as GitLab sends it, at most `max_files`.
pub async fn diff(
    path: &Path,
    from: Option<&str>,
    to: &str,
    max_files: usize,
) -> Result<Vec<FileChange>, RepositoryError> {
    let git_dir = path.display().to_string();
    let base = from.unwrap_or(EMPTY_TREE);
    let raw = super::git::git(&[
        "--git-dir",
        &git_dir,
        "diff",
        "--no-color",
        "--no-ext-diff",
        "-M",
        "--full-index",
        "--raw",
        "--numstat",
        "-z",
        base,
        to,
    ])
    .await?;
    let patch = super::git::git(&[
        "--git-dir",
        &git_dir,
        "diff",
        "--no-color",
        "--no-ext-diff",
        "-M",
        base,
        to,
    ])
    .await?;
    Ok(assemble(&raw, &String::from_utf8_lossy(&patch), max_files))
}

/// Joins `--raw --numstat -z` records with the patch text of each file.
fn assemble(raw: &[u8], patch: &str, max_files: usize) -> Vec<FileChange> {
    let fields: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    let mut changes: Vec<FileChange> = Vec::new();
    let mut i = 0;
    // --raw records: ":<a mode> <b mode> <a sha> <b sha> <status>\0<path>[\0<new path>]"
    while i < fields.len() && fields[i].starts_with(b":") {
        let meta = String::from_utf8_lossy(fields[i]).into_owned();
        let parts: Vec<&str> = meta.trim_start_matches(':').split_whitespace().collect();
        let status = parts.get(4).copied().unwrap_or("M");
        let renamed = status.starts_with('R');
        let old =
            String::from_utf8_lossy(fields.get(i + 1).copied().unwrap_or_default()).into_owned();
        let new = if renamed || status.starts_with('C') {
            i += 1;
            String::from_utf8_lossy(fields.get(i + 1).copied().unwrap_or_default()).into_owned()
        } else {
            old.clone()
        };
        i += 2;
        changes.push(FileChange {
            old_path: old,
            new_path: new,
            a_mode: parts.first().copied().unwrap_or("0").to_owned(),
            b_mode: parts.get(1).copied().unwrap_or("0").to_owned(),
            new_file: status == "A",
            renamed_file: renamed,
            deleted_file: status == "D",
            diff: String::new(),
            additions: 0,
            deletions: 0,
        });
    }
    // --numstat records follow: "<add>\t<del>\t<path>" (renames: "<add>\t<del>\t\0old\0new").
    let mut n = 0;
    while i < fields.len() && n < changes.len() {
        let text = String::from_utf8_lossy(fields[i]).into_owned();
        let mut cols = text.splitn(3, '\t');
        let add = cols.next().and_then(|c| c.parse().ok()).unwrap_or(0);
        let del = cols.next().and_then(|c| c.parse().ok()).unwrap_or(0);
        let rest = cols.next().unwrap_or("");
        if rest.is_empty() {
            // A rename: the two paths follow as their own fields.
            i += 2;
        }
        if let Some(change) = changes.get_mut(n) {
            change.additions = add;
            change.deletions = del;
        }
        n += 1;
        i += 1;
    }
    // The patch, split per file, in the same order.
    let mut pieces = patch
        .split("\ndiff --git ")
        .map(|p| p.trim_start_matches("diff --git "));
    for change in changes.iter_mut() {
        let Some(piece) = pieces.next() else { break };
        // GitLab's `diff` starts at the first hunk ("@@") or is empty (binary, mode).
        change.diff = match piece.find("\n@@") {
            Some(at) => format!("{}\n", piece[at + 1..].trim_end_matches('\n')),
            None => String::new(),
        };
    }
    changes.truncate(max_files);
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_repository() {
        assert_eq!(clean_path("src/lib.rs").unwrap(), "src/lib.rs");
        assert_eq!(clean_path("/src/").unwrap(), "src");
        assert_eq!(clean_path("").unwrap(), "");
        for bad in ["../etc/passwd", "src/../../x", "a//b", "a/./b", "x\0y"] {
            assert!(clean_path(bad).is_err(), "{bad}");
        }
    }
}
