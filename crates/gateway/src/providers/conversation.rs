//! A conversation with a tool-calling model: the turns and the calls the
//! model made. The workflow service stores conversations in its checkpoints
//! and the chat agent builds one per native step; the serialized form keeps
//! LangGraph's message type names so checkpoints read like GitLab's.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub args: Value,
}

/// One turn of an agent's conversation, tagged with LangGraph's message type
/// names so checkpoints read like GitLab's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Message {
    HumanMessage {
        content: String,
    },
    #[serde(rename = "AIMessage")]
    AiMessage {
        content: String,
        #[serde(default)]
        tool_calls: Vec<ToolCall>,
    },
    ToolMessage {
        content: String,
        tool_call_id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        is_error: bool,
    },
}

impl Message {
    pub fn human(content: impl Into<String>) -> Self {
        Self::HumanMessage {
            content: content.into(),
        }
    }

    pub fn tool(call: &ToolCall, content: impl Into<String>, is_error: bool) -> Self {
        Self::ToolMessage {
            content: content.into(),
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            is_error,
        }
    }

    /// A rough size in tokens (four bytes each), for context trimming.
    pub fn estimated_tokens(&self) -> usize {
        let bytes = match self {
            Self::HumanMessage { content } => content.len(),
            Self::AiMessage {
                content,
                tool_calls,
            } => {
                content.len()
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.args.to_string().len())
                        .sum::<usize>()
            }
            Self::ToolMessage { content, .. } => content.len(),
        };
        bytes / 4 + 4
    }
}
