//! `POST /v1/proxy/anthropic/{path}` and `POST /v1/proxy/vertex-ai/{path}`.

use crate::app_state::AppState;
use crate::auth::GatewayUser;
use crate::error::ApiError;
use crate::observability::ModelWaitClock;
use crate::proxy::{self, IncomingCall, ProxyKind};
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde_json::json;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/v1/proxy/anthropic/{path:.*}",
        web::post().to(|req, body, state, clock, user| {
            handle(ProxyKind::Anthropic, req, body, state, clock, user)
        }),
    )
    .route(
        "/v1/proxy/vertex-ai/{path:.*}",
        web::post().to(|req, body, state, clock, user| {
            handle(ProxyKind::VertexAi, req, body, state, clock, user)
        }),
    );
}

async fn handle(
    kind: ProxyKind,
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
    clock: ModelWaitClock,
    user: GatewayUser,
) -> Result<HttpResponse, ApiError> {
    let purpose = proxy::check_purpose(kind, req.headers(), &user)?;
    tracing::debug!(event = %format!("request_{purpose}"), proxy = kind.name(), "proxy request");
    if state.config.providers.mock_model_responses {
        return Ok(HttpResponse::Ok().json(json!({ "response": "mocked" })));
    }
    let body = read_body(body, state.config.max_body_bytes).await?;
    let prefix = format!("/v1/proxy/{}", kind.name());
    let path = req.path().strip_prefix(&prefix).unwrap_or_default();
    let call = proxy::plan(
        kind,
        &state.config.providers,
        IncomingCall {
            path,
            raw_path: req.uri().path(),
            query: req.query_string(),
            headers: req.headers(),
            body,
        },
    )?;
    // Proxied calls have no feature of their own: the unit primitive they
    // are made for stands in as their feature category.
    proxy::forward(
        &state.http,
        &state.direct_http,
        call,
        &clock,
        purpose.as_str(),
    )
    .await
}

/// Reads the whole body, refusing more than `limit` bytes with 413.
async fn read_body(mut payload: web::Payload, limit: usize) -> Result<Bytes, ApiError> {
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|err| ApiError::BadRequest(format!("Could not read body: {err}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(super::body::TOO_LARGE.into()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}
