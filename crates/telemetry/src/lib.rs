//! What every process of the system shares for telling operators what it
//! does: log lines (text or JSON) with secrets redacted, OpenTelemetry traces
//! exported over OTLP when the standard variables ask for it, W3C trace
//! context carried across HTTP, gRPC, WebSocket and the job queue, and the
//! LLM debug log.
//!
//! Traces are off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; then spans go, batched, to
//! `<endpoint>/v1/traces` as OTLP protobuf over HTTP, named by
//! `OTEL_SERVICE_NAME` (or the process's own default). With traces off no
//! span context is built and no `traceparent` is sent, so the hot paths pay
//! nothing for them.

mod http_server;
mod llm_debug;
pub mod propagation;
mod redact;

pub use http_server::trace_requests;
pub use llm_debug::{
    DEFAULT_PATH as LLM_DEBUG_DEFAULT_PATH, LlmDebugLog, llm_debug_log, switch_on,
};
pub use propagation::{
    TRACEPARENT, continue_from_headers, continue_from_traceparent, current_headers,
    current_trace_id, current_traceparent, inject, outgoing_headers,
};
pub use redact::{REDACTED, Redacting, RedactingWriter, redact};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

static TRACES: AtomicBool = AtomicBool::new(false);
static CONTENT: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (an OTLP endpoint is configured).
pub fn traces_enabled() -> bool {
    TRACES.load(Ordering::Relaxed)
}

/// Whether the operator opted in to prompts and answers on spans
/// (`DUO_OTEL_EXPORT_CONTENT`); even then they pass through [`redact`].
pub fn content_export_enabled() -> bool {
    traces_enabled() && CONTENT.load(Ordering::Relaxed)
}

/// Where log lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTarget {
    Stdout,
    Stderr,
}

/// How a process wants its logs.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// The service name when `OTEL_SERVICE_NAME` is not set.
    pub service: &'static str,
    /// An `EnvFilter` directive (`info`, `warn,gateway=debug`).
    pub filter: String,
    /// One JSON object per line instead of text.
    pub json: bool,
    pub target: LogTarget,
}

impl LogOptions {
    /// Text on stderr at `filter`.
    pub fn new(service: &'static str, filter: impl Into<String>) -> Self {
        Self {
            service,
            filter: filter.into(),
            json: false,
            target: LogTarget::Stderr,
        }
    }

    pub fn json(mut self, json: bool, target: LogTarget) -> Self {
        self.json = json;
        self.target = target;
        self
    }
}

/// Keeps the trace exporter alive; dropping it flushes the spans still
/// batched (hold it in `main` until the process ends).
#[derive(Debug, Default)]
#[must_use = "dropping the guard stops exporting traces"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans batched so far now (tests, and before a process exits
    /// without unwinding).
    pub fn flush(&self) {
        if let Some(provider) = &self.provider {
            let _ = provider.force_flush();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn wants_traces() -> bool {
    let endpoint =
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
    endpoint.is_some()
        && !switch_on(env("OTEL_SDK_DISABLED").as_deref())
        && env("OTEL_TRACES_EXPORTER").is_none_or(|e| e.trim() != "none")
}

fn tracer_provider(service: &'static str) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| e.to_string())?;
    let resource = if env("OTEL_SERVICE_NAME").is_some() {
        opentelemetry_sdk::Resource::builder().build()
    } else {
        opentelemetry_sdk::Resource::builder()
            .with_service_name(service)
            .build()
    };
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

fn log_layer(options: &LogOptions) -> BoxedLayer {
    let filter = EnvFilter::try_new(&options.filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let layer = tracing_subscriber::fmt::layer();
    match (options.json, options.target) {
        (true, LogTarget::Stdout) => layer
            .json()
            .with_writer(RedactingWriter(std::io::stdout))
            .with_filter(filter)
            .boxed(),
        (true, LogTarget::Stderr) => layer
            .json()
            .with_writer(RedactingWriter(std::io::stderr))
            .with_filter(filter)
            .boxed(),
        (false, LogTarget::Stdout) => layer
            .with_writer(RedactingWriter(std::io::stdout))
            .with_filter(filter)
            .boxed(),
        (false, LogTarget::Stderr) => layer
            .with_writer(RedactingWriter(std::io::stderr))
            .with_filter(filter)
            .boxed(),
    }
}

/// Installs logging (and, when configured, trace export and the LLM debug
/// log) for this process. Returns a guard to hold until the process ends. A
/// second call (tests) keeps the first subscriber.
pub fn init(options: LogOptions) -> Telemetry {
    let mut layers = vec![log_layer(&options)];
    let mut provider = None;
    let mut problem = None;
    if wants_traces() {
        match tracer_provider(options.service) {
            Ok(built) => {
                let tracer = built.tracer("duo");
                // Spans from this system's crates at INFO and above; the
                // libraries' own spans (HTTP clients, pools) stay out.
                let filter = EnvFilter::try_new(
                    env("DUO_OTEL_TRACES_FILTER").unwrap_or_else(|| "info".to_owned()),
                )
                .unwrap_or_else(|_| EnvFilter::new("info"));
                layers.push(
                    tracing_opentelemetry::layer()
                        .with_tracer(tracer)
                        .with_filter(filter)
                        .boxed(),
                );
                provider = Some(built);
            }
            Err(e) => problem = Some(e),
        }
    }
    let installed = tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .is_ok();
    if installed && provider.is_some() {
        TRACES.store(true, Ordering::Relaxed);
        CONTENT.store(
            switch_on(env("DUO_OTEL_EXPORT_CONTENT").as_deref()),
            Ordering::Relaxed,
        );
        tracing::info!(service = options.service, "exporting traces over OTLP");
    }
    if let Some(problem) = problem {
        tracing::warn!(error = %problem, "traces are not exported: the OTLP exporter could not be set up");
    }
    llm_debug::init(options.service);
    Telemetry {
        provider: if installed { provider } else { None },
    }
}
