//! The prompt registry: versioned YAML prompt definitions with Jinja templates
//! under `prompts/`, resolved by prompt id, model family and version
//! constraint. Changing a prompt is a data change; see `docs/prompts.md`.

mod invoke;
mod registry;
mod schema;
mod version;

pub use invoke::{PreparedPrompt, PromptInvocation, choose_families, prepare};
pub use registry::{PromptDefinition, PromptRegistry, RenderedMessage};
pub use schema::{
    ModelClassProvider, ModelConfig, ModelSettings, PromptParams, TemplateRole, ToolCalling,
};
pub use version::{DEFAULT_CONSTRAINT, VersionConstraint};

use crate::error::ApiError;
use std::path::{Path, PathBuf};

/// Start-up failures: each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum PromptLoadError {
    #[error("cannot read prompts at {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("invalid prompt file {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("cannot set up the template environment: {0}")]
    Environment(String),
}

impl PromptLoadError {
    fn io(path: &Path, err: &std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            reason: err.to_string(),
        }
    }

    fn invalid(path: &Path, reason: String) -> Self {
        Self::Invalid {
            path: path.to_owned(),
            reason,
        }
    }
}

/// Failures resolving, authorising or rendering one prompt; each maps itself
/// to the HTTP answer of `/v1/prompts`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    #[error("Prompt '{0}' not found")]
    NotFound(String),
    #[error("Unauthorized to access '{0}'")]
    Unauthorized(String),
    /// The prompt exists but cannot be invoked directly (the ReAct agent).
    #[error("Prompt '{0}' is not supported")]
    NotSupported(String),
    #[error("Invalid version constraint")]
    InvalidVersionConstraint,
    #[error("No version of the prompt matches the requested constraint")]
    NoMatchingVersion,
    /// Names the missing input(s).
    #[error("Missing prompt input: {0}")]
    MissingInput(String),
    #[error("failed to render the prompt: {0}")]
    Render(String),
    #[error(
        "model_metadata is not accepted: custom models are disabled on this gateway (AIGW_CUSTOM_MODELS__ENABLED)"
    )]
    CustomModelsDisabled,
    #[error("{0}")]
    InvalidModelMetadata(String),
    /// `model_metadata.endpoint` is not one the caller's token vouches
    /// for, or the egress policy refuses it.
    #[error("{0}")]
    ModelEndpointRefused(#[from] crate::providers::egress::EgressError),
}

impl From<crate::providers::CustomModelError> for PromptError {
    fn from(err: crate::providers::CustomModelError) -> Self {
        match err {
            crate::providers::CustomModelError::Disabled => Self::CustomModelsDisabled,
            crate::providers::CustomModelError::Endpoint(e) => Self::ModelEndpointRefused(e),
        }
    }
}

impl From<PromptError> for ApiError {
    fn from(err: PromptError) -> Self {
        match err {
            PromptError::NotFound(_) => Self::NotFound(err.to_string()),
            PromptError::Unauthorized(_) | PromptError::ModelEndpointRefused(_) => {
                Self::Forbidden(err.to_string())
            }
            PromptError::NotSupported(_)
            | PromptError::InvalidVersionConstraint
            | PromptError::NoMatchingVersion
            | PromptError::MissingInput(_)
            | PromptError::CustomModelsDisabled
            | PromptError::InvalidModelMetadata(_) => Self::Unprocessable(err.to_string()),
            // A template bug, not the caller's fault: logged, never sent.
            PromptError::Render(_) => Self::Internal(err.to_string()),
        }
    }
}
