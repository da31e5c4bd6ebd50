//! Per-call model metrics, shared by the model router and the proxies.

use super::{
    INFERENCE_REQUEST_DURATION, MODEL_INFERENCES_IN_FLIGHT, MODEL_INFERENCES_MAX_CONCURRENT,
    MODEL_INFERENCES_TOTAL,
};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram};

use crate::recent_values::RecentValues;

/// Distinct `model_name` label values a process gives out; any later name
/// is labelled [`OTHER_MODEL_NAME`]. A request can name its own self-hosted
/// model, so without a cap every new name would add series for good.
pub const MAX_MODEL_NAME_LABELS: usize = 256;

/// The `model_name` of calls past [`MAX_MODEL_NAME_LABELS`] distinct names.
pub const OTHER_MODEL_NAME: &str = "other";

static MODEL_NAME_LABELS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The `model_name` label for `model`: its own name while fewer than
/// [`MAX_MODEL_NAME_LABELS`] names are in use (or it is one of them),
/// [`OTHER_MODEL_NAME`] after. Called once per label set, when a worker
/// thread first makes its handles ([`CallMetrics`]), not per call.
fn model_label(model: &str) -> String {
    let Ok(mut names) = MODEL_NAME_LABELS.lock() else {
        return OTHER_MODEL_NAME.to_owned();
    };
    if names.contains(model) {
        return model.to_owned();
    }
    if names.len() < MAX_MODEL_NAME_LABELS {
        names.insert(model.to_owned());
        return model.to_owned();
    }
    OTHER_MODEL_NAME.to_owned()
}

/// The `feature_category` of calls made outside any known feature.
pub const UNKNOWN_FEATURE_CATEGORY: &str = "unknown";

/// What one model call is labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InferenceLabels {
    /// `model_engine`: `anthropic`, `openai_compatible`, `vertex_ai`, `mock`.
    pub engine: &'static str,
    pub model: String,
    pub feature_category: &'static str,
    /// Whether the provider was asked for a stream.
    pub streaming: bool,
}

/// Counts one call in flight from [`InferenceRecorder::start`] until it is
/// dropped, then records it as finished or failed.
///
/// With traces on it also holds the call's span (GenAI semantic attributes:
/// model, tokens in and out, time to first token, error); run the provider
/// request inside [`InferenceRecorder::span`] so its `traceparent` names it.
#[derive(Debug)]
pub struct InferenceRecorder {
    labels: InferenceLabels,
    metrics: Arc<CallMetrics>,
    started: Instant,
    failed: bool,
    span: tracing::Span,
    first_token: bool,
    output_chars: usize,
    /// With the LLM debug log on: the request id and the answer so far.
    debug: Option<DebugCapture>,
}

#[derive(Debug)]
struct DebugCapture {
    log: &'static duo_telemetry::LlmDebugLog,
    request_id: Option<String>,
    answer: String,
    error: Option<String>,
}

/// Tokens from characters, for providers that report no usage (about four
/// characters a token for English text and code).
fn estimated_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX)
}

impl InferenceRecorder {
    /// `max_concurrent` is the operator's configured limit for this engine
    /// and model (`AIGW_MODEL_ENGINE_CONCURRENCY_LIMITS`); it is exported,
    /// not enforced, as GitLab's gateway does.
    pub fn start(labels: InferenceLabels, max_concurrent: Option<u32>) -> Self {
        let metrics = CallMetrics::of(&labels);
        metrics.in_flight.increment(1.0);
        if let Some(limit) = max_concurrent {
            let (engine, model) = (labels.engine, metrics.model_name.clone());
            metrics::gauge!(MODEL_INFERENCES_MAX_CONCURRENT, "model_engine" => engine, "model_name" => model)
                .set(f64::from(limit));
        }
        let span = if duo_telemetry::traces_enabled() {
            tracing::info_span!(
                "gen_ai.chat",
                otel.name = %format!("chat {}", labels.model),
                otel.kind = "client",
                gen_ai.operation.name = "chat",
                gen_ai.system = labels.engine,
                gen_ai.request.model = %labels.model,
                duo.feature_category = labels.feature_category,
                duo.streaming = labels.streaming,
                gen_ai.usage.input_tokens = tracing::field::Empty,
                gen_ai.usage.output_tokens = tracing::field::Empty,
                duo.usage.estimated = tracing::field::Empty,
                duo.time_to_first_token_ms = tracing::field::Empty,
                error.type = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
                gen_ai.prompt = tracing::field::Empty,
                gen_ai.completion = tracing::field::Empty,
            )
        } else {
            tracing::Span::none()
        };
        Self {
            labels,
            metrics,
            started: Instant::now(),
            failed: false,
            span,
            first_token: false,
            output_chars: 0,
            debug: duo_telemetry::llm_debug_log().map(|log| DebugCapture {
                log,
                request_id: super::current_request_id(),
                answer: String::new(),
                error: None,
            }),
        }
    }

