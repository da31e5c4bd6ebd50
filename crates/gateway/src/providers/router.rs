//! [`ModelRouter`]: the gateway's [`ChatModel`], dispatching each call to its
//! provider over one shared HTTP client, with retries, metrics and the
//! model-wait clock.

use super::vertex::{self, VertexModel};
use super::{
    ChatModel, ModelCall, ModelTarget, ProviderError, ProviderKind, TextStream, anthropic, mock,
    openai,
};
use crate::config::ProvidersConfig;
use crate::observability::{InferenceLabels, InferenceRecorder};
use crate::proxy::vertex_base_url;
use futures::StreamExt;
use secrecy::ExposeSecret;
use std::time::Duration;

const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where one call goes after configuration and overrides are applied.
#[derive(Debug, Clone, PartialEq)]
enum Route {
    Mock,
    Anthropic {
        base_url: String,
        api_key: Option<String>,
    },
    OpenAi {
        base_url: String,
        api_key: Option<String>,
        model: String,
    },
    Vertex {
        base_url: String,
        location: String,
        access_token: Option<String>,
    },
}

impl Route {
    fn kind(&self) -> ProviderKind {
        match self {
            Self::Mock => ProviderKind::Mock,
            Self::Anthropic { .. } => ProviderKind::Anthropic,
            Self::OpenAi { .. } => ProviderKind::OpenAiCompatible,
            Self::Vertex { .. } => ProviderKind::VertexAi,
        }
    }
}

/// The outcome of one provider's readiness probe.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeResult {
    /// `anthropic`, `openai_compatible` or `local`.
    pub provider: &'static str,
    pub result: Result<(), ProviderError>,
}

pub struct ModelRouter {
    http: reqwest::Client,
    config: ProvidersConfig,
}

