//! The tools the ReAct agent may run. The gateway decides which tools the
//! model is offered; the monolith runs them. A tool authorizes the user
//! through the policy module before any content of a resource is read, so
//! nothing the user may not see can reach a prompt.
//!
//! Adding a tool: `docs/adding-a-tool.md`.

pub mod build_reader;
pub mod codebase_search;
pub mod commit_reader;
pub mod epic_reader;
pub mod gitlab_documentation;
pub mod issue_reader;
pub mod merge_request_reader;
pub mod resource_identifier;

use async_trait::async_trait;
use contracts::{DuoErrorCode, UnitPrimitive};

use super::{RequestContext, Services};
use crate::chat::completion::{ChatAnswer, ChunkSender};

/// What the agent asked a tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInput {
    /// The model's `Action Input`.
    pub input: String,
    /// The model's thought before the action: a hint for identifier prompts.
    pub suggestions: String,
}

/// What a tool produced.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// Goes into the scratchpad; the agent takes another step.
    Observation(String),
    /// The answer itself (already streamed to the chunk sender when streamed).
    Final(ChatAnswer),
    /// A coded failure ends the request.
    Failed { code: DuoErrorCode, detail: String },
}

impl ToolOutcome {
    pub fn failed(code: DuoErrorCode, detail: impl Into<String>) -> Self {
        Self::Failed {
            code,
            detail: detail.into(),
        }
    }
}

/// Everything a tool may use while it runs.
pub struct ToolEnv<'a> {
    pub services: &'a Services,
    pub ctx: &'a RequestContext,
    pub chunks: &'a ChunkSender,
}

#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model writes after `Action:` (the gateway's catalogue name).
    fn name(&self) -> &'static str;
    /// The scope the user's seat must grant for this tool.
    fn unit_primitive(&self) -> UnitPrimitive;
    /// The feature flag that must be on for the question, if any (the
    /// gateway gates the tool on the same flag).
    fn feature_flag(&self) -> Option<&'static str> {
        None
    }
    async fn execute(&self, env: &ToolEnv<'_>, input: &ToolInput) -> ToolOutcome;
}

/// The tools this monolith implements.
pub struct ToolBox {
    tools: Vec<Box<dyn Tool>>,
}

impl ToolBox {
    pub fn standard() -> Self {
        Self {
            tools: vec![
                Box::new(build_reader::BuildReader),
                Box::new(commit_reader::CommitReader),
                Box::new(epic_reader::epic_reader()),
                Box::new(issue_reader::issue_reader()),
                Box::new(merge_request_reader::merge_request_reader()),
                Box::new(gitlab_documentation::GitlabDocumentation),
                Box::new(codebase_search::CodebaseSearch),
            ],
        }
    }

    /// These tools but the one named `name`.
    pub fn without(mut self, name: &str) -> Self {
        self.tools.retain(|t| t.name() != name);
        self
    }

    pub fn find(&self, name: &str) -> Option<&dyn Tool> {
        self.tools
            .iter()
            .find(|t| t.name() == name)
            .map(|t| t.as_ref())
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|t| t.name()).collect()
    }

    /// Runs a tool after checking the user's seat grants it (else M3005)
    /// and its feature flag is on for the question (else the model is told
    /// the tool is not available, and nothing is read).
    pub async fn run(&self, tool: &dyn Tool, env: &ToolEnv<'_>, input: &ToolInput) -> ToolOutcome {
        if let Some(flag) = tool.feature_flag()
            && !env.ctx.feature_enabled(flag)
        {
            return ToolOutcome::Observation(flag_off_observation(tool.name()));
        }
        if !env.ctx.has_scope(tool.unit_primitive()) {
            return ToolOutcome::failed(
                DuoErrorCode::M3005,
                format!("the seat does not grant {}", tool.unit_primitive()),
            );
        }
        crate::ai_usage::note_tool(tool.name());
        tool.execute(env, input).await
    }
}

/// What the model reads when it picks a tool whose feature flag is off.
pub fn flag_off_observation(tool: &str) -> String {
    format!("The tool {tool} is not available. Answer with another tool or from what you know.")
}
