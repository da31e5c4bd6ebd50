//! Instance settings (`/application/settings`) and Duo seat assignments.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::require_admin;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES};
use crate::app_state::AppState;
use crate::duo_settings::DuoSettingsError;
use crate::policy::DuoSwitchScope;

// ---- application settings and seats ---------------------------------------------

pub(super) fn settings_json(row: &tokio_postgres::Row) -> Value {
    json!({
        "gitlab_dedicated_instance": false,
        "realm": row.get::<_, String>("realm"),
        "instance_tier": row.get::<_, String>("instance_tier"),
        "duo_features_enabled": row.get::<_, bool>("duo_features_enabled"),
        "ai_gateway_url": row.get::<_, Option<String>>("ai_gateway_url"),
        "ai_action_api_rate_limit": row.get::<_, i32>("ai_action_api_rate_limit"),
        "duo_chat_expiration_days": row.get::<_, i32>("duo_chat_expiration_days"),
        "instance_level_ai_beta_features_enabled": row.get::<_, bool>("instance_level_ai_beta_features_enabled"),
    })
}

pub(super) const SETTINGS_SQL: &str = "SELECT realm, instance_tier, duo_features_enabled, ai_gateway_url, ai_action_api_rate_limit, duo_chat_expiration_days, instance_level_ai_beta_features_enabled FROM instance_settings";

pub(super) async fn show_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, READ_SCOPES).await?;
    let db = state.pool.get().await?;
    let row = db.query_one(SETTINGS_SQL, &[]).await?;
    Ok(HttpResponse::Ok().json(settings_json(&row)))
}

#[derive(Deserialize)]
pub(super) struct SettingsUpdate {
    instance_tier: Option<String>,
    duo_features_enabled: Option<bool>,
    ai_gateway_url: Option<String>,
    duo_chat_expiration_days: Option<i32>,
    instance_level_ai_beta_features_enabled: Option<bool>,
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
    let db = state.pool.get().await?;
    db.execute(
        "UPDATE instance_settings SET
           instance_tier = coalesce($1, instance_tier),
           duo_features_enabled = coalesce($2, duo_features_enabled),
           ai_gateway_url = coalesce($3, ai_gateway_url),
           duo_chat_expiration_days = coalesce($4, duo_chat_expiration_days),
           instance_level_ai_beta_features_enabled = coalesce($5, instance_level_ai_beta_features_enabled),
           updated_at = now()",
        &[
            &b.instance_tier,
            &b.duo_features_enabled,
            &b.ai_gateway_url,
            &b.duo_chat_expiration_days,
            &b.instance_level_ai_beta_features_enabled,
        ],
    )
    .await?;
    if b.duo_features_enabled.is_some() {
        super::projects::follow_duo_switch(&state, &*db, DuoSwitchScope::Instance).await?;
    }
    let row = db.query_one(SETTINGS_SQL, &[]).await?;
    Ok(HttpResponse::Ok().json(settings_json(&row)))
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
