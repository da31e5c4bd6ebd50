//! What every repository endpoint shares: the repository a caller may read or
//! write, running git on the blocking pool, a repository failure as the API
//! answers it, recording a change as a push would, and the commit author.
//! The endpoints (tree, files and blobs in `repository`, commits in
//! `repository_commits`, branches and tags in `branches`) sit on top of it.

use std::path::PathBuf;

use actix_web::HttpRequest;
use base64::Engine as _;
use serde_json::{Value, json};

use super::{ApiError, require_user};
use crate::app_state::AppState;
use crate::identity::tokens::AuthenticatedUser;
use crate::policy::{Ability, Actor, PushAccess, Subject};
use crate::repositories::pushes::{self, RefUpdate};
use crate::repositories::writer::Signature;
use crate::repositories::{RepositoryError, reader};

/// Most files one diff answer lists (GitLab's default `max_files`-style bound).
pub(super) const MAX_DIFF_FILES: usize = 1000;

/// A project's repository the caller may read.
pub(super) struct Repo {
    pub project_id: i64,
    pub path: PathBuf,
    pub default_branch: String,
    pub full_path: String,
    pub user: Option<AuthenticatedUser>,
}

impl Repo {
    /// `https://host/acme/website`
    pub fn web_url(&self, state: &AppState) -> String {
        format!("{}{}", state.config.external_url.as_str(), self.full_path)
    }

    /// The commit `rev` names (the default branch when `None`); `missing` is the
    /// 404 to answer when it names nothing.
    pub async fn resolve(
        &self,
        rev: Option<&str>,
        missing: &'static str,
    ) -> Result<String, ApiError> {
        let rev = rev
            .filter(|r| !r.trim().is_empty())
            .unwrap_or(&self.default_branch)
            .to_owned();
        let path = self.path.clone();
        match blocking(move || reader::resolve(&path, &rev)).await {
            Ok(id) => Ok(id),
            // An ambiguous name is the caller's to fix; anything else names nothing.
            Err(ApiError::Invalid(msg)) => Err(ApiError::Invalid(msg)),
            Err(_) => Err(ApiError::NotFound(missing)),
        }
    }
}

/// Runs repository reading on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RepositoryError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(repository_error)
}

/// A repository failure as the API answers it.
pub(super) fn repository_error(e: RepositoryError) -> ApiError {
    match e {
        RepositoryError::NotFound(_) => ApiError::NotFound("File"),
        // GitLab's `render_api_error!(message, 400)`: `{"message": "..."}`.
        RepositoryError::Invalid(msg) => ApiError::Invalid(Value::String(msg)),
        RepositoryError::Conflict => ApiError::Invalid(Value::String(
            "The branch has changed since you started editing it".into(),
        )),
        other => ApiError::Internal(other.to_string()),
    }
}

/// The caller may read the project's code (404 "Project Not Found" otherwise,
/// as for a project that does not exist); the repository exists on disk.
pub(super) async fn readable_repo(
    state: &AppState,
    req: &impl super::Caller,
    project_id: i64,
) -> Result<Repo, ApiError> {
    // The token's scope (`read_repository` reads here) is checked by
    // `optional_user`, as on every REST route.
    let user = req.reader(state).await?;
    let actor = user.as_ref().map(Actor::from);
    let db = state.pool.get().await?;
    if !state
        .policy
        .can(&*db, actor, Ability::ReadCode, Subject::Project(project_id))
        .await?
    {
        return Err(ApiError::NotFound("Project"));
    }
    let (default_branch, full_path) =
        crate::namespaces::projects::repository_facts(&*db, project_id)
            .await?
            .ok_or(ApiError::NotFound("Project"))?;
    drop(db);
    let path = state
        .repositories
        .ensure(project_id, &default_branch)
        .await
        .map_err(repository_error)?;
    Ok(Repo {
        project_id,
        path,
        default_branch,
        full_path,
        user,
    })
}

/// A signed-in caller with an `api` token who may push to `branch` (404 when the
/// project is not readable, 403 when they may not push there).
pub(super) async fn writable_repo(
    state: &AppState,
    req: &HttpRequest,
    project_id: i64,
    branch: &str,
) -> Result<(Repo, AuthenticatedUser), ApiError> {
    let me = require_user(state, req, super::WRITE_SCOPES).await?;
    let repo = readable_repo(state, req, project_id).await?;
    let db = state.pool.get().await?;
    let access = state
        .policy
        .push_access(&*db, Some(Actor::from(&me)), project_id)
        .await?;
    let allowed = match access {
        PushAccess::All => true,
        PushAccess::UnprotectedBranches => branch != repo.default_branch,
        PushAccess::None => false,
    };
    if !allowed {
        return Err(ApiError::ForbiddenBecause(
            "You are not allowed to push into this branch",
        ));
    }
    Ok((repo, me))
}

/// Records a ref change made through the API exactly as a push would be.
pub(super) async fn record_update(
    state: &AppState,
    project_id: i64,
    pusher: i64,
    update: RefUpdate,
) -> Result<(), ApiError> {
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    pushes::record(&tx, project_id, Some(pusher), &[update])
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    tx.commit().await?;
    Ok(())
}

/// `content` in its declared encoding (`text`, the default, or `base64`).
pub(super) fn decode_content(
    content: Option<&str>,
    encoding: Option<&str>,
) -> Result<Vec<u8>, ApiError> {
    let content = content.unwrap_or_default();
    match encoding.unwrap_or("text") {
        "text" => Ok(content.as_bytes().to_vec()),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(content.trim())
            .map_err(|_| ApiError::BadRequest("content is not valid base64".into())),
        _ => Err(ApiError::BadRequest(
            "encoding does not have a valid value".into(),
        )),
    }
}

/// The commit's author: the caller, or the name and email they gave.
pub(super) async fn author(
    state: &AppState,
    me: &AuthenticatedUser,
    name: Option<String>,
    email: Option<String>,
) -> Result<Signature, ApiError> {
    let db = state.pool.get().await?;
    let (own_name, own_email) =
        crate::identity::users::name_and_email(&*db, me.author_id()).await?;
    // A composite identity commits as its service account, whatever the
    // request names (a run may not sign as someone else).
    let (name, email) = match me.service_account {
        Some(_) => (None, None),
        None => (name, email),
    };
    Ok(Signature {
        name: name.filter(|n| !n.trim().is_empty()).unwrap_or(own_name),
        email: email.filter(|e| !e.trim().is_empty()).unwrap_or(own_email),
        when: None,
    })
}

pub(super) fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, ApiError> {
    value
        .as_deref()
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| ApiError::BadRequest(format!("{name} is missing")))
}

/// The repository fields of a project's JSON: `default_branch`,
/// `http_url_to_repo` and `empty_repo`.
pub(super) fn project_repository_fields(
    state: &AppState,
    project: &mut Value,
    project_id: i64,
    full_path: &str,
    default_branch: &str,
) {
    if let Some(map) = project.as_object_mut() {
        map.insert("default_branch".into(), json!(default_branch));
        map.insert(
            "http_url_to_repo".into(),
            json!(format!(
                "{}{full_path}.git",
                state.config.external_url.as_str()
            )),
        );
        map.insert(
            "empty_repo".into(),
            json!(state.repositories.looks_empty(project_id)),
        );
    }
}
