//! Duo Chat on the gateway side: the tool catalogue, the ReAct output parser
//! and the agent that streams events for `/v2/chat/agent`. The [`agent`]
//! prepares each step and runs it with the ReAct parser, or hands it to
//! [`native`] when the prompt asks for the provider's own tool calling.

pub mod agent;
pub mod native;
pub mod react_parser;
pub mod tools_registry;

pub use tools_registry::{DuoChatToolsRegistry, ToolDefinition};

/// The `feature_category` of the agent's model calls, both ways of asking
/// (GitLab's category for chat).
pub const FEATURE_CATEGORY: &str = "duo_chat";
