//! Where repositories live: `<DUO_REPOSITORIES_DIR>/@hashed/ab/cd/<sha256 of the
//! project id>.git`, GitLab's hashed layout. The path depends on the project's
//! id only, so renaming or moving a project moves nothing on disk and keeps its
//! history; deleting the project deletes the directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use sha2::{Digest, Sha256};

use super::error::RepositoryError;
use super::git::git;

/// The hook every repository runs before accepting a push: it refuses updates
/// of the protected branch named in `DUO_PROTECTED_REF` unless
/// `DUO_MAY_PUSH_PROTECTED=1`, both set by the monolith for each push.
const PRE_RECEIVE_HOOK: &str = r#"#!/bin/sh
# Installed by duo-monolith: branch protection for pushes over HTTP.
[ -z "$DUO_PROTECTED_REF" ] && exit 0
[ "$DUO_MAY_PUSH_PROTECTED" = "1" ] && exit 0
status=0
while read -r old new ref; do
  if [ "$ref" = "$DUO_PROTECTED_REF" ]; then
    echo "GitLab: You are not allowed to push code to protected branches on this project." >&2
    status=1
  fi
done
exit $status
"#;

/// The repositories of this instance.
#[derive(Debug, Clone)]
pub struct Repositories {
    root: PathBuf,
    /// Bounds how many git processes serve clones and pushes at once, so a
    /// flood of (anonymous) clones cannot fork the machine to death.
    slots: Arc<Semaphore>,
    last_commits: CommitFactsCache<(PathBuf, String, String), Option<String>>,
    commit_stats: CommitFactsCache<(PathBuf, String), (u64, u64)>,
}

/// Entries each cache of facts about commits keeps (a few hundred bytes each).
const COMMIT_FACTS_CACHE_ENTRIES: usize = 16_384;

/// Facts computed from commits by id ("the last commit that changed this
/// path, seen from that commit", "a commit's line counts"): a walk or a git
/// process each time, and never different for the same commit, so each is
/// computed once (GitLab caches them too). Bounded, least recently used out.
struct CommitFactsCache<K, V>(Arc<std::sync::Mutex<lru::LruCache<K, V>>>);

impl<K, V> Clone for CommitFactsCache<K, V> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K, V> std::fmt::Debug for CommitFactsCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitFactsCache")
    }
}

impl<K: std::hash::Hash + Eq, V: Clone> CommitFactsCache<K, V> {
    fn new() -> Self {
        let size = std::num::NonZeroUsize::new(COMMIT_FACTS_CACHE_ENTRIES)
            .unwrap_or(std::num::NonZeroUsize::MIN);
        Self(Arc::new(std::sync::Mutex::new(lru::LruCache::new(size))))
    }

    fn get(&self, key: &K) -> Option<V> {
        self.0.lock().ok()?.get(key).cloned()
    }

    fn put(&self, key: K, value: V) {
        if let Ok(mut cache) = self.0.lock() {
            cache.put(key, value);
        }
    }
}

impl Repositories {
    pub fn new(root: impl Into<PathBuf>, max_concurrent: usize) -> Self {
        Self {
            root: root.into(),
            slots: Arc::new(Semaphore::new(max_concurrent.max(1))),
            last_commits: CommitFactsCache::new(),
            commit_stats: CommitFactsCache::new(),
        }
    }

    /// The newest commit reachable from `commit` that changed `file_path`
    /// (a full commit id, so the answer never goes stale).
    pub async fn last_commit_for_path(
        &self,
        repository: &Path,
        commit: &str,
        file_path: &str,
    ) -> Result<Option<String>, RepositoryError> {
        let key = (
            repository.to_path_buf(),
            commit.to_owned(),
            file_path.to_owned(),
        );
        if let Some(known) = self.last_commits.get(&key) {
            return Ok(known);
        }
        let (path, start, file) = key.clone();
        let found = tokio::task::spawn_blocking(move || {
            super::reader::last_commit_for_path(&path, &start, &file)
        })
        .await
        .map_err(|e| RepositoryError::Read(e.to_string()))??;
        self.last_commits.put(key, found.clone());
        Ok(found)
    }

