//! Anthropic Messages API client (streaming).
//!
//! A trailing assistant message is sent as is: Anthropic continues it (prefill).

use super::sse::SseEvent;
use super::streaming::{self, EventDecoder, Step};
use super::{ChatRole, ModelCall, ProviderError, TextStream};
use serde_json::{Value, json};

pub(crate) const API_VERSION: &str = "2023-06-01";

/// `https://api.anthropic.com` or `.../v1` both mean the same API root.
pub(crate) fn api_root(base_url: &str) -> &str {
    base_url.trim_end_matches('/').trim_end_matches("/v1")
}

pub(crate) fn request_body(call: &ModelCall) -> Value {
    let messages: Vec<Value> = call
        .messages
        .iter()
        .map(|m| {
            let role = match m.role {
                ChatRole::User => "user",
                ChatRole::Assistant => "assistant",
            };
            json!({"role": role, "content": m.content})
        })
        .collect();
    let mut body = json!({
        "model": call.target.model,
        "max_tokens": call.params.max_tokens,
        "messages": messages,
        "stream": true,
    });
    if let Some(system) = &call.system {
        body["system"] = json!(system);
    }
    if !call.params.stop.is_empty() {
        body["stop_sequences"] = json!(call.params.stop);
    }
    if let Some(t) = call.params.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(p) = call.params.top_p {
        body["top_p"] = json!(p);
    }
    if let Some(k) = call.params.top_k {
        body["top_k"] = json!(k);
    }
    body
}

pub(crate) fn error_for_status(status: u16, body: &str) -> ProviderError {
    let (kind, message) = streaming::error_parts(body);
    if status == 529 || kind.as_deref() == Some("overloaded_error") {
        return ProviderError::Overloaded {
            message: format!("overloaded_error: {message}"),
        };
    }
    ProviderError::Status {
        status,
        message: match kind {
            Some(kind) => format!("{kind}: {message}"),
            None => message,
        },
    }
}

#[derive(Default)]
struct Decoder;

impl EventDecoder for Decoder {
    fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError> {
        let json: Value = serde_json::from_str(&event.data)
            .map_err(|e| ProviderError::Malformed(format!("bad event data: {e}")))?;
        match json["type"].as_str().or(event.event.as_deref()) {
            Some("content_block_delta") => Ok(Step::Text(
                json["delta"]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )),
            Some("message_stop") => Ok(Step::Done),
            Some("error") => {
                let kind = json["error"]["type"].as_str().unwrap_or("error");
                let message = json["error"]["message"].as_str().unwrap_or_default();
                if kind == "overloaded_error" {
                    Err(ProviderError::Overloaded {
                        message: format!("overloaded_error: {message}"),
                    })
                } else {
                    Err(ProviderError::Malformed(format!(
                        "the provider reported {kind}: {message}"
                    )))
                }
            }
            _ => Ok(Step::Skip),
        }
    }
}

pub(crate) async fn stream(
    http: &reqwest::Client,
    base_url: &str,
    api_key: Option<&str>,
    call: &ModelCall,
) -> Result<TextStream, ProviderError> {
    let api_key = api_key.ok_or_else(|| {
        ProviderError::NotConfigured("no Anthropic API key (ANTHROPIC_API_KEY)".to_owned())
    })?;
    let request = http
        .post(format!("{}/v1/messages", api_root(base_url)))
        .headers(duo_telemetry::outgoing_headers())
        .header("x-api-key", api_key)
        .header("anthropic-version", API_VERSION)
        .header("accept", "text/event-stream")
        .json(&request_body(call));
    streaming::start(request, &call.params, Decoder, error_for_status).await
}

/// Readiness: lists models, which needs a valid key but costs nothing.
pub(crate) async fn probe(
    http: &reqwest::Client,
    base_url: &str,
    api_key: &str,
    timeout: std::time::Duration,
) -> Result<(), ProviderError> {
    let response = http
        .get(format!("{}/v1/models", api_root(base_url)))
        .header("x-api-key", api_key)
        .header("anthropic-version", API_VERSION)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| streaming::transport_error(&e))?;
    let status = response.status().as_u16();
    if response.status().is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    Err(error_for_status(status, &body))
}
