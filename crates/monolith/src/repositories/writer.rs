//! Commits and branches made through the API, with git's own plumbing
//! (`hash-object`, `update-index` on a private index, `write-tree`,
//! `commit-tree`, `update-ref`). The final `update-ref` compares and swaps, so
//! two writers racing on one branch cannot both win: the loser gets
//! [`RepositoryError::Conflict`] and nothing of its commit is visible.

use std::path::Path;

use super::error::RepositoryError;
use super::git::git_with;
use super::pushes::{RefUpdate, ZERO_SHA};
use super::reader::{self, clean_path};

/// Who a commit is by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub name: String,
    pub email: String,
    /// Seconds since the epoch and the offset in minutes; `None` for now.
    pub when: Option<(i64, i32)>,
}

/// One change of a multi-file commit, as GitLab's commits API names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileAction {
    Create {
        path: String,
        content: Vec<u8>,
        executable: bool,
    },
    Update {
        path: String,
        content: Vec<u8>,
    },
    Delete {
        path: String,
    },
    /// Renames `previous_path` to `path`, with new content when given.
    Move {
        previous_path: String,
        path: String,
        content: Option<Vec<u8>>,
    },
    Chmod {
        path: String,
        executable: bool,
    },
    /// Creates or replaces a file (the seed's and the workflow tools' write).
    Upsert {
        path: String,
        content: Vec<u8>,
    },
}

/// A commit to make on `branch`.
#[derive(Debug, Clone)]
pub struct CommitRequest {
    pub branch: String,
    /// Where a new `branch` starts (a branch, tag or commit); ignored when the
    /// branch exists.
    pub start: Option<String>,
    pub message: String,
    pub author: Signature,
    pub actions: Vec<FileAction>,
}

/// What a commit produced: its id and the branch it moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub commit_id: String,
    pub update: RefUpdate,
}

/// Most actions one commit may carry.
pub const MAX_ACTIONS: usize = 1000;

