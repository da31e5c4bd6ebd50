//! The outermost middleware: correlation id, timing headers and request metrics.
//!
//! The headers describe the request up to its response head (nothing later
//! can be put in a header); the metrics are recorded when the body has been
//! sent, so a streamed answer is counted whole.

use super::{GATEWAY_OVERHEAD, HTTP_REQUEST_DURATION, ModelWaitClock};
use crate::recent_values::RecentValues;
use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage};
use bytes::Bytes;
use contracts::headers;
use std::cell::RefCell;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use std::time::Instant;

/// The correlation id of a request (`X-Request-ID`), in request extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// Label for requests that matched no route, so raw paths never become labels.
const UNMATCHED_HANDLER: &str = "none";

fn accepted_request_id(value: Option<&HeaderValue>) -> Option<String> {
    let text = value?.to_str().ok()?;
    let ok = !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    ok.then(|| text.to_owned())
}

/// A fresh random (version 4) request id, from the thread's generator: the
/// operating system's, which `Uuid::new_v4` asks, costs a system call per
/// request.
fn new_request_id() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .simple()
        .to_string()
}

/// A duration in seconds with six decimals, rounded to the microsecond, as
/// `{:.6}` prints it (a tie of exactly half a microsecond may round the
/// other way); integers only, as it runs twice per request.
fn seconds_to_micros(duration: Duration) -> String {
    let micros = (duration.as_nanos() + 500) / 1000;
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// Use with `actix_web::middleware::from_fn(request_telemetry)`, wrapped last
/// so that it times everything, authentication failures included.
pub async fn request_telemetry(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let started = Instant::now();
    let request_id =
        accepted_request_id(req.headers().get(headers::REQUEST_ID)).unwrap_or_else(new_request_id);
    let clock = ModelWaitClock::default();
    req.extensions_mut().insert(clock.clone());
    req.extensions_mut().insert(RequestId(request_id.clone()));
    let method = method_label(req.method());

    // With the LLM debug log on, whatever runs for this request (model calls,
    // in the handler or while its body streams) knows the request's id.
    let debug_id: Option<std::sync::Arc<str>> = duo_telemetry::llm_debug_log()
        .is_some()
        .then(|| request_id.as_str().into());
    let mut res = match &debug_id {
        Some(id) => {
            super::REQUEST_ID_SCOPE
                .scope(id.clone(), next.call(req))
                .await?
        }
        None => next.call(req).await?,
    };

    let elapsed = started.elapsed();
    let overhead = elapsed.saturating_sub(clock.total());
    let handler = res
        .request()
        .match_pattern()
        .unwrap_or_else(|| UNMATCHED_HANDLER.to_owned());
    let status = res.status().as_u16();
    let finish = RecordOnEnd {
        started,
        clock,
        handler,
        method,
        status,
    };

    let out = res.headers_mut();
    for (name, value) in [
        (headers::REQUEST_ID, request_id),
        (headers::PROCESS_TIME, seconds_to_micros(elapsed)),
        (headers::GATEWAY_OVERHEAD, seconds_to_micros(overhead)),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            out.insert(HeaderName::from_static(name), value);
        }
    }
    Ok(res.map_into_boxed_body().map_body(|_, body| TimedBody {
        inner: body,
        finish: Some(finish),
        debug_id,
    }))
}

/// The request metrics, recorded once the body is done.
struct RecordOnEnd {
    started: Instant,
    clock: ModelWaitClock,
    handler: String,
    method: &'static str,
    status: u16,
}

/// The `method` label: the standard methods by name, any other as `other`,
/// so that a caller cannot add label values (and series) of its own making.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::HEAD,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    KNOWN
        .iter()
        .find(|known| *known == method)
        .map_or("other", |known| known.as_str())
}

/// (handler, method, status) label sets whose histograms a worker thread
/// keeps at hand, the oldest dropped first. Handlers are route patterns and
/// methods a fixed list, so in practice a few dozen.
const KEPT_REQUEST_HISTOGRAMS: usize = 64;

