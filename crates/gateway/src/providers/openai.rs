//! OpenAI-compatible chat completions client (vLLM, Ollama, the bundled
//! local model server).
//!
//! A trailing assistant message (prefill) is sent as the last message; some
//! servers continue it, others answer anew, so callers must accept both.

use super::escaped_text::JsonText;
use super::sse::SseEvent;
use super::streaming::{self, EventDecoder, Step};
use super::upstream::ProviderHttp;
use super::{ModelCall, ProviderError, TextStream, WireMessage};
use serde_json::Value;

/// The chat completions request, written straight from the call (no JSON
/// tree built first).
#[derive(serde::Serialize)]
pub(crate) struct CompletionsRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dry_multiplier: Option<f64>,
}

pub(crate) fn request_body<'a>(call: &'a ModelCall, model: &'a str) -> CompletionsRequest<'a> {
    let system = call.system.as_deref().map(|system| WireMessage {
        role: "system",
        content: JsonText(system),
    });
    let turns = call.messages.iter().map(WireMessage::from);
    CompletionsRequest {
        model,
        messages: system.into_iter().chain(turns).collect(),
        max_tokens: call.params.max_tokens,
        stream: true,
        stop: &call.params.stop,
        // As a JSON number the f32 always was (widened, not rounded).
        temperature: call.params.temperature.map(f64::from),
        top_p: call.params.top_p.map(f64::from),
        dry_multiplier: call.params.dry_multiplier.map(f64::from),
    }
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

/// One streamed chunk, read only as far as the decoders need: the first
/// choice's `delta` is kept as its JSON text (no tree is built and printed
/// again), and an `error` of any shape ends the stream.
#[derive(serde::Deserialize)]
struct ChunkWire<'a> {
    /// `null` (some compatible servers) reads as none.
    #[serde(default, borrow)]
    choices: Option<Vec<ChoiceWire<'a>>>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(serde::Deserialize)]
struct ChoiceWire<'a> {
    #[serde(default, borrow)]
    delta: Option<&'a serde_json::value::RawValue>,
}

/// The text part of a `delta`.
#[derive(serde::Deserialize)]
struct DeltaText<'a> {
    #[serde(default, borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
}

/// One chunk, `None` at `[DONE]`; an error chunk is an error.
fn chunk(event: &SseEvent) -> Result<Option<ChunkWire<'_>>, ProviderError> {
    if event.data.trim() == "[DONE]" {
        return Ok(None);
    }
    let chunk: ChunkWire<'_> = serde_json::from_str(&event.data)
        .map_err(|e| ProviderError::Malformed(format!("bad chunk: {e}")))?;
    if let Some(error) = &chunk.error {
        let message = error["message"].as_str().unwrap_or("unknown error");
        return Err(ProviderError::Malformed(format!(
            "the provider reported an error: {message}"
        )));
    }
    Ok(Some(chunk))
}

/// The first choice's `delta`, as JSON text.
fn first_delta<'a>(chunk: &ChunkWire<'a>) -> Option<&'a str> {
    chunk.choices.as_ref()?.first()?.delta.map(|raw| raw.get())
}

/// The text of each chunk.
struct Decoder;

impl EventDecoder for Decoder {
    fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError> {
        let Some(chunk) = chunk(&event)? else {
            return Ok(Step::Done);
        };
        // A delta whose `content` is not text (null, or a shape this client
        // does not know) contributes nothing, as before.
        let text = first_delta(&chunk)
            .and_then(|delta| serde_json::from_str::<DeltaText<'_>>(delta).ok())
            .and_then(|delta| delta.content)
            .unwrap_or_default();
        Ok(Step::Text(text.into_owned()))
    }
}

/// Each chunk's whole `delta` object as JSON text, tool-call pieces included.
struct DeltaDecoder;

impl EventDecoder for DeltaDecoder {
    fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError> {
        let Some(chunk) = chunk(&event)? else {
            return Ok(Step::Done);
        };
        Ok(match first_delta(&chunk) {
            // An object with at least one field (`{}` and non-objects are skipped).
            Some(delta) if delta.trim_start().starts_with('{') && !is_empty_object(delta) => {
                Step::Text(delta.to_owned())
            }
            _ => Step::Skip,
        })
    }
}

/// `{}` with any whitespace inside.
fn is_empty_object(json: &str) -> bool {
    json.trim()
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'))
        .is_some_and(|inside| inside.trim().is_empty())
}

/// Streams a prepared chat-completions `body` (with `"stream": true`) and
/// yields each chunk's `delta` as JSON text, for callers that read tool calls
/// as they are generated. Deadlines and errors as [`stream`]'s.
pub(crate) async fn stream_deltas(
    http: ProviderHttp<'_>,
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
    http: ProviderHttp<'_>,
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
        .map_err(|e| streaming::pooled_transport_error(&e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: &str) -> SseEvent {
        SseEvent {
            event: None,
            data: data.to_owned(),
        }
    }

    fn text(step: Step) -> Option<String> {
        match step {
            Step::Text(text) => Some(text),
            _ => None,
        }
    }

    #[test]
    fn the_text_decoder_reads_the_first_choices_content() {
        let mut decoder = Decoder;
        let step = decoder
            .decode(event(
                r#"{"choices":[{"index":0,"delta":{"content":"a\"b"}},{"delta":{"content":"x"}}]}"#,
            ))
            .unwrap();
        assert_eq!(text(step).as_deref(), Some("a\"b"));
        // No content, null content, no choices: an empty piece.
        for data in [
            r#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
            r#"{"choices":[{"delta":{"content":null}}]}"#,
            r#"{"choices":[]}"#,
            r#"{"choices":null}"#,
            r#"{"choices":[{"delta":{"content":["not","text"]}}]}"#,
        ] {
            assert_eq!(
                text(decoder.decode(event(data)).unwrap()).as_deref(),
                Some(""),
                "{data}"
            );
        }
        assert!(matches!(
            decoder.decode(event(" [DONE] ")).unwrap(),
            Step::Done
        ));
    }

    #[test]
    fn the_delta_decoder_passes_the_delta_through_and_skips_empty_ones() {
        let mut decoder = DeltaDecoder;
        let delta = r#"{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}"#;
        let step = decoder
            .decode(event(&format!(r#"{{"choices":[{{"delta":{delta}}}]}}"#)))
            .unwrap();
        assert_eq!(text(step).as_deref(), Some(delta));
        for data in [
            r#"{"choices":[{"delta":{}}]}"#,
            r#"{"choices":[{"delta":{ }}]}"#,
            r#"{"choices":[{"delta":null}]}"#,
            r#"{"choices":[{"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"delta":"text"}]}"#,
            r#"{"usage":{"total_tokens":3}}"#,
        ] {
            assert!(
                matches!(decoder.decode(event(data)).unwrap(), Step::Skip),
                "{data}"
            );
        }
    }

    #[test]
    fn error_chunks_and_bad_json_end_the_stream_with_an_error() {
        for (data, wanted) in [
            (
                r#"{"error":{"message":"model overloaded"}}"#,
                "model overloaded",
            ),
            (r#"{"error":"boom"}"#, "unknown error"),
            ("{not json", "bad chunk"),
        ] {
            let err = DeltaDecoder
                .decode(event(data))
                .err()
                .map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(wanted)),
                "{data}: {err:?}"
            );
        }
    }
}
