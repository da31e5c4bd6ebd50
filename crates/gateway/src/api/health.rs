//! `GET /monitoring/healthz` and `GET /monitoring/ready` (no authentication).
//! Readiness also fails from SIGTERM on, while the gateway drains.

use crate::app_state::AppState;
use crate::error::ApiError;
use actix_web::{HttpResponse, web};
use serde_json::json;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/monitoring/healthz", web::get().to(healthz))
        .route("/monitoring/ready", web::get().to(ready));
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

async fn ready(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if state.readiness.is_stopping() {
        return Err(ApiError::Unavailable("Shutting down".into()));
    }
    match state.readiness.check(&state.http).await {
        Ok(()) => Ok(HttpResponse::Ok().json(json!({ "status": "ok" }))),
        Err(failed) => Err(ApiError::Unavailable(format!(
            "Model providers not reachable: {}",
            failed.join(", ")
        ))),
    }
}
