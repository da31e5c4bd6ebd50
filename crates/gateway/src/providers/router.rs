//! [`ModelRouter`]: the gateway's [`ChatModel`], dispatching each call to its
//! provider over one shared HTTP client, with retries, metrics and the
//! model-wait clock.

use super::route::{ModelRoute, ProviderClients, route_for_target};
use super::vertex::{self, VertexModel};
use super::{ChatModel, ModelCall, ProviderError, TextStream, anthropic, mock, openai};
use crate::config::ProvidersConfig;
use crate::observability::{InferenceLabels, InferenceRecorder};
use futures::StreamExt;
use secrecy::ExposeSecret;
use std::time::Duration;
use tracing::Instrument;

const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The outcome of one provider's readiness probe.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeResult {
    /// `anthropic`, `openai_compatible` or `local`.
    pub provider: &'static str,
    pub result: Result<(), ProviderError>,
}

pub struct ModelRouter {
    clients: ProviderClients,
    config: ProvidersConfig,
}

impl ModelRouter {
    pub fn new(config: &ProvidersConfig) -> Result<Self, ProviderError> {
        Ok(Self::with_clients(config, ProviderClients::new(config)?))
    }

    /// A router sharing its connection pools with other model clients.
    pub fn with_clients(config: &ProvidersConfig, clients: ProviderClients) -> Self {
        Self {
            clients,
            config: config.clone(),
        }
    }

    /// The pooled HTTP client for configured upstreams (proxies).
    pub fn http_client(&self) -> &reqwest::Client {
        self.clients.configured()
    }

    async fn attempt(
        &self,
        route: &ModelRoute,
        call: &ModelCall,
    ) -> Result<TextStream, ProviderError> {
        let http = self.clients.get(route.egress());
        match route {
            ModelRoute::Mock => Ok(mock::stream()),
            ModelRoute::Anthropic {
                base_url, api_key, ..
            } => anthropic::stream(http, base_url, api_key.as_deref(), call).await,
            ModelRoute::OpenAi {
                base_url,
                api_key,
                model,
                ..
            } => openai::stream(http, base_url, api_key.as_deref(), model, call).await,
            ModelRoute::Vertex {
                base_url,
                location,
                access_token,
                model,
                ..
            } => {
                let target = VertexModel {
                    base_url,
                    project: &self.config.vertex_project,
                    location,
                    model,
                    access_token: access_token.as_deref(),
                };
                vertex::stream(http, &target, call).await
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
                    self.clients.configured(),
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
                    self.clients.configured(),
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
                result: openai::probe(
                    self.clients.configured(),
                    base_url,
                    key,
                    None,
                    PROBE_TIMEOUT,
                )
                .await,
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

/// What a call sends, as text, for spans when content export is on.
fn prompt_text(call: &ModelCall) -> String {
    let mut text = call.system.clone().unwrap_or_default();
    for message in &call.messages {
        text.push_str("\n\n");
        text.push_str(&message.content);
    }
    text
}

#[async_trait::async_trait]
impl ChatModel for ModelRouter {
    fn pacing(&self, target: &super::ModelTarget) -> super::upstream::Pacing {
        route_for_target(&self.config, target)
            .map_or(super::upstream::Pacing::OtherTasks, |route| route.pacing())
    }

    async fn stream(&self, mut call: ModelCall) -> Result<TextStream, ProviderError> {
        let route = route_for_target(&self.config, &call.target)?;
        let engine = route.kind().engine();
        let model = match &route {
            ModelRoute::Mock => call.target.model.clone(),
            other => other.model().to_owned(),
        };
        // Only Vertex AI has a one-shot call; the others always stream.
        let streaming = !matches!(route, ModelRoute::Vertex { .. }) || call.streaming;
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
        recorder.prompt(|| prompt_text(&call));
        let clock = call.wait_clock.clone().unwrap_or_default();
        let mut retries_left = call.params.max_retries;
        // Connecting and waiting for the first token is all model time.
        let stream = clock
            .time(
                async {
                    loop {
                        match self.attempt(&route, &call).await {
                            Ok(stream) => break Ok(stream),
                            Err(
                                err @ (ProviderError::Overloaded { .. }
                                | ProviderError::Connection(_)),
                            ) if retries_left > 0 => {
                                retries_left -= 1;
                                tracing::debug!(engine, error = %err, "retrying the model call");
                            }
                            Err(err) => break Err(err),
                        }
                    }
                }
                .instrument(recorder.span()),
            )
            .await;
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(err) => {
                recorder.fail_with(&err);
                return Err(err);
            }
        };
        Ok(async_stream::stream! {
            // Time spent here waiting for the next chunk is model time; time
            // between yields belongs to whoever consumes the stream.
            while let Some(item) = clock.time(stream.next()).await {
                match &item {
                    Ok(text) => recorder.output(text),
                    Err(err) => recorder.fail_with(err),
                }
                yield item;
            }
            drop(recorder);
        }
        .boxed())
    }
}
