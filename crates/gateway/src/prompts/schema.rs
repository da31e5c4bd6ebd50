//! The YAML schema of a prompt definition file. Every level rejects unknown
//! keys, so a typo fails start-up instead of being silently ignored.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One `<prompt id>/<family>/<version>.yml` file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PromptFile {
    pub name: String,
    pub model: ModelFile,
    pub unit_primitives: Vec<String>,
    pub prompt_template: PromptTemplate,
    #[serde(default)]
    pub params: PromptParams,
    /// A version that ships behind a feature flag: chosen only for requests
    /// announcing the flag (`x-gitlab-enabled-feature-flags`).
    #[serde(default)]
    pub feature_flag: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelFile {
    pub name: String,
    pub params: ModelClassParams,
}

/// `model.params`, discriminated by `model_class_provider`: each provider
/// class accepts only its own extra keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "model_class_provider", rename_all = "snake_case")]
pub(crate) enum ModelClassParams {
    Anthropic(AnthropicParams),
    Litellm(LitellmParams),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnthropicParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub max_tokens: Option<u32>,
    pub max_retries: Option<u32>,
    #[serde(default)]
    pub default_headers: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LitellmParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub max_tokens: Option<u32>,
    pub max_retries: Option<u32>,
    pub custom_llm_provider: Option<String>,
    /// llama.cpp's "don't repeat yourself" penalty (0 to 5), for prompts
    /// whose small model loops under greedy decoding.
    pub dry_multiplier: Option<f32>,
}

/// Which client class calls the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelClassProvider {
    /// The Anthropic Messages API.
    Anthropic,
    /// Any OpenAI-compatible server (self-hosted models, the local default).
    Litellm,
}

/// `model`: the model id and its call parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub name: String,
    pub params: ModelSettings,
}

/// `model.params`, flattened after validation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSettings {
    pub model_class_provider: ModelClassProvider,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub max_tokens: Option<u32>,
    /// Retries on connection errors and overload; 1 unless set.
    pub max_retries: u32,
    /// litellm only (e.g. `vertex_ai`).
    pub custom_llm_provider: Option<String>,
    /// anthropic only: extra headers sent with every call.
    pub default_headers: BTreeMap<String, String>,
    /// litellm only: llama.cpp's DRY penalty, sent to OpenAI-compatible servers.
    pub dry_multiplier: Option<f32>,
}

impl From<ModelFile> for ModelConfig {
    fn from(file: ModelFile) -> Self {
        let params = match file.params {
            ModelClassParams::Anthropic(p) => ModelSettings {
                model_class_provider: ModelClassProvider::Anthropic,
                temperature: p.temperature,
                top_p: p.top_p,
                top_k: p.top_k,
                max_tokens: p.max_tokens,
                max_retries: p.max_retries.unwrap_or(1),
                custom_llm_provider: None,
                default_headers: p.default_headers,
                dry_multiplier: None,
            },
            ModelClassParams::Litellm(p) => ModelSettings {
                model_class_provider: ModelClassProvider::Litellm,
                temperature: p.temperature,
                top_p: p.top_p,
                top_k: p.top_k,
                max_tokens: p.max_tokens,
                max_retries: p.max_retries.unwrap_or(1),
                custom_llm_provider: p.custom_llm_provider,
                default_headers: BTreeMap::new(),
                dry_multiplier: p.dry_multiplier.filter(|m| (0.0..=5.0).contains(m)),
            },
        };
        Self {
            name: file.name,
            params,
        }
    }
}

/// `params`: bound to the model call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptParams {
    #[serde(default)]
    pub stop: Vec<String>,
    /// Seconds for the whole call.
    pub timeout: Option<f64>,
    pub vertex_location: Option<String>,
    /// How an agent prompt asks for tools: ReAct text or the provider's own
    /// tool calling.
    #[serde(default)]
    pub tool_calling: ToolCalling,
}

/// `params.tool_calling` of an agent prompt (`chat/react`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCalling {
    /// The model writes `Thought:` / `Action:` / `Action Input:` text that
    /// the gateway parses; works with any text model.
    #[default]
    React,
    /// The tools go to the provider as function definitions (OpenAI
    /// `tools`, Anthropic tool use, the bundled server's grammar-constrained
    /// tools) and the model answers with a structured call.
    Native,
}

/// The role of one template, which becomes the role of its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateRole {
    System,
    User,
    Assistant,
}

impl TemplateRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

/// `prompt_template`: a map from role to template whose key order is the
/// message order, so it is read as an ordered list of pairs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PromptTemplate(pub Vec<(TemplateRole, String)>);

impl<'de> Deserialize<'de> for PromptTemplate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OrderedTemplates;

        impl<'de> Visitor<'de> for OrderedTemplates {
            type Value = PromptTemplate;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map from role (system, user, assistant) to a template")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut templates: Vec<(TemplateRole, String)> = Vec::new();
                while let Some((role, template)) = map.next_entry::<TemplateRole, String>()? {
                    if templates.iter().any(|(r, _)| *r == role) {
                        return Err(de::Error::custom(format_args!(
                            "duplicate role `{}` in prompt_template",
                            role.as_str()
                        )));
                    }
                    templates.push((role, template));
                }
                if templates.is_empty() {
                    return Err(de::Error::custom("prompt_template is empty"));
                }
                Ok(PromptTemplate(templates))
            }
        }

        deserializer.deserialize_map(OrderedTemplates)
    }
}
