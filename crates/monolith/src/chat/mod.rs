//! Duo Chat requests, threads and messages: everything behind `aiAction`,
//! `aiMessages` and `aiConversationThreads`, independent of GraphQL.

pub mod completion;
pub mod jobs;
pub mod live;
pub mod markdown;
pub mod resource;
mod service;
mod storage;

pub use markdown::render_markdown;
pub use service::{ChatService, RATE_LIMIT_ACTION};
pub use storage::{
    CompletionStart, HistoryRow, MAX_FEEDBACK_REASON_CHARS, apply_retention, completion_start,
    delete_idle_threads, delete_thread, messages_since_reset, question_extras, record_feedback,
    store_answer_once, store_answer_recording, store_message, store_question_with_job,
};

use chrono::{DateTime, Utc};
use contracts::DuoErrorCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::policy::ChatAuthError;

/// GitLab's limits on chat input.
pub const MAX_CONTENT_CHARS: usize = 100_000;
pub const MAX_FILE_NAME_CHARS: usize = 1_000;
pub const MAX_CONTEXT_ID_CHARS: usize = 255;
pub const MAX_CONTEXT_CONTENT_CHARS: usize = 600_000;
/// How many messages of a thread are returned and used as history.
pub const THREAD_WINDOW: i64 = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationType {
    DuoChatLegacy = 1,
    DuoCodeReview = 2,
    DuoQuickChat = 3,
    DuoChat = 4,
}

impl ConversationType {
    pub fn from_db(v: i16) -> Self {
        match v {
            2 => Self::DuoCodeReview,
            3 => Self::DuoQuickChat,
            4 => Self::DuoChat,
            _ => Self::DuoChatLegacy,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User = 1,
    Assistant = 2,
}

/// An item of additional context as the gateway receives it: the GraphQL
/// edge converts its input into this type once, the job carries it, the agent
/// passes it on.
pub use contracts::AdditionalContext;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurrentFile {
    pub file_name: String,
    pub selected_text: String,
    pub content_above_cursor: Option<String>,
    pub content_below_cursor: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    pub content: String,
    pub resource_id: Option<String>,
    pub thread_id: Option<i64>,
    pub conversation_type: Option<ConversationType>,
    pub client_subscription_id: Option<String>,
    pub current_file: Option<CurrentFile>,
    pub additional_context: Vec<AdditionalContext>,
    pub platform_origin: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatAccepted {
    pub request_id: Uuid,
    pub thread_id: i64,
}

/// A completion to run for a stored user message: the payload of a
/// `chat_completion` job in the PostgreSQL queue. New fields must default
/// (`#[serde(default)]`) so jobs enqueued by an older release still run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CompletionJob {
    pub request_id: Uuid,
    pub user_id: i64,
    pub thread_id: i64,
    pub content: String,
    /// Global ID of the page's resource (`gid://gitlab/Issue/1`, or the user's own GID).
    pub resource_id: Option<String>,
    /// Where streamed chunks go; `None` means nobody waits for chunks.
    pub client_subscription_id: Option<String>,
    #[serde(default)]
    pub current_file: Option<CurrentFile>,
    #[serde(default, deserialize_with = "known_context_items")]
    pub additional_context: Vec<AdditionalContext>,
    #[serde(default)]
    pub platform_origin: Option<String>,
    /// The question's editor context (`current_file`, `additional_context`)
    /// travels in this job, even when empty. Jobs enqueued by a release
    /// before it lack the flag; their context is read from the stored question.
    #[serde(default)]
    pub context_in_job: bool,
}

/// A job's context items; items this version cannot read (a category from a
/// newer release) are skipped rather than failing the whole answer.
fn known_context_items<'de, D>(deserializer: D) -> Result<Vec<AdditionalContext>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let items = Vec::<Value>::deserialize(deserializer)?;
    Ok(known_context_values(&items))
}

/// The context items of a list of JSON values, skipping unreadable ones.
pub fn known_context_values(items: &[Value]) -> Vec<AdditionalContext> {
    items
        .iter()
        .filter_map(|item| serde_json::from_value(item.clone()).ok())
        .collect()
}

impl job_queue::Job for CompletionJob {
    const KIND: &'static str = "chat_completion";
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("authentication required")]
    Unauthenticated,
    #[error("This endpoint has been requested too many times. Try again later.")]
    RateLimited,
    #[error("{0}")]
    Invalid(String),
    #[error("Thread not found. It may have expired.")]
    ThreadNotFound,
    #[error(
        "The resource that you are attempting to access does not exist or you don't have permission to perform this action"
    )]
    ResourceNotFound,
    #[error("AI features are not enabled or resource is not permitted to be sent.")]
    ResourceNotPermitted,
    #[error("{}", .0.user_message())]
    Denied(DuoErrorCode),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<tokio_postgres::Error> for ChatError {
    fn from(e: tokio_postgres::Error) -> Self {
        ChatError::Internal(e.to_string())
    }
}

