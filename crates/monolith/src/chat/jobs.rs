//! The chat's queue jobs: `chat_completion` answers a question, the periodic
//! `chat_thread_retention` deletes idle threads. The worker role registers
//! them (`crate::worker`).
//!
//! For each completion job the handler asks a [`ChatResponder`] for the answer,
//! streams its chunks to the request's `clientSubscriptionId` (`chunkId` 1, 2,
//! 3…), stores the full answer once and broadcasts it. Durability lives here,
//! not in responders:
//! - a request whose answer is already stored is skipped (a re-run after a crash);
//! - the answer is inserted with `ON CONFLICT DO NOTHING` on a unique index, so two
//!   runs racing each other (lease expired while the first still ran) store one;
//! - a [`ResponderError`] is retried by the queue; on the last attempt the user
//!   still gets a stored A9999 answer instead of silence.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use contracts::DuoErrorCode;
use deadpool_postgres::Pool;
use job_queue::{JobContext, JobError, JobHandler};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;

use super::completion::StreamEvent;
use super::completion::{ChatAnswer, ChatResponder, ResponderError};
use super::live::{self, LiveMessage};
use super::{ChatError, CompletionJob};
use crate::chat;

/// How long the chunk publisher may keep draining after the responder returned
/// (a responder that leaked its sender into a task must not hold the job forever).
const CHUNK_DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// After a chunk went out, what the model streams during this long goes out
/// together as the next chunk (at most ~40 chunk messages a second per answer;
/// a reader does not see the difference, PostgreSQL and the web replicas do).
const CHUNK_SLICE: Duration = Duration::from_millis(25);

/// How long the first piece of an answer waits for the rest before it goes
/// out alone. An answer made within this time (a slash command, an error, a
/// fast model) travels whole in the answer's own statement: no chunk
/// statement, no extra NOTIFY waking every listener. A streaming model's first
/// chunk is this much later, well under what a reader notices.
const FIRST_CHUNK_HOLD: Duration = Duration::from_millis(10);

/// Answers every question with a coded "not yet available" error, so a client
/// gets a clear answer while no agent is wired in.
pub struct NotYetAvailableResponder;

/// The text shown before the error code by [`NotYetAvailableResponder`].
pub const NOT_YET_AVAILABLE: &str = "Duo Chat answers are not yet available on this instance.";

#[async_trait]
impl ChatResponder for NotYetAvailableResponder {
    async fn respond(
        &self,
        _job: &CompletionJob,
        _chunks: super::completion::ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        let mut answer = ChatAnswer::failed(DuoErrorCode::A9999, "no chat responder configured");
        answer.content = NOT_YET_AVAILABLE.to_owned();
        Ok(answer)
    }
}

/// Runs `chat_completion` jobs.
pub struct CompletionHandler {
    pub responder: Arc<dyn ChatResponder>,
    pub docs_base_url: String,
}

#[async_trait]
impl JobHandler for CompletionHandler {
    type Job = CompletionJob;

    async fn run(&self, ctx: JobContext, job: CompletionJob) -> Result<(), JobError> {
        {
            let db = ctx.pool.get().await.map_err(JobError::retryable)?;
            match chat::completion_start(&*db, job.request_id, job.thread_id)
                .await
                .map_err(JobError::retryable)?
            {
                chat::CompletionStart::Answer => {}
                chat::CompletionStart::AlreadyAnswered => {
                    tracing::info!(job_id = ctx.job_id, "request already answered; skipping");
                    return Ok(());
                }
                chat::CompletionStart::ThreadGone => {
                    tracing::info!(job_id = ctx.job_id, "thread is gone; nothing to answer");
                    return Ok(());
                }
            }
        }

        let (chunks, received) = super::completion::ChunkSender::channel();
        let mut streaming = tokio::spawn(stream_chunks(ctx.pool.clone(), job.clone(), received));
        let result = self.responder.respond(&job, chunks).await;
        let last_chunks = match tokio::time::timeout(CHUNK_DRAIN_LIMIT, &mut streaming).await {
            Ok(last_chunks) => last_chunks.unwrap_or_default(),
            Err(_) => {
                streaming.abort();
                Vec::new()
            }
        };

        let answer = match result {
            Ok(answer) => answer,
            Err(e) if ctx.attempt < ctx.max_attempts => {
                if !last_chunks.is_empty()
                    && let Ok(db) = ctx.pool.get().await
                {
                    publish_chunks(&*db, &job, &last_chunks).await;
                }
                return Err(JobError::retryable(e));
            }
            Err(e) => {
                tracing::warn!(job_id = ctx.job_id, error = %e, "no answer after the last attempt");
                ChatAnswer::failed(DuoErrorCode::A9999, e.to_string())
            }
        };
        store_and_broadcast(&ctx.pool, &job, answer, &self.docs_base_url, last_chunks)
            .await
            .map_err(JobError::retryable)
    }
}

