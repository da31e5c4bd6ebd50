//! One upstream call's answer, whichever client made it: [`DirectHttp`]
//! for plain-`http` endpoints, reqwest for the others.

use bytes::Bytes;
use futures::future::Either;
use futures::{Stream, StreamExt};
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use super::direct_http::{DirectBody, DirectHttp, DirectHttpError};
use super::upstream_url;

/// How a body's pieces reach the task that relays them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Through other tasks (a pooled connection's task, a channel): a piece
    /// that is on its way may need a few turns of the scheduler.
    OtherTasks,
    /// Decoded in the relaying task itself: "pending" means nothing more
    /// has arrived, so nothing is waited for.
    SameTask,
}

/// Why an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error(transparent)]
    Pooled(#[from] reqwest::Error),
    #[error(transparent)]
    Direct(#[from] DirectHttpError),
    /// Named by part only: the value may be a credential.
    #[error("the request's {0} could not be sent")]
    Invalid(&'static str),
}

impl UpstreamError {
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::Pooled(err) => err.is_timeout(),
            Self::Direct(err) => err.is_timeout(),
            Self::Invalid(_) => false,
        }
    }

    pub fn is_connect(&self) -> bool {
        match self {
            Self::Pooled(err) => err.is_connect(),
            Self::Direct(err) => err.is_connect(),
            Self::Invalid(_) => false,
        }
    }
}

/// The answer's head, and its body still to read.
pub struct Upstream {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: UpstreamBody,
}

/// An answer's body, from either client.
pub enum UpstreamBody {
    Pooled(reqwest::Response),
    Direct(DirectBody),
}

/// The clients a model call may use: plain-`http` URLs go through
/// `direct` when there is one (configured endpoints), everything else
/// through `pooled`.
#[derive(Clone, Copy)]
pub struct ProviderHttp<'a> {
    pooled: &'a reqwest::Client,
    direct: Option<&'a DirectHttp>,
}

impl<'a> ProviderHttp<'a> {
    pub fn new(pooled: &'a reqwest::Client, direct: Option<&'a DirectHttp>) -> Self {
        Self { pooled, direct }
    }

    /// The pooled client (probes, and what `direct` does not take).
    pub fn pooled(self) -> &'a reqwest::Client {
        self.pooled
    }

    /// A POST to `url`, sent by [`UpstreamRequest::send`].
    pub fn post(self, url: String) -> UpstreamRequest<'a> {
        UpstreamRequest {
            http: self,
            url,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            invalid: None,
        }
    }
}

/// A POST being put together, in reqwest's builder style; a header or body
/// that cannot be sent fails the call at [`UpstreamRequest::send`].
#[derive(Clone)]
pub struct UpstreamRequest<'a> {
    http: ProviderHttp<'a>,
    url: String,
    headers: HeaderMap,
    body: Bytes,
    invalid: Option<&'static str>,
}

impl UpstreamRequest<'_> {
    /// Adds `headers`, each replacing any earlier one of its name.
    pub fn headers(mut self, headers: HeaderMap) -> Self {
        self.headers.extend(headers);
        self
    }

    /// Sets one header; a name or value that is not a valid header fails
    /// the call.
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(name), Ok(mut value)) => {
                // Keys and tokens are kept out of HTTP/2's header index.
                value.set_sensitive(SENSITIVE.contains(&name.as_str()));
                self.headers.insert(name, value);
            }
            _ => self.invalid = Some(name),
        }
        self
    }

    /// `Authorization: Bearer {token}`.
    pub fn bearer_auth(self, token: &str) -> Self {
        self.header("authorization", &format!("Bearer {token}"))
    }

    /// The body as JSON, with its content type.
    pub fn json<T: serde::Serialize + ?Sized>(mut self, body: &T) -> Self {
        // A model request (system prompt, tools, turns) is a few KiB: room
        // for one up front instead of growing from serde_json's 128 bytes,
        // a copy at each doubling.
        let mut bytes = Vec::with_capacity(JSON_BODY_START_BYTES);
        match serde_json::to_writer(&mut bytes, body) {
            Ok(()) => {
                self.body = Bytes::from(bytes);
                self.headers
                    .entry(CONTENT_TYPE)
                    .or_insert(HeaderValue::from_static("application/json"));
            }
            Err(_) => self.invalid = Some("body"),
        }
        self
    }

    pub fn body(mut self, body: Bytes) -> Self {
        self.body = body;
        self
    }

    /// Sends the request and waits for the answer's head.
    pub async fn send(self) -> Result<Upstream, UpstreamError> {
        if let Some(part) = self.invalid {
            return Err(UpstreamError::Invalid(part));
        }
        if let Some(direct) = self.http.direct
            && let Some(parsed) = upstream_url::parsed(&self.url)
            && DirectHttp::serves(&parsed)
        {
            let answer = direct.post(&parsed, self.headers, self.body).await?;
            return Ok(Upstream {
                status: answer.status,
                headers: answer.headers,
                body: UpstreamBody::Direct(answer.body),
            });
        }
        let mut answer = upstream_url::post(self.http.pooled, self.url)
            .headers(self.headers)
            .body(self.body)
            .send()
            .await?;
        Ok(Upstream {
            status: answer.status(),
            headers: std::mem::take(answer.headers_mut()),
            body: UpstreamBody::Pooled(answer),
        })
    }
}

/// The buffer a JSON body is first written into.
const JSON_BODY_START_BYTES: usize = 8 * 1024;

