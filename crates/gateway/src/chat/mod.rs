//! Duo Chat on the gateway side: the tool catalogue, the ReAct output parser
//! and the agent that streams events for `/v2/chat/agent`.

pub mod agent;
pub mod native;
pub mod react_parser;
pub mod tools_registry;

pub use tools_registry::{DuoChatToolsRegistry, ToolDefinition};
