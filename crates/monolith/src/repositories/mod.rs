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
    Ok(Some(
        reader::diff(&path, base.as_deref(), to, max_files).await?,
    ))
}