    /// Lines added and removed by `commit` against its first parent (`None`
    /// for a root commit), over every file.
    pub async fn commit_stats(
        &self,
        repository: &Path,
        commit: &str,
        parent: Option<&str>,
    ) -> Result<(u64, u64), RepositoryError> {
        let key = (repository.to_path_buf(), commit.to_owned());
        if let Some(known) = self.commit_stats.get(&key) {
            return Ok(known);
        }
        let stats = super::reader::diff_stats(repository, parent, commit).await?;
        self.commit_stats.put(key, stats);
        Ok(stats)
    }

    /// A slot for one git process; `None` when all are busy for `wait`.
    pub async fn slot(&self, wait: std::time::Duration) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(wait, self.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The repository's path relative to the root (what `git http-backend`
    /// gets as `PATH_INFO`).
    pub fn relative_path(project_id: i64) -> String {
        let digest = hex::encode(Sha256::digest(project_id.to_string().as_bytes()));
        format!("@hashed/{}/{}/{digest}.git", &digest[..2], &digest[2..4])
    }

    pub fn path(&self, project_id: i64) -> PathBuf {
        self.root.join(Self::relative_path(project_id))
    }

    /// Creates the bare repository (default branch `branch`) unless it exists.
    pub async fn ensure(&self, project_id: i64, branch: &str) -> Result<PathBuf, RepositoryError> {
        let path = self.path(project_id);
        if path.join("HEAD").exists() {
            return Ok(path);
        }
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        // Into a temporary directory first, then renamed: a repository is either
        // complete or absent, also when two requests create it at once.
        let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4()));
        git(&[
            "init",
            "--bare",
            "--quiet",
            &format!("--initial-branch={branch}"),
            &tmp.display().to_string(),
        ])
        .await?;
        for (key, value) in [
            // Accept only complete, well-formed objects and never rewrite history
            // by accident through the HTTP server.
            ("receive.fsckObjects", "true"),
            ("receive.denyNonFastforwards", "false"),
            ("http.receivepack", "true"),
            ("uploadpack.allowFilter", "true"),
            ("uploadpack.allowAnySHA1InWant", "false"),
        ] {
            git(&[
                "--git-dir",
                &tmp.display().to_string(),
                "config",
                key,
                value,
            ])
            .await?;
        }
        let hook = tmp.join("hooks").join("pre-receive");
        tokio::fs::write(&hook, PRE_RECEIVE_HOOK).await?;
        set_executable(&hook)?;
        match tokio::fs::rename(&tmp, &path).await {
            Ok(()) => Ok(path),
            // Another request created it first: use theirs.
            Err(_) if path.join("HEAD").exists() => {
                let _ = tokio::fs::remove_dir_all(&tmp).await;
                Ok(path)
            }
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&tmp).await;
                Err(e.into())
            }
        }
    }

    /// Whether the repository has no branch yet (also when it was never
    /// created): a look at the ref files only, cheap enough for project lists.
    pub fn looks_empty(&self, project_id: i64) -> bool {
        let path = self.path(project_id);
        let loose = std::fs::read_dir(path.join("refs").join("heads"))
            .map(|mut d| d.next().is_none())
            .unwrap_or(true);
        let packed = std::fs::read_to_string(path.join("packed-refs"))
            .map(|text| !text.contains(" refs/heads/"))
            .unwrap_or(true);
        loose && packed
    }

    /// Deletes the repository (the project is gone).
    pub async fn remove(&self, project_id: i64) -> Result<(), RepositoryError> {
        let path = self.path(project_id);
        match tokio::fs::remove_dir_all(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(unix)]
fn set_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_hashed_from_the_id_only() {
        let p = Repositories::relative_path(1);
        assert!(p.starts_with(
            "@hashed/6b/86/6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"
        ));
        assert!(p.ends_with(".git"));
        assert_ne!(p, Repositories::relative_path(2));
    }
}
