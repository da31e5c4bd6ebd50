//! Turning a provider's SSE response into a [`TextStream`](super::TextStream), with the
//! first-token and whole-call deadlines and error mapping shared by clients.

use super::sse::{SseEvent, SseParser};
use super::upstream::{UpstreamError, UpstreamRequest};
use super::{ModelParams, ProviderError};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use std::collections::VecDeque;
use tokio::time::{Instant, timeout_at};

/// What one SSE event means to a protocol: a piece of the answer (text, or
/// what a decoder reads the event into), nothing, or the stream's end.
#[derive(Debug)]
pub(crate) enum Step<T = String> {
    Text(T),
    Skip,
    Done,
}

/// A piece of an answer; an empty one is not handed on.
pub(crate) trait Piece: Send + 'static {
    fn is_empty(&self) -> bool;
}

impl Piece for String {
    fn is_empty(&self) -> bool {
        self.as_str().is_empty()
    }
}

impl<T: Send + 'static> Piece for Vec<T> {
    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }
}

/// Reads one protocol's events.
pub(crate) trait EventDecoder: Send + 'static {
    /// What the stream yields: text, or the decoder's own pieces (read in
    /// the same pass as the event's JSON, not written out and read again).
    type Item: Piece;

    fn decode(&mut self, event: SseEvent) -> Result<Step<Self::Item>, ProviderError>;

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
    async fn next_text(&mut self) -> Option<Result<D::Item, ProviderError>> {
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
                        release_after_answer(std::mem::replace(
                            &mut self.body,
                            futures::stream::empty().boxed(),
                        ));
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

/// How long a body whose closing event came is read on for its end.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// At most this many more pieces are read past the closing event.
const RELEASE_MAX_FRAMES: usize = 16;

/// Reads a body on past its protocol's closing event, so that its
/// connection goes back to the pool, in a task of its own. Done in the
/// reader's final poll, this work (the body's end, the pool's bookkeeping:
/// a few thousand instructions) came before the caller's answer could end;
/// now the answer ends first. And the body's end no longer has to be in the
/// same read as the closing event for the connection to be kept: it is
/// waited for, briefly. Outside a runtime the body is only dropped.
fn release_after_answer(body: BoxStream<'static, Result<Bytes, UpstreamError>>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut body = body;
        let read_to_end = async {
            let mut frames = 0;
            while frames < RELEASE_MAX_FRAMES && matches!(body.next().await, Some(Ok(_))) {
                frames += 1;
            }
        };
        // Past either limit the body is dropped unread: its connection closes.
        let _ = tokio::time::timeout(RELEASE_WAIT, read_to_end).await;
    });
}

/// The stream [`start`] returns: [`TextStream`](super::TextStream) for the
/// decoders of text.
pub(crate) type PieceStream<T> = BoxStream<'static, Result<T, ProviderError>>;

/// Sends the request and waits for the first text, so errors before it are
/// returned rather than streamed. `error_for_status` maps a non-2xx answer.
pub(crate) async fn start<D: EventDecoder>(
    request: UpstreamRequest<'_>,
    params: &ModelParams,
    decoder: D,
    error_for_status: fn(u16, &str) -> ProviderError,
) -> Result<PieceStream<D::Item>, ProviderError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::direct_http::{DirectHttp, DirectHttpSettings};
    use crate::providers::upstream::ProviderHttp;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::Notify;

    /// Each event's data is its text; `[DONE]` closes the stream.
    struct PlainDecoder;

    impl EventDecoder for PlainDecoder {
        type Item = String;

        fn decode(&mut self, event: SseEvent) -> Result<Step, ProviderError> {
            Ok(match event.data.as_str() {
                "[DONE]" => Step::Done,
                text => Step::Text(text.to_owned()),
            })
        }
    }

    /// Reads one request (head and `content-length` body) off `socket`.
    async fn read_request(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> bool {
        loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse().ok())
                    .unwrap_or(0);
                if buffer.len() >= end + 4 + length {
                    buffer.drain(..end + 4 + length);
                    return true;
                }
            }
            let mut more = [0u8; 4096];
            match socket.read(&mut more).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buffer.extend_from_slice(&more[..n]),
            }
        }
    }

    /// A server answering each request with one event and `[DONE]`, and
    /// sending the chunked body's end only when `end_body` is notified.
    async fn server_ending_late(end_body: Arc<Notify>) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/v1/chat/completions",
            listener.local_addr().unwrap()
        );
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let end_body = end_body.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    while read_request(&mut socket, &mut buffer).await {
                        let mut answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                        for event in ["data: hello\n\n", "data: [DONE]\n\n"] {
                            answer.extend_from_slice(
                                format!("{:x}\r\n{event}\r\n", event.len()).as_bytes(),
                            );
                        }
                        socket.write_all(&answer).await.unwrap();
                        end_body.notified().await;
                        socket.write_all(b"0\r\n\r\n").await.unwrap();
                    }
                });
            }
        });
        (url, connections)
    }

    #[tokio::test]
    async fn the_answer_ends_at_its_closing_event_and_the_connection_is_kept_for_the_next_call() {
        let end_body = Arc::new(Notify::new());
        let (url, connections) = server_ending_late(end_body.clone()).await;
        let pooled = reqwest::Client::new();
        let direct = DirectHttp::new(DirectHttpSettings::default());
        for call in 0..2 {
            let request = ProviderHttp::new(&pooled, Some(&direct))
                .post(url.clone())
                .body(Bytes::from_static(b"{}"));
            let texts: Vec<String> = start(
                request,
                &ModelParams::default(),
                PlainDecoder,
                |status, body| ProviderError::Status {
                    status,
                    message: body.to_owned(),
                },
            )
            .await
            .unwrap()
            .map(|text| text.unwrap())
            .collect()
            .await;
            // The stream ended at `[DONE]`, before the body's end was sent.
            assert_eq!(texts, ["hello"], "call {call}");
            assert_eq!(direct.idle_connections(), 0, "call {call}");
            end_body.notify_one();
            // Read on in the background, the body's end brings the
            // connection back to the pool.
            tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while direct.idle_connections() == 0 {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("the connection came back to the pool");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1);
    }
}
