//! Preparing one `/v1/prompts` invocation: choosing the model family, the
//! checks in GitLab's order, rendering, and building the model call. The HTTP
//! handler only parses the body and streams the answer.

use super::PromptError;
use super::registry::{PromptDefinition, PromptRegistry};
use super::version::VersionConstraint;
use crate::auth::GatewayUser;
use crate::config::Config;
use crate::providers::ModelCall;
use contracts::{ModelMetadata, PromptRequest};
use std::sync::Arc;

/// The family tried when the chosen one lacks the prompt: `openai` for
/// custom (self-hosted) models, `base` otherwise.
const CUSTOM_MODEL_FALLBACK_FAMILY: &str = "openai";
const DEFAULT_FALLBACK_FAMILY: &str = "base";

/// The `feature_category` of `/v1/prompts` model calls, as GitLab labels
/// that endpoint.
pub const FEATURE_CATEGORY: &str = "ai_abstraction_layer";

/// The prompt ids served by the agent endpoint, not by `/v1/prompts`.
fn is_agent_prompt(prompt_id: &str) -> bool {
    prompt_id == "chat/react" || prompt_id.starts_with("chat/react/")
}

/// Families to try for `prompt_id`, in order.
///
/// With `model_metadata` (custom models enabled) its `name` is the family,
/// falling back to `openai`, since our self-hosted prompts are written for
/// any OpenAI-compatible model. Otherwise `AIGW_DEFAULT_PROMPTS[id]`, else the
/// configured default family, falling back to `base`.
pub fn choose_families(
    prompt_id: &str,
    model_metadata: Option<&ModelMetadata>,
    config: &Config,
) -> Vec<String> {
    let mut families = match model_metadata.filter(|_| config.providers.custom_models_enabled) {
        Some(metadata) => vec![
            metadata.name.clone(),
            CUSTOM_MODEL_FALLBACK_FAMILY.to_owned(),
        ],
        None => vec![
            config
                .prompts
                .default_families
                .get(prompt_id)
                .cloned()
                .unwrap_or_else(|| config.prompts.default_family.clone()),
            DEFAULT_FALLBACK_FAMILY.to_owned(),
        ],
    };
    families.dedup();
    families
}

/// One request to invoke a prompt.
#[derive(Debug, Clone, Copy)]
pub struct PromptInvocation<'a> {
    pub prompt_id: &'a str,
    pub request: &'a PromptRequest,
    pub user: &'a GatewayUser,
}

/// A prompt ready to send to the model.
#[derive(Debug, Clone)]
pub struct PreparedPrompt {
    pub definition: Arc<PromptDefinition>,
    pub call: ModelCall,
}

/// Runs every check of `/v1/prompts` in GitLab's order (not found, unit
/// primitives, not supported, version constraint, model metadata, missing
/// inputs) and builds the model call.
pub fn prepare(
    registry: &PromptRegistry,
    config: &Config,
    invocation: PromptInvocation<'_>,
) -> Result<PreparedPrompt, PromptError> {
    let PromptInvocation {
        prompt_id,
        request,
        user,
    } = invocation;
    let families = choose_families(prompt_id, request.model_metadata.as_ref(), config);
    let versions = families
        .iter()
        .find_map(|family| registry.versions(prompt_id, family))
        .ok_or_else(|| PromptError::NotFound(prompt_id.to_owned()))?;

    let constraint = VersionConstraint::parse(request.prompt_version.as_deref());
    let selected = constraint.as_ref().and_then(|c| {
        versions
            .iter()
            .filter(|d| c.matches(&d.version))
            // A version behind a feature flag is for the agent's requests.
            .filter(|d| d.feature_flag.is_none())
            .max_by(|a, b| a.version.cmp(&b.version))
    });
    // The scope check comes before the version check, so when no version
    // can be selected it is made against the newest one.
    let for_scope_check = selected.or_else(|| versions.last());
    if let Some(definition) = for_scope_check
        && !definition.allowed_for(user)
    {
        return Err(PromptError::Unauthorized(prompt_id.to_owned()));
    }
    if is_agent_prompt(prompt_id) {
        return Err(PromptError::NotSupported(prompt_id.to_owned()));
    }
    if constraint.is_none() {
        return Err(PromptError::InvalidVersionConstraint);
    }
    let definition = selected.cloned().ok_or(PromptError::NoMatchingVersion)?;

    let target = definition.model_target(
        &config.providers,
        request.model_metadata.as_ref(),
        &user.endpoint_guard(&config.providers.egress),
    )?;
    let inputs = serde_json::Value::Object(request.inputs.clone());
    let messages = definition.render(registry, &inputs)?;
    let mut call = definition.model_call(messages, target);
    call.streaming = request.stream;
    call.feature_category = FEATURE_CATEGORY;
    Ok(PreparedPrompt { definition, call })
}
