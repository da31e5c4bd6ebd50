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

    /// Sets one header; a value that is not a valid header fails the call.
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        match HeaderValue::from_str(value) {
            Ok(mut value) => {
                // Keys and tokens are kept out of HTTP/2's header index.
                value.set_sensitive(SENSITIVE.contains(&name));
                self.headers.insert(HeaderName::from_static(name), value);
            }
            Err(_) => self.invalid = Some(name),
        }
        self
    }

    /// `Authorization: Bearer {token}`.
    pub fn bearer_auth(self, token: &str) -> Self {
        self.header("authorization", &format!("Bearer {token}"))
    }

    /// The body as JSON, with its content type.
    pub fn json<T: serde::Serialize + ?Sized>(mut self, body: &T) -> Self {
        match serde_json::to_vec(body) {
            Ok(bytes) => {
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
        let bytes = self.bytes().await?;
        Ok(match String::from_utf8(bytes.to_vec()) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        })
    }

    /// The whole body.
    pub async fn bytes(self) -> Result<Bytes, UpstreamError> {
        match self {
            Self::Pooled(answer) => Ok(answer.bytes().await?),
            Self::Direct(body) => Ok(body.bytes().await?),
        }
    }
}
