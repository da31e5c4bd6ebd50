//! What the Duo Workflow endpoints share: who is calling (both identities of
//! a composite token), the workflow they may reach, and GitLab's workflow
//! entity. The public API (`workflows`), the internal one
//! (`workflows_internal`) and the executor socket (`workflows_socket`) sit on
//! top of it.

use actix_web::HttpRequest;
use serde_json::{Value, json};

use super::{ApiError, require_user};
use crate::app_state::AppState;
use crate::identity::oauth::AI_WORKFLOWS_SCOPE;
use crate::identity::tokens::AuthenticatedUser;
use crate::policy::{Actor, Policy, WorkflowMcp};
use crate::queries::Queries;
use crate::workflows::store::{self, Workflow};
use crate::workflows::{Caller, privileges};

/// Scopes the internal endpoints and the socket accept.
pub(super) const INTERNAL_SCOPES: &[&str] = &["api", AI_WORKFLOWS_SCOPE];

/// The caller of a workflow endpoint, with both identities of a composite token.
pub(super) struct WorkflowCaller {
    pub user: AuthenticatedUser,
    pub actor: Actor,
    pub service_account: Option<Actor>,
}

impl WorkflowCaller {
    pub fn caller(&self) -> Caller {
        Caller {
            user_id: self.user.id,
            service_account_id: self.service_account.map(|s| s.id),
        }
    }
}

pub(super) async fn workflow_caller(
    state: &AppState,
    req: &HttpRequest,
    scopes: &[&'static str],
) -> Result<WorkflowCaller, ApiError> {
    let user = require_user(state, req, scopes).await?;
    Ok(WorkflowCaller {
        actor: Actor::from(&user),
        service_account: user
            .service_account
            .as_ref()
            .map(|s| Actor::user(s.id, s.admin)),
        user,
    })
}

/// The workflow `id` as its owner (or an admin) sees it: another user's
/// workflow is 404, as if it did not exist; one whose project the caller (or
/// the service account acting for them) may no longer run workflows in is 403.
pub(super) async fn find_workflow(
    state: &AppState,
    who: &WorkflowCaller,
    id: &str,
) -> Result<Workflow, ApiError> {
    let id: i64 = id.parse().map_err(|_| ApiError::RecordNotFound)?;
    let db = state.pool.get().await?;
    let workflow = store::find(&*db, id)
        .await?
        .filter(|w| w.user_id == who.actor.id || who.actor.admin)
        .ok_or(ApiError::RecordNotFound)?;
    if !state
        .policy
        .can_access_workflow(&*db, who.actor, who.service_account, workflow.facts())
        .await?
    {
        return Err(ApiError::Forbidden);
    }
    Ok(workflow)
}

/// GitLab's workflow entity for one workflow (one query more: whether it
/// may use MCP servers).
pub(super) async fn workflow_entity(
    state: &AppState,
    db: &impl Queries,
    w: &Workflow,
) -> Result<Value, ApiError> {
    let mcp = Policy::mcp_for_workflow(db, w.container()).await?;
    Ok(workflow_json(w, &mcp, &state.config.external_url))
}

/// GitLab's workflow entities for a list, in order (one query for all).
pub(super) async fn workflow_entities(
    state: &AppState,
    db: &impl Queries,
    workflows: &[Workflow],
) -> Result<Vec<Value>, ApiError> {
    let containers: Vec<_> = workflows.iter().map(Workflow::container).collect();
    let mcp = Policy::mcp_for_workflows(db, &containers).await?;
    Ok(workflows
        .iter()
        .zip(mcp.iter().chain(std::iter::repeat(&WorkflowMcp::default())))
        .map(|(w, m)| workflow_json(w, m, &state.config.external_url))
        .collect())
}

/// GitLab's workflow entity, with `mcp_allowed_servers`, our addition: the
/// MCP servers the executor may connect to (the instance allow-list, empty
/// unless `mcp_enabled`).
fn workflow_json(w: &Workflow, mcp: &WorkflowMcp, gitlab_url: &url::Url) -> Value {
    json!({
        "id": w.id,
        "project_id": w.project_id,
        "namespace_id": w.namespace_id,
        "agent_privileges": w.agent_privileges,
        "agent_privileges_names": privileges::names(&w.agent_privileges),
        "pre_approved_agent_privileges": w.pre_approved_agent_privileges,
        "pre_approved_agent_privileges_names": privileges::names(&w.pre_approved_agent_privileges),
        "workflow_definition": w.workflow_definition,
        "status": w.status.name(),
        "goal": w.goal,
        "summary": w.summary,
        "allow_agent_to_request_user": w.allow_agent_to_request_user,
        "image": w.image,
        "environment": w.environment_name(),
        "ai_catalog_item_version_id": Value::Null,
        "workload": Value::Null,
        "mcp_enabled": mcp.enabled,
        "mcp_allowed_servers": mcp.allowed_servers,
        "gitlab_url": gitlab_url.as_str().trim_end_matches('/'),
        "created_at": w.created_at,
        "updated_at": w.updated_at,
    })
}
