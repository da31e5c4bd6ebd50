//! One decision for where a model call goes, shared by the streaming router
//! (prompts, chat) and the tool-calling client (workflows, native chat): the
//! configured providers with their keys, the bundled local model when nothing
//! is configured, or an endpoint a request named with only the request's key.

use super::direct_http::{DirectHttp, DirectHttpSettings};
use super::egress::{CallerEndpoint, EgressError, EndpointGuard};
use super::upstream::{Pacing, ProviderHttp};
use super::{ModelTarget, ProviderError, ProviderKind};
use crate::config::ProvidersConfig;
use crate::proxy::vertex_base_url;
use secrecy::ExposeSecret;
use std::sync::Arc;
use std::time::Duration;

/// Which HTTP client a call takes: endpoints from the configuration, or
/// endpoints a request named (resolved through the egress policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    Configured,
    CallerNamed,
}

/// Which wire and where.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelRoute {
    /// `AIGW_MOCK_MODEL_RESPONSES`: answers "mock" without calling anything.
    Mock,
    Anthropic {
        base_url: String,
        api_key: Option<String>,
        model: String,
        egress: Egress,
    },
    OpenAi {
        base_url: String,
        api_key: Option<String>,
        model: String,
        egress: Egress,
    },
    Vertex {
        base_url: String,
        location: String,
        access_token: Option<String>,
        model: String,
        egress: Egress,
    },
}

impl ModelRoute {
    pub fn kind(&self) -> ProviderKind {
        match self {
            Self::Mock => ProviderKind::Mock,
            Self::Anthropic { .. } => ProviderKind::Anthropic,
            Self::OpenAi { .. } => ProviderKind::OpenAiCompatible,
            Self::Vertex { .. } => ProviderKind::VertexAi,
        }
    }

    /// The model id the provider is asked for (empty for mock answers).
    pub fn model(&self) -> &str {
        match self {
            Self::Mock => "",
            Self::Anthropic { model, .. }
            | Self::OpenAi { model, .. }
            | Self::Vertex { model, .. } => model,
        }
    }

    pub fn egress(&self) -> Egress {
        match self {
            Self::Mock => Egress::Configured,
            Self::Anthropic { egress, .. }
            | Self::OpenAi { egress, .. }
            | Self::Vertex { egress, .. } => *egress,
        }
    }

    /// How the answer's pieces reach the handler relaying them: from
    /// [`DirectHttp`] (configured plain-`http` endpoints) and mock answers
    /// in its own task, from reqwest through its connections' tasks.
    pub fn pacing(&self) -> Pacing {
        let base_url = match self {
            Self::Mock => return Pacing::SameTask,
            Self::Anthropic { base_url, .. }
            | Self::OpenAi { base_url, .. }
            | Self::Vertex { base_url, .. } => base_url,
        };
        let direct = self.egress() == Egress::Configured
            && super::upstream_url::parsed(base_url).is_some_and(|url| DirectHttp::serves(&url));
        if direct {
            Pacing::SameTask
        } else {
            Pacing::OtherTasks
        }
    }

    /// The model family whose prompts fit this route.
    pub fn family(&self) -> &'static str {
        match self {
            Self::OpenAi { .. } => "openai",
            Self::Anthropic { .. } | Self::Mock | Self::Vertex { .. } => "base",
        }
    }
}

/// Where a resolved target goes. A target that names its own endpoint goes
/// there with its own key or none; the configured keys go only to the
/// configured endpoints.
pub fn route_for_target(
    config: &ProvidersConfig,
    target: &ModelTarget,
) -> Result<ModelRoute, ProviderError> {
    let secret =
        |s: &Option<secrecy::SecretString>| s.as_ref().map(|k| k.expose_secret().to_owned());
    if target.kind == ProviderKind::Mock
        || (config.mock_model_responses && target.kind == ProviderKind::Anthropic)
    {
        return Ok(ModelRoute::Mock);
    }
    let model = target.model.clone();
    if let Some(endpoint) = &target.endpoint {
        let base_url = endpoint.base_url().to_owned();
        let api_key = endpoint.api_key().map(str::to_owned);
        let egress = Egress::CallerNamed;
        return Ok(match target.kind {
            ProviderKind::Anthropic => ModelRoute::Anthropic {
                base_url,
                api_key,
                model,
                egress,
            },
            ProviderKind::VertexAi => ModelRoute::Vertex {
                base_url: vertex_base_url(&base_url),
                location: target
                    .location
                    .clone()
                    .unwrap_or_else(|| config.vertex_location.clone()),
                access_token: api_key,
                model,
                egress,
            },
            ProviderKind::OpenAiCompatible | ProviderKind::Mock => ModelRoute::OpenAi {
                base_url,
                api_key,
                model,
                egress,
            },
        });
    }
    let egress = Egress::Configured;
    if target.kind == ProviderKind::VertexAi {
        // A prompt written for Vertex AI goes there even when nothing else
        // is configured: the local model server cannot serve it.
        return Ok(ModelRoute::Vertex {
            base_url: vertex_base_url(&config.vertex_endpoint),
            location: target
                .location
                .clone()
                .unwrap_or_else(|| config.vertex_location.clone()),
            access_token: secret(&config.vertex_access_token),
            model,
            egress,
        });
    }
    if config.uses_local_default() {
        return Ok(ModelRoute::OpenAi {
            base_url: config.local_llm_url.clone(),
            api_key: None,
            model: config.local_llm_model.clone(),
            egress,
        });
    }
    match target.kind {
        ProviderKind::Anthropic => Ok(ModelRoute::Anthropic {
            base_url: config.anthropic_base_url.clone(),
            api_key: secret(&config.anthropic_api_key),
            model,
            egress,
        }),
        _ => Ok(ModelRoute::OpenAi {
            base_url: config.openai_base_url.clone().ok_or_else(|| {
                ProviderError::NotConfigured(
                    "no OpenAI-compatible endpoint (OPENAI_BASE_URL)".to_owned(),
                )
            })?,
            api_key: secret(&config.openai_api_key),
            model,
            egress,
        }),
    }
}