/// Publishes the streamed answer to the request's `clientSubscriptionId`:
/// the first piece with what follows it within [`FIRST_CHUNK_HOLD`] (the user
/// sees the answer start), then what arrived since, coalesced into one chunk
/// per [`CHUNK_SLICE`] (a NOTIFY per piece would cost PostgreSQL and every
/// web replica a wake-up per few characters). Chunks are numbered from 1; their texts concatenate to what
/// the responder sent. A tool status stays a message of its own, in order.
///
/// What arrived after the last chunk went out, once the responder is done,
/// is not published here but returned: it goes out with the stored answer
/// (in the answer's own statement when it can), right before it.
async fn stream_chunks(
    pool: Pool,
    job: CompletionJob,
    mut received: mpsc::UnboundedReceiver<StreamEvent>,
) -> Vec<LiveMessage> {
    if job.client_subscription_id.is_none() {
        // Nobody can subscribe to this request's chunks: just drain them.
        while received.recv().await.is_some() {}
        return Vec::new();
    }
    let mut chunk_id = 0;
    let mut db = None;
    let mut last_publish: Option<tokio::time::Instant> = None;
    let mut open = true;
    while open {
        let Some(first) = received.recv().await else {
            break;
        };
        let mut batch = vec![first];
        let slice_ends = match last_publish {
            Some(at) => at + CHUNK_SLICE,
            None => tokio::time::Instant::now() + FIRST_CHUNK_HOLD,
        };
        loop {
            match tokio::time::timeout_at(slice_ends, received.recv()).await {
                Ok(Some(event)) => batch.push(event),
                Ok(None) => {
                    open = false;
                    break;
                }
                Err(_) => break,
            }
        }
        let messages: Vec<LiveMessage> = coalesce(batch)
            .into_iter()
            .map(|event| match event {
                StreamEvent::Text(text) => {
                    chunk_id += 1;
                    LiveMessage::chunk(job.thread_id, job.request_id, chunk_id, text)
                }
                StreamEvent::Tool(tool) => LiveMessage::tool(job.thread_id, job.request_id, &tool),
            })
            .collect();
        if !open {
            return messages;
        }
        if db.is_none() {
            db = pool.get().await.ok();
        }
        let Some(client) = db.as_ref() else {
            continue;
        };
        publish_chunks(&**client, &job, &messages).await;
        last_publish = Some(tokio::time::Instant::now());
    }
    Vec::new()
}

/// Publishes streamed chunks to the request's `clientSubscriptionId`.
async fn publish_chunks(
    db: &impl crate::queries::Queries,
    job: &CompletionJob,
    chunks: &[LiveMessage],
) {
    let Some(client_id) = job.client_subscription_id.as_deref() else {
        return;
    };
    for chunk in chunks {
        if let Err(e) = live::publish_to_client(db, job.user_id, client_id, chunk).await {
            // Chunks are a courtesy; the stored answer is what counts.
            tracing::debug!(error = %e, "publishing a chunk failed");
        }
    }
}

/// Joins neighbouring text pieces; tool statuses keep their place.
fn coalesce(events: Vec<StreamEvent>) -> Vec<StreamEvent> {
    let mut joined: Vec<StreamEvent> = Vec::with_capacity(events.len());
    for event in events {
        match (joined.last_mut(), event) {
            (Some(StreamEvent::Text(text)), StreamEvent::Text(more)) => text.push_str(&more),
            (_, event) => joined.push(event),
        }
    }
    joined
}

/// The `errors` entry and `error_details` of a coded answer.
pub fn error_details(answer: &ChatAnswer, docs_base_url: &str) -> Option<serde_json::Value> {
    let error = answer.error.as_ref()?;
    let lead = if answer.content.trim().is_empty() {
        error.code.user_message().to_owned()
    } else {
        answer.content.trim().to_owned()
    };
    let text = format!(
        "{lead} Error code: [{}]({})",
        error.code,
        error.code.doc_url(docs_base_url)
    );
    Some(json!({ "errors": [text], "code": error.code.to_string() }))
}

