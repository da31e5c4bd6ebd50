//! Code embeddings for the monolith's code index: texts in, one vector per
//! text out, from the configured embedding model (the bundled model server's
//! MiniLM by default, an OpenAI-compatible `/embeddings`, or Vertex AI's
//! `:predict`), or a self-hosted model named in the request.
//!
//! Texts go out in batches of `AIGW_CODE_EMBEDDINGS__BATCH_SIZE`. A batch the
//! model refuses as too long is split in half and each half tried again (as
//! GitLab's indexer does); a single text that is still too long is the
//! caller's error. Overload and connection failures are retried once.

use std::time::Duration;

use secrecy::ExposeSecret;
use serde_json::{Value, json};

use crate::config::{CodeEmbeddingsConfig, EmbeddingProvider, ProvidersConfig};

/// Where one embedding call goes.
#[derive(Debug, Clone)]
pub struct EmbeddingTarget {
    pub provider: EmbeddingProvider,
    /// Base URL: `…/v1` for OpenAI-compatible servers, the host for Vertex.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Vertex only.
    pub vertex_project: String,
    pub vertex_location: String,
    /// A request named the endpoint: the egress-checked client calls it.
    pub egress: crate::providers::Egress,
}

impl EmbeddingTarget {
    /// The instance's configured embedding model.
    pub fn configured(config: &CodeEmbeddingsConfig, providers: &ProvidersConfig) -> Self {
        let (base_url, api_key) = match config.provider {
            EmbeddingProvider::Local => (providers.local_llm_url.clone(), None),
            EmbeddingProvider::OpenAi => (
                providers
                    .openai_base_url
                    .clone()
                    .unwrap_or_else(|| "https://api.openai.com/v1".into()),
                providers
                    .openai_api_key
                    .as_ref()
                    .map(|k| k.expose_secret().to_owned()),
            ),
            EmbeddingProvider::Vertex => (
                providers.vertex_endpoint.clone(),
                providers
                    .vertex_access_token
                    .as_ref()
                    .map(|k| k.expose_secret().to_owned()),
            ),
        };
        Self {
            provider: config.provider,
            base_url,
            model: config.model.clone(),
            api_key,
            vertex_project: providers.vertex_project.clone(),
            vertex_location: providers.vertex_location.clone(),
            egress: crate::providers::Egress::Configured,
        }
    }

    /// `model.engine` in the answer.
    pub fn engine(&self) -> &'static str {
        match self.provider {
            EmbeddingProvider::Local => "local",
            EmbeddingProvider::OpenAi => "openai",
            EmbeddingProvider::Vertex => "vertex-ai",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// One text alone is over the model's input limit.
    #[error("an input is too long for the embedding model")]
    InputTooLong,
    /// The model rate-limits us (after the retry).
    #[error("the embedding model is rate limited")]
    RateLimited,
    /// The model's credentials were refused.
    #[error("the embedding model refused the credentials")]
    Unauthorized,
    #[error("the embedding model did not answer in time")]
    Timeout,
    /// Anything else the model or the network did.
    #[error("embedding model error: {0}")]
    Upstream(String),
}

/// What one call to the model answered.
enum CallError {
    TooLong,
    Retryable(EmbedError),
    Final(EmbedError),
}

/// Embeds `texts`, one vector per text, in order.
pub async fn embed(
    http: &reqwest::Client,
    target: &EmbeddingTarget,
    texts: &[String],
    batch_size: usize,
    timeout: Duration,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let mut out = Vec::with_capacity(texts.len());
    for batch in texts.chunks(batch_size.max(1)) {
        out.extend(embed_halving(http, target, batch, timeout).await?);
    }
    Ok(out)
}

/// One batch; halves it while the model says it is too long.
async fn embed_halving(
    http: &reqwest::Client,
    target: &EmbeddingTarget,
    batch: &[String],
    timeout: Duration,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    // An explicit stack instead of recursion: each entry is a slice still to do,
    // in order.
    let mut pending: Vec<&[String]> = vec![batch];
    let mut done: Vec<Vec<f32>> = Vec::with_capacity(batch.len());
    while let Some(part) = pending.pop() {
        match call_with_retry(http, target, part, timeout).await {
            Ok(vectors) => done.extend(vectors),
            Err(CallError::TooLong) if part.len() > 1 => {
                let (left, right) = part.split_at(part.len() / 2);
                pending.push(right);
                pending.push(left);
            }
            Err(CallError::TooLong) => return Err(EmbedError::InputTooLong),
            Err(CallError::Retryable(e) | CallError::Final(e)) => return Err(e),
        }
    }
    Ok(done)
}

async fn call_with_retry(
    http: &reqwest::Client,
    target: &EmbeddingTarget,
    part: &[String],
    timeout: Duration,
) -> Result<Vec<Vec<f32>>, CallError> {
    match call(http, target, part, timeout).await {
        Err(CallError::Retryable(_)) => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            call(http, target, part, timeout).await
        }
        other => other,
    }
}

