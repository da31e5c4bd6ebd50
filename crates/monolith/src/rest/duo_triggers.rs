//! A project's Duo triggers (our extension): which events start Duo's work
//! there (the review bot added as a reviewer, a mention of it, a failed
//! pipeline). Maintainers read and switch them; an event the project never
//! switched follows its default.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::containers::Container;
use crate::app_state::AppState;
use crate::duo_settings::{self, DuoSettingsError, ProjectTrigger};
use crate::policy::WriteAbility;
use crate::review::triggers::TriggerEvent;

fn trigger_json(event: TriggerEvent, own: &[ProjectTrigger]) -> Value {
    let enabled = own
        .iter()
        .find(|t| t.event == event.as_str())
        .map_or(event.default_enabled(), |t| t.enabled);
    json!({
        "event": event.as_str(),
        "enabled": enabled,
        "default": event.default_enabled(),
    })
}

fn settings_error(e: DuoSettingsError) -> ApiError {
    match e {
        DuoSettingsError::Invalid(msg) => ApiError::BadRequest(msg),
        other => ApiError::Internal(other.to_string()),
    }
}

/// `GET /projects/:id/duo_triggers`: every event with its state; a reading
/// token is enough, the role is a maintainer's.
pub(super) async fn list(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let project = path.into_inner();
    let user = Container::Project(project)
        .readable(&state, &req)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    let db = state.pool.get().await?;
    if !state
        .policy
        .can_write(
            &*db,
            Some(user),
            WriteAbility::AdminProject,
            Container::Project(project).subject(),
        )
        .await?
    {
        return Err(ApiError::Forbidden);
    }
    let own = duo_settings::project_triggers(&*db, project)
        .await
        .map_err(settings_error)?;
    let items: Vec<Value> = TriggerEvent::ALL
        .iter()
        .map(|e| trigger_json(*e, &own))
        .collect();
    Ok(HttpResponse::Ok().json(items))
}

#[derive(Debug, Deserialize)]
pub(super) struct TriggerUpdate {
    enabled: bool,
}

/// `PUT /projects/:id/duo_triggers/:event` with `enabled`: maintainers.
pub(super) async fn update(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
    body: super::params::Params<TriggerUpdate>,
) -> Result<HttpResponse, ApiError> {
    let (project, event) = path.into_inner();
    let me = Container::Project(project)
        .writer(&state, &req, WriteAbility::AdminProject)
        .await?;
    let event = TriggerEvent::parse(&event).ok_or(ApiError::NotFound("Trigger"))?;
    let db = state.pool.get().await?;
    duo_settings::set_project_trigger(&*db, project, event.as_str(), body.enabled, me.id)
        .await
        .map_err(settings_error)?;
    let own = duo_settings::project_triggers(&*db, project)
        .await
        .map_err(settings_error)?;
    Ok(HttpResponse::Ok().json(trigger_json(event, &own)))
}
