//! A workflow's state, its checkpoint format and the three status
//! vocabularies (the state's, the checkpoint notification's and the
//! monolith's events).

use crate::providers::conversation::{Message, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The state channel's status (GitLab's `WorkflowStatusEnum` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum WorkflowStatus {
    #[default]
    #[serde(rename = "Not Started")]
    NotStarted,
    Planning,
    Execution,
    Completed,
    Error,
    Paused,
    Cancelled,
    #[serde(rename = "input_required")]
    InputRequired,
    #[serde(rename = "plan_approval_required")]
    PlanApprovalRequired,
    #[serde(rename = "tool_call_approval_required")]
    ToolCallApprovalRequired,
}

impl WorkflowStatus {
    /// `NewCheckpoint.status`: the upper-case checkpoint status.
    pub fn checkpoint_status(self) -> &'static str {
        match self {
            Self::NotStarted => "CREATED",
            Self::Planning | Self::Execution => "RUNNING",
            Self::Completed => "FINISHED",
            Self::Error => "FAILED",
            Self::Paused => "PAUSED",
            Self::Cancelled => "STOPPED",
            Self::InputRequired => "INPUT_REQUIRED",
            Self::PlanApprovalRequired => "PLAN_APPROVAL_REQUIRED",
            Self::ToolCallApprovalRequired => "TOOL_CALL_APPROVAL_REQUIRED",
        }
    }

    pub fn awaits_approval(self) -> bool {
        matches!(
            self,
            Self::ToolCallApprovalRequired | Self::PlanApprovalRequired | Self::InputRequired
        )
    }
}

/// What the tool did, shown in the client's chat log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolInfo {
    pub name: String,
    pub args: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_response: Option<String>,
}

/// One entry of `ui_chat_log`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UiChatLogEntry {
    /// agent, user, tool, request or workflow_end.
    pub message_type: String,
    #[serde(default)]
    pub message_sub_type: Option<String>,
    pub content: String,
    pub timestamp: String,
    /// pending, success or failure.
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub correlation_id: Option<String>,
    #[serde(default)]
    pub tool_info: Option<ToolInfo>,
    #[serde(default)]
    pub additional_context: Option<Value>,
    #[serde(default)]
    pub message_id: Option<String>,
}

impl UiChatLogEntry {
    pub fn new(message_type: &str, content: impl Into<String>) -> Self {
        Self {
            message_type: message_type.to_owned(),
            message_sub_type: None,
            content: content.into(),
            timestamp: now_iso(),
            status: Some("success".to_owned()),
            correlation_id: None,
            tool_info: None,
            additional_context: None,
            message_id: Some(uuid::Uuid::new_v4().to_string()),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanStep {
    pub id: String,
    pub description: String,
    /// Not Started, In Progress, Completed.
    pub status: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    #[serde(default)]
    pub steps: Vec<PlanStep>,
}

/// Everything a run needs to continue after a restart; stored in each
/// checkpoint's `channel_values`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkflowState {
    pub status: WorkflowStatus,
    #[serde(default)]
    pub goal: String,
    /// The graph node that runs next (none once the graph has ended).
    #[serde(default)]
    pub next_node: Option<String>,
    /// Each agent's conversation, by agent name.
    #[serde(default)]
    pub conversation_history: BTreeMap<String, Vec<Message>>,
    #[serde(default)]
    pub ui_chat_log: Vec<UiChatLogEntry>,
    #[serde(default)]
    pub plan: Plan,
    /// Calls waiting for the user's approval, with the agent that made them.
    #[serde(default)]
    pub pending_tool_calls: Vec<ToolCall>,
    #[serde(default)]
    pub pending_agent: Option<String>,
    /// Each agent's final answer (the context builder's hands over to the
    /// planner and the executor).
    #[serde(default)]
    pub agent_results: BTreeMap<String, String>,
    /// Graph steps taken so far (the checkpoint metadata's `step`).
    #[serde(default)]
    pub step: i64,
}

impl WorkflowState {
    pub fn conversation(&mut self, agent: &str) -> &mut Vec<Message> {
        self.conversation_history
            .entry(agent.to_owned())
            .or_default()
    }

    /// The state from a stored checkpoint document.
    pub fn from_checkpoint(checkpoint: &Value) -> Result<Self, String> {
        let values = checkpoint
            .get("channel_values")
            .ok_or("the checkpoint has no channel_values")?;
        serde_json::from_value(values.clone()).map_err(|e| e.to_string())
    }

    /// What `newCheckpoint.checkpoint` carries: the parts a client shows.
    pub fn client_view(&self) -> String {
        #[derive(Serialize)]
        struct Values<'a> {
            status: WorkflowStatus,
            ui_chat_log: &'a [UiChatLogEntry],
            plan: &'a Plan,
        }
        #[derive(Serialize)]
        struct View<'a> {
            channel_values: Values<'a>,
        }
        let view = View {
            channel_values: Values {
                status: self.status,
                ui_chat_log: &self.ui_chat_log,
                plan: &self.plan,
            },
        };
        // Plain structs, string keys: serializing cannot fail.
        serde_json::to_string(&view).unwrap_or_default()
    }
}

