//! Shared by the tests that run the chat agent or `/v1/prompts` against a
//! model scripted in the test: the scripted model, the real prompts and a
//! configuration with a provider (whose calls the scripted model takes).
#![allow(dead_code)]

use futures::StreamExt;
use gateway::Config;
use gateway::prompts::PromptRegistry;
use gateway::providers::{ChatModel, ModelCall, ProviderError, TextStream};
use std::path::PathBuf;
use std::sync::Mutex;

pub fn registry() -> PromptRegistry {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../prompts");
    PromptRegistry::load(&dir).unwrap()
}

/// Anthropic configured (family `base`), though the model is always scripted.
pub fn config(extra: &[(&str, &str)]) -> Config {
    let mut vars = vec![("ANTHROPIC_API_KEY", "test-key")];
    vars.extend_from_slice(extra);
    Config::for_tests(&vars).unwrap()
}

/// A model that answers with the chunks it was given, optionally failing
/// before the first chunk, and records every call.
#[derive(Default)]
pub struct ScriptedModel {
    pub chunks: Vec<Result<String, ProviderError>>,
    pub start_error: Option<ProviderError>,
    pub calls: Mutex<Vec<ModelCall>>,
}

impl ScriptedModel {
    pub fn answering(chunks: &[&str]) -> Self {
        Self {
            chunks: chunks.iter().map(|c| Ok((*c).to_owned())).collect(),
            ..Self::default()
        }
    }

    pub fn calls(&self) -> Vec<ModelCall> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl ChatModel for ScriptedModel {
    async fn stream(&self, call: ModelCall) -> Result<TextStream, ProviderError> {
        self.calls.lock().unwrap().push(call);
        if let Some(err) = &self.start_error {
            return Err(err.clone());
        }
        Ok(futures::stream::iter(self.chunks.clone()).boxed())
    }
}
