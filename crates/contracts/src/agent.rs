//! The request body of `POST /v2/chat/agent`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::limits::{self, *};

/// The unavailable-resources list the gateway assumes when the caller sends none.
pub const DEFAULT_UNAVAILABLE_RESOURCES: &str = "Merge Requests, Pipelines, Vulnerabilities";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRequest {
    /// History plus the current question; the last message must be from the user.
    #[serde(deserialize_with = "limits::vec_max::<_, _, MAX_MESSAGES>")]
    pub messages: Vec<AgentMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<AgentOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_metadata: Option<ModelMetadata>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "limits::opt_vec_max::<_, _, MAX_UNAVAILABLE_RESOURCES>"
    )]
    pub unavailable_resources: Option<Vec<ShortText>>,
}

/// A short text field (ids, names, paths): at most [`MAX_SHORT_FIELD`] characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShortText(
    #[serde(deserialize_with = "limits::string_max::<_, MAX_SHORT_FIELD>")] pub String,
);

impl From<&str> for ShortText {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl AgentRequest {
    /// Bytes of all the text the request carries (what a prompt built from it
    /// is made of): checked against the gateway's prompt limit before
    /// anything is rendered.
    pub fn text_bytes(&self) -> usize {
        let message = |m: &AgentMessage| {
            m.content.len()
                + m.context.as_ref().map_or(0, |c| c.content.len())
                + m.current_file
                    .as_ref()
                    .map_or(0, |f| f.data.len() + f.file_path.len())
                + m.additional_context
                    .iter()
                    .flatten()
                    .map(|c| {
                        c.content.as_ref().map_or(0, String::len)
                            + c.id.as_ref().map_or(0, String::len)
                    })
                    .sum::<usize>()
        };
        self.messages.iter().map(message).sum::<usize>()
            + self
                .steps()
                .iter()
                .map(|s| s.thought.len() + s.tool.len() + s.tool_input.len() + s.observation.len())
                .sum::<usize>()
    }

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
            .as_ref()
            .map(|list| list.iter().map(|s| s.0.clone()).collect())
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
    #[serde(deserialize_with = "limits::string_max::<_, MAX_MESSAGE_CONTENT>")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ResourceContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_file: Option<CurrentFile>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "limits::opt_vec_max::<_, _, MAX_CONTEXT_ITEMS>"
    )]
    pub additional_context: Option<Vec<AdditionalContext>>,
    /// Accepted for compatibility; not used by the gateway.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "limits::opt_string_max::<_, MAX_RESOURCE_CONTENT>"
    )]
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
    #[serde(deserialize_with = "limits::string_max::<_, MAX_RESOURCE_CONTENT>")]
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentFile {
    #[serde(deserialize_with = "limits::string_max::<_, MAX_SHORT_FIELD>")]
    pub file_path: String,
    #[serde(deserialize_with = "limits::string_max::<_, MAX_RESOURCE_CONTENT>")]
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
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "limits::opt_string_max::<_, MAX_SHORT_FIELD>"
    )]
    pub id: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "limits::opt_string_max::<_, MAX_CONTEXT_CONTENT>"
    )]
    pub content: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "limits::opt_map_max::<_, MAX_METADATA_KEYS>"
    )]
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_scratchpad: Option<AgentScratchpad>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentScratchpad {
    #[serde(
        default = "react",
        deserialize_with = "limits::string_max::<_, MAX_SHORT_FIELD>"
    )]
    pub agent_type: String,
    #[serde(
        default,
        deserialize_with = "limits::vec_max::<_, _, MAX_SCRATCHPAD_STEPS>"
    )]
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
    #[serde(default, deserialize_with = "limits::string_max::<_, MAX_STEP_FIELD>")]
    pub thought: String,
    #[serde(default, deserialize_with = "limits::string_max::<_, MAX_STEP_FIELD>")]
    pub tool: String,
    #[serde(default, deserialize_with = "limits::string_max::<_, MAX_STEP_FIELD>")]
    pub tool_input: String,
    #[serde(default, deserialize_with = "limits::string_max::<_, MAX_OBSERVATION>")]
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
