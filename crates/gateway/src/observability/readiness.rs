//! `/monitoring/ready`: can the configured model providers be reached?
//!
//! Each configured provider gets one cheap GET. Any answer that is not a
//! server error or an authentication refusal counts: the point is "reachable
//! with our credentials", not "this endpoint exists". Once every probe has
//! passed the result is cached, as GitLab's gateway does.

use crate::config::ProvidersConfig;
use crate::proxy::vertex_base_url;
use secrecy::ExposeSecret;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct Probe {
    /// Names the provider in the 503 body.
    pub name: &'static str,
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
}

#[derive(Debug)]
pub struct Readiness {
    probes: Vec<Probe>,
    passed: AtomicBool,
    /// Set at SIGTERM: from then on the gateway is never ready again. A
    /// watch, so the workflow service (on its own runtime) can wait for it.
    stopping: tokio::sync::watch::Sender<bool>,
}

impl Readiness {
    pub fn from_config(config: &ProvidersConfig) -> Self {
        let mut probes = Vec::new();
        if !config.mock_model_responses {
            if let Some(key) = &config.anthropic_api_key {
                probes.push(Probe {
                    name: "anthropic",
                    url: format!(
                        "{}/v1/models",
                        config.anthropic_base_url.trim_end_matches('/')
                    ),
                    headers: vec![
                        ("x-api-key", key.expose_secret().to_owned()),
                        ("anthropic-version", "2023-06-01".to_owned()),
                    ],
                });
            }
            if let Some(base) = &config.openai_base_url {
                probes.push(Probe {
                    name: "openai-compatible",
                    url: format!("{}/models", base.trim_end_matches('/')),
                    headers: config
                        .openai_api_key
                        .iter()
                        .map(|k| ("authorization", format!("Bearer {}", k.expose_secret())))
                        .collect(),
                });
            }
            if config.uses_local_default() {
                probes.push(Probe {
                    name: "local model server",
                    url: format!("{}/models", config.local_llm_url.trim_end_matches('/')),
                    headers: Vec::new(),
                });
            }
            if let Some(token) = &config.vertex_access_token {
                probes.push(Probe {
                    name: "vertex-ai",
                    url: format!("{}/", vertex_base_url(&config.vertex_endpoint)),
                    headers: vec![("authorization", format!("Bearer {}", token.expose_secret()))],
                });
            }
        }
        Self::new(probes)
    }

    pub fn new(probes: Vec<Probe>) -> Self {
        Self {
            probes,
            passed: AtomicBool::new(false),
            stopping: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The process is shutting down: readiness fails from now on.
    pub fn begin_stopping(&self) {
        self.stopping.send_replace(true);
    }

    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Resolves once the process has begun stopping (at once if it has).
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.subscribe();
        async move {
            // The sender lives as long as `self`; were it gone, nothing
            // could begin stopping any more, so waiting forever is right.
            if stopping.wait_for(|stopping| *stopping).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    pub fn probes(&self) -> &[Probe] {
        &self.probes
    }

    /// `Ok` when every provider answered; else the names of those that did not.
    pub async fn check(&self, client: &reqwest::Client) -> Result<(), Vec<String>> {
        if self.passed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let results = futures::future::join_all(self.probes.iter().map(|p| probe(client, p))).await;
        let failed: Vec<String> = results.into_iter().flat_map(Result::err).collect();
        if failed.is_empty() {
            self.passed.store(true, Ordering::Relaxed);
            Ok(())
        } else {
            Err(failed)
        }
    }
}

async fn probe(client: &reqwest::Client, probe: &Probe) -> Result<(), String> {
    let mut request = client.get(&probe.url).timeout(PROBE_TIMEOUT);
    for (name, value) in &probe.headers {
        request = request.header(*name, value);
    }
    match request.send().await {
        Ok(resp) => {
            let status = resp.status();
            if status.is_server_error() || status == 401 || status == 403 {
                Err(format!("{} (HTTP {})", probe.name, status.as_u16()))
            } else {
                Ok(())
            }
        }
        Err(err) if err.is_timeout() => Err(format!("{} (timed out)", probe.name)),
        Err(_) => Err(format!("{} (unreachable)", probe.name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn probes_follow_the_configuration() {
        let names = |c: Config| -> Vec<&'static str> {
            Readiness::from_config(&c.providers)
                .probes()
                .iter()
                .map(|p| p.name)
                .collect()
        };
        assert_eq!(
            names(Config::for_tests(&[]).unwrap()),
            ["local model server"]
        );
        assert_eq!(
            names(Config::for_tests(&[("ANTHROPIC_API_KEY", "k")]).unwrap()),
            ["anthropic"]
        );
        assert!(
            names(Config::for_tests(&[("AIGW_MOCK_MODEL_RESPONSES", "true")]).unwrap()).is_empty()
        );
    }
}
