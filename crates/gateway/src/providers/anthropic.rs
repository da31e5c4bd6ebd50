//! Anthropic Messages API client (streaming).
//!
//! A trailing assistant message is sent as is: Anthropic continues it (prefill).

use super::escaped_text::JsonText;
use super::sse::SseEvent;
use super::streaming::{self, EventDecoder, Step};
use super::upstream::ProviderHttp;
use super::{ModelCall, ProviderError, TextStream, WireMessage};
use serde_json::value::RawValue;
use std::borrow::Cow;

pub(crate) const API_VERSION: &str = "2023-06-01";

/// `https://api.anthropic.com` or `.../v1` both mean the same API root.
pub(crate) fn api_root(base_url: &str) -> &str {
    base_url.trim_end_matches('/').trim_end_matches("/v1")
}

/// The Messages API request, written straight from the call (no JSON tree
/// built first); the fields in the order the API documents them.
#[derive(serde::Serialize)]
pub(crate) struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<JsonText<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
}

pub(crate) fn request_body(call: &ModelCall) -> MessagesRequest<'_> {
    MessagesRequest {
        model: &call.target.model,
        max_tokens: call.params.max_tokens,
        messages: call.messages.iter().map(WireMessage::from).collect(),
        stream: true,
        system: call.system.as_deref().map(JsonText),
        stop_sequences: &call.params.stop,
        // As a JSON number the f32 always was (widened, not rounded).
        temperature: call.params.temperature.map(f64::from),
        top_p: call.params.top_p.map(f64::from),
        top_k: call.params.top_k,
    }
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

/// One streamed event, read only as far as the decoder needs: the fields it
/// looks at stay JSON text until their event type asks for them, and the
/// rest (`message_start`'s whole message, usage, ...) is skipped without
/// building a tree. Any shape of `delta` or `error` reads as before: what is
/// not the expected shape counts as absent.
#[derive(serde::Deserialize, Default)]
struct EventWire<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<&'a RawValue>,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct TextWire<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct ErrorWire<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<&'a RawValue>,
    #[serde(default, borrow)]
    message: Option<&'a RawValue>,
}

/// A field's value if it is the shape `T` reads, else none.
fn read<'a, T: serde::Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    serde_json::from_str(raw?.get()).ok()
}

impl EventDecoder for Decoder {
    type Item = String;

    fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError> {
        let wire: EventWire<'_> = match serde_json::from_str(&event.data) {
            Ok(wire) => wire,
            // JSON that is not an object has none of the fields: the
            // event's name alone decides, as for any other event.
            Err(_) if serde_json::from_str::<serde::de::IgnoredAny>(&event.data).is_ok() => {
                EventWire::default()
            }
            Err(e) => return Err(ProviderError::Malformed(format!("bad event data: {e}"))),
        };
        let kind: Option<Cow<'_, str>> = read(wire.kind);
        match kind.as_deref().or(event.event.as_deref()) {
            Some("content_block_delta") => Ok(Step::Text(
                read::<TextWire<'_>>(wire.delta)
                    .and_then(|delta| delta.text)
                    .unwrap_or_default()
                    .into_owned(),
            )),
            Some("message_stop") => Ok(Step::Done),
            Some("error") => {
                let error: Option<ErrorWire<'_>> = read(wire.error);
                let (kind, message): (Option<Cow<'_, str>>, Option<Cow<'_, str>>) =
                    error.map_or((None, None), |e| (read(e.kind), read(e.message)));
                let kind = kind.as_deref().unwrap_or("error");
                let message = message.as_deref().unwrap_or_default();
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
    http: ProviderHttp<'_>,
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
        .map_err(|e| streaming::pooled_transport_error(&e))?;
    let status = response.status().as_u16();
    if response.status().is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    Err(error_for_status(status, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(event: Option<&str>, data: &str) -> Result<Step, ProviderError> {
        Decoder.decode(SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
        })
    }

    fn text(step: Result<Step, ProviderError>) -> String {
        match step {
            Ok(Step::Text(text)) => text,
            other => panic!("expected text, got {other:?}"),
        }
    }

    #[test]
    fn text_deltas_are_read_with_their_escapes() {
        let data = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a \"quote\"\nnext"}}"#;
        assert_eq!(
            text(decode(Some("content_block_delta"), data)),
            "a \"quote\"\nnext"
        );
        // A delta without text (a tool's JSON piece) or of another shape adds nothing.
        let data = r#"{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{"}}"#;
        assert_eq!(text(decode(None, data)), "");
        assert_eq!(
            text(decode(
                None,
                r#"{"type":"content_block_delta","delta":"odd"}"#
            )),
            ""
        );
    }

    #[test]
    fn the_event_name_stands_in_for_a_missing_or_odd_type() {
        assert_eq!(
            text(decode(
                Some("content_block_delta"),
                r#"{"delta":{"text":"x"}}"#
            )),
            "x"
        );
        assert_eq!(
            text(decode(
                Some("content_block_delta"),
                r#"{"type":7,"delta":{"text":"y"}}"#
            )),
            "y"
        );
        assert!(matches!(decode(Some("message_stop"), "{}"), Ok(Step::Done)));
        // Data that is JSON but not an object: the event's name decides.
        assert!(matches!(
            decode(Some("message_stop"), "[1]"),
            Ok(Step::Done)
        ));
        assert!(matches!(decode(Some("ping"), "\"x\""), Ok(Step::Skip)));
        assert_eq!(text(decode(Some("content_block_delta"), "null")), "");
    }

    #[test]
    fn other_events_are_skipped_without_reading_them() {
        let start = r#"{"type":"message_start","message":{"id":"m","content":[],"usage":{"input_tokens":12,"output_tokens":1}}}"#;
        assert!(matches!(
            decode(Some("message_start"), start),
            Ok(Step::Skip)
        ));
        assert!(matches!(
            decode(Some("ping"), r#"{"type":"ping"}"#),
            Ok(Step::Skip)
        ));
        let delta = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#;
        assert!(matches!(decode(None, delta), Ok(Step::Skip)));
        assert!(matches!(
            decode(None, r#"{"type":"message_stop"}"#),
            Ok(Step::Done)
        ));
    }

    #[test]
    fn errors_end_the_stream_overloaded_apart() {
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        match decode(Some("error"), overloaded) {
            Err(ProviderError::Overloaded { message }) => {
                assert_eq!(message, "overloaded_error: Overloaded")
            }
            other => panic!("{other:?}"),
        }
        let other = r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#;
        match decode(None, other) {
            Err(ProviderError::Malformed(message)) => {
                assert_eq!(message, "the provider reported api_error: boom")
            }
            other => panic!("{other:?}"),
        }
        // A part of another shape counts as absent, the rest still reads.
        match decode(
            None,
            r#"{"type":"error","error":{"type":"api_error","message":7}}"#,
        ) {
            Err(ProviderError::Malformed(message)) => {
                assert_eq!(message, "the provider reported api_error: ")
            }
            other => panic!("{other:?}"),
        }
        match decode(None, r#"{"type":"error","error":"odd"}"#) {
            Err(ProviderError::Malformed(message)) => {
                assert_eq!(message, "the provider reported error: ")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode(None, "not json"),
            Err(ProviderError::Malformed(m)) if m.starts_with("bad event data")
        ));
    }
}
