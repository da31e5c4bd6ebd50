//! `POST /v1/prompts/{prompt_id:.*}`: invoke one prompt of the registry.
//!
//! Wiring (gw-app): `configure` registers the route; the handler reads
//! - `web::Data<Arc<PromptRegistry>>`: the loaded registry,
//! - `web::Data<Arc<dyn ChatModel>>`: the model router,
//! - `web::Data<Config>`: for providers (mock mode, custom models) and the
//!   default prompt families,
//! - the caller's [`GatewayUser`] from the request extensions, where the
//!   authentication middleware puts it.
//!
//! Answers: 200 with a JSON string, or with `stream: true` a
//! `text/event-stream; charset=utf-8` body of raw text chunks (no `data:`
//! framing). Errors follow [`PromptError`]'s mapping; a model failure before
//! the answer starts is 421 `{"detail": "<status>: <reason>"}` (or the
//! failure's description when the provider sent no status, e.g. a timeout).
//! A streamed answer is committed to 200 only once the first text arrives;
//! a failure after that just ends the body and is logged. A rendered prompt
//! larger than the model's known context (configured, or reported by the
//! bundled server) is not sent: 413 with the sizes and what to change.

use super::body::{RawBody, prepare_in_place_or_blocking};
use crate::auth::GatewayUser;
use crate::chat::budget::{self, Budget};
use crate::chat::context_window::ContextWindows;
use crate::config::Config;
use crate::error::ApiError;
use crate::prompts::{PromptInvocation, PromptRegistry, prepare};
use crate::providers::{ChatModel, ModelWaitClock, ProviderError, ProviderKind};
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::Bytes;
use contracts::PromptRequest;
use futures::StreamExt;

/// What mock mode (`AIGW_MOCK_MODEL_RESPONSES`) answers.
pub const MOCK_RESPONSE: &str = "mock";

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/prompts/{prompt_id:.*}", web::post().to(invoke_prompt));
}

/// 421 for a model that failed before answering.
fn upstream_error(err: &ProviderError) -> ApiError {
    match err {
        ProviderError::Status { status, message } => {
            ApiError::Upstream(format!("{status}: {message}"))
        }
        other => match other.status_code() {
            Some(status) => ApiError::Upstream(format!("{status}: {other}")),
            None => ApiError::Upstream(other.to_string()),
        },
    }
}

// Extractors are the handler's arguments.
#[allow(clippy::too_many_arguments)]
pub async fn invoke_prompt(
    req: HttpRequest,
    user: GatewayUser,
    prompt_id: web::Path<String>,
    RawBody(body): RawBody,
    registry: web::Data<PromptRegistry>,
    model: web::Data<dyn ChatModel>,
    config: web::Data<Config>,
    clock: ModelWaitClock,
) -> Result<HttpResponse, ApiError> {
    let prompt_id = prompt_id.into_inner();
    let body_len = body.len();
    let (stream_requested, mut prepared) = {
        let prompt_id = prompt_id.clone();
        let config = config.clone();
        prepare_in_place_or_blocking(body_len, "preparing the prompt", move || {
            let request: PromptRequest =
                serde_json::from_slice(&body).map_err(ApiError::invalid_body)?;
            drop(body);
            if request.text_bytes() > config.max_prompt_bytes {
                return Err(ApiError::invalid_body(format!(
                    "the inputs carry more than {} bytes of text (AIGW_MAX_PROMPT_BYTES)",
                    config.max_prompt_bytes
                )));
            }
            let prepared = prepare(
                &registry,
                &config,
                PromptInvocation {
                    prompt_id: &prompt_id,
                    request: &request,
                    user: &user,
                },
            )?;
            Ok((request.stream, prepared))
        })
        .await?
    };

    prepared.call.wait_clock = Some(clock);
    if prepared.call.target.kind == ProviderKind::Mock {
        return Ok(respond_with_text(
            stream_requested,
            MOCK_RESPONSE.to_owned(),
        ));
    }

    if let Some(windows) = req.app_data::<web::Data<ContextWindows>>()
        && let Some((model_id, context_tokens)) = windows
            .lookup(&config.providers, &prepared.call.target)
            .await
    {
        check_fits(&prompt_id, &prepared.call, model_id, context_tokens)?;
    }

    let pacing = model.pacing(&prepared.call.target);
    let mut stream = model
        .stream(prepared.call)
        .await
        .map_err(|e| upstream_error(&e))?;

    if !stream_requested {
        let mut answer = String::new();
        while let Some(chunk) = stream.next().await {
            answer.push_str(&chunk.map_err(|e| upstream_error(&e))?);
        }
        return Ok(HttpResponse::Ok().json(answer));
    }

    // Wait for the first text before committing to 200, so a model that fails
    // at once still gets its 421.
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        let text = chunk.map_err(|e| upstream_error(&e))?;
        if !text.is_empty() {
            first = Some(text);
            break;
        }
    }
    let body = async_stream::stream! {
        if let Some(text) = first {
            yield Ok::<Bytes, actix_web::Error>(Bytes::from(text));
        }
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(text) if text.is_empty() => {}
                Ok(text) => yield Ok::<Bytes, actix_web::Error>(Bytes::from(text)),
                Err(err) => {
                    // The status line is gone; ending the body is all we can do.
                    tracing::warn!(prompt_id = %prompt_id, error = %err, "model failed while streaming a prompt answer");
                    break;
                }
            }
        }
    };
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream; charset=utf-8")
        .streaming(super::stream_body::first_chunk_ready(body, pacing).await))
}

/// Refuses a prompt its model cannot hold (the caller's inputs are the
/// prompt: nothing here may be dropped to fit).
fn check_fits(
    prompt_id: &str,
    call: &crate::providers::ModelCall,
    model: String,
    context_tokens: u32,
) -> Result<(), ApiError> {
    let budget = Budget::new(model, context_tokens, call.params.max_tokens);
    let needed = budget::estimate_tokens(call.prompt_chars());
    if needed <= budget.prompt_tokens() {
        return Ok(());
    }
    Err(ApiError::PayloadTooLarge(format!(
        "prompt is too long for the model {}: its context holds {} tokens ({} kept for the \
         answer), and the prompt {prompt_id} with these inputs needs about {needed} tokens. Send \
         shorter inputs, or give the model a larger context (the bundled model server: \
         DUO_LOCAL_LLM_CONTEXT) or choose a model with a larger one",
        budget.model, budget.context_tokens, budget.reserve_tokens
    )))
}

fn respond_with_text(stream: bool, text: String) -> HttpResponse {
    if stream {
        HttpResponse::Ok()
            .content_type("text/event-stream; charset=utf-8")
            .body(text)
    } else {
        HttpResponse::Ok().json(text)
    }
}
