//! OpenAI-compatible chat completions client (vLLM, Ollama, the bundled
//! local model server).
//!
//! A trailing assistant message (prefill) is sent as the last message; some
//! servers continue it, others answer anew, so callers must accept both.

use super::escaped_text::JsonText;
use super::sse::SseEvent;
use super::streaming::{self, EventDecoder, PieceStream, Step};
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
    if is_done(event) {
        return Ok(None);
    }
    let chunk: ChunkWire<'_> = serde_json::from_str(&event.data)
        .map_err(|e| ProviderError::Malformed(format!("bad chunk: {e}")))?;
    if let Some(error) = &chunk.error {
        return Err(reported_error(error));
    }
    Ok(Some(chunk))
}

/// The stream's closing event.
fn is_done(event: &SseEvent) -> bool {
    event.data.trim() == "[DONE]"
}

/// An `error` field of any shape, as the error that ends the stream.
fn reported_error(error: &Value) -> ProviderError {
    let message = error["message"].as_str().unwrap_or("unknown error");
    ProviderError::Malformed(format!("the provider reported an error: {message}"))
}

/// The first choice's `delta`, as JSON text.
fn first_delta<'a>(chunk: &ChunkWire<'a>) -> Option<&'a str> {
    chunk.choices.as_ref()?.first()?.delta.map(|raw| raw.get())
}

/// The text of each chunk.
struct Decoder;

impl EventDecoder for Decoder {
    type Item = String;

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

/// A piece of a streamed turn (OpenAI chunk shapes: a call's id and name
/// come in its first piece, its arguments in pieces after).
#[derive(Debug, Clone, PartialEq)]
pub enum TurnDelta {
    Text(String),
    Call {
        /// Which call of the turn (`tool_calls[].index`).
        index: u64,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
}

/// A chunk's `delta` as OpenAI streams it (fields borrowed from the text).
#[derive(serde::Deserialize)]
struct DeltaWire<'a> {
    #[serde(default, borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<ToolCallDeltaWire<'a>>>,
}

#[derive(serde::Deserialize)]
struct ToolCallDeltaWire<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<FunctionDeltaWire<'a>>,
}

#[derive(serde::Deserialize)]
struct FunctionDeltaWire<'a> {
    #[serde(default, borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<std::borrow::Cow<'a, str>>,
}

/// The pieces in one chunk's `delta` (given as JSON text). The typed read is
/// the common case; a delta with a field of another type than OpenAI's (some
/// compatible servers differ) is read leniently, taking what has the
/// expected type.
pub(super) fn turn_deltas(delta: &str) -> Vec<TurnDelta> {
    match serde_json::from_str::<DeltaWire<'_>>(delta) {
        Ok(wire) => turn_pieces(wire),
        Err(_) => lenient_turn_deltas(delta),
    }
}

/// The pieces of a `delta` read with OpenAI's types.
fn turn_pieces(wire: DeltaWire<'_>) -> Vec<TurnDelta> {
    let mut pieces = Vec::new();
    if let Some(text) = wire.content.filter(|t| !t.is_empty()) {
        pieces.push(TurnDelta::Text(text.into_owned()));
    }
    for call in wire.tool_calls.into_iter().flatten() {
        let (name, arguments) = match call.function {
            Some(f) => (f.name, f.arguments),
            None => (None, None),
        };
        pieces.push(TurnDelta::Call {
            index: call.index.unwrap_or(0),
            id: call.id.map(|id| id.into_owned()),
            name: name.map(|n| n.into_owned()),
            arguments: arguments.map(|a| a.into_owned()).unwrap_or_default(),
        });
    }
    pieces
}

fn lenient_turn_deltas(delta: &str) -> Vec<TurnDelta> {
    let Ok(delta) = serde_json::from_str::<Value>(delta) else {
        return Vec::new();
    };
    let mut pieces = Vec::new();
    if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
        pieces.push(TurnDelta::Text(text.to_owned()));
    }
    for call in delta["tool_calls"].as_array().into_iter().flatten() {
        pieces.push(TurnDelta::Call {
            index: call["index"].as_u64().unwrap_or(0),
            id: call["id"].as_str().map(str::to_owned),
            name: call["function"]["name"].as_str().map(str::to_owned),
            arguments: call["function"]["arguments"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        });
    }
    pieces
}

/// Each chunk's `delta` as the turn's pieces (text, tool-call pieces).
struct DeltaDecoder;

/// A chunk with its first choice's `delta` read with OpenAI's types, in the
/// same pass as the chunk.
#[derive(serde::Deserialize)]
struct TypedChunkWire<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<TypedChoiceWire<'a>>>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(serde::Deserialize)]
struct TypedChoiceWire<'a> {
    #[serde(default, borrow)]
    delta: Option<DeltaWire<'a>>,
}

impl EventDecoder for DeltaDecoder {
    type Item = Vec<TurnDelta>;