/// A time-ordered checkpoint id: UUIDv7 text sorts by creation time.
pub fn new_thread_ts() -> String {
    uuid::Uuid::now_v7().to_string()
}

pub fn now_iso() -> String {
    chrono_like_now()
}

/// RFC 3339 UTC with milliseconds, without pulling a date crate in.
fn chrono_like_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let millis = now.subsec_millis();
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

/// The body of `POST …/checkpoints`, serialized once when a step hands it
/// over: writing the state straight to text costs a fraction of building a
/// JSON tree of it first, and the text is what travels to the executor.
/// `parent_ts` is left out until the writer knows which checkpoint it stored
/// last ([`CheckpointPost::with_parent`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointPost {
    /// A JSON object without `parent_ts`.
    object: String,
}

impl CheckpointPost {
    pub fn new(
        state: &WorkflowState,
        thread_ts: &str,
        source: &str,
        model_metadata: Option<&Value>,
    ) -> Self {
        #[derive(Serialize)]
        struct Empty {}
        #[derive(Serialize)]
        struct Document<'a> {
            v: u8,
            id: &'a str,
            ts: String,
            channel_values: &'a WorkflowState,
            channel_versions: Empty,
            versions_seen: Empty,
            pending_sends: [u8; 0],
        }
        #[derive(Serialize)]
        struct Metadata<'a> {
            source: &'a str,
            step: i64,
            writes: Empty,
            parents: Empty,
        }
        #[derive(Serialize)]
        struct Post<'a> {
            thread_ts: &'a str,
            checkpoint: Document<'a>,
            metadata: Metadata<'a>,
            #[serde(skip_serializing_if = "Option::is_none")]
            model_metadata_json: Option<String>,
        }
        let post = Post {
            thread_ts,
            checkpoint: Document {
                v: 1,
                id: thread_ts,
                ts: now_iso(),
                channel_values: state,
                channel_versions: Empty {},
                versions_seen: Empty {},
                pending_sends: [],
            },
            metadata: Metadata {
                source,
                step: state.step,
                writes: Empty {},
                parents: Empty {},
            },
            model_metadata_json: model_metadata.map(Value::to_string),
        };
        // Plain structs, string keys: serializing cannot fail.
        let object = serde_json::to_string(&post).unwrap_or_else(|_| "{}".to_owned());
        Self { object }
    }

    /// The whole body, chained to `parent_ts` (none for a first checkpoint).
    pub fn with_parent(&self, parent_ts: Option<&str>) -> String {
        let parent = match parent_ts {
            Some(ts) => Value::String(ts.to_owned()).to_string(),
            None => "null".to_owned(),
        };
        let rest = self.object.strip_prefix('{').unwrap_or(&self.object);
        let mut body = String::with_capacity(self.object.len() + parent.len() + 16);
        body.push_str("{\"parent_ts\":");
        body.push_str(&parent);
        if rest != "}" {
            body.push(',');
        }
        body.push_str(rest);
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn state_round_trips_through_a_checkpoint() {
        let mut state = WorkflowState {
            status: WorkflowStatus::ToolCallApprovalRequired,
            goal: "g".into(),
            next_node: Some("tools".into()),
            ..WorkflowState::default()
        };
        state.conversation("chat").push(Message::AiMessage {
            content: "x".into(),
            tool_calls: vec![ToolCall {
                id: "1".into(),
                name: "edit_file".into(),
                args: json!({"file_path": "a"}),
            }],
        });
        let post = CheckpointPost::new(&state, "t2", "loop", None);
        let body: Value = serde_json::from_str(&post.with_parent(Some("t1"))).unwrap();
        assert_eq!(body["parent_ts"], "t1");
        assert_eq!(body["thread_ts"], "t2");
        assert_eq!(
            body["metadata"],
            json!({"source": "loop", "step": 0, "writes": {}, "parents": {}})
        );
        assert_eq!(body["checkpoint"]["pending_sends"], json!([]));
        assert_eq!(body.get("model_metadata_json"), None);
        let first: Value = serde_json::from_str(&post.with_parent(None)).unwrap();
        assert_eq!(first["parent_ts"], Value::Null);
        let chosen = json!({"provider": "anthropic"});
        let with_model: Value = serde_json::from_str(
            &CheckpointPost::new(&state, "t3", "loop", Some(&chosen)).with_parent(Some("t\"2")),
        )
        .unwrap();
        assert_eq!(with_model["parent_ts"], "t\"2");
        assert_eq!(with_model["model_metadata_json"], chosen.to_string());
        assert_eq!(
            body["checkpoint"]["channel_values"]["status"],
            "tool_call_approval_required"
        );
        assert_eq!(
            body["checkpoint"]["channel_values"]["conversation_history"]["chat"][0]["type"],
            "AIMessage"
        );
        let back = WorkflowState::from_checkpoint(&body["checkpoint"]).unwrap();
        assert_eq!(back, state);
    }

    #[test]
    fn thread_ts_sort_in_creation_order() {
        let a = new_thread_ts();
        let b = new_thread_ts();
        assert!(a < b, "{a} < {b}");
        assert!(now_iso().ends_with('Z'));
        assert_eq!(now_iso().len(), "2026-01-01T00:00:00.000Z".len());
    }
}
