//! Which model a workflow run uses: the caller's choice from
//! `x-gitlab-agent-platform-model-metadata`, else the prompt's model through
//! the gateway's configured providers (the bundled local model when nothing
//! else is configured), resolved by the providers' one route decision.

use crate::config::ProvidersConfig;
use crate::prompts::PromptDefinition;
use crate::providers::{
    CustomModel, CustomModelError, EgressPolicy, EndpointGuard, ModelRoute, route_for_target,
};
use serde_json::{Value, json};

/// The `feature_category` of the workflow service's model calls.
pub const WORKFLOW_FEATURE_CATEGORY: &str = "duo_workflow";

/// `x-gitlab-agent-platform-model-metadata`, as far as the service reads it.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct AgentModelMetadata {
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub endpoint: String,
    #[serde(default)]
    pub api_key: Option<String>,
    #[serde(default)]
    pub identifier: Option<String>,
    #[serde(default)]
    pub feature_setting: Option<String>,
}

impl AgentModelMetadata {
    /// Reads the header; a malformed value is logged (without the value, it
    /// may hold a key) and ignored.
    pub fn parse(raw: Option<&str>) -> Option<Self> {
        let raw = raw?.trim();
        if raw.is_empty() {
            return None;
        }
        match serde_json::from_str::<Self>(raw) {
            Ok(metadata) => Some(metadata),
            Err(_) => {
                tracing::warn!(
                    "ignoring a malformed x-gitlab-agent-platform-model-metadata header"
                );
                None
            }
        }
    }

    /// A GitLab-managed choice (`provider: gitlab`) picks among the
    /// configured models; anything else names a self-hosted endpoint.
    pub fn is_self_hosted(&self) -> bool {
        !self.provider.is_empty() && !self.provider.eq_ignore_ascii_case("gitlab")
    }

    /// What the checkpoint stores with the workflow: never the key.
    pub fn stored(&self) -> Value {
        let mut value = json!({ "provider": self.provider });
        for (key, field) in [
            ("name", Some(&self.name)),
            ("endpoint", Some(&self.endpoint)),
            ("identifier", self.identifier.as_ref()),
            ("feature_setting", self.feature_setting.as_ref()),
        ] {
            if let Some(text) = field.filter(|t| !t.is_empty()) {
                value[key] = Value::String(text.clone());
            }
        }
        value
    }

    /// The model as the provider layer reads a self-hosted choice.
    pub fn custom(&self) -> CustomModel<'_> {
        CustomModel {
            provider: &self.provider,
            name: &self.name,
            identifier: self.identifier.as_deref(),
            endpoint: &self.endpoint,
            api_key: self.api_key.as_deref(),
        }
    }

    /// The family for this model before a prompt is picked.
    pub fn family(&self) -> Option<&'static str> {
        if !self.is_self_hosted() {
            return None;
        }
        Some(if self.provider.eq_ignore_ascii_case("anthropic") {
            "base"
        } else {
            "openai"
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelChoiceError {
    #[error(
        "self-hosted models are not accepted: custom models are disabled on this gateway (AIGW_CUSTOM_MODELS__ENABLED)"
    )]
    CustomModelsDisabled,
    /// The header named an endpoint the caller's token does not vouch for,
    /// or one the egress policy refuses.
    #[error("{0}")]
    EndpointRefused(#[from] crate::providers::egress::EgressError),
    #[error("Vertex AI models cannot call tools in workflows")]
    Unsupported,
    #[error("{0}")]
    NotConfigured(String),
}

impl From<CustomModelError> for ModelChoiceError {
    fn from(err: CustomModelError) -> Self {
        match err {
            CustomModelError::Disabled => Self::CustomModelsDisabled,
            CustomModelError::Endpoint(e) => Self::EndpointRefused(e),
        }
    }
}

/// The model a run was asked for, and the endpoints its caller's token
/// vouches for.
#[derive(Debug, Clone, Default)]
pub struct ModelChoice {
    pub metadata: Option<AgentModelMetadata>,
    pub vouched: Vec<String>,
    /// Authentication is off (development): any endpoint is vouched for.
    pub debug: bool,
}

impl ModelChoice {
    pub fn guard<'a>(&'a self, policy: &'a EgressPolicy) -> EndpointGuard<'a> {
        EndpointGuard {
            vouched: &self.vouched,
            debug: self.debug,
            policy,
        }
    }

    /// Refuses, before a run starts, a self-hosted endpoint the caller may
    /// not name.
    pub fn check(&self, config: &ProvidersConfig) -> Result<(), ModelChoiceError> {
        if let Some(metadata) = self.metadata.as_ref().filter(|m| m.is_self_hosted()) {
            metadata
                .custom()
                .target(config, &self.guard(&config.egress))?;
        }
        Ok(())
    }
}

/// Where the model for `definition` is, given the caller's choice.
pub fn route_for(
    config: &ProvidersConfig,
    definition: &PromptDefinition,
    choice: &ModelChoice,
) -> Result<ModelRoute, ModelChoiceError> {
    let guard = choice.guard(&config.egress);
    let guard = &guard;
    let target = match choice.metadata.as_ref().filter(|m| m.is_self_hosted()) {
        Some(metadata) => metadata.custom().target(config, guard)?,
        None if config.mock_model_responses => return Ok(ModelRoute::Mock),
        None => definition
            .model_target(config, None, guard)
            .map_err(|e| ModelChoiceError::NotConfigured(e.to_string()))?,
    };
    match route_for_target(config, &target)
        .map_err(|e| ModelChoiceError::NotConfigured(e.to_string()))?
    {
        ModelRoute::Vertex { .. } => Err(ModelChoiceError::Unsupported),
        route => Ok(route),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_metadata_has_no_key() {
        let metadata = AgentModelMetadata::parse(Some(
            r#"{"provider":"openai","name":"m","endpoint":"http://x","api_key":"secret"}"#,
        ))
        .unwrap();
        assert!(!metadata.stored().to_string().contains("secret"));
        assert!(AgentModelMetadata::parse(Some("{nope")).is_none());
    }
}
