//! Instance settings (`/application/settings`) and Duo seat assignments.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::require_admin;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES};
use crate::app_state::AppState;

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
    })
}

pub(super) const SETTINGS_SQL: &str = "SELECT realm, instance_tier, duo_features_enabled, ai_gateway_url, ai_action_api_rate_limit, duo_chat_expiration_days FROM instance_settings";

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
           updated_at = now()",
        &[
            &b.instance_tier,
            &b.duo_features_enabled,
            &b.ai_gateway_url,
            &b.duo_chat_expiration_days,
        ],
    )
    .await?;
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
    let purchase: i64 = match tx
        .query_opt(
            "SELECT id FROM add_on_purchases WHERE add_on = $1 AND namespace_id IS NULL AND expires_on >= current_date
             ORDER BY id LIMIT 1 FOR UPDATE",
            &[&add_on.as_str()],
        )
        .await?
    {
        Some(r) => r.get(0),
        None => tx
            .query_one(
                "INSERT INTO add_on_purchases (add_on, quantity, expires_on) VALUES ($1, 100, current_date + 365) RETURNING id",
                &[&add_on.as_str()],
            )
            .await?
            .get(0),
    };
    let used: i64 = tx
        .query_one(
            "SELECT count(*) FROM add_on_seat_assignments WHERE purchase_id = $1",
            &[&purchase],
        )
        .await?
        .get(0);
    let quantity: i32 = tx
        .query_one(
            "SELECT quantity FROM add_on_purchases WHERE id = $1",
            &[&purchase],
        )
        .await?
        .get(0);
    if used >= i64::from(quantity) {
        return Err(ApiError::Conflict("No seats available".into()));
    }
    tx.execute(
        "INSERT INTO add_on_seat_assignments (purchase_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&purchase, &body.user_id],
    )
    .await
    .map_err(|e| if e.code().is_some() { ApiError::NotFound("User") } else { e.into() })?;
    tx.commit().await?;
    Ok(HttpResponse::Created().json(
        json!({ "add_on": add_on.as_str(), "user_id": body.user_id, "purchase_id": purchase }),
    ))
}
