//! Duo Chat on the gateway side: the tool catalogue, the ReAct output parser
//! and the agent that streams events for `/v2/chat/agent`. The [`agent`]
//! prepares each step and runs it with the ReAct parser, or hands it to
//! [`native`] when the prompt asks for the provider's own tool calling.

pub mod agent;
pub mod budget;
pub mod context_window;
pub mod native;
pub mod react_parser;
pub mod tools_registry;

pub use tools_registry::{DuoChatToolsRegistry, ToolDefinition};

/// The `feature_category` of the agent's model calls, both ways of asking
/// (GitLab's category for chat).
pub const FEATURE_CATEGORY: &str = "duo_chat";

/// The text of an agent `error` event for a failed model call. A model
/// server that refuses the prompt as too large for its context (HTTP 413,
/// as the bundled model server answers) gets the words the monolith turns
/// into A1005, with the server's own account of the sizes.
pub fn model_error_message(err: &crate::providers::ProviderError) -> String {
    match err {
        crate::providers::ProviderError::Status {
            status: 413,
            message,
        } => format!(
            "prompt is too long for the model's context ({message}). Use a model with a larger \
             context (the bundled model server: DUO_LOCAL_LLM_CONTEXT) or ask with less context"
        ),
        other => other.to_string(),
    }
}
