//! Duo Chat requests, threads and messages: everything behind `aiAction`,
//! `aiMessages` and `aiConversationThreads`, independent of GraphQL.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use contracts::DuoErrorCode;
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::gid::{self, ChatResource};
use crate::policy::{Ability, Actor, ChatAuthError, Policy};

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdditionalContext {
    pub id: String,
    pub category: String,
    pub content: String,
    pub metadata: Option<Value>,
}

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
    #[serde(default)]
    pub additional_context: Vec<AdditionalContext>,
    #[serde(default)]
    pub platform_origin: Option<String>,
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

/// Where completion jobs go. The job is written in the transaction that stores
/// the user's message, so a question is never stored without its job (or the
/// other way round).
#[async_trait]
pub trait CompletionQueue: Send + Sync {
    async fn enqueue(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        job: &CompletionJob,
    ) -> Result<(), ChatError>;
}

/// The production queue: a `chat_completion` job in `background_jobs`, deduplicated
/// by request id, run by the `worker` role.
pub struct PgCompletionQueue {
    pub max_attempts: i32,
}

#[async_trait]
impl CompletionQueue for PgCompletionQueue {
    async fn enqueue(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        job: &CompletionJob,
    ) -> Result<(), ChatError> {
        let options = job_queue::EnqueueOptions {
            max_attempts: self.max_attempts.max(1),
            ..Default::default()
        }
        .queue(COMPLETION_QUEUE)
        .dedupe(format!("chat_completion:{}", job.request_id));
        job_queue::enqueue(tx, job, options).await?;
        Ok(())
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

#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    pub id: i64,
    pub conversation_type: ConversationType,
    pub created_at: DateTime<Utc>,
    pub last_updated_at: DateTime<Utc>,
    pub title: Option<String>,
}

pub async fn store_message(
    db: &impl GenericClient,
    thread_id: i64,
    role: Role,
    content: &str,
    request_xid: Option<Uuid>,
    error_details: Option<Value>,
    extras: Value,
) -> Result<StoredMessage, ChatError> {
    let row = db
        .query_one(
            "WITH m AS (
                 INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid, error_details, extras)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *
             ), t AS (
                 UPDATE ai_conversation_threads SET last_updated_at = now() WHERE id = $1
             )
             SELECT id, thread_id, role, content, message_xid, request_xid, error_details, extras, has_feedback, created_at FROM m",
            &[&thread_id, &(role as i16), &content, &Uuid::new_v4(), &request_xid, &error_details, &extras],
        )
        .await?;
    Ok(message_from_row(&row))
}

/// Stores the assistant's answer to `request_xid` unless one is stored already
/// (a unique index allows one per request); `None` when it was already there.
pub async fn store_answer_once(
    db: &impl GenericClient,
    thread_id: i64,
    request_xid: Uuid,
    content: &str,
    error_details: Option<Value>,
    extras: Value,
) -> Result<Option<StoredMessage>, ChatError> {
    let row = db
        .query_opt(
            "WITH m AS (
                 INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid, error_details, extras)
                 VALUES ($1, 2, $2, $3, $4, $5, $6)
                 ON CONFLICT (request_xid) WHERE role = 2 AND request_xid IS NOT NULL DO NOTHING
                 RETURNING *
             ), t AS (
                 UPDATE ai_conversation_threads SET last_updated_at = now()
                 WHERE id = $1 AND EXISTS (SELECT 1 FROM m)
             )
             SELECT id, thread_id, role, content, message_xid, request_xid, error_details, extras, has_feedback, created_at FROM m",
            &[&thread_id, &content, &Uuid::new_v4(), &request_xid, &error_details, &extras],
        )
        .await?;
    Ok(row.as_ref().map(message_from_row))
}

/// Whether the request already has a stored assistant answer.
pub async fn answer_exists(db: &impl GenericClient, request_xid: Uuid) -> Result<bool, ChatError> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM ai_conversation_messages WHERE request_xid = $1 AND role = 2",
            &[&request_xid],
        )
        .await?
        .is_some())
}

/// Whether the thread still exists (retention or `/clear` may have removed it).
pub async fn thread_exists(db: &impl GenericClient, thread_id: i64) -> Result<bool, ChatError> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM ai_conversation_threads WHERE id = $1",
            &[&thread_id],
        )
        .await?
        .is_some())
}

