//! Calls to models. Every model call in the gateway goes through [`ChatModel`];
//! concrete clients speak the Anthropic Messages API, OpenAI-compatible chat
//! completions (vLLM, Ollama, the bundled local model server) and Vertex AI
//! text-model predict.

mod anthropic;
pub mod conversation;
pub mod direct_http;
pub mod egress;
pub(crate) mod escaped_text;
mod mock;
mod openai;
pub mod route;
mod router;
mod sse;
mod streaming;
pub mod tool_calling;
pub mod upstream;
pub(crate) mod upstream_url;
mod vertex;

pub use crate::observability::ModelWaitClock;
pub use egress::{CallerEndpoint, EgressPolicy, EndpointGuard};
pub use route::{
    CustomModel, CustomModelError, Egress, ModelRoute, ProviderClients, route_for_target,
};
pub use router::{ModelRouter, ProbeResult};

use futures::stream::BoxStream;
use std::time::Duration;

/// Which wire protocol a call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    Anthropic,
    /// OpenAI-compatible chat completions (self-hosted models, local default).
    OpenAiCompatible,
    /// Vertex AI text models (`:predict` / `:serverStreamingPredict`).
    VertexAi,
    /// Deterministic answers for `AIGW_MOCK_MODEL_RESPONSES`.
    Mock,
}

impl ProviderKind {
    /// The `model_engine` metric label.
    pub fn engine(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::OpenAiCompatible => "openai_compatible",
            Self::VertexAi => "vertex_ai",
            Self::Mock => "mock",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatRole {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: ChatRole,
    pub content: String,
}

/// A message as the providers' JSON bodies carry it (`role`, `content`).
#[derive(serde::Serialize)]
pub(crate) struct WireMessage<'a> {
    pub role: &'static str,
    pub content: escaped_text::JsonText<'a>,
}

impl<'a> From<&'a ChatMessage> for WireMessage<'a> {
    fn from(message: &'a ChatMessage) -> Self {
        Self {
            role: match message.role {
                ChatRole::User => "user",
                ChatRole::Assistant => "assistant",
            },
            content: escaped_text::JsonText(&message.content),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    /// The whole call, including the time to the first token.
    pub timeout: Duration,
    /// How long to wait for the first token; the router lowers it to
    /// `AIGW_MODELS__FIRST_TOKEN_TIMEOUT_SECONDS` when that is shorter.
    pub first_token_timeout: Duration,
    /// Retries on connection errors and overload (GitLab uses 1).
    pub max_retries: u32,
    /// llama.cpp's "don't repeat yourself" penalty, sent only to servers
    /// that take it (the bundled model server): small models loop otherwise.
    pub dry_multiplier: Option<f32>,
}

impl Default for ModelParams {
    fn default() -> Self {
        Self {
            temperature: None,
            top_p: None,
            top_k: None,
            max_tokens: 4096,
            stop: Vec::new(),
            timeout: Duration::from_secs(60),
            first_token_timeout: Duration::from_secs(30),
            max_retries: 1,
            dry_multiplier: None,
        }
    }
}

/// Where and how to reach a model for one call.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTarget {
    pub kind: ProviderKind,
    /// The provider's model id (`claude-3-5-sonnet-20241022`, `mistral`, ...).
    pub model: String,
    /// An endpoint the request named (custom models' `endpoint`, admitted
    /// by an [`EndpointGuard`]) with the request's own key: the call goes
    /// there instead of to a configured provider.
    pub endpoint: Option<CallerEndpoint>,
    /// Vertex AI only: overrides `AIGW_GOOGLE_CLOUD_PLATFORM__LOCATION`
    /// (a prompt's `params.vertex_location`).
    pub location: Option<String>,
}

impl ModelTarget {
    /// A target with no overrides.
    pub fn new(kind: ProviderKind, model: impl Into<String>) -> Self {
        Self {
            kind,
            model: model.into(),
            endpoint: None,
            location: None,
        }
    }
}

/// One model call: a system prompt, the conversation, and the sampling
/// parameters. An assistant message last is a prefill the model continues.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCall {
    pub target: ModelTarget,
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub params: ModelParams,
    /// Accumulates the time spent waiting on the model, for the gateway's
    /// own-overhead figure. `None` when the caller does not measure it.
    pub wait_clock: Option<ModelWaitClock>,
    /// Whether the caller streams the answer on. Providers with separate
    /// streaming and one-shot calls (Vertex AI) pick by it; the others always
    /// stream, and the answer arrives the same way either way.
    pub streaming: bool,
    /// The `feature_category` label of the call's metrics.
    pub feature_category: &'static str,
}

impl ModelCall {
    /// Characters of the prompt (system text and messages), for budgets.
    pub fn prompt_chars(&self) -> usize {
        self.system.as_ref().map_or(0, |s| s.chars().count())
            + self
                .messages
                .iter()
                .map(|m| m.content.chars().count())
                .sum::<usize>()
    }

    /// A streamed call with default parameters, no system prompt, no wait
    /// clock and no feature category.
    pub fn new(target: ModelTarget, messages: Vec<ChatMessage>) -> Self {
        Self {
            target,
            system: None,
            messages,
            params: ModelParams::default(),
            wait_clock: None,
            streaming: true,
            feature_category: crate::observability::UNKNOWN_FEATURE_CATEGORY,
        }
    }
}

/// Text as the model produces it.
pub type TextStream = BoxStream<'static, Result<String, ProviderError>>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// The provider is overloaded (Anthropic 529 / `overloaded_error`, HTTP 429/503).
    /// The message keeps the provider's text, which names `overloaded_error`.
    #[error("{message}")]
    Overloaded { message: String },
    /// The provider answered with an error status.
    #[error("{status}: {message}")]
    Status { status: u16, message: String },
    #[error("timed out waiting for the model ({0})")]
    Timeout(&'static str),
    #[error("could not connect to the model provider: {0}")]
    Connection(String),
    /// The provider sent something we could not read (bad SSE, bad JSON),
    /// or reported an error in the middle of a stream.
    #[error("malformed response from the model provider: {0}")]
    Malformed(String),
    #[error("model provider not configured: {0}")]
    NotConfigured(String),
}

impl ProviderError {
    /// Whether the caller may try again (GitLab: only for overload).
    pub fn retryable(&self) -> bool {
        matches!(self, Self::Overloaded { .. })
    }

    /// A failure of the connection or of an overloaded or restarting
    /// provider, after which the same call may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Overloaded { .. }
                | Self::Connection(_)
                | Self::Status {
                    status: 502..=504,
                    ..
                }
        )
    }

    /// The HTTP status the provider answered with, when there was one.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            Self::Overloaded { .. } => Some(529),
            _ => None,
        }
    }
}

/// Anything that can stream a model's answer.
#[async_trait::async_trait]
pub trait ChatModel: Send + Sync {
    /// Starts the call; the returned stream yields text as it arrives.
    /// Errors before the first token (connection, status, first-token timeout)
    /// are returned here; errors after it arrive in the stream.
    async fn stream(&self, call: ModelCall) -> Result<TextStream, ProviderError>;

    /// How the pieces of an answer for `target` reach the task reading the
    /// stream (see [`upstream::Pacing`]); when unsure, through other tasks.
    fn pacing(&self, _target: &ModelTarget) -> upstream::Pacing {
        upstream::Pacing::OtherTasks
    }
}
