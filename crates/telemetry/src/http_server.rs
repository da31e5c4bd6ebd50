//! A server span per HTTP request, continuing the caller's trace.

use actix_web::Error;
use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use bytes::Bytes;
use opentelemetry::propagation::Extractor;
use std::pin::Pin;
use std::task::{Context, Poll};
use tracing::Instrument;

struct ActixHeaders<'a>(&'a actix_web::http::header::HeaderMap);

impl Extractor for ActixHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Use with `actix_web::middleware::from_fn(trace_requests)`. With traces off
/// it only calls the next service. The span is named after the matched route
/// (`POST /api/graphql`), never the raw path, which may hold names. It stays
/// open, and current, while a streamed body is produced, so the work a
/// stream does (an agent's model calls) belongs to the request's trace.
pub async fn trace_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody, TracedBody>>, Error> {
    if !crate::traces_enabled() {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_left_body);
    }
    let method = req.method().as_str().to_owned();
    let route = req
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let span = tracing::info_span!(
        "http.server",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    crate::propagation::continue_from(&span, &ActixHeaders(req.headers()));
    let res = next.call(req).instrument(span.clone()).await;
    match res {
        Ok(res) => {
            let status = res.status();
            span.record("http.response.status_code", status.as_u16());
            if status.is_server_error() {
                span.record("otel.status_code", "ERROR");
            }
            Ok(res.map_body(|_, body| {
                EitherBody::right(TracedBody {
                    inner: body.boxed(),
                    span,
                })
            }))
        }
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            Err(e)
        }
    }
}

/// A response body polled inside its request's span; the span ends when the
/// body is dropped.
pub struct TracedBody {
    inner: BoxBody,
    span: tracing::Span,
}

impl MessageBody for TracedBody {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.inner.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = &mut *self;
        let _entered = this.span.enter();
        Pin::new(&mut this.inner).poll_next(cx)
    }

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