/// Headers whose values are credentials.
const SENSITIVE: &[&str] = &["authorization", "x-api-key"];

impl UpstreamBody {
    /// How the body's pieces reach whoever reads it.
    pub fn pacing(&self) -> Pacing {
        match self {
            // A pooled connection is a task of its own, handing the body
            // one frame per run.
            Self::Pooled(_) => Pacing::OtherTasks,
            Self::Direct(_) => Pacing::SameTask,
        }
    }

    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, UpstreamError>> + Send + 'static {
        match self {
            Self::Pooled(answer) => Either::Left(
                answer
                    .bytes_stream()
                    .map(|chunk| chunk.map_err(UpstreamError::from)),
            ),
            Self::Direct(body) => {
                Either::Right(body.map(|chunk| chunk.map_err(UpstreamError::from)))
            }
        }
    }

    /// The whole body as text (invalid UTF-8 replaced).
    pub async fn text(self) -> Result<String, UpstreamError> {
        Ok(String::from_utf8_lossy(&self.bytes().await?).into_owned())
    }

    /// The whole body.
    pub async fn bytes(self) -> Result<Bytes, UpstreamError> {
        match self {
            Self::Pooled(answer) => Ok(answer.bytes().await?),
            Self::Direct(body) => Ok(body.bytes().await?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::direct_http::DirectHttpSettings;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server answering every request on every connection with `ok`,
    /// sending back the request head it read as the body.
    async fn echo_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buffer = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut buffer).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buffer[..n]);
                        // Bodies here are small: answer once the body came.
                        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n")
                            && seen.ends_with(b"}")
                        {
                            let head = seen[..end].to_vec();
                            let answer = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                                head.len()
                            );
                            let _ = socket.write_all(answer.as_bytes()).await;
                            let _ = socket.write_all(&head).await;
                            seen.clear();
                        }
                    }
                });
            }
        });
        format!("http://127.0.0.1:{port}/v1/messages")
    }

    #[tokio::test]
    async fn plain_http_goes_direct_only_when_a_direct_client_is_given() {
        let url = echo_server().await;
        let pooled = reqwest::Client::new();
        let direct = DirectHttp::new(DirectHttpSettings::default());
        let configured = ProviderHttp::new(&pooled, Some(&direct));
        let answer = configured
            .post(url.clone())
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        assert!(matches!(answer.body, UpstreamBody::Direct(_)));
        assert_eq!(answer.body.pacing(), Pacing::SameTask);
        // Endpoints a request named: never the direct client, whatever the
        // scheme (their names must pass the egress resolver).
        let caller_named = ProviderHttp::new(&pooled, None);
        let answer = caller_named
            .post(url)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        assert!(matches!(answer.body, UpstreamBody::Pooled(_)));
        assert_eq!(answer.body.pacing(), Pacing::OtherTasks);
    }

    #[tokio::test]
    async fn headers_are_set_as_the_builder_says() {
        let url = echo_server().await;
        let pooled = reqwest::Client::new();
        let direct = DirectHttp::new(DirectHttpSettings::default());
        let mut first = HeaderMap::new();
        first.insert("x-trace", HeaderValue::from_static("one"));
        let mut second = HeaderMap::new();
        second.insert("x-trace", HeaderValue::from_static("two"));
        let answer = ProviderHttp::new(&pooled, Some(&direct))
            .post(url)
            .headers(first)
            .headers(second)
            .header("X-Api-Key", "key-1")
            .json(&serde_json::json!({"a": 1}))
            .send()
            .await
            .unwrap();
        let head = answer.body.text().await.unwrap().to_ascii_lowercase();
        let lines: Vec<&str> = head.lines().collect();
        for expected in [
            "x-trace: two",
            "x-api-key: key-1",
            "content-type: application/json",
        ] {
            assert!(lines.contains(&expected), "{expected} missing in {lines:?}");
        }
        assert!(!lines.contains(&"x-trace: one"));
    }

    #[tokio::test]
    async fn a_header_that_cannot_be_sent_fails_the_call_without_its_value() {
        let pooled = reqwest::Client::new();
        let direct = DirectHttp::new(DirectHttpSettings::default());
        let http = ProviderHttp::new(&pooled, Some(&direct));
        let refused = http
            .post("http://127.0.0.1:9/v1".to_owned())
            .header("x-api-key", "secret\nInjected: yes")
            .send()
            .await;
        match refused {
            Err(err @ UpstreamError::Invalid("x-api-key")) => {
                assert!(!err.to_string().contains("secret"), "{err}");
            }
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) => panic!("sent a header with a line break"),
        }
        let refused = http
            .post("http://127.0.0.1:9/v1".to_owned())
            .header("bad header", "x")
            .send()
            .await;
        assert!(matches!(refused, Err(UpstreamError::Invalid("bad header"))));
    }

    #[test]
    fn credentials_are_marked_sensitive() {
        let pooled = reqwest::Client::new();
        let request = ProviderHttp::new(&pooled, None)
            .post("http://127.0.0.1/v1".to_owned())
            .bearer_auth("token")
            .header("x-api-key", "key")
            .header("anthropic-version", "2023-06-01");
        assert!(request.headers["authorization"].is_sensitive());
        assert_eq!(request.headers["authorization"], "Bearer token");
        assert!(request.headers["x-api-key"].is_sensitive());
        assert!(!request.headers["anthropic-version"].is_sensitive());
    }
}
