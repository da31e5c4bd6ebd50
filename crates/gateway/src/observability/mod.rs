//! Logs, metrics and the per-request timing headers.
//!
//! Every response carries `X-Request-ID`, `X-Process-Time` (seconds spent on
//! the request until the response head was ready) and `X-Gateway-Overhead-Time`
//! (the same minus the time spent waiting on a model or a proxied provider, as
//! measured by the request's [`ModelWaitClock`]). Headers cannot wait for a
//! streamed body, so the request metrics are recorded when the body ends
//! instead, covering the whole stream.

mod inference;
pub mod readiness;
mod telemetry;

pub use inference::{InferenceLabels, InferenceRecorder, UNKNOWN_FEATURE_CATEGORY};
pub use telemetry::{RequestId, request_telemetry};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

tokio::task_local! {
    /// The `X-Request-ID` of the request being handled.
    static REQUEST_ID_SCOPE: std::sync::Arc<str>;
}

/// The `X-Request-ID` of the request this task is handling, if any (known
/// only while the LLM debug log is on, its one reader).
pub fn current_request_id() -> Option<String> {
    REQUEST_ID_SCOPE.try_with(|id| id.to_string()).ok()
}

/// `http_request_duration_seconds{handler,method,status}`: until the last
/// byte of the body was handed to the connection.
pub const HTTP_REQUEST_DURATION: &str = "http_request_duration_seconds";
/// `gateway_overhead_seconds{handler}`: the same minus model wait time.
pub const GATEWAY_OVERHEAD: &str = "gateway_overhead_seconds";
/// Recorded per model call by [`InferenceRecorder`].
pub const MODEL_INFERENCES_IN_FLIGHT: &str = "model_inferences_in_flight";
pub const MODEL_INFERENCES_MAX_CONCURRENT: &str = "model_inferences_max_concurrent";
pub const MODEL_INFERENCES_TOTAL: &str = "model_inferences_total";
pub const INFERENCE_REQUEST_DURATION: &str = "inference_request_duration_seconds";

/// Time one request spent waiting on models or proxied providers. Cloned
/// handles share one total, so model clients add to the clock as they wait
/// (connecting, then before each chunk) and the request telemetry reads it
/// when the response head is written and again when the body ends.
#[derive(Debug, Clone, Default)]
pub struct ModelWaitClock(Arc<AtomicU64>);

impl ModelWaitClock {
    pub fn add(&self, waited: Duration) {
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Starts timing a wait; the time is added when the guard is dropped.
    pub fn start(&self) -> WaitGuard {
        WaitGuard {
            clock: self.clone(),
            started: Instant::now(),
        }
    }

    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Awaits `fut`, counting the time as waiting.
    pub async fn time<F: std::future::Future>(&self, fut: F) -> F::Output {
        let _waiting = self.start();
        fut.await
    }
}

/// A clock is bookkeeping, not part of what a model call asks for: any two
/// compare equal so that calls holding one can still be compared in tests.
impl PartialEq for ModelWaitClock {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

/// Adds the time since [`ModelWaitClock::start`] when dropped.
#[derive(Debug)]
pub struct WaitGuard {
    clock: ModelWaitClock,
    started: Instant,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.clock.add(self.started.elapsed());
    }
}

impl actix_web::FromRequest for ModelWaitClock {
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self, Self::Error>>;

    /// The request's clock (installed by [`request_telemetry`]); a detached
    /// one when the middleware is absent, so handlers never fail on it.
    fn from_request(
        req: &actix_web::HttpRequest,
        _payload: &mut actix_web::dev::Payload,
    ) -> Self::Future {
        use actix_web::HttpMessage;
        let clock = req
            .extensions()
            .get::<ModelWaitClock>()
            .cloned()
            .unwrap_or_default();
        std::future::ready(Ok(clock))
    }
}

/// The process-wide Prometheus recorder. `metrics` allows one global
/// recorder, so every app in the process (tests start many) shares it.
#[derive(Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

static METRICS: OnceLock<Metrics> = OnceLock::new();

impl Metrics {
    /// Installs the recorder on first use and returns the shared handle.
    pub fn global() -> Metrics {
        METRICS
            .get_or_init(|| {
                // Real histograms (not summaries), from sub-millisecond
                // overheads to minute-long model calls.
                let builder = PrometheusBuilder::new()
                    .set_buckets(BUCKETS)
                    .unwrap_or_else(|_| PrometheusBuilder::new());
                let recorder = builder.build_recorder();
                let handle = recorder.handle();
                // Fails only when another recorder was installed first; the
                // handle still renders (empty) text then.
                if metrics::set_global_recorder(recorder).is_err() {
                    tracing::warn!("a metrics recorder was already installed");
                }
                describe();
                Metrics { handle }
            })
            .clone()
    }

    /// The Prometheus text exposition of every metric recorded so far.
    pub fn render(&self) -> String {
        self.handle.run_upkeep();
        self.handle.render()
    }
}

fn describe() {
    metrics::describe_histogram!(
        HTTP_REQUEST_DURATION,
        metrics::Unit::Seconds,
        "Time to answer an HTTP request, until the end of its body"
    );
    metrics::describe_histogram!(
        GATEWAY_OVERHEAD,
        metrics::Unit::Seconds,
        "Request time minus time spent waiting on models or proxied providers"
    );
    metrics::describe_gauge!(MODEL_INFERENCES_IN_FLIGHT, "Model calls in progress");
    metrics::describe_gauge!(
        MODEL_INFERENCES_MAX_CONCURRENT,
        "Configured concurrency limit of a model (exported, not enforced)"
    );
    metrics::describe_counter!(MODEL_INFERENCES_TOTAL, "Model calls made");
    metrics::describe_histogram!(
        INFERENCE_REQUEST_DURATION,
        metrics::Unit::Seconds,
        "Duration of model calls"
    );
}

/// Logging set-up for the binaries: `AIGW_LOGGING__LEVEL` (info) is an
/// env-filter directive; `AIGW_LOGGING__FORMAT_JSON` switches to JSON lines on
/// stdout (where container log collectors expect them); text goes to stderr.
/// Secrets are redacted from every line; traces are exported when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Hold the guard until the process ends.
pub fn init_logging(level: &str, json: bool) -> duo_telemetry::Telemetry {
    let target = if json {
        duo_telemetry::LogTarget::Stdout
    } else {
        duo_telemetry::LogTarget::Stderr
    };
    duo_telemetry::init(duo_telemetry::LogOptions::new("duo-gateway", level).json(json, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_clones_share_one_total() {
        let clock = ModelWaitClock::default();
        let other = clock.clone();
        other.add(Duration::from_millis(5));
        {
            let _guard = clock.start();
        }
        assert!(clock.total() >= Duration::from_millis(5));
        assert_eq!(clock.total(), other.total());
    }

    #[tokio::test]
    async fn timed_futures_add_their_wait() {
        let clock = ModelWaitClock::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let waiter = tokio::spawn({
            let clock = clock.clone();
            async move { clock.time(rx).await }
        });
        tx.send(7).unwrap();
        assert_eq!(waiter.await.unwrap().unwrap(), 7);
        // The wait was short but real: the clock moved.
        assert!(clock.total() > Duration::ZERO);
    }
}
