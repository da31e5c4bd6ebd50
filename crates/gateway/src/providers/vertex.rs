//! Vertex AI text models through the publisher-model predict API:
//! `POST {endpoint}/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:predict`
//! for a whole answer, `:serverStreamingPredict?alt=sse` for a stream.
//!
//! Text models take one prompt, not a conversation, so the system prompt and
//! the turns are flattened into it; a trailing assistant message (prefill)
//! ends the prompt, for the model to continue. `predict` speaks the instance
//! shape (`instances[].prompt` → `predictions[].content`);
//! `serverStreamingPredict` only speaks Vertex's tensor shape
//! (`inputs[].structVal.prompt.stringVal` → `outputs[].structVal.content.stringVal`).

use super::sse::SseEvent;
use super::streaming::{self, EventDecoder, Step};
use super::upstream::{ProviderHttp, UpstreamRequest};
use super::{ChatRole, ModelCall, ModelParams, ProviderError, TextStream};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::time::{Instant, timeout_at};

/// Where one Vertex AI call goes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VertexModel<'a> {
    /// `https://us-central1-aiplatform.googleapis.com` or a test server's URL.
    pub base_url: &'a str,
    pub project: &'a str,
    pub location: &'a str,
    pub model: &'a str,
    pub access_token: Option<&'a str>,
}

impl VertexModel<'_> {
    pub(crate) fn url(&self, action: &str) -> String {
        format!(
            "{}/v1/projects/{}/locations/{}/publishers/google/models/{}:{action}",
            self.base_url.trim_end_matches('/'),
            self.project,
            self.location,
            self.model
        )
    }
}

/// The single prompt a text model reads. A lone user message is sent as is
/// after the system prompt; a conversation labels its turns so the model can
/// tell them apart.
pub(crate) fn prompt_text(call: &ModelCall) -> String {
    let mut parts: Vec<String> = call.system.iter().cloned().collect();
    let labelled = call.messages.len() > 1;
    for message in &call.messages {
        if labelled {
            let label = match message.role {
                ChatRole::User => "User",
                ChatRole::Assistant => "Assistant",
            };
            parts.push(format!("{label}: {}", message.content));
        } else {
            parts.push(message.content.clone());
        }
    }
    parts.join("\n\n")
}

/// Sampling parameters under Vertex's names.
fn parameters(params: &ModelParams) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("maxOutputTokens".into(), json!(params.max_tokens));
    if let Some(t) = params.temperature {
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = params.top_p {
        out.insert("topP".into(), json!(p));
    }
    if let Some(k) = params.top_k {
        out.insert("topK".into(), json!(k));
    }
    if !params.stop.is_empty() {
        out.insert("stopSequences".into(), json!(params.stop));
    }
    out
}

pub(crate) fn predict_body(call: &ModelCall) -> Value {
    json!({
        "instances": [{"prompt": prompt_text(call)}],
        "parameters": parameters(&call.params),
    })
}

/// A JSON value as a Vertex `Tensor`.
fn tensor(value: &Value) -> Value {
    match value {
        Value::String(s) => json!({"stringVal": [s]}),
        Value::Bool(b) => json!({"boolVal": [b]}),
        Value::Number(n) if n.is_f64() => json!({"floatVal": [n]}),
        Value::Number(n) => json!({"intVal": [n]}),
        Value::Array(items) => json!({"listVal": items.iter().map(tensor).collect::<Vec<_>>()}),
        Value::Object(map) => json!({"structVal": map
            .iter()
            .map(|(k, v)| (k.clone(), tensor(v)))
            .collect::<Map<String, Value>>()}),
        Value::Null => json!({}),
    }
}

pub(crate) fn streaming_body(call: &ModelCall) -> Value {
    json!({
        "inputs": [tensor(&json!({"prompt": prompt_text(call)}))],
        "parameters": tensor(&Value::Object(parameters(&call.params))),
    })
}

/// Vertex's error body is `{"error": {"code", "message", "status"}}`.
pub(crate) fn error_for_status(status: u16, body: &str) -> ProviderError {
    let json: Value = serde_json::from_str(body).unwrap_or_default();
    let error = &json["error"];
    let message = error["message"]
        .as_str()
        .map_or_else(|| body.chars().take(200).collect(), str::to_owned);
    let code = error["status"].as_str().unwrap_or_default();
    if matches!(status, 429 | 503 | 529) || matches!(code, "RESOURCE_EXHAUSTED" | "UNAVAILABLE") {
        return ProviderError::Overloaded {
            message: format!("overloaded_error: {message}"),
        };
    }
    ProviderError::Status { status, message }
}

/// The text of one answer object, in either shape.
fn answer_text(json: &Value) -> String {
    let tensors = json["outputs"].as_array().into_iter().flatten().map(|o| {
        o["structVal"]["content"]["stringVal"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect::<String>()
    });
    let instances = json["predictions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["content"].as_str().map(str::to_owned));
    tensors.chain(instances).collect()
}

struct Decoder;

impl EventDecoder for Decoder {
    type Item = String;

    fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError> {
        let json: Value = serde_json::from_str(&event.data)
            .map_err(|e| ProviderError::Malformed(format!("bad stream event: {e}")))?;
        if json.get("error").is_some() {
            let status = json["error"]["code"]
                .as_u64()
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(500);
            return Err(match error_for_status(status, &event.data) {
                overloaded @ ProviderError::Overloaded { .. } => overloaded,
                other => ProviderError::Malformed(format!("the provider reported {other}")),
            });
        }
        Ok(Step::Text(answer_text(&json)))
    }

    /// Vertex's stream has no closing event: it ends with the body.
    fn ends_at_eof(&self) -> bool {
        true
    }
}

fn authorised<'a>(request: UpstreamRequest<'a>, access_token: Option<&str>) -> UpstreamRequest<'a> {
    match access_token {
        Some(token) => request.bearer_auth(token),
        None => request,
    }
}

