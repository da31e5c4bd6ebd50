//! `POST /v2/chat/agent`: one ReAct step, streamed as NDJSON.
//!
//! App data this handler needs (wired by the app):
//! - `web::Data<Config>`
//! - `web::Data<PromptRegistry>` (holds `chat/react`)
//! - `web::Data<dyn ChatModel>` (`web::Data::from(Arc<dyn ChatModel>)`)
//! - `web::Data<ToolCallingModel>` (prompt families with native tool calling)
//!
//! and a [`GatewayUser`] in the request extensions, put there by the
//! authentication middleware before the handler runs.

use super::body::RawBody;
use crate::auth::GatewayUser;
use crate::chat::agent::{self, ClientInfo};
use crate::config::Config;
use crate::error::ApiError;
use crate::prompts::PromptRegistry;
use crate::providers::tool_calling::ToolCallingModel;
use crate::providers::{ChatModel, ModelWaitClock};
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::Bytes;
use contracts::{AgentRequest, headers};
use futures::StreamExt;
use std::convert::Infallible;

pub const NDJSON: &str = "application/x-ndjson; charset=utf-8";

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v2/chat/agent", web::post().to(chat_agent));
}

fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

// The caller comes first: extractors run in order, so a missing identity is
// 401 before the body is read (413).
async fn chat_agent(
    user: GatewayUser,
    req: HttpRequest,
    RawBody(body): RawBody,
    config: web::Data<Config>,
    registry: web::Data<PromptRegistry>,
    model: web::Data<dyn ChatModel>,
    clock: ModelWaitClock,
) -> Result<HttpResponse, ApiError> {
    let version = header(&req, headers::VERSION).map(str::to_owned);
    let flags = header(&req, headers::ENABLED_FEATURE_FLAGS).map(str::to_owned);
    // `Data` is an `Arc`: the closure below takes one handle, this keeps one.
    let shared_config = config.clone();
    // Parsing and rendering a large request is CPU work: on the blocking pool,
    // so the async workers keep answering health checks and other requests.
    let mut prepared = web::block(move || -> Result<agent::PreparedAgent, ApiError> {
        let request: AgentRequest =
            serde_json::from_slice(&body).map_err(ApiError::invalid_body)?;
        drop(body);
        let client = ClientInfo {
            gitlab_version: version.as_deref(),
            feature_flags: flags.as_deref(),
        };
        Ok(agent::prepare(&registry, &config, &user, client, &request)?)
    })
    .await
    .map_err(|e| ApiError::Internal(format!("preparing the agent step: {e}")))??;
    prepared.call.wait_clock = Some(clock);
    let tool_model = match req.app_data::<web::Data<ToolCallingModel>>() {
        Some(tool_model) => tool_model.get_ref().clone(),
        // Apps that do not register one (tests of the ReAct path) still work.
        None => ToolCallingModel::new(&shared_config.providers)
            .map_err(|e| ApiError::Internal(format!("tool-calling client: {e}")))?,
    };
    let events = agent::run(model.into_inner(), tool_model, prepared)
        .map(|event| Ok::<_, Infallible>(Bytes::from(event.to_ndjson_line())));
    Ok(HttpResponse::Ok().content_type(NDJSON).streaming(events))
}
