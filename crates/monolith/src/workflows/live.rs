//! Live workflow updates for the owner's `workflowEventsUpdated` subscription:
//! each status change and each new checkpoint is published (PostgreSQL NOTIFY
//! through `job_queue::pubsub`, at commit) on the owner's topic; subscribers
//! keep the messages of the workflow they asked for.
//!
//! A checkpoint travels by reference (its id): it is already stored, and
//! copying a long run's state into every notification would write it twice
//! and serialize it again for nobody when no one is subscribed. A subscriber
//! reads it when it delivers the event ([`WorkflowEventMessage::resolve`]).

use crate::queries::Queries;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use super::checkpoint_record::{self as checkpoints, Checkpoint};
use super::record::Workflow;
use super::{Status, WorkflowError};

/// The topic of one user's workflow updates.
pub fn user_topic(user_id: i64) -> String {
    format!("duo_workflow:user:{user_id}")
}

/// One `DuoWorkflowEvent` as it travels between processes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkflowEventMessage {
    pub workflow_id: i64,
    /// The status name (`running`).
    pub status: String,
    pub goal: String,
    pub workflow_definition: String,
    pub checkpoint: Option<Box<RawValue>>,
    pub metadata: Option<Value>,
    /// The stored checkpoint this event is about, when it is not inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<i64>,
    pub thread_ts: Option<String>,
    pub parent_ts: Option<String>,
    pub timestamp: Option<DateTime<Utc>>,
    pub parent_timestamp: Option<DateTime<Utc>>,
}

impl WorkflowEventMessage {
    pub fn new(workflow: &Workflow, status: Status, checkpoint: Option<&Checkpoint>) -> Self {
        Self {
            workflow_id: workflow.id,
            status: status.name().to_owned(),
            goal: workflow.goal.clone(),
            workflow_definition: workflow.workflow_definition.clone(),
            checkpoint: None,
            metadata: None,
            checkpoint_id: checkpoint.map(|c| c.id),
            thread_ts: checkpoint.map(|c| c.thread_ts.clone()),
            parent_ts: checkpoint.and_then(|c| c.parent_ts.clone()),
            // Read from the body when the event is delivered
            // ([`summary_of`]): a long run's body is not scanned for nobody.
            timestamp: None,
            parent_timestamp: None,
        }
    }

    /// Reads the referenced checkpoint into the message (it may be gone by
    /// now, deleted with its workflow: then the event carries none).
    /// A connection is taken only for that.
    pub async fn resolve(mut self, pool: &deadpool_postgres::Pool) -> Result<Self, WorkflowError> {
        let (None, Some(id)) = (&self.checkpoint, self.checkpoint_id) else {
            return Ok(self);
        };
        let db = pool.get().await.map_err(crate::db::DbError::from)?;
        if let Some(stored) = checkpoints::get(&db, self.workflow_id, id).await? {
            self.checkpoint = Some(stored.checkpoint);
            self.metadata = Some(stored.metadata);
        }
        Ok(self)
    }
}

/// The two small fields an event shows from its checkpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointSummary {
    /// When the checkpoint was taken: LangGraph's `ts`.
    pub timestamp: Option<DateTime<Utc>>,
    /// The state's own status (`channel_values.status`).
    pub status: Option<String>,
}

/// Reads [`CheckpointSummary`] from a checkpoint's text in one pass, without
/// building the rest of it.
pub fn summary_of(checkpoint: &RawValue) -> CheckpointSummary {
    #[derive(Default, Deserialize)]
    struct Peek {
        ts: Option<Value>,
        channel_values: Option<PeekValues>,
    }
    #[derive(Deserialize)]
    struct PeekValues {
        status: Option<Value>,
    }
    let peek: Peek = serde_json::from_str(checkpoint.get()).unwrap_or_default();
    CheckpointSummary {
        timestamp: peek
            .ts
            .as_ref()
            .and_then(Value::as_str)
            .and_then(|ts| DateTime::parse_from_rfc3339(ts).ok())
            .map(|t| t.with_timezone(&Utc)),
        status: peek
            .channel_values
            .and_then(|v| v.status)
            .and_then(|s| s.as_str().map(str::to_owned)),
    }
}

/// One entry of a checkpoint's conversation (`channel_values.ui_chat_log`),
/// as the workflow service writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ChatLogEntry {
    /// `user`, `agent`, `tool`, `request` or `workflow_end`.
    #[serde(default)]
    pub message_type: String,
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub tool_info: Option<Value>,
    #[serde(default)]
    pub timestamp: Option<String>,
    #[serde(default)]
    pub correlation_id: Option<String>,
}

/// The conversation a checkpoint carries, oldest first; empty when it has
/// none (or is not a checkpoint of ours). Entries that are not objects are
/// skipped rather than failing the whole list.
pub fn chat_log_of(checkpoint: &RawValue) -> Vec<ChatLogEntry> {
    #[derive(Default, Deserialize)]
    struct Peek {
        channel_values: Option<PeekValues>,
    }
    #[derive(Default, Deserialize)]
    struct PeekValues {
        #[serde(default)]
        ui_chat_log: Vec<Value>,
    }
    let peek: Peek = serde_json::from_str(checkpoint.get()).unwrap_or_default();
    peek.channel_values
        .unwrap_or_default()
        .ui_chat_log
        .into_iter()
        .filter_map(|entry| serde_json::from_value(entry).ok())
        .collect()
}

async fn publish(
    db: &impl Queries,
    owner: i64,
    message: &WorkflowEventMessage,
) -> Result<(), WorkflowError> {
    let payload = serde_json::to_value(message).map_err(job_queue::QueueError::from)?;
    crate::db::publish(db, &user_topic(owner), &payload).await?;
    Ok(())
}

/// Tells the owner's subscribers about a status change, with the newest
/// checkpoint (as GitLab's trigger does).
pub async fn publish_status(db: &impl Queries, workflow: &Workflow) -> Result<(), WorkflowError> {
    let latest = checkpoints::latest(db, workflow.id).await?;
    let message = WorkflowEventMessage::new(workflow, workflow.status, latest.as_ref());
    publish(db, workflow.user_id, &message).await
}

/// Tells the owner's subscribers about a new checkpoint.
pub async fn publish_checkpoint(
    db: &impl Queries,
    workflow: &Workflow,
    status: Status,
    checkpoint: &Checkpoint,
) -> Result<(), WorkflowError> {
    let message = WorkflowEventMessage::new(workflow, status, Some(checkpoint));
    publish(db, workflow.user_id, &message).await
}
