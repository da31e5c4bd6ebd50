//! Live chat messages: what the worker and the web role publish through
//! PostgreSQL NOTIFY (`job_queue::pubsub`) and what `aiCompletionResponse`
//! subscribers receive, on whichever `web` process their socket is open.
//!
//! Two kinds of topic, both scoped by user id so guessing another user's
//! `clientSubscriptionId` gets nothing:
//! - [`user_topic`]: full messages (the echoed question, the stored answer) for
//!   subscribers that passed `aiAction: CHAT` without a `clientSubscriptionId`;
//! - [`client_topic`]: the streamed chunks and then the full answer of one request.

use std::sync::Arc;

use crate::queries::Queries;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use tokio::sync::{OnceCell, broadcast};
use uuid::Uuid;

use crate::chat::{Role, StoredMessage};

/// Broadcast buffer per topic in one process; a subscriber that falls this far
/// behind skips ahead (it still reads the stored answer through `aiMessages`).
const TOPIC_CAPACITY: usize = 1024;

pub fn user_topic(user_id: i64) -> String {
    format!("ai_completion:user:{user_id}")
}

pub fn client_topic(user_id: i64, client_subscription_id: &str) -> String {
    format!("ai_completion:client:{user_id}:{client_subscription_id}")
}

/// One `AiMessage` as it travels between processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveMessage {
    pub message: StoredMessage,
    /// 1, 2, 3… for streamed chunks; `None` for full messages.
    pub chunk_id: Option<i32>,
    /// A `TOOL` message: which tool the answer is using now (never stored).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool: bool,
}

impl LiveMessage {
    pub fn stored(message: StoredMessage) -> Self {
        Self {
            message,
            chunk_id: None,
            tool: false,
        }
    }

    /// Tells the client that the answer to `request_id` now uses `tool`
    /// (GitLab's message of type `TOOL`, shown as a status, not as text).
    pub fn tool(thread_id: i64, request_id: Uuid, tool: &str) -> Self {
        let mut message = Self::chunk(thread_id, request_id, 0, tool_status(tool));
        message.chunk_id = None;
        message.tool = true;
        message
    }

    /// A streamed piece of the answer to `request_id`; never stored.
    pub fn chunk(thread_id: i64, request_id: Uuid, chunk_id: i32, content: String) -> Self {
        Self {
            message: StoredMessage {
                id: 0,
                thread_id,
                role: Role::Assistant,
                content,
                message_xid: Uuid::new_v4(),
                request_xid: Some(request_id),
                errors: Vec::new(),
                error_code: None,
                extras: serde_json::json!({ "sources": [] }),
                has_feedback: false,
                created_at: Utc::now(),
            },
            chunk_id: Some(chunk_id),
            tool: false,
        }
    }
}

/// What a user reads while a tool runs.
pub fn tool_status(tool: &str) -> String {
    let what = match tool {
        "issue_reader" => "the issue",
        "epic_reader" => "the epic",
        "merge_request_reader" => "the merge request",
        "build_reader" => "the job",
        "commit_reader" => "the commit",
        "codebase_search" => "the code",
        "gitlab_documentation" => "the GitLab documentation",
        _ => "a tool",
    };
    format!("Reading {what}…")
}

/// Publishes to the user's `aiAction` subscribers. Inside a transaction the
/// message goes out at commit.
pub async fn publish_to_user(
    db: &impl Queries,
    user_id: i64,
    message: &LiveMessage,
) -> Result<(), job_queue::QueueError> {
    let payload = serde_json::to_value(message)?;
    crate::db::publish(db, &user_topic(user_id), &payload).await
}

/// Publishes to the subscribers of one request's `clientSubscriptionId`.
pub async fn publish_to_client(
    db: &impl Queries,
    user_id: i64,
    client_subscription_id: &str,
    message: &LiveMessage,
) -> Result<(), job_queue::QueueError> {
    let payload = serde_json::to_value(message)?;
    crate::db::publish(db, &client_topic(user_id, client_subscription_id), &payload).await
}

