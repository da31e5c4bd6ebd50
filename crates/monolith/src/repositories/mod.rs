//! Every project's git repository: a bare repository on disk, served over smart
//! HTTP by the system's `git http-backend` behind our own authentication,
//! read in-process with gitoxide, written only through `git` itself (pushes,
//! and the API's commits through git's plumbing).
//!
//! - [`storage`]: where a project's repository lives and its lifecycle;
//! - [`error`]: what can go wrong with one; [`git`]: running `git` itself;
//! - [`http_backend`]: running `git http-backend` as a CGI program;
//! - [`pushes`]: what changed in a push, recorded, and the job that announces it;
//! - [`reader`]: trees, files, commits, diffs and refs, read with gitoxide;
//! - [`writer`]: commits and branches made through git plumbing.

pub mod error;
pub mod git;
pub mod http_backend;
pub mod pushes;
pub mod reader;
pub mod storage;
pub mod writer;

pub use error::RepositoryError;
pub use storage::Repositories;

/// The changes a merge request from `source` into `target` brings (since their
/// common ancestor, as GitLab shows them); `None` when the repository does
/// not have both branches (the merge request then keeps its stored diff).
pub async fn branch_changes(
    repositories: &Repositories,
    project_id: i64,
    source: &str,
    target: &str,
    max_files: usize,
) -> Result<Option<Vec<reader::FileChange>>, RepositoryError> {
    Ok(
        branch_comparison(repositories, project_id, source, target, max_files)
            .await?
            .map(|c| c.changes),
    )
}

/// A merge request's comparison with the commits it is made against, as
/// GitLab's diff positions name them.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The common ancestor (GitLab's `base_sha`; the target's tip when the
    /// branches share none).
    pub base_sha: String,
    /// The target branch's tip (`start_sha`).
    pub start_sha: String,
    /// The source branch's tip (`head_sha`).
    pub head_sha: String,
    pub changes: Vec<reader::FileChange>,
}

/// [`branch_changes`] with the three commits of the comparison.
pub async fn branch_comparison(
    repositories: &Repositories,
    project_id: i64,
    source: &str,
    target: &str,
    max_files: usize,
) -> Result<Option<Comparison>, RepositoryError> {
    let path = repositories.path(project_id);
    if !path.join("HEAD").exists() {
        return Ok(None);
    }
    let p = path.clone();
    let refs = tokio::task::spawn_blocking(move || reader::refs(&p))
        .await
        .map_err(|e| RepositoryError::Read(e.to_string()))??;
    let (Some(from), Some(to)) = (refs.branches.get(target), refs.branches.get(source)) else {
        return Ok(None);
    };
    let base = reader::merge_base(&path, from, to).await?;
    let changes = reader::diff(&path, base.as_deref(), to, max_files).await?;
    Ok(Some(Comparison {
        base_sha: base.unwrap_or_else(|| from.clone()),
        start_sha: from.clone(),
        head_sha: to.clone(),
        changes,
    }))
}
