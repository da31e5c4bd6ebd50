//! The seam between the job worker (which claims completion jobs, streams
//! chunks to subscribers and stores the answer exactly once) and whatever
//! produces the answer (the agent loop and slash commands in `crate::agent`).
//!
//! The worker owns transport and durability; a [`ChatResponder`] owns the
//! answer. A responder never writes the assistant message itself: it returns a
//! [`ChatAnswer`] and the worker stores and broadcasts it, so a retried job can
//! check "already answered" in one place.

use std::sync::Arc;

use async_trait::async_trait;
use contracts::DuoErrorCode;
use serde_json::Value;
use tokio::sync::mpsc;

pub use crate::chat::CompletionJob;

/// What a responder streams while it works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// A text delta of the answer.
    Text(String),
    /// A tool began to run (its name): GitLab's `TOOL` message.
    Tool(String),
}

/// Text deltas of the answer as they arrive, and which tool is running. The
/// worker numbers the deltas (`chunkId` from 1) and publishes each to the
/// request's `clientSubscriptionId`, with a `TOOL` message when a tool
/// starts. Send errors mean nobody listens any more; ignore them.
#[derive(Debug, Clone)]
pub struct ChunkSender(Sink);

#[derive(Debug, Clone)]
enum Sink {
    Events(mpsc::UnboundedSender<StreamEvent>),
    /// Text only (tool notices are dropped): what tests and internal
    /// callers with nobody to tell pass.
    Text(mpsc::UnboundedSender<String>),
}

impl ChunkSender {
    /// A sender of every event, and where they arrive.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<StreamEvent>) {
        let (sender, received) = mpsc::unbounded_channel();
        (Self(Sink::Events(sender)), received)
    }

    /// Streams a text delta.
    pub fn send(&self, text: String) -> Result<(), mpsc::error::SendError<String>> {
        match &self.0 {
            Sink::Events(sender) => sender.send(StreamEvent::Text(text)).map_err(|e| match e.0 {
                StreamEvent::Text(text) | StreamEvent::Tool(text) => mpsc::error::SendError(text),
            }),
            Sink::Text(sender) => sender.send(text),
        }
    }

    /// Says that `tool` starts running.
    pub fn tool(&self, tool: &str) {
        if let Sink::Events(sender) = &self.0 {
            let _ = sender.send(StreamEvent::Tool(tool.to_owned()));
        }
    }

    /// Passes an event on as it came.
    pub fn forward(&self, event: StreamEvent) {
        match event {
            StreamEvent::Text(text) => {
                let _ = self.send(text);
            }
            StreamEvent::Tool(tool) => self.tool(&tool),
        }
    }
}

impl From<mpsc::UnboundedSender<String>> for ChunkSender {
    fn from(sender: mpsc::UnboundedSender<String>) -> Self {
        Self(Sink::Text(sender))
    }
}

/// What a responder produced for one request.
#[derive(Debug, Clone)]
pub struct ChatAnswer {
    /// The full answer in Markdown (the concatenation of the chunks, or the
    /// whole text when nothing was streamed). When `error` is set, this is the
    /// user-facing sentence put before "Error code: [CODE](link)"; leave it empty
    /// to use the code's own message. Error answers are stored with empty content.
    pub content: String,
    /// `{"sources": [...]}` when a tool supplied sources; `{"sources": []}` otherwise.
    pub extras: Value,
    /// A coded failure: the worker stores the user-facing text with its
    /// documentation link in the message's `errors`.
    pub error: Option<AnswerError>,
    /// A record written with the answer, by the run whose answer is stored
    /// (the question's usage); none for answers nobody records.
    pub record: Option<Arc<dyn AnswerRecord>>,
}

/// Answers compare by what the user gets; the records they carry, by identity.
impl PartialEq for ChatAnswer {
    fn eq(&self, other: &Self) -> bool {
        let same_record = match (&self.record, &other.record) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        self.content == other.content
            && self.extras == other.extras
            && self.error == other.error
            && same_record
    }
}

/// Something the worker writes in the statement that stores an answer, and
/// only when that answer is the one stored (a question's usage record): one
/// statement and one commit per answer instead of two, and a run whose
/// answer lost to another run's writes nothing.
#[async_trait]
pub trait AnswerRecord: Send + Sync + std::fmt::Debug {
    /// The record's common table expressions (no leading comma), their
    /// parameters numbered from `$first` in [`AnswerRecord::params`]' order,
    /// writing only when the CTE named `answer` stored a row. CTE names must
    /// not clash with the answer statement's own (`c`, `m`, `t`).
    fn ctes(&self, first: usize, answer: &str) -> String;

    /// Which [`AnswerRecord::ctes`] text this record writes: records of one
    /// kind and variant give the same text for the same arguments, so the
    /// worker builds each statement once (a handful of them per kind).
    fn variant(&self) -> (&'static str, usize);

    fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)>;

    /// Writes the record on its own: its answer went through a transaction,
    /// or the statement carrying it was refused by the record's part. Never
    /// fails: a problem is logged.
    async fn write_alone(&self, pool: &deadpool_postgres::Pool);
}

#[derive(Debug, Clone, PartialEq)]
pub struct AnswerError {
    pub code: DuoErrorCode,
    /// Extra detail for logs at DEBUG; never shown to the user verbatim.
    pub detail: String,
}

impl ChatAnswer {
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            extras: serde_json::json!({ "sources": [] }),
            error: None,
            record: None,
        }
    }

    pub fn failed(code: DuoErrorCode, detail: impl Into<String>) -> Self {
        Self {
            content: String::new(),
            extras: serde_json::json!({ "sources": [] }),
            error: Some(AnswerError {
                code,
                detail: detail.into(),
            }),
            record: None,
        }
    }
}

/// Why a responder could not produce any answer, not even a coded one. The
/// worker retries these (a crashed database, say), then stores A9999.
#[derive(Debug, thiserror::Error)]
pub enum ResponderError {
    #[error("transient failure: {0}")]
    Transient(String),
}

/// Produces the answer to one stored user question.
#[async_trait]
pub trait ChatResponder: Send + Sync {
    async fn respond(
        &self,
        job: &CompletionJob,
        chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError>;

    /// What categorises this responder's questions for the usage records
    /// (the worker runs it as a job after the answer); none by default.
    fn categorizer(&self) -> Option<Arc<dyn QuestionCategorizer>> {
        None
    }
}

/// Categorises a recorded question (the `ai_usage` domain's job, through
/// the AI gateway the responder talks to). `Err` only for failures worth a
/// retry; anything else is noted on the record.
#[async_trait]
pub trait QuestionCategorizer: Send + Sync {
    async fn categorize(
        &self,
        pool: &deadpool_postgres::Pool,
        request_id: uuid::Uuid,
    ) -> Result<(), String>;
}