type RequestLabels = (String, &'static str, u16);
type RequestHistograms = (metrics::Histogram, metrics::Histogram);

thread_local! {
    /// The request histograms by label set: looked up in the recorder once,
    /// not on every request (building the key and finding its series cost
    /// more than the rest of the request's telemetry).
    static REQUEST_HISTOGRAMS: RefCell<RecentValues<RequestLabels, RequestHistograms>> =
        const { RefCell::new(RecentValues::new(KEPT_REQUEST_HISTOGRAMS)) };
}

impl RecordOnEnd {
    fn record(self) {
        let elapsed = self.started.elapsed();
        let overhead = elapsed.saturating_sub(self.clock.total());
        let labels = (self.handler, self.method, self.status);
        let (duration, gateway_overhead) = REQUEST_HISTOGRAMS.with_borrow_mut(|kept| {
            kept.get_or_insert_with(&labels, || {
                // Handles taken before the recorder is installed would count
                // nothing, for as long as they are kept.
                super::Metrics::global();
                let (handler, method, status) = labels.clone();
                let histograms = (
                    metrics::histogram!(HTTP_REQUEST_DURATION, "handler" => handler.clone(), "method" => method, "status" => status.to_string()),
                    metrics::histogram!(GATEWAY_OVERHEAD, "handler" => handler),
                );
                (labels.clone(), histograms)
            })
        });
        duration.record(elapsed.as_secs_f64());
        gateway_overhead.record(overhead.as_secs_f64());
    }
}

/// A response body that records the request metrics when it ends: at its
/// last chunk, on a failure, or when dropped (the client went away).
struct TimedBody {
    inner: BoxBody,
    finish: Option<RecordOnEnd>,
    /// The request id for code run while the body streams (LLM debug log on).
    debug_id: Option<std::sync::Arc<str>>,
}

impl TimedBody {
    fn finish(&mut self) {
        if let Some(finish) = self.finish.take() {
            finish.record();
        }
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        self.finish();
    }
}

impl MessageBody for TimedBody {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.inner.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let polled = match self.debug_id.clone() {
            Some(id) => {
                let inner = &mut self.inner;
                super::REQUEST_ID_SCOPE.sync_scope(id, || Pin::new(inner).poll_next(cx))
            }
            None => Pin::new(&mut self.inner).poll_next(cx),
        };
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.finish();
        }
        polled
    }

    /// Keeps actix's shortcut for bodies that are already complete.
    fn try_into_bytes(mut self) -> Result<Bytes, Self> {
        let inner = std::mem::replace(&mut self.inner, BoxBody::new(()));
        match inner.try_into_bytes() {
            Ok(bytes) => Ok(bytes),
            Err(inner) => {
                self.inner = inner;
                Err(self)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_standard_methods_are_label_values() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::OPTIONS), "OPTIONS");
        let made_up = Method::from_bytes(b"BREWCOFFEE").unwrap();
        assert_eq!(method_label(&made_up), "other");
    }

    #[test]
    fn durations_print_as_seconds_with_six_decimals() {
        for nanos in [
            0,
            1,
            499,
            501,
            999_999,
            1_000_000_499,
            12_345_678_901,
            3_999_999_600,
        ] {
            let duration = Duration::from_nanos(nanos);
            assert_eq!(
                seconds_to_micros(duration),
                format!("{:.6}", duration.as_secs_f64()),
                "{nanos} ns"
            );
        }
    }

    #[test]
    fn request_ids_are_checked() {
        let ok = HeaderValue::from_static("abc-123_x.y:z");
        assert_eq!(
            accepted_request_id(Some(&ok)).as_deref(),
            Some("abc-123_x.y:z")
        );
        let bad = HeaderValue::from_static("has space");
        assert_eq!(accepted_request_id(Some(&bad)), None);
        let long = HeaderValue::from_str(&"a".repeat(200)).unwrap();
        assert_eq!(accepted_request_id(Some(&long)), None);
        assert_eq!(accepted_request_id(None), None);
    }

    #[test]
    fn fresh_request_ids_are_random_version_4_uuids() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_request_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in ids.iter().take(20) {
            assert_eq!(id.len(), 32);
            let parsed = uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(parsed.get_version(), Some(uuid::Version::Random));
            assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
            // What a client may send back as its own id is accepted again.
            let header = HeaderValue::from_str(id).unwrap();
            assert_eq!(
                accepted_request_id(Some(&header)).as_deref(),
                Some(id.as_str())
            );
        }
    }
}