/// A branch name git accepts and GitLab would create (`git check-ref-format`'s
/// rules, checked here so a bad name never reaches git).
pub fn check_branch_name(name: &str) -> Result<(), RepositoryError> {
    let bad = |why: &str| {
        Err(RepositoryError::Invalid(format!(
            "Branch name is invalid: {why}"
        )))
    };
    if name.is_empty() || name.len() > 255 {
        return bad("it must be 1 to 255 characters");
    }
    if name.starts_with(['-', '/', '.']) || name.ends_with(['/', '.']) || name.ends_with(".lock") {
        return bad("it starts or ends with a character git refuses");
    }
    if name.contains("..")
        || name.contains("//")
        || name.contains("@{")
        || name == "@"
        || name == "HEAD"
    {
        return bad("it contains a sequence git refuses");
    }
    if name
        .chars()
        .any(|c| c.is_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\'))
    {
        return bad("it contains a character git refuses");
    }
    if name
        .split('/')
        .any(|part| part.starts_with('.') || part.ends_with(".lock"))
    {
        return bad("a part of it starts with a dot or ends with .lock");
    }
    Ok(())
}

/// A path a commit may write: relative, inside the repository, never into `.git`.
fn writable_path(path: &str) -> Result<String, RepositoryError> {
    let clean = clean_path(path)?;
    if clean.is_empty() {
        return Err(RepositoryError::Invalid("file_path is empty".into()));
    }
    if clean.len() > 4096 || clean.split('/').any(|p| p.len() > 255) {
        return Err(RepositoryError::Invalid("file_path is too long".into()));
    }
    if clean.split('/').any(|p| p.eq_ignore_ascii_case(".git")) {
        return Err(RepositoryError::Invalid(
            "file_path must not name .git".into(),
        ));
    }
    Ok(clean)
}

fn git_dir(path: &Path) -> String {
    path.display().to_string()
}

async fn plumbing(
    path: &Path,
    index: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&[u8]>,
) -> Result<String, RepositoryError> {
    let dir = git_dir(path);
    let index = index.display().to_string();
    let mut all_env: Vec<(&str, &str)> = vec![("GIT_INDEX_FILE", index.as_str())];
    all_env.extend_from_slice(env);
    let mut all_args = vec!["--git-dir", dir.as_str()];
    all_args.extend_from_slice(args);
    let out = git_with(&all_args, &all_env, stdin).await?;
    Ok(String::from_utf8_lossy(&out).trim().to_owned())
}

/// Makes the commit and moves the branch to it.
pub async fn commit(path: &Path, request: &CommitRequest) -> Result<Committed, RepositoryError> {
    check_branch_name(&request.branch)?;
    if request.actions.is_empty() {
        return Err(RepositoryError::Invalid("actions is empty".into()));
    }
    if request.actions.len() > MAX_ACTIONS {
        return Err(RepositoryError::Invalid(format!(
            "a commit takes at most {MAX_ACTIONS} actions"
        )));
    }
    if request.message.trim().is_empty() {
        return Err(RepositoryError::Invalid("commit_message is empty".into()));
    }
    let refs = {
        let p = path.to_owned();
        tokio::task::spawn_blocking(move || reader::refs(&p))
            .await
            .map_err(|e| RepositoryError::Read(e.to_string()))??
    };
    let existing = refs.branches.get(&request.branch).cloned();
    let parent = match (&existing, &request.start) {
        (Some(head), _) => Some(head.clone()),
        (None, Some(start)) => {
            let p = path.to_owned();
            let start = start.clone();
            Some(
                tokio::task::spawn_blocking(move || reader::resolve(&p, &start))
                    .await
                    .map_err(|e| RepositoryError::Read(e.to_string()))?
                    .map_err(|_| RepositoryError::Invalid("Invalid start_branch".into()))?,
            )
        }
        (None, None) if refs.branches.is_empty() => None,
        (None, None) => {
            return Err(RepositoryError::Invalid(
                "You can only create or edit files when you are on a branch".into(),
            ));
        }
    };

    // Check every action against the parent's tree before writing anything.
    let actions = validate_actions(path, parent.as_deref(), &request.actions).await?;

    let scratch = tempdir_in(path).await?;
    let index = scratch.join("index");
    let result = build_commit(path, &index, parent.as_deref(), request, &actions).await;
    let _ = tokio::fs::remove_dir_all(&scratch).await;
    let commit_id = result?;

    let name = format!("refs/heads/{}", request.branch);
    let old = existing.clone().unwrap_or_else(|| ZERO_SHA.to_owned());
    let dir = git_dir(path);
    git_with(
        &["--git-dir", &dir, "update-ref", &name, &commit_id, &old],
        &[],
        None,
    )
    .await
    .map_err(|_| RepositoryError::Conflict)?;
    Ok(Committed {
        commit_id: commit_id.clone(),
        update: RefUpdate {
            name,
            before: old,
            after: commit_id,
        },
    })
}

/// An action with its paths cleaned and checked against the parent tree.
#[derive(Debug)]
struct CheckedAction {
    remove: Option<String>,
    /// (path, mode, content or the blob to keep)
    write: Option<(String, &'static str, Content)>,
}

#[derive(Debug)]
enum Content {
    Bytes(Vec<u8>),
    Blob(String),
}

async fn validate_actions(
    path: &Path,
    parent: Option<&str>,
    actions: &[FileAction],
) -> Result<Vec<CheckedAction>, RepositoryError> {
    // What the parent has at each path the actions name: (blob id, mode).
    let mut names: Vec<String> = Vec::new();
    for action in actions {
        match action {
            FileAction::Create { path, .. }
            | FileAction::Update { path, .. }
            | FileAction::Delete { path }
            | FileAction::Chmod { path, .. }
            | FileAction::Upsert { path, .. } => names.push(writable_path(path)?),
            FileAction::Move {
                previous_path,
                path,
                ..
            } => {
                names.push(writable_path(previous_path)?);
                names.push(writable_path(path)?);
            }
        }
    }
    let present = {
        let p = path.to_owned();
        let parent = parent.map(str::to_owned);
        let names = names.clone();
        tokio::task::spawn_blocking(move || reader::entries_at(&p, parent.as_deref(), &names))
            .await
            .map_err(|e| RepositoryError::Read(e.to_string()))??
    };
    let exists = |p: &str| present.get(p).cloned();
    let mode = |executable: bool| if executable { "100755" } else { "100644" };
    let mut out = Vec::with_capacity(actions.len());
    for action in actions {
        out.push(match action {
            FileAction::Create {
                path,
                content,
                executable,
            } => {
                let path = writable_path(path)?;
                if exists(&path).is_some() {
                    return Err(RepositoryError::Invalid(
                        "A file with this name already exists".into(),
                    ));
                }
                CheckedAction {
                    remove: None,
                    write: Some((path, mode(*executable), Content::Bytes(content.clone()))),
                }
            }
            FileAction::Update { path, content } => {
                let path = writable_path(path)?;
                let Some((_, current_mode)) = exists(&path) else {
                    return Err(RepositoryError::Invalid(
                        "A file with this name doesn't exist".into(),
                    ));
                };
                CheckedAction {
                    remove: None,
                    write: Some((
                        path,
                        mode(current_mode == "100755"),
                        Content::Bytes(content.clone()),
                    )),
                }
            }
            FileAction::Delete { path } => {
                let path = writable_path(path)?;
                if exists(&path).is_none() {
                    return Err(RepositoryError::Invalid(
                        "A file with this name doesn't exist".into(),
                    ));
                }
                CheckedAction {
                    remove: Some(path),
                    write: None,
                }
            }
            FileAction::Move {
                previous_path,
                path,
                content,
            } => {
                let from = writable_path(previous_path)?;
                let to = writable_path(path)?;
                let Some((blob, current_mode)) = exists(&from) else {
                    return Err(RepositoryError::Invalid(
                        "A file with this name doesn't exist".into(),
                    ));
                };
                if exists(&to).is_some() {
                    return Err(RepositoryError::Invalid(
                        "A file with this name already exists".into(),
                    ));
                }
                let data = match content {
                    Some(bytes) => Content::Bytes(bytes.clone()),
                    None => Content::Blob(blob),
                };
                CheckedAction {
                    remove: Some(from),
                    write: Some((to, mode(current_mode == "100755"), data)),
                }
            }
            FileAction::Upsert { path, content } => {
                let path = writable_path(path)?;
                let executable = exists(&path).is_some_and(|(_, m)| m == "100755");
                CheckedAction {
                    remove: None,
                    write: Some((path, mode(executable), Content::Bytes(content.clone()))),
                }
            }
            FileAction::Chmod { path, executable } => {
                let path = writable_path(path)?;
                let Some((blob, _)) = exists(&path) else {
                    return Err(RepositoryError::Invalid(
                        "A file with this name doesn't exist".into(),
                    ));
                };
                CheckedAction {
                    remove: None,
                    write: Some((path, mode(*executable), Content::Blob(blob))),
                }
            }
        });
    }
    Ok(out)
}

async fn build_commit(
    path: &Path,
    index: &Path,
    parent: Option<&str>,
    request: &CommitRequest,
    actions: &[CheckedAction],
) -> Result<String, RepositoryError> {
    match parent {
        Some(parent) => plumbing(path, index, &["read-tree", parent], &[], None).await?,
        None => plumbing(path, index, &["read-tree", "--empty"], &[], None).await?,
    };
    // One `update-index --index-info` for all entries: removals as mode 0.
    let mut info = String::new();
    for action in actions {
        if let Some(removed) = &action.remove {
            info.push_str(&format!("0 {ZERO_SHA}\t{removed}\n"));
        }
        if let Some((file, mode, content)) = &action.write {
            let blob = match content {
                Content::Blob(id) => id.clone(),
                Content::Bytes(bytes) => {
                    plumbing(
                        path,
                        index,
                        &["hash-object", "-w", "--stdin"],
                        &[],
                        Some(bytes),
                    )
                    .await?
                }
            };
            info.push_str(&format!("{mode} {blob}\t{file}\n"));
        }
    }
    plumbing(
        path,
        index,
        &["update-index", "--index-info"],
        &[],
        Some(info.as_bytes()),
    )
    .await?;
    let tree = plumbing(path, index, &["write-tree"], &[], None).await?;

    let when = request.author.when.map(|(secs, offset)| {
        let sign = if offset < 0 { '-' } else { '+' };
        let offset = offset.abs();
        format!("{secs} {sign}{:02}{:02}", offset / 60, offset % 60)
    });
    let mut env: Vec<(&str, &str)> = vec![
        ("GIT_AUTHOR_NAME", request.author.name.as_str()),
        ("GIT_AUTHOR_EMAIL", request.author.email.as_str()),
        ("GIT_COMMITTER_NAME", request.author.name.as_str()),
        ("GIT_COMMITTER_EMAIL", request.author.email.as_str()),
    ];
    if let Some(when) = when.as_deref() {
        env.push(("GIT_AUTHOR_DATE", when));
        env.push(("GIT_COMMITTER_DATE", when));
    }
    let mut args = vec!["commit-tree", tree.as_str()];
    if let Some(parent) = parent {
        args.extend_from_slice(&["-p", parent]);
    }
    args.extend_from_slice(&["-F", "-"]);
    plumbing(path, index, &args, &env, Some(request.message.as_bytes())).await
}

/// A private scratch directory inside the repository (same filesystem, removed
/// after the commit).
async fn tempdir_in(path: &Path) -> Result<std::path::PathBuf, RepositoryError> {
    let dir = path.join(format!("duo-tmp-{}", uuid::Uuid::new_v4()));
    tokio::fs::create_dir_all(&dir).await?;
    Ok(dir)
}

/// Creates `refs/heads/<name>` at `target` (a branch, tag or commit).
pub async fn create_branch(
    path: &Path,
    name: &str,
    target: &str,
) -> Result<RefUpdate, RepositoryError> {
    check_branch_name(name)?;
    let p = path.to_owned();
    let target = target.to_owned();
    let id = tokio::task::spawn_blocking(move || reader::resolve(&p, &target))
        .await
        .map_err(|e| RepositoryError::Read(e.to_string()))?
        .map_err(|_| RepositoryError::Invalid("Invalid reference name".into()))?;
    let full = format!("refs/heads/{name}");
    let dir = git_dir(path);
    git_with(
        &["--git-dir", &dir, "update-ref", &full, &id, ZERO_SHA],
        &[],
        None,
    )
    .await
    .map_err(|_| RepositoryError::Invalid("Branch already exists".into()))?;
    Ok(RefUpdate {
        name: full,
        before: ZERO_SHA.to_owned(),
        after: id,
    })
}

/// Deletes `refs/heads/<name>` if it still points at `expected`.
pub async fn delete_branch(
    path: &Path,
    name: &str,
    expected: &str,
) -> Result<RefUpdate, RepositoryError> {
    let full = format!("refs/heads/{name}");
    let dir = git_dir(path);
    git_with(
        &["--git-dir", &dir, "update-ref", "-d", &full, expected],
        &[],
        None,
    )
    .await
    .map_err(|_| RepositoryError::Conflict)?;
    Ok(RefUpdate {
        name: full,
        before: expected.to_owned(),
        after: ZERO_SHA.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_follow_gits_rules() {
        for good in ["main", "feature/login", "fix-1.2", "release/v2"] {
            assert!(check_branch_name(good).is_ok(), "{good}");
        }
        for bad in [
            "", "-x", "/x", "x/", "a..b", "a b", "a~1", "x.lock", "a//b", "@", "HEAD", "a\0b",
            ".hidden", "a/.b", "a@{1}",
        ] {
            assert!(check_branch_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn written_paths_stay_out_of_git_dir() {
        assert_eq!(writable_path("src/a.rs").unwrap(), "src/a.rs");
        for bad in [
            "",
            "../a",
            ".git/config",
            "x/.GIT/hooks/pre-receive",
            "a\0b",
        ] {
            assert!(writable_path(bad).is_err(), "{bad:?}");
        }
    }
}