impl ModelRouter {
    pub fn new(config: &ProvidersConfig) -> Result<Self, ProviderError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| ProviderError::NotConfigured(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            config: config.clone(),
        })
    }

    /// The pooled HTTP client, for other upstream calls (proxies).
    pub fn http_client(&self) -> &reqwest::Client {
        &self.http
    }

    fn route(&self, call: &ModelCall) -> Result<Route, ProviderError> {
        let target = &call.target;
        let config = &self.config;
        let secret =
            |s: &Option<secrecy::SecretString>| s.as_ref().map(|s| s.expose_secret().to_owned());
        if target.kind == ProviderKind::Mock
            || (config.mock_model_responses && target.kind == ProviderKind::Anthropic)
        {
            return Ok(Route::Mock);
        }
        if target.kind == ProviderKind::VertexAi {
            // A prompt written for Vertex AI goes there even when nothing
            // else is configured: the local model server cannot serve it.
            return Ok(self.vertex_route(target));
        }
        if config.uses_local_default() {
            // Nothing configured: everything goes to the bundled local model
            // server, except a custom model that names its own endpoint.
            if let (ProviderKind::OpenAiCompatible, Some(base_url)) =
                (target.kind, &target.base_url)
            {
                return Ok(Route::OpenAi {
                    base_url: base_url.clone(),
                    api_key: target.api_key.clone(),
                    model: target.model.clone(),
                });
            }
            return Ok(Route::OpenAi {
                base_url: config.local_llm_url.clone(),
                api_key: None,
                model: config.local_llm_model.clone(),
            });
        }
        match target.kind {
            ProviderKind::Mock => Ok(Route::Mock),
            ProviderKind::VertexAi => Ok(self.vertex_route(target)),
            ProviderKind::Anthropic => Ok(Route::Anthropic {
                base_url: target
                    .base_url
                    .clone()
                    .unwrap_or_else(|| config.anthropic_base_url.clone()),
                api_key: target
                    .api_key
                    .clone()
                    .or_else(|| secret(&config.anthropic_api_key)),
            }),
            ProviderKind::OpenAiCompatible => {
                let base_url = target
                    .base_url
                    .clone()
                    .or_else(|| config.openai_base_url.clone())
                    .ok_or_else(|| {
                        ProviderError::NotConfigured(
                            "no OpenAI-compatible endpoint (OPENAI_BASE_URL)".to_owned(),
                        )
                    })?;
                Ok(Route::OpenAi {
                    base_url,
                    api_key: target
                        .api_key
                        .clone()
                        .or_else(|| secret(&config.openai_api_key)),
                    model: target.model.clone(),
                })
            }
        }
    }

    /// `AIGW_VERTEX_TEXT_MODEL__ENDPOINT` and the Google Cloud settings, with
    /// the target's overrides (a custom model's endpoint and key, a prompt's
    /// location).
    fn vertex_route(&self, target: &ModelTarget) -> Route {
        let config = &self.config;
        Route::Vertex {
            base_url: vertex_base_url(
                target
                    .base_url
                    .as_deref()
                    .unwrap_or(&config.vertex_endpoint),
            ),
            location: target
                .location
                .clone()
                .unwrap_or_else(|| config.vertex_location.clone()),
            access_token: target.api_key.clone().or_else(|| {
                config
                    .vertex_access_token
                    .as_ref()
                    .map(|s| s.expose_secret().to_owned())
            }),
        }
    }

    async fn attempt(&self, route: &Route, call: &ModelCall) -> Result<TextStream, ProviderError> {
        match route {
            Route::Mock => Ok(mock::stream()),
            Route::Anthropic { base_url, api_key } => {
                anthropic::stream(&self.http, base_url, api_key.as_deref(), call).await
            }
            Route::OpenAi {
                base_url,
                api_key,
                model,
            } => openai::stream(&self.http, base_url, api_key.as_deref(), model, call).await,
            Route::Vertex {
                base_url,
                location,
                access_token,
            } => {
                let target = VertexModel {
                    base_url,
                    project: &self.config.vertex_project,
                    location,
                    model: &call.target.model,
                    access_token: access_token.as_deref(),
                };
                vertex::stream(&self.http, &target, call).await
            }
        }
    }

    /// Probes every configured provider once (for `/monitoring/ready`).
    pub async fn probe_all(&self) -> Vec<ProbeResult> {
        let config = &self.config;
        let mut results = Vec::new();
        if config.mock_model_responses {
            return results;
        }
        if config.uses_local_default() {
            results.push(ProbeResult {
                provider: "local",
                result: openai::probe(
                    &self.http,
                    &config.local_llm_url,
                    None,
                    Some(&config.local_llm_model),
                    PROBE_TIMEOUT,
                )
                .await,
            });
            return results;
        }
        if let Some(key) = &config.anthropic_api_key {
            results.push(ProbeResult {
                provider: "anthropic",
                result: anthropic::probe(
                    &self.http,
                    &config.anthropic_base_url,
                    key.expose_secret(),
                    PROBE_TIMEOUT,
                )
                .await,
            });
        }
        if let Some(base_url) = &config.openai_base_url {
            let key = config.openai_api_key.as_ref().map(|k| k.expose_secret());
            results.push(ProbeResult {
                provider: "openai_compatible",
                result: openai::probe(&self.http, base_url, key, None, PROBE_TIMEOUT).await,
            });
        }
        results
    }

    /// Ready when every configured provider answers its probe.
    pub async fn probe(&self) -> Result<(), ProviderError> {
        for probe in self.probe_all().await {
            probe.result?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ChatModel for ModelRouter {
    async fn stream(&self, mut call: ModelCall) -> Result<TextStream, ProviderError> {
        let route = self.route(&call)?;
        let engine = route.kind().engine();
        let model = match &route {
            Route::OpenAi { model, .. } => model.clone(),
            _ => call.target.model.clone(),
        };
        // Only Vertex AI has a one-shot call; the others always stream.
        let streaming = !matches!(route, Route::Vertex { .. }) || call.streaming;
        let limit = self.config.concurrency_limit(engine, &model);
        let mut recorder = InferenceRecorder::start(
            InferenceLabels {
                engine,
                model,
                feature_category: call.feature_category,
                streaming,
            },
            limit,
        );
        call.params.first_token_timeout = call
            .params
            .first_token_timeout
            .min(self.config.first_token_timeout);
        let clock = call.wait_clock.clone().unwrap_or_default();
        let mut retries_left = call.params.max_retries;
        // Connecting and waiting for the first token is all model time.
        let stream = clock
            .time(async {
                loop {
                    match self.attempt(&route, &call).await {
                        Ok(stream) => break Ok(stream),
                        Err(
                            err @ (ProviderError::Overloaded { .. } | ProviderError::Connection(_)),
                        ) if retries_left > 0 => {
                            retries_left -= 1;
                            tracing::debug!(engine, error = %err, "retrying the model call");
                        }
                        Err(err) => break Err(err),
                    }
                }
            })
            .await;
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(err) => {
                recorder.fail();
                return Err(err);
            }
        };
        Ok(async_stream::stream! {
            // Time spent here waiting for the next chunk is model time; time
            // between yields belongs to whoever consumes the stream.
            while let Some(item) = clock.time(stream.next()).await {
                if item.is_err() {
                    recorder.fail();
                }
                yield item;
            }
            drop(recorder);
        }
        .boxed())
    }
}