fn message_from_row(row: &tokio_postgres::Row) -> StoredMessage {
    let details: Option<Value> = row.get(6);
    let errors = details
        .as_ref()
        .and_then(|d| d.get("errors"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let error_code = details
        .as_ref()
        .and_then(|d| d.get("code"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    StoredMessage {
        id: row.get(0),
        thread_id: row.get(1),
        role: if row.get::<_, i16>(2) == 2 {
            Role::Assistant
        } else {
            Role::User
        },
        content: row.get(3),
        message_xid: row.get(4),
        request_xid: row.get(5),
        errors,
        error_code,
        extras: row.get::<_, Option<Value>>(7).unwrap_or(Value::Null),
        has_feedback: row.get(8),
        created_at: row.get(9),
    }
}

/// Renders Markdown to HTML with everything unsafe removed.
pub fn render_markdown(content: &str) -> String {
    let parser = pulldown_cmark::Parser::new_ext(content, pulldown_cmark::Options::all());
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, parser);
    ammonia::clean(&html)
}

pub struct ChatService {
    pub pool: Pool,
    pub policy: Policy,
    pub queue: Arc<dyn CompletionQueue>,
    pub rate_limit: u32,
    pub rate_window: std::time::Duration,
    pub docs_base_url: String,
}

impl ChatService {
    /// Validates, authorizes, rate-limits and stores a chat question, then enqueues
    /// its completion (except for `/clear` and `/reset`).
    pub async fn submit(
        &self,
        user: Option<Actor>,
        request: ChatRequest,
    ) -> Result<ChatAccepted, ChatError> {
        let user = user.ok_or(ChatError::Unauthenticated)?;
        // GitLab counts every attempt, valid or not, before looking at it.
        self.check_rate_limit(user.id).await?;
        validate(&request)?;

        let mut client = self.pool.get().await?;
        self.policy
            .authorize_chat_user(&**client, Some(user))
            .await?;
        if let Some(resource) = &request.resource_id {
            self.authorize_resource(&**client, user, resource).await?;
        }

        let tx = client.transaction().await?;
        let thread =
            resolve_thread_for_write(&*tx, user.id, request.thread_id, request.conversation_type)
                .await?;
        let command = request.content.trim();
        let request_id = Uuid::new_v4();
        if command == "/new" {
            // What GitLab's clients do for `/new` (they drop the thread id):
            // a fresh multi-thread conversation; the old one stays listed.
            let fresh = create_thread(&*tx, user.id, ConversationType::DuoChat).await?;
            tx.commit().await?;
            return Ok(ChatAccepted {
                request_id,
                thread_id: fresh.id,
            });
        }
        if command == "/clear" {
            // Nothing is stored: the conversation continues in a fresh thread.
            let fresh = create_thread(&*tx, user.id, thread.conversation_type).await?;
            tx.commit().await?;
            return Ok(ChatAccepted {
                request_id,
                thread_id: fresh.id,
            });
        }
        let extras = json!({
            "additional_context": request.additional_context.iter().map(|c| json!({
                "id": c.id, "category": c.category, "content": c.content, "metadata": c.metadata,
            })).collect::<Vec<_>>(),
        });
        let question = store_message(
            &*tx,
            thread.id,
            Role::User,
            &request.content,
            Some(request_id),
            None,
            extras,
        )
        .await?;
        if command != "/reset" {
            let job = CompletionJob {
                request_id,
                user_id: user.id,
                thread_id: thread.id,
                content: request.content,
                resource_id: request.resource_id,
                client_subscription_id: request.client_subscription_id,
                current_file: request.current_file,
                additional_context: request.additional_context,
                platform_origin: request.platform_origin,
            };
            self.queue.enqueue(&tx, &job).await?;
        }
        // GitLab echoes the question to the user's open chats; NOTIFY inside the
        // transaction is delivered at commit, so nobody sees an unsaved question.
        crate::subscriptions::publish_to_user(
            &*tx,
            user.id,
            &crate::subscriptions::LiveMessage::stored(question),
        )
        .await?;
        tx.commit().await?;

        Ok(ChatAccepted {
            request_id,
            thread_id: thread.id,
        })
    }

    /// Whether `user` may name `gid_text` as the chat's resource: unknown and
    /// unreadable resources are both `ResourceNotFound`; a readable one in a
    /// group or project with Duo features off is `ResourceNotPermitted`.
    pub async fn authorize_resource(
        &self,
        db: &impl GenericClient,
        user: Actor,
        gid_text: &str,
    ) -> Result<(), ChatError> {
        let subject = match gid::parse_chat_resource(gid_text) {
            Some(ChatResource::User(id)) if id == user.id => return Ok(()),
            Some(ChatResource::Item(subject)) => subject,
            _ => return Err(ChatError::ResourceNotFound),
        };
        let readable = match Ability::to_read(subject) {
            Some(ability) if ability != Ability::ReadNote => {
                self.policy.can(db, Some(user), ability, subject).await?
            }
            _ => false,
        };
        if !readable {
            return Err(ChatError::ResourceNotFound);
        }
        if !self.policy.duo_features_on_for(db, user, subject).await? {
            return Err(ChatError::ResourceNotPermitted);
        }
        Ok(())
    }

    async fn check_rate_limit(&self, user_id: i64) -> Result<(), ChatError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // Serialise one user's requests across every replica while counting.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('ai_action:' || $1::bigint::text, 0))",
            &[&user_id],
        )
        .await?;
        let window = self.rate_window.as_secs_f64();
        let used: i64 = tx
            .query_one(
                "SELECT count(*) FROM rate_limit_events
                 WHERE user_id = $1 AND action = 'ai_action' AND occurred_at > now() - make_interval(secs => $2)",
                &[&user_id, &window],
            )
            .await?
            .get(0);
        if used >= i64::from(self.rate_limit) {
            return Err(ChatError::RateLimited);
        }
        tx.execute(
            "INSERT INTO rate_limit_events (user_id, action) VALUES ($1, 'ai_action')",
            &[&user_id],
        )
        .await?;
        tx.execute(
            "DELETE FROM rate_limit_events WHERE user_id = $1 AND action = 'ai_action'
               AND occurred_at <= now() - make_interval(secs => $2)",
            &[&user_id, &window],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The last messages of a thread, oldest first; `None` thread means the user's
    /// latest thread of the type (a legacy thread is created when missing).
    pub async fn messages(
        &self,
        user: Option<Actor>,
        thread_id: Option<i64>,
        conversation_type: Option<ConversationType>,
        request_ids: Option<&[String]>,
        roles: Option<&[Role]>,
    ) -> Result<Vec<StoredMessage>, ChatError> {
        let Some(user) = user else {
            return Ok(Vec::new());
        };
        let client = self.pool.get().await?;
        let thread = match thread_id {
            Some(id) => find_thread(&**client, user.id, id)
                .await?
                .ok_or(ChatError::ThreadNotFound)?,
            None => {
                let kind = conversation_type.unwrap_or(ConversationType::DuoChatLegacy);
                match latest_thread(&**client, user.id, kind).await? {
                    Some(t) => t,
                    None => create_thread(&**client, user.id, kind).await?,
                }
            }
        };
        let rows = client
            .query(
                "SELECT * FROM (
                     SELECT id, thread_id, role, content, message_xid, request_xid, error_details, extras, has_feedback, created_at
                     FROM ai_conversation_messages WHERE thread_id = $1 ORDER BY id DESC LIMIT $2
                 ) last ORDER BY id",
                &[&thread.id, &THREAD_WINDOW],
            )
            .await?;
        Ok(rows
            .iter()
            .map(message_from_row)
            .filter(|m| {
                request_ids.is_none_or(|ids| {
                    m.request_xid
                        .is_some_and(|r| ids.iter().any(|i| *i == r.to_string()))
                })
            })
            .filter(|m| roles.is_none_or(|rs| rs.contains(&m.role)))
            .collect())
    }

    pub async fn threads(&self, user: Option<Actor>) -> Result<Vec<Thread>, ChatError> {
        let Some(user) = user else {
            return Ok(Vec::new());
        };
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT t.id, t.conversation_type, t.created_at, t.last_updated_at,
                        (SELECT left(content, 80) FROM ai_conversation_messages m
                          WHERE m.thread_id = t.id AND m.role = 1 ORDER BY m.id LIMIT 1)
                 FROM ai_conversation_threads t WHERE t.user_id = $1 ORDER BY t.last_updated_at DESC, t.id DESC",
                &[&user.id],
            )
            .await?;
        Ok(rows.iter().map(thread_from_row).collect())
    }
}

/// Deletes threads (and their messages) idle for more than `days`; returns how many.
pub async fn delete_idle_threads(db: &impl GenericClient, days: i32) -> Result<u64, ChatError> {
    Ok(db
        .execute(
            "DELETE FROM ai_conversation_threads WHERE last_updated_at < now() - make_interval(days => $1)",
            &[&days],
        )
        .await?)
}

/// Retention with the instance's configured number of days.
pub async fn apply_retention(pool: &Pool) -> Result<u64, ChatError> {
    let db = pool.get().await?;
    let days: i32 = db
        .query_one(
            "SELECT duo_chat_expiration_days FROM instance_settings",
            &[],
        )
        .await?
        .get(0);
    delete_idle_threads(&**db, days).await
}

fn validate(request: &ChatRequest) -> Result<(), ChatError> {
    if request.content.trim().is_empty() {
        return Err(ChatError::Invalid("content can't be blank".into()));
    }
    if request.content.chars().count() > MAX_CONTENT_CHARS {
        return Err(ChatError::Invalid(format!(
            "content is too long (maximum is {MAX_CONTENT_CHARS} characters)"
        )));
    }
    if let Some(file) = &request.current_file
        && file.file_name.chars().count() > MAX_FILE_NAME_CHARS
    {
        return Err(ChatError::Invalid(format!(
            "currentFile.fileName is too long (maximum is {MAX_FILE_NAME_CHARS} characters)"
        )));
    }
    for item in &request.additional_context {
        if item.id.chars().count() > MAX_CONTEXT_ID_CHARS {
            return Err(ChatError::Invalid(format!(
                "additionalContext.id is too long (maximum is {MAX_CONTEXT_ID_CHARS} characters)"
            )));
        }
        if item.content.chars().count() > MAX_CONTEXT_CONTENT_CHARS {
            return Err(ChatError::Invalid(format!(
                "additionalContext.content is too long (maximum is {MAX_CONTEXT_CONTENT_CHARS} characters)"
            )));
        }
    }
    Ok(())
}

fn thread_from_row(row: &tokio_postgres::Row) -> Thread {
    Thread {
        id: row.get(0),
        conversation_type: ConversationType::from_db(row.get(1)),
        created_at: row.get(2),
        last_updated_at: row.get(3),
        title: row.try_get::<_, Option<String>>(4).ok().flatten(),
    }
}

async fn find_thread(
    db: &impl GenericClient,
    user_id: i64,
    id: i64,
) -> Result<Option<Thread>, ChatError> {
    let row = db
        .query_opt(
            "SELECT id, conversation_type, created_at, last_updated_at FROM ai_conversation_threads
             WHERE id = $1 AND user_id = $2",
            &[&id, &user_id],
        )
        .await?;
    Ok(row.as_ref().map(thread_from_row))
}

async fn latest_thread(
    db: &impl GenericClient,
    user_id: i64,
    kind: ConversationType,
) -> Result<Option<Thread>, ChatError> {
    let row = db
        .query_opt(
            "SELECT id, conversation_type, created_at, last_updated_at FROM ai_conversation_threads
             WHERE user_id = $1 AND conversation_type = $2 ORDER BY last_updated_at DESC, id DESC LIMIT 1",
            &[&user_id, &(kind as i16)],
        )
        .await?;
    Ok(row.as_ref().map(thread_from_row))
}

async fn create_thread(
    db: &impl GenericClient,
    user_id: i64,
    kind: ConversationType,
) -> Result<Thread, ChatError> {
    let row = db
        .query_one(
            "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, $2)
             RETURNING id, conversation_type, created_at, last_updated_at",
            &[&user_id, &(kind as i16)],
        )
        .await?;
    Ok(thread_from_row(&row))
}

/// GitLab's write-mode thread rules: an explicit thread must be the user's; no
/// thread and no type continues the legacy thread; a type alone starts a new one.
async fn resolve_thread_for_write(
    db: &impl GenericClient,
    user_id: i64,
    thread_id: Option<i64>,
    conversation_type: Option<ConversationType>,
) -> Result<Thread, ChatError> {
    match (thread_id, conversation_type) {
        (Some(id), _) => find_thread(db, user_id, id)
            .await?
            .ok_or(ChatError::ThreadNotFound),
        (None, Some(kind)) => create_thread(db, user_id, kind).await,
        (None, None) => match latest_thread(db, user_id, ConversationType::DuoChatLegacy).await? {
            Some(t) => Ok(t),
            None => create_thread(db, user_id, ConversationType::DuoChatLegacy).await,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_is_rendered_and_sanitised() {
        let html = render_markdown("**bold** <script>alert(1)</script> [x](javascript:alert(1))");
        assert!(html.contains("<strong>bold</strong>"));
        assert!(!html.contains("<script"));
        assert!(!html.contains("javascript:"));
    }

    #[test]
    fn validation_rejects_blank_and_oversized_input() {
        let ok = ChatRequest {
            content: "hi".into(),
            ..Default::default()
        };
        assert!(validate(&ok).is_ok());
        let blank = ChatRequest {
            content: "   ".into(),
            ..Default::default()
        };
        assert!(matches!(validate(&blank), Err(ChatError::Invalid(_))));
        let long = ChatRequest {
            content: "x".repeat(MAX_CONTENT_CHARS + 1),
            ..Default::default()
        };
        assert!(matches!(validate(&long), Err(ChatError::Invalid(_))));
        let ctx = ChatRequest {
            content: "hi".into(),
            additional_context: vec![AdditionalContext {
                id: "x".repeat(256),
                category: "file".into(),
                content: String::new(),
                metadata: None,
            }],
            ..Default::default()
        };
        assert!(matches!(validate(&ctx), Err(ChatError::Invalid(_))));
    }
}
