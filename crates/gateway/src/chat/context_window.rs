//! How many tokens a model's context holds, so the chat agent can size its
//! prompt ([`super::budget`]).
//!
//! In order:
//! 1. `AIGW_MODEL_CONTEXT_TOKENS` (`{"model id": tokens}`), for any model;
//! 2. the model list of the bundled model server (`GET {base}/models`,
//!    `AIGW_LOCAL_LLM__URL`): the entry's `context_length` (also read:
//!    `max_model_len` as vLLM names it, and `context_window`).
//!
//! A server's answer is kept for good; a server that names no size is asked
//! again after [`RETRY_AFTER`]. Endpoints a request named itself are never
//! asked (the gateway does not make extra calls to caller-chosen hosts).

use crate::config::ProvidersConfig;
use crate::providers::route::Egress;
use crate::providers::{ModelRoute, ModelTarget, route_for_target};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a server that reported no context size is left alone.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long the model list may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// `(base url, model)` → the size, or none and when that was learnt.
/// Keys are configured endpoints and model names, hashed once per request.
type Known = HashMap<(String, String), (Option<u32>, Instant), foldhash::fast::RandomState>;

#[derive(Debug, Default)]
pub struct ContextWindows {
    client: reqwest::Client,
    known: Mutex<Known>,
}

impl ContextWindows {
    pub fn new() -> Self {
        Self::default()
    }

    /// The model `target` goes to (its id on the server) and its context
    /// size, if known.
    pub async fn lookup(
        &self,
        config: &ProvidersConfig,
        target: &ModelTarget,
    ) -> Option<(String, u32)> {
        if let Some(tokens) = config.model_context_tokens.get(&target.model) {
            return Some((target.model.clone(), *tokens));
        }
        let route = route_for_target(config, target).ok()?;
        self.for_route(config, &route).await
    }

    /// The model `route` goes to and its context size, if known (the
    /// configured sizes, else the bundled server's model list).
    pub async fn for_route(
        &self,
        config: &ProvidersConfig,
        route: &ModelRoute,
    ) -> Option<(String, u32)> {
        let ModelRoute::OpenAi {
            base_url,
            model,
            egress: Egress::Configured,
            ..
        } = route
        else {
            return None;
        };
        let (base_url, model) = (base_url.clone(), model.clone());
        if let Some(tokens) = config.model_context_tokens.get(&model) {
            return Some((model, *tokens));
        }
        // Only the bundled server is asked: hosted providers' model lists
        // name no context size (and cost a call).
        if base_url != config.local_llm_url {
            return None;
        }
        let key = (base_url.clone(), model.clone());
        if let Ok(known) = self.known.lock()
            && let Some((tokens, when)) = known.get(&key)
            && (tokens.is_some() || when.elapsed() < RETRY_AFTER)
        {
            return tokens.map(|t| (model, t));
        }
        let tokens = self.ask(&base_url, &model).await;
        if let Ok(mut known) = self.known.lock() {
            known.insert(key, (tokens, Instant::now()));
        }
        tokens.map(|t| (model, t))
    }

    async fn ask(&self, base_url: &str, model: &str) -> Option<u32> {
        let url = format!("{}/models", base_url.trim_end_matches('/'));
        let answer = self
            .client
            .get(&url)
            .timeout(LOOKUP_TIMEOUT)
            .send()
            .await
            .ok()?
            .error_for_status()
            .ok()?;
        let list: Value = answer.json().await.ok()?;
        let tokens = context_from_model_list(&list, model);
        tracing::debug!(%url, model, ?tokens, "asked the model server for the context size");
        tokens
    }
}

/// The context size a model list gives `model`.
pub fn context_from_model_list(list: &Value, model: &str) -> Option<u32> {
    let entry = list
        .get("data")?
        .as_array()?
        .iter()
        .find(|m| m.get("id").and_then(Value::as_str) == Some(model))?;
    ["context_length", "max_model_len", "context_window"]
        .iter()
        .find_map(|field| entry.get(*field).and_then(Value::as_u64))
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn model_lists_of_known_servers_are_read() {
        let list = json!({"object": "list", "data": [
            {"id": "smollm2-135m-instruct", "context_length": 2048},
            {"id": "all-minilm-l6-v2"},
            {"id": "mistral", "max_model_len": 32768},
        ]});
        assert_eq!(
            context_from_model_list(&list, "smollm2-135m-instruct"),
            Some(2048)
        );
        assert_eq!(context_from_model_list(&list, "mistral"), Some(32768));
        assert_eq!(context_from_model_list(&list, "all-minilm-l6-v2"), None);
        assert_eq!(context_from_model_list(&list, "other"), None);
    }
}