impl From<deadpool_postgres::PoolError> for ChatError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        ChatError::Internal(e.to_string())
    }
}

impl From<ChatAuthError> for ChatError {
    fn from(e: ChatAuthError) -> Self {
        match e {
            ChatAuthError::Denied(code) => ChatError::Denied(code),
            ChatAuthError::Policy(p) => ChatError::Internal(p.to_string()),
        }
    }
}

impl From<crate::policy::PolicyError> for ChatError {
    fn from(e: crate::policy::PolicyError) -> Self {
        ChatError::Internal(e.to_string())
    }
}

impl From<job_queue::QueueError> for ChatError {
    fn from(e: job_queue::QueueError) -> Self {
        ChatError::Internal(e.to_string())
    }
}

/// Where completion jobs go. The job is written by the statement (or in the
/// transaction) that stores the user's message, so a question is never stored
/// without its job (or the other way round).
pub trait CompletionQueue: Send + Sync {
    /// How a question's completion job is queued.
    fn options(&self, job: &CompletionJob) -> job_queue::EnqueueOptions;

    /// The job's row, for the statement that stores its question.
    fn job_values(&self, job: &CompletionJob) -> Result<job_queue::JobValues, ChatError> {
        Ok(job_queue::JobValues::new(job, self.options(job))?)
    }
}

/// The production queue: a `chat_completion` job in `background_jobs`, deduplicated
/// by request id, run by the `worker` role.
pub struct PgCompletionQueue {
    pub max_attempts: i32,
}

impl CompletionQueue for PgCompletionQueue {
    fn options(&self, job: &CompletionJob) -> job_queue::EnqueueOptions {
        job_queue::EnqueueOptions {
            max_attempts: self.max_attempts.max(1),
            ..Default::default()
        }
        .queue(COMPLETION_QUEUE)
        .dedupe(format!("chat_completion:{}", job.request_id))
    }
}

/// The queue completion jobs go to.
pub const COMPLETION_QUEUE: &str = "default";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub id: i64,
    pub thread_id: i64,
    pub role: Role,
    pub content: String,
    pub message_xid: Uuid,
    pub request_xid: Option<Uuid>,
    pub errors: Vec<String>,
    pub error_code: Option<String>,
    pub extras: Value,
    pub has_feedback: bool,
    pub created_at: DateTime<Utc>,
}

impl StoredMessage {
    /// A message about to be stored: its id and time are the database's
    /// (stored and announced by one statement, see `live::Announcement`).
    pub fn draft(
        thread_id: i64,
        role: Role,
        content: String,
        request_xid: Option<Uuid>,
        error_details: Option<&Value>,
        extras: Value,
    ) -> Self {
        let (errors, error_code) = storage::errors_of(error_details);
        Self {
            id: 0,
            thread_id,
            role,
            content,
            message_xid: Uuid::new_v4(),
            request_xid,
            errors,
            error_code,
            extras,
            has_feedback: false,
            created_at: Utc::now(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    pub id: i64,
    pub conversation_type: ConversationType,
    pub created_at: DateTime<Utc>,
    pub last_updated_at: DateTime<Utc>,
    pub title: Option<String>,
}
