//! A server span per HTTP request, continuing the caller's trace.

use actix_web::Error;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use opentelemetry::propagation::Extractor;
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
/// (`POST /api/graphql`), never the raw path, which may hold names.
pub async fn trace_requests(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    if !crate::traces_enabled() {
        return next.call(req).await;
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
    match &res {
        Ok(res) => {
            let status = res.status();
            span.record("http.response.status_code", status.as_u16());
            if status.is_server_error() {
                span.record("otel.status_code", "ERROR");
            }
        }
        Err(_) => {
            span.record("otel.status_code", "ERROR");
        }
    }
    res
}