/// Publishes a stored answer to the user's `aiAction` subscribers and, when
/// the request named one, to its `clientSubscriptionId`'s: one notification
/// for both topics. Inside a transaction the message goes out at commit.
pub async fn publish_answer(
    db: &impl Queries,
    user_id: i64,
    client_subscription_id: Option<&str>,
    message: &LiveMessage,
) -> Result<(), job_queue::QueueError> {
    let payload = serde_json::to_value(message)?;
    let client = client_subscription_id.map(|id| client_topic(user_id, id));
    let also = client.as_deref();
    crate::db::publish_to(db, &user_topic(user_id), also.as_slice(), &payload).await
}

/// The notification that announces a message being stored (as
/// [`publish_to_user`] or [`publish_answer`] would send it), with two
/// stand-ins the database replaces by what only it knows: the message's `id`
/// and `created_at`. So the statement that stores a message also announces
/// it, and as a NOTIFY goes out at commit, a message is announced if and only
/// if it was stored, without a statement of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// The notification's text with both stand-ins in it.
    pub text: String,
    /// The text standing for the id (a number), found once in `text`.
    pub id_stand_in: String,
    /// The text standing for the timestamp (a JSON string), found once in `text`.
    pub created_at_stand_in: String,
    /// An answer's last streamed chunk, sent just before it by the same
    /// statement (answers only: see [`Announcement::after_chunk`]).
    pub chunk_before: Option<String>,
}

/// What the database may put in place of the stand-ins at most: an `i64`
/// and a quoted timestamp with microseconds and an offset.
const FILLED_IN_BYTES: usize = 20 + 40;

impl Announcement {
    /// The echo of a user's question to their `aiAction` subscribers.
    pub fn to_user(
        user_id: i64,
        message: &StoredMessage,
    ) -> Result<Option<Self>, job_queue::QueueError> {
        Self::new(&user_topic(user_id), &[], message)
    }

    /// A stored answer, to the user's subscribers and the request's
    /// `clientSubscriptionId`'s.
    pub fn answer(
        user_id: i64,
        client_subscription_id: Option<&str>,
        message: &StoredMessage,
    ) -> Result<Option<Self>, job_queue::QueueError> {
        let client = client_subscription_id.map(|c| client_topic(user_id, c));
        Self::new(&user_topic(user_id), client.as_deref().as_slice(), message)
    }

    /// Sends `chunk`, the answer's last streamed chunk, to the request's
    /// `clientSubscriptionId` just before this announcement and in the same
    /// statement (one NOTIFY statement fewer for an answer that ended while
    /// its last chunk was being gathered). `false`, and nothing changes, when
    /// the chunk is too large to travel inline: it must then be published first.
    pub fn after_chunk(
        &mut self,
        user_id: i64,
        client_subscription_id: &str,
        chunk: &LiveMessage,
    ) -> Result<bool, job_queue::QueueError> {
        let topic = client_topic(user_id, client_subscription_id);
        self.chunk_before = job_queue::pubsub::inline_notification(&topic, chunk)?;
        Ok(self.chunk_before.is_some())
    }

    /// The announcement of `message` (its id and time are ignored) on `topic`
    /// and `also`, or `None` when it must go the long way: too large to travel
    /// inline, or a stand-in that happens to occur in the message's own text.
    fn new(
        topic: &str,
        also: &[&str],
        message: &StoredMessage,
    ) -> Result<Option<Self>, job_queue::QueueError> {
        // Random stand-ins, checked to occur exactly once: nothing the message
        // carries (its text, its extras) can be mistaken for one.
        let seed = Uuid::new_v4().as_u64_pair().0;
        let id = -1 - i64::try_from(seed >> 2).unwrap_or(0);
        let nanos = u32::try_from(seed % 1_000_000_000).unwrap_or(0);
        let created_at = chrono::DateTime::from_timestamp(0, nanos).unwrap_or_default();
        let mut draft = LiveMessage::stored(message.clone());
        draft.message.id = id;
        draft.message.created_at = created_at;
        let Some(text) = job_queue::pubsub::inline_notification_to(topic, also, &draft)? else {
            return Ok(None);
        };
        let id_stand_in = id.to_string();
        let created_at_stand_in = serde_json::to_string(&created_at)?;
        let once = |needle: &str| text.matches(needle).count() == 1;
        let fits = text.len() + FILLED_IN_BYTES <= job_queue::pubsub::MAX_INLINE_BYTES;
        Ok(
            (fits && once(&id_stand_in) && once(&created_at_stand_in)).then_some(Self {
                text,
                id_stand_in,
                created_at_stand_in,
                chunk_before: None,
            }),
        )
    }
}

