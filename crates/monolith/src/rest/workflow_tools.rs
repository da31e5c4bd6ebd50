//! `ai_workflows` tokens in a project or group whose Duo features are off:
//! refused with 403 on every endpoint there, before the handler runs (the
//! rule is [`crate::policy::Policy::workflow_token_may_act_in`]); a run's
//! token anywhere but its own project: 404.

use actix_web::HttpRequest;

use super::ApiError;
use crate::app_state::AppState;
use crate::identity::tokens::AuthenticatedUser;
use crate::policy::{Actor, Subject};

/// GitLab's words for a Duo feature turned off where it is used.
pub(super) const DUO_OFF: &str = "GitLab Duo features are turned off for this project or group";

/// Refuses a workflow-only token on an endpoint of a project or group with
/// Duo off; any other caller or endpoint passes.
pub(super) async fn refuse_where_duo_is_off(
    state: &AppState,
    req: &HttpRequest,
    user: Option<&AuthenticatedUser>,
) -> Result<(), ApiError> {
    let Some(user) = user.filter(|u| super::workflow_only(u)) else {
        return Ok(());
    };
    let Some(container) = container_of(req) else {
        return Ok(());
    };
    // A run's token (a workflow the product runs) knows only its project:
    // anything else looks as if it did not exist.
    if let Some(run) = user.run
        && container != Subject::Project(run.project_id)
    {
        return Err(ApiError::NotFound(match container {
            Subject::Group(_) => "Group",
            _ => "Project",
        }));
    }
    let db = state.pool.get().await?;
    if state
        .policy
        .workflow_token_may_act_in(&*db, Actor::from(user), container)
        .await?
    {
        Ok(())
    } else {
        Err(ApiError::ForbiddenBecause(DUO_OFF))
    }
}

/// The project or group the matched route names by its `{id}` (path forms
/// were turned into ids before routing).
fn container_of(req: &HttpRequest) -> Option<Subject> {
    let id: i64 = req.match_info().get("id")?.parse().ok()?;
    let path = req.path();
    if path.starts_with("/api/v4/projects/") {
        Some(Subject::Project(id))
    } else if path.starts_with("/api/v4/groups/") {
        Some(Subject::Group(id))
    } else {
        None
    }
}
