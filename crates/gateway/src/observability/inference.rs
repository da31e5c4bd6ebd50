//! Per-call model metrics, shared by the model router and the proxies.

use super::{
    INFERENCE_REQUEST_DURATION, MODEL_INFERENCES_IN_FLIGHT, MODEL_INFERENCES_MAX_CONCURRENT,
    MODEL_INFERENCES_TOTAL,
};
use std::time::Instant;

/// The `feature_category` of calls made outside any known feature.
pub const UNKNOWN_FEATURE_CATEGORY: &str = "unknown";

/// What one model call is labelled with.
#[derive(Debug, Clone)]
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
#[derive(Debug)]
pub struct InferenceRecorder {
    labels: InferenceLabels,
    started: Instant,
    failed: bool,
}

impl InferenceRecorder {
    /// `max_concurrent` is the operator's configured limit for this engine
    /// and model (`AIGW_MODEL_ENGINE_CONCURRENCY_LIMITS`); it is exported,
    /// not enforced, as GitLab's gateway does.
    pub fn start(labels: InferenceLabels, max_concurrent: Option<u32>) -> Self {
        let engine = labels.engine;
        let model = labels.model.clone();
        metrics::gauge!(MODEL_INFERENCES_IN_FLIGHT, "model_engine" => engine, "model_name" => model.clone())
            .increment(1.0);
        if let Some(limit) = max_concurrent {
            metrics::gauge!(MODEL_INFERENCES_MAX_CONCURRENT, "model_engine" => engine, "model_name" => model)
                .set(f64::from(limit));
        }
        Self {
            labels,
            started: Instant::now(),
            failed: false,
        }
    }

    pub fn fail(&mut self) {
        self.failed = true;
    }
}

impl Drop for InferenceRecorder {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        let InferenceLabels {
            engine,
            model,
            feature_category,
            streaming,
        } = self.labels.clone();
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let error = yes_no(self.failed);
        let streaming = yes_no(streaming);
        metrics::gauge!(MODEL_INFERENCES_IN_FLIGHT, "model_engine" => engine, "model_name" => model.clone())
            .decrement(1.0);
        metrics::counter!(
            MODEL_INFERENCES_TOTAL,
            "model_engine" => engine,
            "model_name" => model.clone(),
            "error" => error,
            "streaming" => streaming,
            "feature_category" => feature_category
        )
        .increment(1);
        metrics::histogram!(
            INFERENCE_REQUEST_DURATION,
            "model_engine" => engine,
            "model_name" => model,
            "error" => error,
            "streaming" => streaming,
            "feature_category" => feature_category
        )
        .record(elapsed.as_secs_f64());
    }
}
