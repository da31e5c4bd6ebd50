//! `POST /v2/chat/agent`: one ReAct step, streamed as NDJSON.
//!
//! App data this handler needs (wired by the app):
//! - `web::Data<Config>`
//! - `web::Data<PromptRegistry>` (holds `chat/react`)
//! - `web::Data<dyn ChatModel>` (`web::Data::from(Arc<dyn ChatModel>)`)
//! - `web::Data<ToolCallingModel>` (prompt families with native tool calling)
//! - `web::Data<ContextWindows>` (the models' context sizes; without it
//!   only `AIGW_MODEL_CONTEXT_TOKENS` and uncached lookups)
//!
//! and a [`GatewayUser`] in the request extensions, put there by the
//! authentication middleware before the handler runs.

use super::body::{RawBody, prepare_in_place_or_blocking};
use crate::auth::GatewayUser;
use crate::chat::agent::{self, ClientInfo};
use crate::chat::budget::{self, Budget};
use crate::chat::context_window::ContextWindows;
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
    let body_len = body.len();
    // `Data` is an `Arc`: the closure below takes one handle, this keeps one.
    let shared_config = config.clone();
    let user_for_fit = user.clone();
    let registry_for_fit = registry.clone();
    let prepare = move || -> Result<(AgentRequest, agent::PreparedAgent), ApiError> {
        let request: AgentRequest =
            serde_json::from_slice(&body).map_err(ApiError::invalid_body)?;
        drop(body);
        let client = ClientInfo {
            gitlab_version: version.as_deref(),
            feature_flags: flags.as_deref(),
        };
        let prepared = agent::prepare(&registry, &config, &user, client, &request)?;
        Ok((request, prepared))
    };
    let (request, prepared) =
        prepare_in_place_or_blocking(body_len, "preparing the agent step", prepare).await?;
    let mut prepared = fit_context(
        &req,
        &shared_config,
        registry_for_fit,
        user_for_fit,
        request,
        prepared,
    )
    .await?;
    prepared.call.wait_clock = Some(clock);
    let pacing = model.pacing(&prepared.call.target);
    let tool_model = match req.app_data::<web::Data<ToolCallingModel>>() {
        Some(tool_model) => tool_model.get_ref().clone(),
        // Apps that do not register one (tests of the ReAct path) still work.
        None => ToolCallingModel::new(&shared_config.providers)
            .map_err(|e| ApiError::Internal(format!("tool-calling client: {e}")))?,
    };
    let events = super::stream_body::first_chunk_ready(
        agent::run(model.into_inner(), tool_model, prepared)
            .map(|event| Ok::<_, Infallible>(Bytes::from(event.to_ndjson_line()))),
        pacing,
    )
    .await;
    Ok(HttpResponse::Ok().content_type(NDJSON).streaming(events))
}

/// Trims the step's prompt to the model's context, when the model's size is
/// known and the prompt is over it (see [`crate::chat::budget`]).
async fn fit_context(
    req: &HttpRequest,
    config: &web::Data<Config>,
    registry: web::Data<PromptRegistry>,
    user: GatewayUser,
    request: AgentRequest,
    prepared: agent::PreparedAgent,
) -> Result<agent::PreparedAgent, ApiError> {
    let windows = match req.app_data::<web::Data<ContextWindows>>() {
        Some(windows) => windows.clone(),
        None => web::Data::new(ContextWindows::new()),
    };
    let Some((model, context_tokens)) = windows
        .lookup(&config.providers, &prepared.call.target)
        .await
    else {
        return Ok(prepared);
    };
    let budget = Budget::new(model, context_tokens, prepared.call.params.max_tokens);
    if budget::estimate_tokens(agent::prompt_chars(&prepared)) <= budget.prompt_tokens() {
        return Ok(prepared);
    }
    let version = header(req, headers::VERSION).map(str::to_owned);
    let flags = header(req, headers::ENABLED_FEATURE_FLAGS).map(str::to_owned);
    let config = config.clone();
    let (fitted, trimmed) = web::block(move || {
        let client = ClientInfo {
            gitlab_version: version.as_deref(),
            feature_flags: flags.as_deref(),
        };
        agent::prepare_to_fit(&registry, &config, &user, client, &request, &budget)
            .map_err(|e| (e, budget))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("fitting the agent step: {e}")))?
    .map_err(|(e, budget)| {
        tracing::warn!(
            model = %budget.model,
            context_tokens = budget.context_tokens,
            error = %e,
            "the chat prompt does not fit the model's context"
        );
        ApiError::from(e)
    })?;
    tracing::info!(
        dropped_messages = trimmed.dropped_messages,
        clipped = ?trimmed.clipped,
        tokens_before = trimmed.tokens_before,
        tokens_after = trimmed.tokens_after,
        context_tokens,
        "trimmed the chat prompt to fit the model's context"
    );
    Ok(fitted)
}