/// This process's one LISTEN connection for live messages, opened on the first
/// subscription (so the web role starts even while the database is still coming up).
pub struct LiveHub {
    database_url: String,
    subscriber: OnceCell<job_queue::pubsub::Subscriber>,
}

impl LiveHub {
    pub fn new(database_url: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            database_url: database_url.into(),
            subscriber: OnceCell::new(),
        })
    }

    async fn subscriber(&self) -> Result<&job_queue::pubsub::Subscriber, job_queue::QueueError> {
        self.subscriber
            .get_or_try_init(|| {
                job_queue::pubsub::Subscriber::connect(&self.database_url, TOPIC_CAPACITY)
            })
            .await
    }

    /// Receives every message published on `topic` from now on (by any process).
    pub async fn subscribe(
        &self,
        topic: &str,
    ) -> Result<broadcast::Receiver<serde_json::Value>, job_queue::QueueError> {
        Ok(self.subscriber().await?.subscribe(topic))
    }

    /// How many receivers in this process listen to `topic` (readiness probes in tests).
    pub fn receiver_count(&self, topic: &str) -> usize {
        self.subscriber.get().map_or(0, |s| s.receiver_count(topic))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_messages_round_trip_through_json() {
        let chunk = LiveMessage::chunk(7, Uuid::new_v4(), 2, "par".into());
        let json = serde_json::to_value(&chunk).unwrap();
        assert_eq!(json["chunk_id"], 2);
        assert_eq!(json["message"]["role"], "assistant");
        let back: LiveMessage = serde_json::from_value(json).unwrap();
        assert_eq!(back, chunk);
    }

    fn answer(content: &str) -> StoredMessage {
        let mut message = LiveMessage::chunk(7, Uuid::new_v4(), 0, content.into()).message;
        message.extras = serde_json::json!({ "sources": [{ "id": 0, "created_at": "x" }] });
        message
    }

    #[test]
    fn an_announcement_filled_in_is_the_stored_answers_notification() {
        let message = answer("Pipelines run jobs.");
        let announcement = Announcement::answer(3, Some("tab-1"), &message)
            .unwrap()
            .unwrap();
        // What the storing statement does with the row's id and time.
        let stored_at = "2026-11-28T01:02:03.456789+00:00";
        let filled = announcement
            .text
            .replace(&announcement.id_stand_in, "4242")
            .replace(
                &announcement.created_at_stand_in,
                &format!("\"{stored_at}\""),
            );
        let mut stored = message.clone();
        stored.id = 4242;
        stored.created_at = chrono::DateTime::parse_from_rfc3339(stored_at)
            .unwrap()
            .with_timezone(&Utc);
        let payload = serde_json::to_value(LiveMessage::stored(stored)).unwrap();
        let expected = job_queue::pubsub::inline_notification_to(
            &user_topic(3),
            &[client_topic(3, "tab-1").as_str()],
            &payload,
        )
        .unwrap()
        .unwrap();
        // Equal as their readers see them (the database writes the time
        // with `+00:00` where chrono writes `Z`).
        let read = |text: &str| {
            let mut envelope: serde_json::Value = serde_json::from_str(text).unwrap();
            let message: LiveMessage = serde_json::from_value(envelope["payload"].take()).unwrap();
            (envelope, message)
        };
        assert_eq!(read(&filled), read(&expected));
    }

    #[test]
    fn answers_too_large_to_announce_inline_take_the_long_way() {
        let fits = "x".repeat(job_queue::pubsub::MAX_INLINE_BYTES - 1000);
        assert!(
            Announcement::answer(3, None, &answer(&fits))
                .unwrap()
                .is_some()
        );
        let too_large = "x".repeat(job_queue::pubsub::MAX_INLINE_BYTES);
        assert!(
            Announcement::answer(3, None, &answer(&too_large))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn topics_are_scoped_by_user() {
        assert_ne!(client_topic(1, "abc"), client_topic(2, "abc"));
        assert_ne!(user_topic(1), client_topic(1, ""));
    }
}
