//! Wire types shared by the monolith and the AI gateway.
//!
//! Both services are upgraded at different times, so every input type ignores
//! unknown fields, and consumers must tolerate event types they do not know.

pub mod agent;
pub mod api_request;
pub mod docs_search;
pub mod duo_workflow;
pub mod error_codes;
pub mod events;
pub mod headers;
pub mod limits;
pub mod prompts;
pub mod unit_primitives;

pub use agent::{
    AdditionalContext, AgentMessage, AgentOptions, AgentRequest, AgentScratchpad, AgentStep,
    ContextCategory, CurrentFile, MessageRole, ModelMetadata, ResourceContext, ResourceType,
};
pub use error_codes::{DuoErrorCode, Layer};
pub use events::AgentEvent;
pub use prompts::PromptRequest;
pub use unit_primitives::UnitPrimitive;