    pub fn fail(&mut self) {
        self.failed = true;
        self.span.record("otel.status_code", "ERROR");
    }

    /// Fails the call with a reason for its span (`error.type`).
    pub fn fail_with(&mut self, error: &impl std::fmt::Display) {
        self.fail();
        let error = error.to_string();
        self.span.record("error.type", error.as_str());
        if let Some(debug) = &mut self.debug {
            debug.error = Some(error);
        }
    }

    /// The call's span (disabled with traces off).
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    /// What the call sends (built only with traces on): its size gives the
    /// estimated input tokens, and its text goes on the span only when the
    /// operator opted in to content export.
    pub fn prompt(&self, text: impl FnOnce() -> String) {
        if self.span.is_disabled() && self.debug.is_none() {
            return;
        }
        let text = text();
        if let Some(debug) = &self.debug {
            debug.log.record(
                "request",
                debug.request_id.as_deref(),
                serde_json::json!({
                    "engine": self.labels.engine,
                    "model": self.labels.model,
                    "feature_category": self.labels.feature_category,
                    "prompt": text,
                }),
            );
        }
        if self.span.is_disabled() {
            return;
        }
        self.span
            .record("gen_ai.usage.input_tokens", estimated_tokens(text.len()));
        self.span.record("duo.usage.estimated", true);
        if duo_telemetry::content_export_enabled() {
            self.span
                .record("gen_ai.prompt", duo_telemetry::redact(&text).as_ref());
        }
    }

    /// Something the model answered besides text (tool calls), for the LLM
    /// debug log only.
    pub fn debug_output(&mut self, describe: impl FnOnce() -> String) {
        if let Some(debug) = &mut self.debug {
            debug.answer.push_str(&describe());
        }
    }

    /// A piece of the answer arrived: the first one sets the time to first token.
    pub fn output(&mut self, text: &str) {
        if !self.first_token {
            self.first_token = true;
            let ttft = self.started.elapsed().as_secs_f64() * 1000.0;
            self.span.record("duo.time_to_first_token_ms", ttft);
        }
        self.output_chars += text.chars().count();
        if let Some(debug) = &mut self.debug {
            debug.answer.push_str(text);
        }
    }
}

impl Drop for InferenceRecorder {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        if !self.span.is_disabled() {
            self.span.record(
                "gen_ai.usage.output_tokens",
                estimated_tokens(self.output_chars),
            );
        }
        if let Some(debug) = self.debug.take() {
            debug.log.record(
                if self.failed { "error" } else { "response" },
                debug.request_id.as_deref(),
                serde_json::json!({
                    "engine": self.labels.engine,
                    "model": self.labels.model,
                    "feature_category": self.labels.feature_category,
                    "duration_ms": elapsed.as_secs_f64() * 1000.0,
                    "answer": debug.answer,
                    "error": debug.error,
                }),
            );
        }
        self.metrics.in_flight.decrement(1.0);
        let (finished, duration) = self.metrics.outcome(&self.labels, self.failed);
        finished.increment(1);
        duration.record(elapsed.as_secs_f64());
    }
}

/// The metric handles of one label set. Looking a handle up by its labels
/// (hashing and sorting them, for three metrics) cost more instructions
/// than anything else in recording a call, so each worker thread keeps the
/// handles of the label sets it has seen.
#[derive(Debug)]
struct CallMetrics {
    /// The `model_name` label of this label set ([`model_label`]).
    model_name: String,
    in_flight: Gauge,
    /// The calls finished and their durations, by outcome (`[succeeded,
    /// failed]`), each registered when a call first ends that way, so no
    /// series of zeros appears for an outcome never seen.
    outcomes: [OnceLock<(Counter, Histogram)>; 2],
}

/// Label sets each worker thread keeps handles for (the oldest goes first:
/// a caller naming ever new self-hosted models only has its handles looked
/// up again, each the same series).
const KEPT_LABEL_SETS: usize = 64;

thread_local! {
    static KEPT_METRICS: RefCell<RecentValues<InferenceLabels, Arc<CallMetrics>>> =
        const { RefCell::new(RecentValues::new(KEPT_LABEL_SETS)) };
}

impl CallMetrics {
    fn of(labels: &InferenceLabels) -> Arc<Self> {
        KEPT_METRICS.with_borrow_mut(|kept| {
            kept.get_or_insert_with(labels, || {
                // Handles taken before the recorder is installed would count
                // nothing, forever: install it first.
                super::Metrics::global();
                (labels.clone(), Arc::new(Self::registered(labels)))
            })
        })
    }

    fn registered(labels: &InferenceLabels) -> Self {
        let (engine, model_name) = (labels.engine, model_label(&labels.model));
        Self {
            in_flight: metrics::gauge!(MODEL_INFERENCES_IN_FLIGHT, "model_engine" => engine, "model_name" => model_name.clone()),
            model_name,
            outcomes: [OnceLock::new(), OnceLock::new()],
        }
    }

