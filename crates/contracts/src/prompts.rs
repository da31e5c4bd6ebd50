//! The request body of `POST /v1/prompts/{prompt_id}`.

use crate::agent::ModelMetadata;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptRequest {
    /// Template inputs; every variable the prompt uses must be present.
    #[serde(
        deserialize_with = "crate::limits::map_max::<_, { crate::limits::MAX_PROMPT_INPUTS }>"
    )]
    pub inputs: Map<String, Value>,
    /// A semver constraint such as `^1.0.0` (the default) or `=1.0.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_version: Option<String>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_metadata: Option<ModelMetadata>,
}

impl PromptRequest {
    /// Bytes of the text in the inputs (strings at any depth), checked against
    /// the gateway's prompt limit before rendering.
    pub fn text_bytes(&self) -> usize {
        fn walk(v: &Value) -> usize {
            match v {
                Value::String(s) => s.len(),
                Value::Array(items) => items.iter().map(walk).sum(),
                Value::Object(map) => map.iter().map(|(k, v)| k.len() + walk(v)).sum(),
                _ => 8,
            }
        }
        self.inputs.iter().map(|(k, v)| k.len() + walk(v)).sum()
    }
}

/// The constraint used when a request names no version.
pub const DEFAULT_PROMPT_VERSION: &str = "^1.0.0";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let req: PromptRequest =
            serde_json::from_str(r#"{"inputs":{"input":"x"},"other":1}"#).unwrap();
        assert!(!req.stream);
        assert_eq!(req.prompt_version, None);
        assert!(serde_json::from_str::<PromptRequest>(r#"{"stream":true}"#).is_err());
    }
}
