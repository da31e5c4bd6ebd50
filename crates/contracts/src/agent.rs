//! The request body of `POST /v2/chat/agent`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The unavailable-resources list the gateway assumes when the caller sends none.
pub const DEFAULT_UNAVAILABLE_RESOURCES: &str = "Merge Requests, Pipelines, Vulnerabilities";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRequest {
    /// History plus the current question; the last message must be from the user.
    pub messages: Vec<AgentMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<AgentOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_metadata: Option<ModelMetadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_resources: Option<Vec<String>>,
}

impl AgentRequest {
    /// The scratchpad steps taken so far, empty when none were sent.
    pub fn steps(&self) -> &[AgentStep] {
        self.options
            .as_ref()
            .and_then(|o| o.agent_scratchpad.as_ref())
            .map(|s| s.steps.as_slice())
            .unwrap_or(&[])
    }

    pub fn unavailable_resources(&self) -> Vec<String> {
        self.unavailable_resources
            .clone()
            .unwrap_or_else(|| vec![DEFAULT_UNAVAILABLE_RESOURCES.to_owned()])
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageRole {
    User,
    Assistant,
    System,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentMessage {
    pub role: MessageRole,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ResourceContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_file: Option<CurrentFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_context: Option<Vec<AdditionalContext>>,
    /// Accepted for compatibility; not used by the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_content: Option<String>,
}

impl AgentMessage {
    pub fn new(role: MessageRole, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            context: None,
            current_file: None,
            additional_context: None,
            resource_content: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceType {
    Issue,
    Epic,
    MergeRequest,
    Commit,
    Build,
}

impl ResourceType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Issue => "issue",
            Self::Epic => "epic",
            Self::MergeRequest => "merge_request",
            Self::Commit => "commit",
            Self::Build => "build",
        }
    }
}

/// The resource the user is looking at, serialised by the monolith.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceContext {
    #[serde(rename = "type")]
    pub resource_type: ResourceType,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentFile {
    pub file_path: String,
    pub data: String,
    /// True when `data` is the user's selection rather than the whole file.
    #[serde(default)]
    pub selected_code: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextCategory {
    File,
    Snippet,
    MergeRequest,
    Issue,
    Dependency,
    LocalGit,
    Terminal,
    Repository,
    Directory,
    UserRule,
}

impl ContextCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Snippet => "snippet",
            Self::MergeRequest => "merge_request",
            Self::Issue => "issue",
            Self::Dependency => "dependency",
            Self::LocalGit => "local_git",
            Self::Terminal => "terminal",
            Self::Repository => "repository",
            Self::Directory => "directory",
            Self::UserRule => "user_rule",
        }
    }

    /// The unit primitive a caller needs to send an item of this category.
    pub fn unit_primitive(self) -> String {
        format!("include_{}_context", self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdditionalContext {
    pub category: ContextCategory,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_scratchpad: Option<AgentScratchpad>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentScratchpad {
    #[serde(default = "react")]
    pub agent_type: String,
    #[serde(default)]
    pub steps: Vec<AgentStep>,
}

fn react() -> String {
    "react".to_owned()
}

impl AgentScratchpad {
    pub fn react(steps: Vec<AgentStep>) -> Self {
        Self {
            agent_type: react(),
            steps,
        }
    }
}

/// One step the agent already took: what it thought, which tool it ran with
/// which input, and what the tool returned.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentStep {
    #[serde(default)]
    pub thought: String,
    #[serde(default)]
    pub tool: String,
    #[serde(default)]
    pub tool_input: String,
    #[serde(default)]
    pub observation: String,
}

/// A self-hosted model chosen per request (only honoured when custom models
/// are enabled on the gateway). Each string is at most 255 characters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelMetadata {
    pub name: String,
    pub provider: String,
    pub endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identifier: Option<String>,
}

impl ModelMetadata {
    pub const MAX_FIELD_LEN: usize = 255;

    /// Names the first field longer than the limit, if any.
    pub fn oversized_field(&self) -> Option<&'static str> {
        let fields: [(&'static str, Option<&String>); 5] = [
            ("name", Some(&self.name)),
            ("provider", Some(&self.provider)),
            ("endpoint", Some(&self.endpoint)),
            ("api_key", self.api_key.as_ref()),
            ("identifier", self.identifier.as_ref()),
        ];
        fields
            .into_iter()
            .find(|(_, v)| v.is_some_and(|v| v.chars().count() > Self::MAX_FIELD_LEN))
            .map(|(k, _)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_ignored_and_defaults_apply() {
        let body = r#"{"messages":[{"role":"user","content":"hi","surprise":1,
            "additional_context":[{"category":"local_git","id":"x","future":true}]}],
            "brand_new":{"a":1}}"#;
        let req: AgentRequest = serde_json::from_str(body).unwrap();
        assert_eq!(req.messages.len(), 1);
        assert!(req.steps().is_empty());
        assert_eq!(
            req.unavailable_resources(),
            vec![DEFAULT_UNAVAILABLE_RESOURCES.to_owned()]
        );
        let ctx = &req.messages[0].additional_context.as_ref().unwrap()[0];
        assert_eq!(ctx.category.unit_primitive(), "include_local_git_context");
    }

    #[test]
    fn scratchpad_round_trips() {
        let body = r##"{"messages":[{"role":"user","content":"q"}],
          "options":{"agent_scratchpad":{"agent_type":"react","steps":[
            {"thought":"t","tool":"issue_reader","tool_input":"#1","observation":"o"}]}}}"##;
        let req: AgentRequest = serde_json::from_str(body).unwrap();
        assert_eq!(req.steps()[0].tool, "issue_reader");
        let again: AgentRequest =
            serde_json::from_str(&serde_json::to_string(&req).unwrap()).unwrap();
        assert_eq!(again, req);
    }

    #[test]
    fn unknown_category_and_role_are_rejected() {
        let bad = r#"{"messages":[{"role":"robot","content":"q"}]}"#;
        assert!(serde_json::from_str::<AgentRequest>(bad).is_err());
        let bad = r#"{"messages":[{"role":"user","content":"q","additional_context":[{"category":"nope"}]}]}"#;
        assert!(serde_json::from_str::<AgentRequest>(bad).is_err());
    }

    #[test]
    fn model_metadata_length_limit() {
        let mut m = ModelMetadata {
            name: "mistral".into(),
            provider: "openai".into(),
            endpoint: "http://x".into(),
            api_key: None,
            identifier: None,
        };
        assert_eq!(m.oversized_field(), None);
        m.identifier = Some("a".repeat(256));
        assert_eq!(m.oversized_field(), Some("identifier"));
    }
}
