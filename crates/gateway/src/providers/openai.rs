//! OpenAI-compatible chat completions client (vLLM, Ollama, the bundled
//! local model server).
//!
//! A trailing assistant message (prefill) is sent as the last message; some
//! servers continue it, others answer anew, so callers must accept both.

use super::sse::SseEvent;
use super::streaming::{self, EventDecoder, Step};
use super::{ChatRole, ModelCall, ProviderError, TextStream};
use serde_json::{Value, json};

pub(crate) fn request_body(call: &ModelCall, model: &str) -> Value {
    let mut messages = Vec::with_capacity(call.messages.len() + 1);
    if let Some(system) = &call.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(call.messages.iter().map(|m| {
        let role = match m.role {
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
        };
        json!({"role": role, "content": m.content})
    }));
    let mut body = json!({
        "model": model,
        "messages": messages,
        "max_tokens": call.params.max_tokens,
        "stream": true,
    });
    if !call.params.stop.is_empty() {
        body["stop"] = json!(call.params.stop);
    }
    if let Some(t) = call.params.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(p) = call.params.top_p {
        body["top_p"] = json!(p);
    }
    if let Some(m) = call.params.dry_multiplier {
        body["dry_multiplier"] = json!(m);
    }
    body
}

pub(crate) fn error_for_status(status: u16, body: &str) -> ProviderError {
    let (kind, message) = streaming::error_parts(body);
    if matches!(status, 429 | 503 | 529) || kind.as_deref() == Some("overloaded_error") {
        return ProviderError::Overloaded {
            message: format!("overloaded_error: {message}"),
        };
    }
    ProviderError::Status { status, message }
}

/// One chunk's JSON, `None` at `[DONE]`; an error chunk is an error.
fn chunk(event: &SseEvent) -> Result<Option<Value>, ProviderError> {
    if event.data.trim() == "[DONE]" {
        return Ok(None);
    }
    let json: Value = serde_json::from_str(&event.data)
        .map_err(|e| ProviderError::Malformed(format!("bad chunk: {e}")))?;
    if let Some(error) = json.get("error") {
        let message = error["message"].as_str().unwrap_or("unknown error");
        return Err(ProviderError::Malformed(format!(
            "the provider reported an error: {message}"
        )));
    }
    Ok(Some(json))
}

/// The text of each chunk.
struct Decoder;

impl EventDecoder for Decoder {
    fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError> {
        let Some(json) = chunk(&event)? else {
            return Ok(Step::Done);
        };
        Ok(Step::Text(
            json["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ))
    }
}

/// Each chunk's whole `delta` object as JSON text, tool-call pieces included.
struct DeltaDecoder;

impl EventDecoder for DeltaDecoder {
    fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError> {
        let Some(json) = chunk(&event)? else {
            return Ok(Step::Done);
        };
        Ok(match &json["choices"][0]["delta"] {
            delta @ Value::Object(fields) if !fields.is_empty() => Step::Text(delta.to_string()),
            _ => Step::Skip,
        })
    }
}

/// Streams a prepared chat-completions `body` (with `"stream": true`) and
/// yields each chunk's `delta` as JSON text, for callers that read tool calls
/// as they are generated. Deadlines and errors as [`stream`]'s.
pub(crate) async fn stream_deltas(
    http: &reqwest::Client,
    base_url: &str,
    api_key: Option<&str>,
    body: &(impl serde::Serialize + ?Sized),
    params: &super::ModelParams,
) -> Result<TextStream, ProviderError> {
    let mut request = http
        .post(endpoint(base_url, "chat/completions"))
        .headers(duo_telemetry::outgoing_headers())
        .header("accept", "text/event-stream")
        .json(body);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    streaming::start(request, params, DeltaDecoder, error_for_status).await
}

fn endpoint(base_url: &str, path: &str) -> String {
    format!("{}/{path}", base_url.trim_end_matches('/'))
}

pub(crate) async fn stream(
    http: &reqwest::Client,
    base_url: &str,
    api_key: Option<&str>,
    model: &str,
    call: &ModelCall,
) -> Result<TextStream, ProviderError> {
    let mut request = http
        .post(endpoint(base_url, "chat/completions"))
        .headers(duo_telemetry::outgoing_headers())
        .header("accept", "text/event-stream")
        .json(&request_body(call, model));
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    streaming::start(request, &call.params, Decoder, error_for_status).await
}

/// Readiness: `GET {base}/models`; with `expect_model`, that model must be
/// listed too (a misnamed model would otherwise fail every chat call).
pub(crate) async fn probe(
    http: &reqwest::Client,
    base_url: &str,
    api_key: Option<&str>,
    expect_model: Option<&str>,
    timeout: std::time::Duration,
) -> Result<(), ProviderError> {
    let mut request = http.get(endpoint(base_url, "models")).timeout(timeout);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request
        .send()
        .await
        .map_err(|e| streaming::transport_error(&e))?;
    let status = response.status().as_u16();
    if !response.status().is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(error_for_status(status, &body));
    }
    let Some(expected) = expect_model else {
        return Ok(());
    };
    let listed: serde_json::Value = response
        .json()
        .await
        .map_err(|e| ProviderError::Malformed(format!("model list: {e}")))?;
    let served: Vec<&str> = listed["data"]
        .as_array()
        .map(|models| models.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    if served.contains(&expected) {
        Ok(())
    } else {
        Err(ProviderError::NotConfigured(format!(
            "the model server does not serve {expected:?} (it serves {served:?})"
        )))
    }
}
