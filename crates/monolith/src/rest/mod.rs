//! REST API under `/api/v4` in GitLab's shapes.

mod admin;
mod branches;
mod ci;
mod common;
mod diffs;
mod epics;
mod error;
mod groups;
pub mod input_guard;
mod issues;
mod item_updates;
mod items;
mod members;
mod merge_requests;
mod notes;
pub mod oidc;
pub mod pagination;
pub mod params;
pub mod path_ids;
mod projects;
mod repository;
mod repository_commits;
pub mod resources;
pub mod users;
mod workflow_tools;
pub mod workflows;
mod workflows_internal;
mod workflows_socket;

pub use error::ApiError;

use actix_web::HttpRequest;

use crate::app_state::AppState;
use crate::identity::request::request_user;
use crate::identity::tokens::{AuthenticatedUser, TokenError};

/// The signed-in user, `None` when no token was sent; a bad token is a 401.
/// A Duo Workflow token (`ai_workflows` only) is refused here, except on the
/// endpoints its GitLab tools call ([`WORKFLOW_TOOL_ENDPOINTS`]); the workflow
/// endpoints ask through [`require_user`].
pub async fn optional_user(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Option<AuthenticatedUser>, ApiError> {
    let user = token_user(state, req).await?;
    if let Some(u) = &user
        && workflow_only(u)
        && !workflow_tool_endpoint(req)
    {
        return Err(ApiError::InsufficientScope(READ_SCOPES.join(" ")));
    }
    workflow_tools::refuse_where_duo_is_off(state, req, user.as_ref()).await?;
    Ok(user)
}

/// The endpoints the workflow service's GitLab tools call, where GitLab also
/// accepts `ai_workflows` tokens (`allow_access_with_scope :ai_workflows`): a
/// run's token reads and writes there as its user (the policy decides), and
/// nowhere else outside the workflow endpoints.
const WORKFLOW_TOOL_ENDPOINTS: &[(&str, &str)] = &[
    ("GET", "/api/v4/projects/{id}/issues/{iid}"),
    ("GET", "/api/v4/projects/{id}/issues/{iid}/notes"),
    ("POST", "/api/v4/projects/{id}/issues/{iid}/notes"),
    ("GET", "/api/v4/projects/{id}/merge_requests/{iid}"),
    ("POST", "/api/v4/projects/{id}/merge_requests"),
    ("GET", "/api/v4/projects/{id}/pipelines/{pipeline_id}/jobs"),
    (
        "GET",
        "/api/v4/projects/{id}/repository/files/{file_path:.+}/raw",
    ),
];

fn workflow_tool_endpoint(req: &HttpRequest) -> bool {
    let Some(pattern) = req.match_pattern() else {
        return false;
    };
    WORKFLOW_TOOL_ENDPOINTS
        .iter()
        .any(|(method, route)| req.method().as_str() == *method && pattern == *route)
}

/// Whether the token carries nothing but Duo Workflow's scope (and the
/// `user:<id>` of a composite identity).
fn workflow_only(user: &AuthenticatedUser) -> bool {
    user.scopes
        .iter()
        .all(|s| s == crate::identity::oauth::AI_WORKFLOWS_SCOPE || s.starts_with("user:"))
}

async fn token_user(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Option<AuthenticatedUser>, ApiError> {
    match request_user(&state.pool, req).await {
        Ok(user) => Ok(user),
        Err(TokenError::Invalid) => Err(ApiError::Unauthorized),
        Err(TokenError::Blocked) => Err(ApiError::Blocked),
        Err(e) => Err(e.into()),
    }
}

/// A signed-in user whose token has one of `scopes`.
pub async fn require_user(
    state: &AppState,
    req: &HttpRequest,
    scopes: &[&'static str],
) -> Result<AuthenticatedUser, ApiError> {
    let user = token_user(state, req)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    let workflow_tool = workflow_only(&user) && workflow_tool_endpoint(req);
    if !(user.has_any_scope(scopes) || workflow_tool) {
        return Err(ApiError::InsufficientScope(scopes.join(" ")));
    }
    workflow_tools::refuse_where_duo_is_off(state, req, Some(&user)).await?;
    Ok(user)
}

/// Scopes that allow reading through the REST API.
pub const READ_SCOPES: &[&str] = &["api", "read_api"];
/// Scopes that allow writing through the REST API.
pub const WRITE_SCOPES: &[&str] = &["api"];

pub async fn require_admin(
    state: &AppState,
    req: &HttpRequest,
    scopes: &[&'static str],
) -> Result<AuthenticatedUser, ApiError> {
    let user = require_user(state, req, scopes).await?;
    if !crate::policy::Policy::administers_instance(Some(crate::policy::Actor::from(&user))) {
        return Err(ApiError::Forbidden);
    }
    Ok(user)
}