async fn call(
    http: &reqwest::Client,
    target: &EmbeddingTarget,
    part: &[String],
    timeout: Duration,
) -> Result<Vec<Vec<f32>>, CallError> {
    let base = target.base_url.trim_end_matches('/');
    let (url, body) = match target.provider {
        EmbeddingProvider::Local | EmbeddingProvider::OpenAi => (
            format!("{base}/embeddings"),
            json!({ "model": target.model, "input": part }),
        ),
        EmbeddingProvider::Vertex => {
            let host = if base.starts_with("http") {
                base.to_owned()
            } else {
                format!("https://{base}")
            };
            (
                format!(
                    "{host}/v1/projects/{}/locations/{}/publishers/google/models/{}:predict",
                    target.vertex_project, target.vertex_location, target.model
                ),
                json!({ "instances": part.iter().map(|t| json!({ "content": t, "task_type": "RETRIEVAL_DOCUMENT" })).collect::<Vec<_>>() }),
            )
        }
    };
    let mut request = http
        .post(url)
        .headers(duo_telemetry::outgoing_headers())
        .timeout(timeout)
        .json(&body);
    if let Some(key) = &target.api_key {
        request = request.bearer_auth(key);
    }
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return Err(CallError::Final(EmbedError::Timeout)),
        Err(e) => return Err(CallError::Retryable(EmbedError::Upstream(e.to_string()))),
    };
    let status = response.status();
    let text = response
        .text()
        .await
        .map_err(|e| CallError::Retryable(EmbedError::Upstream(e.to_string())))?;
    if !status.is_success() {
        let lower = text.to_lowercase();
        return Err(match status.as_u16() {
            400 | 413
                if ["too long", "token", "maximum context", "input length"]
                    .iter()
                    .any(|w| lower.contains(w)) =>
            {
                CallError::TooLong
            }
            401 | 403 => CallError::Final(EmbedError::Unauthorized),
            429 => CallError::Retryable(EmbedError::RateLimited),
            500..=599 => CallError::Retryable(EmbedError::Upstream(format!("status {status}"))),
            _ => CallError::Final(EmbedError::Upstream(format!("status {status}"))),
        });
    }
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| CallError::Final(EmbedError::Upstream(format!("bad answer: {e}"))))?;
    let vectors = parse_vectors(target.provider, &value)
        .ok_or_else(|| CallError::Final(EmbedError::Upstream("bad answer shape".into())))?;
    if vectors.len() != part.len() {
        return Err(CallError::Final(EmbedError::Upstream(format!(
            "{} vectors for {} inputs",
            vectors.len(),
            part.len()
        ))));
    }
    Ok(vectors)
}

fn floats(value: &Value) -> Option<Vec<f32>> {
    value
        .as_array()?
        .iter()
        .map(|v| v.as_f64().map(|f| f as f32))
        .collect()
}

/// The vectors of an answer, in input order.
fn parse_vectors(provider: EmbeddingProvider, value: &Value) -> Option<Vec<Vec<f32>>> {
    match provider {
        EmbeddingProvider::Local | EmbeddingProvider::OpenAi => {
            let mut items: Vec<(u64, Vec<f32>)> = value["data"]
                .as_array()?
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    Some((
                        item["index"].as_u64().unwrap_or(i as u64),
                        floats(&item["embedding"])?,
                    ))
                })
                .collect::<Option<_>>()?;
            items.sort_by_key(|(i, _)| *i);
            Some(items.into_iter().map(|(_, v)| v).collect())
        }
        EmbeddingProvider::Vertex => value["predictions"]
            .as_array()?
            .iter()
            .map(|p| floats(&p["embeddings"]["values"]))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_answer_shapes_are_read_in_order() {
        let openai = json!({"data": [
            {"index": 1, "embedding": [0.5, 0.5]},
            {"index": 0, "embedding": [1.0, 0.0]}
        ]});
        assert_eq!(
            parse_vectors(EmbeddingProvider::OpenAi, &openai),
            Some(vec![vec![1.0, 0.0], vec![0.5, 0.5]])
        );
        let vertex = json!({"predictions": [{"embeddings": {"values": [0.25]}}]});
        assert_eq!(
            parse_vectors(EmbeddingProvider::Vertex, &vertex),
            Some(vec![vec![0.25]])
        );
        assert_eq!(parse_vectors(EmbeddingProvider::Vertex, &json!({})), None);
    }
}
