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
///
/// With traces on it also holds the call's span (GenAI semantic attributes:
/// model, tokens in and out, time to first token, error); run the provider
/// request inside [`InferenceRecorder::span`] so its `traceparent` names it.
#[derive(Debug)]
pub struct InferenceRecorder {
    labels: InferenceLabels,
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
        let engine = labels.engine;
        let model = labels.model.clone();
        metrics::gauge!(MODEL_INFERENCES_IN_FLIGHT, "model_engine" => engine, "model_name" => model.clone())
            .increment(1.0);
        if let Some(limit) = max_concurrent {
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
