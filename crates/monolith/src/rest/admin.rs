//! Instance settings (`/application/settings`) and Duo seat assignments.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::require_admin;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES};
use crate::app_state::AppState;
use crate::duo_settings::DuoSettingsError;
use crate::instance::{self, InstanceSettings, SettingsChange};
use crate::policy::DuoSwitchScope;
use crate::review::instructions::{self, Source};

// ---- application settings and seats ---------------------------------------------

fn settings_json(settings: &InstanceSettings) -> Value {
    json!({
        "gitlab_dedicated_instance": false,
        "realm": settings.realm,
        "instance_tier": settings.instance_tier,
        "duo_features_enabled": settings.duo_features_enabled,
        "ai_gateway_url": settings.ai_gateway_url,
        "ai_action_api_rate_limit": settings.ai_action_api_rate_limit,
        "duo_chat_expiration_days": settings.duo_chat_expiration_days,
        "instance_level_ai_beta_features_enabled": settings.instance_level_ai_beta_features_enabled,
        "duo_workflow_mcp_enabled": settings.duo_workflow_mcp_enabled,
        "duo_workflow_mcp_allowed_servers": settings.duo_workflow_mcp_allowed_servers,
        "duo_code_review_instructions": settings.duo_code_review_instructions,
    })
}

pub(super) async fn show_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, READ_SCOPES).await?;
    let db = state.pool.get().await?;
    let settings = instance::settings(&*db).await?;
    Ok(HttpResponse::Ok().json(settings_json(&settings)))
}

#[derive(Deserialize)]
pub(super) struct SettingsUpdate {
    instance_tier: Option<String>,
    duo_features_enabled: Option<bool>,
    ai_gateway_url: Option<String>,
    duo_chat_expiration_days: Option<i32>,
    instance_level_ai_beta_features_enabled: Option<bool>,
    duo_workflow_mcp_enabled: Option<bool>,
    /// A JSON list, or one comma-separated text (`a,b`) as GitLab takes
    /// list settings; `[]` (or `""`) empties it.
    duo_workflow_mcp_allowed_servers: Option<Vec<String>>,
    /// Our extension: review instructions every merge request review applies
    /// (the YAML of `.gitlab/duo/mr-review-instructions.yaml`; `""` for none).
    duo_code_review_instructions: Option<String>,
}

pub(super) async fn update_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: super::params::Params<SettingsUpdate>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let b = body.into_inner();
    if let Some(t) = &b.instance_tier
        && !["free", "premium", "ultimate"].contains(&t.as_str())
    {
        return Err(ApiError::BadRequest(
            "instance_tier does not have a valid value".into(),
        ));
    }
    if let Some(u) = &b.ai_gateway_url
        && url::Url::parse(u).is_err()
    {
        return Err(ApiError::BadRequest("ai_gateway_url is invalid".into()));
    }
    if b.duo_chat_expiration_days
        .is_some_and(|d| !(1..=365).contains(&d))
    {
        return Err(ApiError::BadRequest(
            "duo_chat_expiration_days must be between 1 and 365".into(),
        ));
    }
    let allowed_servers = b
        .duo_workflow_mcp_allowed_servers
        .as_deref()
        .map(instance::checked_mcp_allowed_servers)
        .transpose()
        .map_err(|e| ApiError::BadRequest(format!("duo_workflow_mcp_allowed_servers {e}")))?;
    if let Some(text) = &b.duo_code_review_instructions {
        checked_review_instructions(text, Source::Instance)?;
    }
    let switched = b.duo_features_enabled.is_some();
    let db = state.pool.get().await?;
    instance::update_settings(
        &*db,
        &SettingsChange {
            instance_tier: b.instance_tier,
            duo_features_enabled: b.duo_features_enabled,
            ai_gateway_url: b.ai_gateway_url,
            duo_chat_expiration_days: b.duo_chat_expiration_days,
            instance_level_ai_beta_features_enabled: b.instance_level_ai_beta_features_enabled,
            duo_workflow_mcp_enabled: b.duo_workflow_mcp_enabled,
            duo_workflow_mcp_allowed_servers: allowed_servers,
            duo_code_review_instructions: b.duo_code_review_instructions,
        },
    )
    .await?;
    if switched {
        super::projects::follow_duo_switch(&state, &*db, DuoSwitchScope::Instance).await?;
    }
    let settings = instance::settings(&*db).await?;
    Ok(HttpResponse::Ok().json(settings_json(&settings)))
}

/// Review instructions as a review would read them: 400 with the reason
/// when they do not parse (bad YAML, a bad glob, too large).
pub(super) fn checked_review_instructions(text: &str, source: Source) -> Result<(), ApiError> {
    instructions::parse(text, source)
        .map(|_| ())
        .map_err(|e| ApiError::BadRequest(format!("duo_code_review_instructions: {e}")))
}

#[derive(Deserialize)]
pub(super) struct SeatAssignment {
    user_id: i64,
}

/// Assigns a seat of the add-on (`duo_pro` or `duo_enterprise`) to a user; creates
/// an instance-wide purchase on first use. Admins only.
pub(super) async fn assign_seat(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    body: super::params::Params<SeatAssignment>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let add_on = crate::policy::add_ons::AddOn::parse(&path.into_inner())
        .ok_or(ApiError::NotFound("Add-on"))?;
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    let seat = crate::duo_settings::assign_seat(&tx, add_on, body.user_id)
        .await
        .map_err(|e| match e {
            DuoSettingsError::NoSeatsLeft => ApiError::Conflict(e.to_string()),
            DuoSettingsError::UnknownUser => ApiError::NotFound("User"),
            DuoSettingsError::Db(db) => db.into(),
            other => ApiError::BadRequest(other.to_string()),
        })?;
    tx.commit().await?;
    Ok(HttpResponse::Created().json(
        json!({ "add_on": seat.add_on.as_str(), "user_id": seat.user_id, "purchase_id": seat.purchase_id }),
    ))
}
