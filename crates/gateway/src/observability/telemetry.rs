//! The outermost middleware: correlation id, timing headers and request metrics.

use super::{GATEWAY_OVERHEAD, HTTP_REQUEST_DURATION, ModelWaitClock};
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage};
use contracts::headers;
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

/// Use with `actix_web::middleware::from_fn(request_telemetry)`, wrapped last
/// so that it times everything, authentication failures included.
pub async fn request_telemetry(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let started = Instant::now();
    let request_id = accepted_request_id(req.headers().get(headers::REQUEST_ID))
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let clock = ModelWaitClock::default();
    req.extensions_mut().insert(clock.clone());
    req.extensions_mut().insert(RequestId(request_id.clone()));
    let method = req.method().to_string();

    let mut res = next.call(req).await?;

    let elapsed = started.elapsed();
    let overhead = elapsed.saturating_sub(clock.total());
    let handler = res
        .request()
        .match_pattern()
        .unwrap_or_else(|| UNMATCHED_HANDLER.to_owned());
    let status = res.status().as_u16().to_string();
    metrics::histogram!(HTTP_REQUEST_DURATION, "handler" => handler.clone(), "method" => method, "status" => status)
        .record(elapsed.as_secs_f64());
    metrics::histogram!(GATEWAY_OVERHEAD, "handler" => handler).record(overhead.as_secs_f64());

    let out = res.headers_mut();
    for (name, value) in [
        (headers::REQUEST_ID, request_id),
        (
            headers::PROCESS_TIME,
            format!("{:.6}", elapsed.as_secs_f64()),
        ),
        (
            headers::GATEWAY_OVERHEAD,
            format!("{:.6}", overhead.as_secs_f64()),
        ),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            out.insert(HeaderName::from_static(name), value);
        }
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
