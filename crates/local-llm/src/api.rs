//! Wire shapes: OpenAI chat/embeddings/models and Vertex text-embedding predict.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<WireMessage>,
    #[serde(default)]
    pub stream: bool,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub stop: Option<StopField>,
    pub seed: Option<u32>,
    pub stream_options: Option<StreamOptions>,
    /// OpenAI function tools: `[{"type": "function", "function": {...}}]`.
    pub tools: Option<Vec<Value>>,
    /// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<Value>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    pub response_format: Option<Value>,
    /// Accepted for compatibility; one call per turn is generated.
    pub parallel_tool_calls: Option<bool>,
    /// OpenAI's penalties (-2 to 2) on tokens already generated: by how often
    /// they occurred, and for occurring at all.
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    /// llama.cpp server's "don't repeat yourself" sampler (0 = off): a token
    /// that would extend a sequence the answer already wrote is penalized by
    /// `multiplier * 1.75^(length - 2)`. It stops the verbatim loops small
    /// models fall into without touching text copied from the prompt.
    pub dry_multiplier: Option<f32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: String,
    /// A string, an array of `{"type":"text","text":...}` parts, or null.
    #[serde(default)]
    pub content: Value,
    /// An assistant turn's earlier calls, in OpenAI's shape.
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn answers this call.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

impl WireMessage {
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            Value::Null => Ok(String::new()),
            Value::String(text) => Ok(text.clone()),
            Value::Array(parts) => {
                let mut text = String::new();
                for part in parts {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::Unprocessable(
                                "only text content parts are supported".to_owned(),
                            ));
                        }
                    }
                }
                Ok(text)
            }
            _ => Err(ApiError::Unprocessable(
                "message content must be a string or an array of text parts".to_owned(),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// `cached_tokens`: prompt tokens whose KV cache was reused.
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub input: EmbeddingInput,
    pub encoding_format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    One(String),
    Many(Vec<String>),
    Tokens(Value),
}

#[derive(Debug, Deserialize)]
pub struct VertexPredictRequest {
    pub instances: Vec<VertexInstance>,
}

#[derive(Debug, Deserialize)]
pub struct VertexInstance {
    pub content: String,
}

/// Parses a JSON body: broken JSON is a 400, JSON of the wrong shape a 422.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            ApiError::Unprocessable(format!("request body does not match the schema: {e}"))
        }
        _ => ApiError::BadRequest(format!("request body is not valid JSON: {e}")),
    })
}