/// Stores the answer (once) and sends it to the user's chats and to the request's
/// `clientSubscriptionId`, both at commit, right after `last_chunks` (what
/// was streamed since the last chunk went out; in the answer's own statement
/// when it is one chunk small enough to travel inline). The record the
/// answer carries, if any, is written with it by the run whose answer is
/// stored.
pub async fn store_and_broadcast(
    pool: &Pool,
    job: &CompletionJob,
    mut answer: ChatAnswer,
    docs_base_url: &str,
    last_chunks: Vec<LiveMessage>,
) -> Result<(), ChatError> {
    if let Some(error) = &answer.error {
        tracing::info!(request_id = %job.request_id, code = %error.code, "answering with an error");
        tracing::debug!(detail = %error.detail, "error detail");
    }
    let record = answer.record.take();
    let details = error_details(&answer, docs_base_url);
    let content = if details.is_some() {
        String::new()
    } else {
        answer.content
    };
    let message = chat::StoredMessage::draft(
        job.thread_id,
        chat::Role::Assistant,
        content,
        Some(job.request_id),
        details.as_ref(),
        answer.extras,
    );
    let client_id = job.client_subscription_id.as_deref();
    let mut client = pool.get().await?;
    // Usually one statement stores and announces the answer and writes its
    // record; a large answer goes through a transaction (its notification
    // names a stored payload), its record written after it.
    // The record still to write on its own, once the answer is stored.
    let (stored, unwritten) = match live::Announcement::answer(job.user_id, client_id, &message)? {
        Some(mut announcement) => {
            let joined = match (client_id, last_chunks.as_slice()) {
                (Some(client_id), [chunk]) => {
                    announcement.after_chunk(job.user_id, client_id, chunk)?
                }
                _ => false,
            };
            if !joined {
                publish_chunks(&*client, job, &last_chunks).await;
            }
            match &record {
                Some(record) => {
                    let (stored, written) = chat::store_answer_recording(
                        &*client,
                        &message,
                        details.as_ref(),
                        &announcement,
                        record.as_ref(),
                    )
                    .await?;
                    (stored, (!written).then_some(record))
                }
                None => {
                    let stored = chat::store_answer_once(
                        &*client,
                        &message,
                        details.as_ref(),
                        Some(&announcement),
                    )
                    .await?;
                    (stored, None)
                }
            }
        }
        None => {
            let tx = client.transaction().await?;
            if let Some(client_id) = client_id {
                for chunk in &last_chunks {
                    live::publish_to_client(&tx, job.user_id, client_id, chunk).await?;
                }
            }
            let stored = chat::store_answer_once(&tx, &message, details.as_ref(), None).await?;
            if let Some(stored) = &stored {
                let live = LiveMessage::stored(stored.clone());
                live::publish_answer(&tx, job.user_id, client_id, &live).await?;
            }
            tx.commit().await?;
            (stored, record.as_ref())
        }
    };
    match (&stored, unwritten) {
        (None, _) => {
            tracing::info!(request_id = %job.request_id, "answer already stored by another run");
        }
        (Some(_), Some(record)) => record.write_alone(pool).await,
        (Some(_), None) => {}
    }
    Ok(())
}

/// The periodic job that deletes idle conversation threads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ThreadRetention {}

impl job_queue::Job for ThreadRetention {
    const KIND: &'static str = "chat_thread_retention";
}

/// Runs `chat_thread_retention` jobs.
pub struct ThreadRetentionHandler;

#[async_trait]
impl JobHandler for ThreadRetentionHandler {
    type Job = ThreadRetention;

    async fn run(&self, ctx: JobContext, _job: ThreadRetention) -> Result<(), JobError> {
        let deleted = chat::apply_retention(&ctx.pool)
            .await
            .map_err(JobError::retryable)?;
        tracing::info!(deleted, "idle conversation threads removed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coded_answers_lead_with_their_text_and_link_the_code() {
        let plain = ChatAnswer::failed(DuoErrorCode::A1000, "slow");
        let details = error_details(&plain, "https://docs.example.com").unwrap();
        let text = details["errors"][0].as_str().unwrap();
        assert!(
            text.starts_with(DuoErrorCode::A1000.user_message()),
            "{text}"
        );
        assert!(
            text.contains("Error code: [A1000](https://docs.example.com"),
            "{text}"
        );
        assert_eq!(details["code"], "A1000");

        let mut custom = ChatAnswer::failed(DuoErrorCode::A9999, "none");
        custom.content = NOT_YET_AVAILABLE.into();
        let details = error_details(&custom, "https://docs.example.com").unwrap();
        let text = details["errors"][0].as_str().unwrap();
        assert!(text.starts_with(NOT_YET_AVAILABLE), "{text}");
        assert!(text.contains("[A9999]"), "{text}");

        assert!(error_details(&ChatAnswer::text("hi"), "x").is_none());
    }

    #[test]
    fn coalescing_joins_text_and_keeps_tool_statuses_in_place() {
        let text = |t: &str| StreamEvent::Text(t.to_owned());
        let joined = coalesce(vec![
            text("A pipe"),
            text("line "),
            StreamEvent::Tool("issue_reader".into()),
            text("runs "),
            text("jobs."),
        ]);
        assert_eq!(
            joined,
            vec![
                text("A pipeline "),
                StreamEvent::Tool("issue_reader".into()),
                text("runs jobs."),
            ]
        );
        assert!(coalesce(Vec::new()).is_empty());
    }
}
