//! [`ModelRouter`]: the gateway's [`ChatModel`], dispatching each call to its
//! provider over one shared HTTP client, with retries, metrics and the
//! model-wait clock.

use super::{
    ChatModel, ModelCall, ModelWaitClock, ProviderError, ProviderKind, TextStream, anthropic, mock,
    openai,
};
use crate::config::ProvidersConfig;
use futures::StreamExt;
use secrecy::ExposeSecret;
use std::time::{Duration, Instant};

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
    async fn stream(&self, call: ModelCall) -> Result<TextStream, ProviderError> {
        let route = self.route(&call)?;
        let engine = match &route {
            Route::Mock => ProviderKind::Mock.engine(),
            Route::Anthropic { .. } => ProviderKind::Anthropic.engine(),
            Route::OpenAi { .. } => ProviderKind::OpenAiCompatible.engine(),
        };
        let model = match &route {
            Route::OpenAi { model, .. } => model.clone(),
            _ => call.target.model.clone(),
        };
        let mut recorder = CallRecorder::start(engine, model, call.wait_clock.clone());
        let mut retries_left = call.params.max_retries;
        let stream = loop {
            match self.attempt(&route, &call).await {
                Ok(stream) => break stream,
                Err(err @ (ProviderError::Overloaded { .. } | ProviderError::Connection(_)))
                    if retries_left > 0 =>
                {
                    retries_left -= 1;
                    tracing::debug!(engine, error = %err, "retrying the model call");
                }
                Err(err) => {
                    recorder.failed = true;
                    return Err(err);
                }
            }
        };
        Ok(async_stream::stream! {
            let mut stream = stream;
            while let Some(item) = stream.next().await {
                if item.is_err() {
                    recorder.failed = true;
                }
                yield item;
            }
            drop(recorder);
        }
        .boxed())
    }
}

/// Records one call's metrics and model-wait time when it ends (finished,
/// failed or dropped by the caller).
struct CallRecorder {
    engine: &'static str,
    model: String,
    started: Instant,
    wait_clock: Option<ModelWaitClock>,
    failed: bool,
}

impl CallRecorder {
    fn start(engine: &'static str, model: String, wait_clock: Option<ModelWaitClock>) -> Self {
        metrics::gauge!("model_inferences_in_flight", "model_engine" => engine, "model_name" => model.clone())
            .increment(1.0);
        Self {
            engine,
            model,
            started: Instant::now(),
            wait_clock,
            failed: false,
        }
    }
}

impl Drop for CallRecorder {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        let engine = self.engine;
        let model = self.model.clone();
        let error = if self.failed { "yes" } else { "no" };
        metrics::gauge!("model_inferences_in_flight", "model_engine" => engine, "model_name" => model.clone())
            .decrement(1.0);
        metrics::counter!("model_inferences_total", "model_engine" => engine, "model_name" => model.clone(), "error" => error, "streaming" => "yes")
            .increment(1);
        metrics::histogram!("inference_request_duration_seconds", "model_engine" => engine, "model_name" => model, "error" => error, "streaming" => "yes")
            .record(elapsed.as_secs_f64());
        if let Some(clock) = &self.wait_clock {
            clock.add(elapsed);
        }
    }
}
