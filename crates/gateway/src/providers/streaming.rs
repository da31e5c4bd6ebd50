//! Turning a provider's SSE response into a [`TextStream`], with the
//! first-token and whole-call deadlines and error mapping shared by clients.

use super::sse::{SseEvent, SseParser};
use super::upstream::{UpstreamError, UpstreamRequest};
use super::{ModelParams, ProviderError, TextStream};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use std::collections::VecDeque;
use tokio::time::{Instant, timeout_at};

/// What one SSE event means to a protocol.
#[derive(Debug)]
pub(crate) enum Step {
    Text(String),
    Skip,
    Done,
}

/// Reads one protocol's events.
pub(crate) trait EventDecoder: Send + 'static {
    fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError>;

    /// Whether the body ending is the normal end of the stream. Protocols
    /// with a closing event say no, so a cut connection is an error.
    fn ends_at_eof(&self) -> bool {
        false
    }
}

/// Maps a transport error; the message never contains request headers, so
/// no API key can leak through it.
pub(crate) fn transport_error(err: &UpstreamError) -> ProviderError {
    match err {
        UpstreamError::Pooled(err) => pooled_transport_error(err),
        UpstreamError::Direct(err) if err.is_timeout() => ProviderError::Timeout("request"),
        // Its messages name no URL or header.
        UpstreamError::Direct(err) => ProviderError::Connection(err.to_string()),
        UpstreamError::Invalid(_) => ProviderError::Connection(err.to_string()),
    }
}

/// [`transport_error`] for reqwest's own calls (probes).
pub(crate) fn pooled_transport_error(err: &reqwest::Error) -> ProviderError {
    if err.is_timeout() {
        ProviderError::Timeout("request")
    } else {
        ProviderError::Connection(err.without_url_string())
    }
}

trait WithoutUrl {
    fn without_url_string(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    fn without_url_string(&self) -> String {
        use std::error::Error as _;
        let mut message = String::from(if self.is_connect() {
            "connection failed"
        } else if self.is_body() || self.is_decode() {
            "reading the response failed"
        } else {
            "request failed"
        });
        if let Some(source) = self.source() {
            message.push_str(": ");
            message.push_str(&source.to_string());
        }
        message
    }
}

struct EventReader<D> {
    body: BoxStream<'static, Result<Bytes, UpstreamError>>,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
    decoder: D,
    finished: bool,
}

impl<D: EventDecoder> EventReader<D> {
    async fn next_text(&mut self) -> Option<Result<String, ProviderError>> {
        loop {
            if self.finished {
                return None;
            }
            if let Some(event) = self.pending.pop_front() {
                match self.decoder.decode(event) {
                    Ok(Step::Text(text)) if !text.is_empty() => return Some(Ok(text)),
                    Ok(Step::Text(_) | Step::Skip) => continue,
                    Ok(Step::Done) => {
                        self.finished = true;
                        return None;
                    }
                    Err(err) => {
                        self.finished = true;
                        return Some(Err(err));
                    }
                }
            }
            match self.body.next().await {
                Some(Ok(bytes)) => self.pending.extend(self.parser.push(&bytes)),
                Some(Err(err)) => {
                    self.finished = true;
                    return Some(Err(transport_error(&err)));
                }
                None if self.decoder.ends_at_eof() => {
                    // A last event without its blank line still counts.
                    self.pending.extend(self.parser.push(b"\n\n"));
                    self.finished = self.pending.is_empty();
                    if self.finished {
                        return None;
                    }
                    self.body = futures::stream::empty().boxed();
                }
                None => {
                    self.finished = true;
                    return Some(Err(ProviderError::Malformed(
                        "the stream ended before its final event".to_owned(),
                    )));
                }
            }
        }
    }
}

/// Sends the request and waits for the first text, so errors before it are
/// returned rather than streamed. `error_for_status` maps a non-2xx answer.
pub(crate) async fn start<D: EventDecoder>(
    request: UpstreamRequest<'_>,
    params: &ModelParams,
    decoder: D,
    error_for_status: fn(u16, &str) -> ProviderError,
) -> Result<TextStream, ProviderError> {
    let started = Instant::now();
    let deadline = started + params.timeout;
    let first_deadline = (started + params.first_token_timeout).min(deadline);
    let first_timeout = || {
        if first_deadline < deadline {
            ProviderError::Timeout("first token")
        } else {
            ProviderError::Timeout("whole call")
        }
    };

    let response = timeout_at(first_deadline, request.send())
        .await
        .map_err(|_| first_timeout())?
        .map_err(|e| transport_error(&e))?;
    let status = response.status.as_u16();
    if !response.status.is_success() {
        let body = timeout_at(first_deadline, response.body.text())
            .await
            .map_err(|_| first_timeout())?
            .unwrap_or_default();
        return Err(error_for_status(status, &body));
    }

    let mut reader = EventReader {
        body: response.body.into_stream().boxed(),
        parser: SseParser::default(),
        pending: VecDeque::new(),
        decoder,
        finished: false,
    };
    let first = match timeout_at(first_deadline, reader.next_text()).await {
        Err(_) => return Err(first_timeout()),
        Ok(None) => return Ok(futures::stream::empty().boxed()),
        Ok(Some(Err(err))) => return Err(err),
        Ok(Some(Ok(text))) => text,
    };
    Ok(async_stream::stream! {
        yield Ok(first);
        loop {
            match timeout_at(deadline, reader.next_text()).await {
                Err(_) => {
                    yield Err(ProviderError::Timeout("whole call"));
                    break;
                }
                Ok(None) => break,
                Ok(Some(item)) => {
                    let failed = item.is_err();
                    yield item;
                    if failed {
                        break;
                    }
                }
            }
        }
    }
    .boxed())
}

/// The message of an error body in either provider's shape
/// (`{"error": {"type", "message"}}`), or the raw body, shortened.
pub(crate) fn error_parts(body: &str) -> (Option<String>, String) {
    let json: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let error = &json["error"];
    let kind = error["type"].as_str().map(str::to_owned);
    let message = match error["message"].as_str() {
        Some(message) => message.to_owned(),
        None => body.chars().take(200).collect(),
    };
    (kind, message)
}
