//! The chat service: validates, authorizes, rate-limits and stores questions,
//! and reads threads and messages back for their owner.

use std::sync::Arc;

use crate::queries::Queries;
use deadpool_postgres::Pool;
use serde_json::json;
use uuid::Uuid;

use super::live;
use super::resource::ChatResourceAccess;
use super::storage::{
    ThreadLookup, create_thread, find_thread, latest_thread, look_up_thread_for_write,
    message_from_row, store_question_with_job, thread_for_write, thread_from_row,
};
use super::*;
use crate::policy::{Actor, Policy};

/// What `aiAction` requests are counted as in the shared rate limiter.
/// The budget chat questions count in (and mentions of the review bot).
pub const RATE_LIMIT_ACTION: &str = "ai_action";

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
        let mut client = self.pool.get().await?;
        // GitLab counts every attempt, valid or not, before looking at it.
        // The access check and the thread's look-up (the named one, or the
        // legacy thread a question without either continues) go out with it
        // (pipelined on the connection); their answers are looked at only
        // after the rate limit and the input.
        let (allowed, access, thread_lookup) = tokio::join!(
            self.take_rate_limit(&client, user.id),
            self.policy.authorize_chat_user(&*client, Some(user)),
            look_up_thread_for_write(
                &*client,
                user.id,
                request.thread_id,
                request.conversation_type
            ),
        );
        allowed?;
        validate(&request)?;
        access?;
        if let Some(resource) = &request.resource_id {
            self.authorize_resource(&*client, user, resource).await?;
        }
        let command = request.content.trim();
        let request_id = Uuid::new_v4();
        if command == "/new" || command == "/clear" {
            return self
                .start_thread(&mut client, user, &request, thread_lookup?, request_id)
                .await;
        }
        let thread = thread_for_write(&*client, user.id, thread_lookup?).await?;
        let extras = json!({ "additional_context": request.additional_context });
        let question = StoredMessage::draft(
            thread.id,
            Role::User,
            request.content.clone(),
            Some(request_id),
            None,
            extras,
        );
        // GitLab echoes the question to the user's open chats, sent by the
        // statement that stores it when it fits a notification (delivered
        // when that statement commits, so nobody sees an unsaved question).
        let echo = live::Announcement::to_user(user.id, &question)?;
        let job = (command != "/reset").then(|| CompletionJob {
            request_id,
            user_id: user.id,
            thread_id: thread.id,
            content: request.content,
            resource_id: request.resource_id,
            client_subscription_id: request.client_subscription_id,
            current_file: request.current_file,
            additional_context: request.additional_context,
            platform_origin: request.platform_origin,
            context_in_job: true,
        });
        match (&echo, &job) {
            // The usual question: stored, echoed and queued by one statement.
            (Some(echo), Some(job)) => {
                let values = self.queue.job_values(job)?;
                store_question_with_job(&*client, &question, echo, &values).await?;
            }
            (Some(echo), None) => {
                store_message(&*client, &question, None, Some(echo)).await?;
            }
            // Too large to echo inline: the echo goes out as a stored payload,
            // in the question's transaction.
            (None, _) => {
                let tx = client.transaction().await?;
                let stored = store_message(&tx, &question, None, None).await?;
                if let Some(job) = &job {
                    crate::db::enqueue(&tx, job, self.queue.options(job)).await?;
                }
                live::publish_to_user(&tx, user.id, &live::LiveMessage::stored(stored)).await?;
                tx.commit().await?;
            }
        }
        Ok(ChatAccepted {
            request_id,
            thread_id: thread.id,
        })
    }

    /// `/new` and `/clear`: a fresh thread, nothing stored in the old one.
    async fn start_thread(
        &self,
        client: &mut deadpool_postgres::Client,
        user: Actor,
        request: &ChatRequest,
        thread_lookup: ThreadLookup,
        request_id: Uuid,
    ) -> Result<ChatAccepted, ChatError> {
        let tx = client.transaction().await?;
        let kind = thread_for_write(&tx, user.id, thread_lookup)
            .await?
            .conversation_type;
        // `/new` is what GitLab's clients send for a new chat (they drop the
        // thread id): a fresh multi-thread conversation, the old one listed.
        // `/clear` continues the conversation in a fresh thread of its type.
        let kind = if request.content.trim() == "/new" {
            ConversationType::DuoChat
        } else {
            kind
        };
        let fresh = create_thread(&tx, user.id, kind).await?;
        tx.commit().await?;
        Ok(ChatAccepted {
            request_id,
            thread_id: fresh.id,
        })
    }

    /// Whether `user` may name `gid_text` as the chat's resource: unknown and
    /// unreadable resources are both `ResourceNotFound`; a readable one in a
    /// group or project with Duo features off is `ResourceNotPermitted`.
    pub async fn authorize_resource(
        &self,
        db: &impl Queries,
        user: Actor,
        gid_text: &str,
    ) -> Result<(), ChatError> {
        match super::resource::authorize(&self.policy, db, user, gid_text).await? {
            ChatResourceAccess::NoResource | ChatResourceAccess::Item(_) => Ok(()),
            ChatResourceAccess::NotFound => Err(ChatError::ResourceNotFound),
            ChatResourceAccess::DuoOff => Err(ChatError::ResourceNotPermitted),
        }
    }

    async fn take_rate_limit(
        &self,
        client: &deadpool_postgres::Client,
        user_id: i64,
    ) -> Result<(), ChatError> {
        let allowed = crate::rate_limit::take(
            client,
            user_id,
            RATE_LIMIT_ACTION,
            self.rate_limit,
            self.rate_window,
        )
        .await?;
        if allowed {
            Ok(())
        } else {
            Err(ChatError::RateLimited)
        }
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
            Some(id) => find_thread(&*client, user.id, id)
                .await?
                .ok_or(ChatError::ThreadNotFound)?,
            None => {
                let kind = conversation_type.unwrap_or(ConversationType::DuoChatLegacy);
                match latest_thread(&*client, user.id, kind).await? {
                    Some(t) => t,
                    None => create_thread(&*client, user.id, kind).await?,
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

fn validate(request: &ChatRequest) -> Result<(), ChatError> {
    // The HTTP edges refuse NUL characters already; this keeps the database
    // safe from any other caller of the service.
    let texts = std::iter::once(request.content.as_str())
        .chain(request.current_file.iter().flat_map(|f| {
            [f.file_name.as_str(), f.selected_text.as_str()]
                .into_iter()
                .chain(f.content_above_cursor.as_deref())
                .chain(f.content_below_cursor.as_deref())
        }))
        .chain(
            request
                .additional_context
                .iter()
                .flat_map(|c| [c.id.as_deref(), c.content.as_deref()])
                .flatten(),
        );
    if texts.into_iter().any(|t| t.contains('\0')) {
        return Err(ChatError::Invalid(
            "Invalid input: NUL characters are not allowed".into(),
        ));
    }
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
        let chars = |text: &Option<String>| text.as_deref().map_or(0, |t| t.chars().count());
        if chars(&item.id) > MAX_CONTEXT_ID_CHARS {
            return Err(ChatError::Invalid(format!(
                "additionalContext.id is too long (maximum is {MAX_CONTEXT_ID_CHARS} characters)"
            )));
        }
        if chars(&item.content) > MAX_CONTEXT_CONTENT_CHARS {
            return Err(ChatError::Invalid(format!(
                "additionalContext.content is too long (maximum is {MAX_CONTEXT_CONTENT_CHARS} characters)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
                id: Some("x".repeat(256)),
                category: contracts::ContextCategory::File,
                content: None,
                metadata: None,
            }],
            ..Default::default()
        };
        assert!(matches!(validate(&ctx), Err(ChatError::Invalid(_))));
        let nul = ChatRequest {
            content: "a\0b".into(),
            ..Default::default()
        };
        assert!(matches!(validate(&nul), Err(ChatError::Invalid(_))));
    }
}