    fn outcome(&self, labels: &InferenceLabels, failed: bool) -> &(Counter, Histogram) {
        self.outcomes[usize::from(failed)].get_or_init(|| {
            let InferenceLabels {
                engine,
                feature_category,
                streaming,
                ..
            } = *labels;
            let model = self.model_name.clone();
            let error = if failed { "yes" } else { "no" };
            let streaming = if streaming { "yes" } else { "no" };
            let finished = metrics::counter!(
                MODEL_INFERENCES_TOTAL,
                "model_engine" => engine,
                "model_name" => model.clone(),
                "error" => error,
                "streaming" => streaming,
                "feature_category" => feature_category
            );
            let duration = metrics::histogram!(
                INFERENCE_REQUEST_DURATION,
                "model_engine" => engine,
                "model_name" => model,
                "error" => error,
                "streaming" => streaming,
                "feature_category" => feature_category
            );
            (finished, duration)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample of `metric` whose labels hold every one of `parts`.
    fn sample(text: &str, metric: &str, parts: &[&str]) -> Option<f64> {
        text.lines()
            .filter(|line| line.starts_with(&format!("{metric}{{")))
            .find(|line| parts.iter().all(|part| line.contains(part)))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
    }

    #[test]
    fn model_names_past_the_cap_share_one_label() {
        let metrics = super::super::Metrics::global();
        let names: Vec<String> = (0..MAX_MODEL_NAME_LABELS + 40)
            .map(|i| format!("caller-named-{i}"))
            .collect();
        for name in &names {
            let labels = InferenceLabels {
                engine: "openai_compatible",
                model: name.clone(),
                feature_category: "duo_chat",
                streaming: true,
            };
            drop(InferenceRecorder::start(labels, None));
        }
        let text = metrics.render();
        let labelled: std::collections::HashSet<&str> = text
            .lines()
            .filter(|line| line.starts_with(&format!("{MODEL_INFERENCES_TOTAL}{{")))
            .filter_map(|line| line.split("model_name=\"").nth(1)?.split('"').next())
            .collect();
        assert!(
            labelled.len() <= MAX_MODEL_NAME_LABELS + 1,
            "{}",
            labelled.len()
        );
        assert!(labelled.contains(OTHER_MODEL_NAME));
        assert!(labelled.contains("caller-named-0"));
        assert!(!labelled.contains(format!("caller-named-{}", names.len() - 1).as_str()));
        // The names past the cap are all counted, under `other`.
        let other = format!("model_name=\"{OTHER_MODEL_NAME}\"");
        let past_cap = sample(&text, MODEL_INFERENCES_TOTAL, &[&other]).unwrap_or(0.0);
        assert!(past_cap >= 40.0, "{past_cap}");
        // A name given out before the cap keeps its own label.
        assert_eq!(model_label("caller-named-0"), "caller-named-0");
    }

    #[test]
    fn kept_handles_count_every_call_and_show_only_outcomes_seen() {
        let metrics = super::super::Metrics::global();
        let labels = InferenceLabels {
            engine: "mock",
            model: "kept-handles-model".into(),
            feature_category: "duo_chat",
            streaming: true,
        };
        let model = "model_name=\"kept-handles-model\"";
        for _ in 0..3 {
            drop(InferenceRecorder::start(labels.clone(), None));
        }
        let text = metrics.render();
        let total = MODEL_INFERENCES_TOTAL;
        assert_eq!(sample(&text, total, &[model, "error=\"no\""]), Some(3.0));
        assert_eq!(sample(&text, total, &[model, "error=\"yes\""]), None);
        let in_flight = InferenceRecorder::start(labels.clone(), None);
        let text = metrics.render();
        assert_eq!(
            sample(&text, MODEL_INFERENCES_IN_FLIGHT, &[model]),
            Some(1.0)
        );
        drop(in_flight);
        let mut failed = InferenceRecorder::start(labels.clone(), None);
        failed.fail();
        drop(failed);
        // Other labels are other series.
        let other = InferenceLabels {
            streaming: false,
            ..labels
        };
        drop(InferenceRecorder::start(other, None));
        let text = metrics.render();
        assert_eq!(
            sample(&text, total, &[model, "error=\"yes\"", "streaming=\"yes\""]),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, total, &[model, "error=\"no\"", "streaming=\"yes\""]),
            Some(4.0)
        );
        assert_eq!(
            sample(&text, total, &[model, "error=\"no\"", "streaming=\"no\""]),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, MODEL_INFERENCES_IN_FLIGHT, &[model]),
            Some(0.0)
        );
        let count = format!("{INFERENCE_REQUEST_DURATION}_count");
        assert_eq!(
            sample(&text, &count, &[model, "error=\"no\"", "streaming=\"yes\""]),
            Some(4.0)
        );
    }
}