    fn decode(&mut self, event: SseEvent) -> Result<Step<Vec<TurnDelta>>, ProviderError> {
        if is_done(&event) {
            return Ok(Step::Done);
        }
        // The usual chunk: read once. One that OpenAI's types do not fit
        // (a field of another type) is read as before: the chunk, then its
        // delta leniently.
        let pieces = match serde_json::from_str::<TypedChunkWire<'_>>(&event.data) {
            Ok(typed) => {
                if let Some(error) = &typed.error {
                    return Err(reported_error(error));
                }
                typed
                    .choices
                    .and_then(|choices| choices.into_iter().next())
                    .and_then(|choice| choice.delta)
                    .map(turn_pieces)
                    .unwrap_or_default()
            }
            Err(_) => {
                let Some(chunk) = chunk(&event)? else {
                    return Ok(Step::Done);
                };
                match first_delta(&chunk) {
                    // An object with at least one field.
                    Some(delta)
                        if delta.trim_start().starts_with('{') && !is_empty_object(delta) =>
                    {
                        turn_deltas(delta)
                    }
                    _ => Vec::new(),
                }
            }
        };
        Ok(if pieces.is_empty() {
            Step::Skip
        } else {
            Step::Text(pieces)
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
/// yields each chunk's `delta` as the turn's pieces, for callers that read
/// tool calls as they are generated. Deadlines and errors as [`stream`]'s.
pub(crate) async fn stream_deltas(
    http: ProviderHttp<'_>,
    base_url: &str,
    api_key: Option<&str>,
    body: &(impl serde::Serialize + ?Sized),
    params: &super::ModelParams,
) -> Result<PieceStream<Vec<TurnDelta>>, ProviderError> {
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

    fn text(step: Step<String>) -> Option<String> {
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

    fn pieces(step: Step<Vec<TurnDelta>>) -> Option<Vec<TurnDelta>> {
        match step {
            Step::Text(pieces) => Some(pieces),
            _ => None,
        }
    }

    #[test]
    fn the_delta_decoder_reads_the_deltas_pieces_and_skips_empty_ones() {
        let mut decoder = DeltaDecoder;
        let step = decoder
            .decode(event(
                r#"{"id":"c","choices":[{"index":0,"delta":{"content":"a\"b","tool_calls":[{"index":1,"id":"t1","function":{"name":"read_file","arguments":"{}"}}]},"finish_reason":null}]}"#,
            ))
            .unwrap();
        assert_eq!(
            pieces(step),
            Some(vec![
                TurnDelta::Text("a\"b".into()),
                TurnDelta::Call {
                    index: 1,
                    id: Some("t1".into()),
                    name: Some("read_file".into()),
                    arguments: "{}".into(),
                },
            ])
        );
        // A field of another type than OpenAI's: the rest is still read.
        let step = decoder
            .decode(event(
                r#"{"choices":[{"delta":{"content":"x","tool_calls":[{"index":"0","function":{"arguments":"1}"}}]}}]}"#,
            ))
            .unwrap();
        assert_eq!(
            pieces(step),
            Some(vec![
                TurnDelta::Text("x".into()),
                TurnDelta::Call {
                    index: 0,
                    id: None,
                    name: None,
                    arguments: "1}".into(),
                },
            ])
        );
        for data in [
            r#"{"choices":[{"delta":{}}]}"#,
            r#"{"choices":[{"delta":{ }}]}"#,
            r#"{"choices":[{"delta":null}]}"#,
            r#"{"choices":[{"delta":{"content":""}}]}"#,
            r#"{"choices":[{"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"delta":"text"}]}"#,
            r#"{"usage":{"total_tokens":3}}"#,
        ] {
            assert!(
                matches!(decoder.decode(event(data)).unwrap(), Step::Skip),
                "{data}"
            );
        }
        assert!(matches!(
            decoder.decode(event(" [DONE] ")).unwrap(),
            Step::Done
        ));
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

    #[test]
    fn turn_deltas_read_text_and_call_pieces_typed_or_leniently() {
        let typed = turn_deltas(
            r#"{"role":"assistant","content":"Hi \u00e9","tool_calls":[{"index":1,"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"a\":"}}]}"#,
        );
        assert_eq!(
            typed,
            vec![
                TurnDelta::Text("Hi é".into()),
                TurnDelta::Call {
                    index: 1,
                    id: Some("c1".into()),
                    name: Some("read_file".into()),
                    arguments: "{\"a\":".into(),
                },
            ]
        );
        // Later pieces of a call carry only arguments; null content is none.
        assert_eq!(
            turn_deltas(
                r#"{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}"#
            ),
            vec![TurnDelta::Call {
                index: 0,
                id: None,
                name: None,
                arguments: "1}".into(),
            }]
        );
        // A server that sends a field of another type: what fits is kept.
        assert_eq!(
            turn_deltas(r#"{"content":"ok","tool_calls":[{"index":"0","function":{"name":"x"}}]}"#),
            vec![
                TurnDelta::Text("ok".into()),
                TurnDelta::Call {
                    index: 0,
                    id: None,
                    name: Some("x".into()),
                    arguments: String::new(),
                },
            ]
        );
        assert_eq!(turn_deltas("not json"), Vec::new());
        assert_eq!(turn_deltas(r#"{"content":""}"#), Vec::new());
    }
}