/// A self-hosted model as a request describes it (`model_metadata`, the
/// workflow service's model header).
#[derive(Debug, Clone, Copy)]
pub struct CustomModel<'a> {
    pub provider: &'a str,
    pub name: &'a str,
    pub identifier: Option<&'a str>,
    pub endpoint: &'a str,
    pub api_key: Option<&'a str>,
}

/// Why a request's model could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CustomModelError {
    #[error(
        "model_metadata is not accepted: custom models are disabled on this gateway (AIGW_CUSTOM_MODELS__ENABLED)"
    )]
    Disabled,
    #[error(transparent)]
    Endpoint(#[from] EgressError),
}

/// The provider names that mean Vertex AI (litellm's spelling).
pub const VERTEX_AI: &str = "vertex_ai";

impl CustomModel<'_> {
    /// The served model's id: `identifier` (without a `provider/` prefix),
    /// else `name`.
    pub fn model_id(&self) -> String {
        match self.identifier.filter(|i| !i.is_empty()) {
            Some(identifier) => identifier
                .split_once('/')
                .map_or(identifier, |(_, model)| model)
                .to_owned(),
            None => self.name.to_owned(),
        }
    }

    pub fn kind(&self) -> ProviderKind {
        if self.provider.eq_ignore_ascii_case("anthropic") {
            ProviderKind::Anthropic
        } else if self.provider.eq_ignore_ascii_case(VERTEX_AI) {
            ProviderKind::VertexAi
        } else {
            ProviderKind::OpenAiCompatible
        }
    }

    /// The target this model describes, its endpoint admitted by `guard`.
    /// Without an endpoint the call goes to the configured provider of the
    /// model's kind, with the gateway's key (the request's key is not sent
    /// anywhere then).
    pub fn target(
        &self,
        config: &ProvidersConfig,
        guard: &EndpointGuard<'_>,
    ) -> Result<ModelTarget, CustomModelError> {
        if !config.custom_models_enabled {
            return Err(CustomModelError::Disabled);
        }
        let endpoint: Option<CallerEndpoint> = if self.endpoint.trim().is_empty() {
            None
        } else {
            Some(guard.admit(self.endpoint, self.api_key)?)
        };
        Ok(ModelTarget {
            kind: self.kind(),
            model: self.model_id(),
            endpoint,
            location: None,
        })
    }
}

/// The two HTTP clients model calls use, one per [`Egress`].
#[derive(Debug, Clone)]
pub struct ProviderClients {
    configured: reqwest::Client,
    /// Configured plain-`http` endpoints (see [`DirectHttp`]).
    configured_direct: DirectHttp,
    caller_named: reqwest::Client,
}

impl ProviderClients {
    pub fn new(config: &ProvidersConfig) -> Result<Self, ProviderError> {
        let http_error =
            |e: reqwest::Error| ProviderError::NotConfigured(format!("HTTP client: {e}"));
        let configured = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            // A provider's redirect is an answer, not a place to send the
            // credentials to (reqwest keeps headers such as `x-api-key` on
            // a redirect to another host).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(http_error)?;
        let caller_named = super::egress::caller_endpoint_client(Arc::new(config.egress.clone()))
            .map_err(http_error)?;
        Ok(Self {
            configured,
            // The model calls keep their own deadlines (first token, whole
            // call), as with reqwest.
            configured_direct: DirectHttp::new(DirectHttpSettings::default()),
            caller_named,
        })
    }

    /// The clients for one egress. Endpoints a request named never go
    /// through [`DirectHttp`]: their names must pass the egress policy's
    /// resolver, which only the caller-named pool has.
    pub fn get(&self, egress: Egress) -> ProviderHttp<'_> {
        match egress {
            Egress::Configured => {
                ProviderHttp::new(&self.configured, Some(&self.configured_direct))
            }
            Egress::CallerNamed => ProviderHttp::new(&self.caller_named, None),
        }
    }

    /// The client for configured upstreams (proxies, probes).
    pub fn configured(&self) -> &reqwest::Client {
        &self.configured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anthropic(base_url: &str, egress: Egress) -> ModelRoute {
        ModelRoute::Anthropic {
            base_url: base_url.to_owned(),
            api_key: Some("key".to_owned()),
            model: "claude".to_owned(),
            egress,
        }
    }

    #[test]
    fn only_configured_plain_http_endpoints_and_mock_answers_are_read_in_the_same_task() {
        assert_eq!(ModelRoute::Mock.pacing(), Pacing::SameTask);
        assert_eq!(
            anthropic("http://127.0.0.1:5052", Egress::Configured).pacing(),
            Pacing::SameTask
        );
        assert_eq!(
            anthropic("https://api.anthropic.com", Egress::Configured).pacing(),
            Pacing::OtherTasks
        );
        assert_eq!(
            anthropic("http://127.0.0.1:5052", Egress::CallerNamed).pacing(),
            Pacing::OtherTasks
        );
        assert_eq!(
            anthropic("http://user:pw@127.0.0.1:5052", Egress::Configured).pacing(),
            Pacing::OtherTasks
        );
    }
}
