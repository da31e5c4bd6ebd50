//! W3C trace context (`traceparent`, `tracestate`) across every hop: HTTP
//! headers, gRPC metadata (both `http::HeaderMap`s underneath), and the
//! text stored with a queued job.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header that carries the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// One `traceparent` value, as stored with a job.
struct Single<'a>(Option<&'a str>);

impl Extractor for Single<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0).flatten()
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

#[derive(Default)]
struct Collect(Option<String>);

impl Injector for Collect {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.0 = Some(value);
        }
    }
}

/// Adds the current span's `traceparent` (and `tracestate`) to outgoing
/// headers. Does nothing when traces are off, so no header is sent then.
pub fn inject(headers: &mut http::HeaderMap) {
    if !crate::traces_enabled() {
        return;
    }
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
}

/// `traceparent` and `tracestate` of the current span, as name/value pairs,
/// for clients that do not take an `http::HeaderMap` (WebSocket handshakes).
pub fn current_headers() -> Vec<(&'static str, String)> {
    let mut headers = http::HeaderMap::new();
    inject(&mut headers);
    [TRACEPARENT, TRACESTATE]
        .into_iter()
        .filter_map(|name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| (name, v.to_owned()))
        })
        .collect()
}

/// The current span's `traceparent`, to store with work that continues
/// elsewhere (a queued job); `None` when traces are off.
pub fn current_traceparent() -> Option<String> {
    if !crate::traces_enabled() {
        return None;
    }
    let context = tracing::Span::current().context();
    let mut out = Collect::default();
    TraceContextPropagator::new().inject_context(&context, &mut out);
    out.0
}

/// The current trace's id (32 hex digits), for log lines and the LLM debug
/// log; `None` when traces are off or no span is active.
pub fn current_trace_id() -> Option<String> {
    if !crate::traces_enabled() {
        return None;
    }
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

/// Makes `span` a child of the trace context carried by `headers`, if any.
/// A malformed `traceparent` is ignored (the span starts a new trace).
pub fn continue_from_headers(span: &tracing::Span, headers: &http::HeaderMap) {
    if !crate::traces_enabled() || !headers.contains_key(TRACEPARENT) {
        return;
    }
    continue_from(span, &HeaderExtractor(headers));
}

/// Makes `span` a child of the trace context any header source carries.
pub fn continue_from(span: &tracing::Span, headers: &dyn Extractor) {
    if !crate::traces_enabled() {
        return;
    }
    let context = TraceContextPropagator::new().extract(headers);
    set_parent(span, context);
}

/// Makes `span` a child of a stored `traceparent`.
pub fn continue_from_traceparent(span: &tracing::Span, traceparent: Option<&str>) {
    if !crate::traces_enabled() || traceparent.is_none() {
        return;
    }
    let context = TraceContextPropagator::new().extract(&Single(traceparent));
    set_parent(span, context);
}

fn set_parent(span: &tracing::Span, context: opentelemetry::Context) {
    if context.span().span_context().is_valid() {
        // Fails only for a span already started elsewhere; the span then
        // keeps its own trace, which is the safe outcome.
        let _ = span.set_parent(context);
    }
}

/// The trace context headers for an outgoing request (empty when traces are
/// off): `request.headers(duo_telemetry::outgoing_headers())`.
pub fn outgoing_headers() -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    inject(&mut headers);
    headers
}
