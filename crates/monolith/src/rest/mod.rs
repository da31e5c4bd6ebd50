//! REST API under `/api/v4` in GitLab's shapes.
//!
//! - [`routes`]: the one route table, every method and path with its handler;
//! - handler modules (`users`, `groups`, `projects`, `issues`, `epics`,
//!   `merge_requests`, `notes`, `discussions`, `members`, `ci`, `repository`,
//!   `repository_commits`, `branches`, `admin`, `duo_triggers`, `workflows`,
//!   `workflows_internal`, `workflows_socket`): parse, ask the policy, call the
//!   domain, render; they register nothing and import no handler module that
//!   registers them;
//! - what handlers share, a floor below them: who is asking (the extractors
//!   here), [`params`] and [`pagination`], `param_values` (labels, search,
//!   sort, state, visibility), `containers` (a group or project the caller may
//!   read or change), `item_access` (items found through the policy),
//!   `entities` (GitLab's JSON fragments), `repository_access`,
//!   `workflow_access`, `duo_events` (the events that start Duo's work), and
//!   [`ApiError`] with its conversions.
//!
//! `docs/adding-an-endpoint.md` walks through adding one.

mod admin;
mod branches;
mod ci;
mod code_search;
mod containers;
mod diffs;
mod discussions;
mod duo_events;
mod duo_triggers;
mod entities;
mod epics;
mod error;
mod features;
mod groups;
pub mod input_guard;
mod issues;
mod item_access;
mod item_updates;
pub mod mcp;
mod members;
mod merge_requests;
mod notes;
pub mod oauth_server;
pub mod oidc;
pub mod pagination;
mod param_values;
pub mod params;
pub mod path_ids;
mod projects;
mod repository;
mod repository_access;
mod repository_commits;
pub mod routes;
mod users;
mod workflow_access;
mod workflow_tools;
mod workflows;
mod workflows_internal;
mod workflows_socket;

pub use error::ApiError;

use actix_web::HttpRequest;

use crate::app_state::AppState;
use crate::identity::request::request_user;
use crate::identity::tokens::{AuthenticatedUser, TokenError};

/// The signed-in user, `None` when no token was sent; a bad token is a 401.
///
/// Every REST read asks here, so this is where a token's scope is checked for
/// reading (GitLab's `authenticate_non_get!`/`allow_access_with_scope`): a
/// token must carry `api` or `read_api` ([`READ_SCOPES`]), or on a repository
/// route also `read_repository` ([`REPOSITORY_READ_SCOPES`]); a Duo Workflow
/// token (`ai_workflows` only) passes only on [`WORKFLOW_TOOL_ENDPOINTS`]. A
/// token without any of them is refused with 403 `insufficient_scope`, even
/// where an anonymous caller could read: presenting a token never widens
/// what its scopes allow. Routes with other rules (users with `read_user`,
/// the workflow endpoints) ask [`require_user`] with their scopes instead.
pub async fn optional_user(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Option<AuthenticatedUser>, ApiError> {
    let user = token_user(state, req).await?;
    if let Some(u) = &user {
        check_read_scope(u, req)?;
    }
    workflow_tools::refuse_where_duo_is_off(state, req, user.as_ref()).await?;
    Ok(user)
}

/// The owner of the presented token (`None` without one) with no REST scope
/// rule applied: for `/api/graphql`, which has its own.
pub async fn presented_user(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Option<AuthenticatedUser>, ApiError> {
    token_user(state, req).await
}

/// Whether `user`'s token may read through the route `req` matched.
fn check_read_scope(user: &AuthenticatedUser, req: &HttpRequest) -> Result<(), ApiError> {
    if workflow_only(user) && workflow_tool_endpoint(req) {
        return Ok(());
    }
    let scopes = read_scopes(req);
    if user.has_any_scope(scopes) {
        Ok(())
    } else {
        Err(ApiError::InsufficientScope(scopes.join(" ")))
    }
}

/// The scopes that read through the route `req` matched.
fn read_scopes(req: &HttpRequest) -> &'static [&'static str] {
    match req.match_pattern() {
        Some(pattern) if pattern.starts_with(REPOSITORY_ROUTES) => REPOSITORY_READ_SCOPES,
        _ => READ_SCOPES,
    }
}

/// Where the repository endpoints (tree, files, blobs, commits, branches,
/// tags) live.
const REPOSITORY_ROUTES: &str = "/api/v4/projects/{id}/repository/";

/// Scopes that read a repository through the API: `read_repository` reads
/// code (as over git), nothing else.
const REPOSITORY_READ_SCOPES: &[&str] = &["api", "read_api", "read_repository"];

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
    ("GET", "/api/v4/projects/{id}/semantic_code_search"),
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

/// Who is asking, as the shared floor of the handlers needs it: an HTTP
/// request (its token, scopes checked per route) or a caller another
/// interface already authenticated (the MCP server's tools). Reads and writes
/// then go through the same policy and the same renderers either way.
pub(crate) trait Caller {
    /// The reader, `None` when anonymous; a credential that may not read here
    /// is refused.
    async fn reader(&self, state: &AppState) -> Result<Option<AuthenticatedUser>, ApiError>;
    /// A signed-in writer whose credential may write.
    async fn writer(&self, state: &AppState) -> Result<AuthenticatedUser, ApiError>;
}

impl Caller for HttpRequest {
    async fn reader(&self, state: &AppState) -> Result<Option<AuthenticatedUser>, ApiError> {
        optional_user(state, self).await
    }

    async fn writer(&self, state: &AppState) -> Result<AuthenticatedUser, ApiError> {
        require_user(state, self, WRITE_SCOPES).await
    }
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