pub(crate) async fn stream(
    http: ProviderHttp<'_>,
    target: &VertexModel<'_>,
    call: &ModelCall,
) -> Result<TextStream, ProviderError> {
    if call.streaming {
        let url = format!("{}?alt=sse", target.url("serverStreamingPredict"));
        let request = http
            .post(url)
            .headers(duo_telemetry::outgoing_headers())
            .header("accept", "text/event-stream")
            .json(&streaming_body(call));
        let request = authorised(request, target.access_token);
        return streaming::start(request, &call.params, Decoder, error_for_status).await;
    }
    let request = authorised(
        http.post(target.url("predict"))
            .headers(duo_telemetry::outgoing_headers())
            .json(&predict_body(call)),
        target.access_token,
    );
    // The whole answer is the first token here, so only the whole-call
    // deadline applies.
    let deadline = Instant::now() + call.params.timeout;
    let timed_out = || ProviderError::Timeout("whole call");
    let response = timeout_at(deadline, request.send())
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| streaming::transport_error(&e))?;
    let status = response.status.as_u16();
    let body = timeout_at(deadline, response.body.text())
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| streaming::transport_error(&e))?;
    if !(200..300).contains(&status) {
        return Err(error_for_status(status, &body));
    }
    let text = predicted_text(&body)?;
    Ok(futures::stream::iter((!text.is_empty()).then_some(Ok(text))).boxed())
}

/// The text of a `:predict` answer. An answer without any text field (an
/// embedding model's, say) is an error rather than an empty answer.
fn predicted_text(body: &str) -> Result<String, ProviderError> {
    let json: Value = serde_json::from_str(body)
        .map_err(|e| ProviderError::Malformed(format!("bad predict response: {e}")))?;
    let has_text = json["predictions"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p["content"].is_string()));
    if !has_text {
        return Err(ProviderError::Malformed(
            "the predict response has no predictions[].content (is this a text model?)".into(),
        ));
    }
    Ok(answer_text(&json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::{ChatMessage, ModelTarget, ProviderKind};

    fn call(messages: &[(ChatRole, &str)]) -> ModelCall {
        let mut call = ModelCall::new(
            ModelTarget::new(ProviderKind::VertexAi, "text-bison"),
            messages
                .iter()
                .map(|(role, content)| ChatMessage {
                    role: *role,
                    content: (*content).to_owned(),
                })
                .collect(),
        );
        call.system = Some("Be brief.".into());
        call
    }

    #[test]
    fn one_question_is_sent_plain_and_turns_are_labelled() {
        assert_eq!(
            prompt_text(&call(&[(ChatRole::User, "What is Rust?")])),
            "Be brief.\n\nWhat is Rust?"
        );
        assert_eq!(
            prompt_text(&call(&[
                (ChatRole::User, "Hi"),
                (ChatRole::Assistant, "Thought:")
            ])),
            "Be brief.\n\nUser: Hi\n\nAssistant: Thought:"
        );
    }

    #[test]
    fn bodies_use_vertex_names_and_shapes() {
        let mut c = call(&[(ChatRole::User, "q")]);
        c.params.temperature = Some(0.5);
        c.params.max_tokens = 64;
        c.params.stop = vec!["Observation:".into()];
        let predict = predict_body(&c);
        assert_eq!(predict["instances"][0]["prompt"], "Be brief.\n\nq");
        assert_eq!(predict["parameters"]["maxOutputTokens"], 64);
        assert_eq!(
            predict["parameters"]["stopSequences"],
            json!(["Observation:"])
        );
        let streaming = streaming_body(&c);
        assert_eq!(
            streaming["inputs"][0]["structVal"]["prompt"]["stringVal"],
            json!(["Be brief.\n\nq"])
        );
        let params = &streaming["parameters"]["structVal"];
        assert_eq!(params["maxOutputTokens"], json!({"intVal": [64]}));
        assert_eq!(params["temperature"], json!({"floatVal": [0.5]}));
        assert_eq!(
            params["stopSequences"],
            json!({"listVal": [{"stringVal": ["Observation:"]}]})
        );
    }

    #[test]
    fn answers_are_read_in_both_shapes() {
        let tensor = json!({"outputs": [{"structVal": {"content": {"stringVal": ["Hel"]}}}]});
        assert_eq!(answer_text(&tensor), "Hel");
        let instance = json!({"predictions": [{"content": "lo"}]});
        assert_eq!(answer_text(&instance), "lo");
    }

    #[test]
    fn a_predict_answer_without_text_is_an_error() {
        assert_eq!(
            predicted_text(r#"{"predictions": [{"content": "hi"}]}"#),
            Ok("hi".to_owned())
        );
        assert_eq!(
            predicted_text(r#"{"predictions": [{"content": ""}]}"#),
            Ok(String::new())
        );
        let embeddings = r#"{"predictions": [{"embeddings": {"values": [0.1]}}]}"#;
        assert!(matches!(
            predicted_text(embeddings),
            Err(ProviderError::Malformed(_))
        ));
    }

    #[test]
    fn errors_map_like_the_other_providers() {
        let busy = r#"{"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}"#;
        let err = error_for_status(429, busy);
        assert!(err.retryable());
        assert!(err.to_string().contains("overloaded_error"));
        let denied = r#"{"error": {"code": 403, "message": "Permission denied", "status": "PERMISSION_DENIED"}}"#;
        assert_eq!(
            error_for_status(403, denied),
            ProviderError::Status {
                status: 403,
                message: "Permission denied".into()
            }
        );
    }
}
