//! Recording one chat answer while it is made.
//!
//! The agent wraps its answer in a [`Recording`]: the recording times the
//! first chunk of streamed text, collects what the agent notes on the way
//! (each tool it runs, the slash command, the page resource it used) and, once
//! the answer is ready, attaches the usage to it: the chat worker writes the
//! record (and queues the question's categorisation) in the statement that
//! stores the answer. A failed attempt's record is written by the recording
//! itself. Notes go through a task-local value, so
//! the agent loop needs no extra parameter: [`note_tool`] and friends do
//! nothing outside a recording.
//!
//! Recording never fails or delays an answer: a database error is logged at
//! WARN and the answer goes on.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use contracts::DuoErrorCode;
use deadpool_postgres::Pool;

use super::store::{self, QuestionFacts, UsageRecord};
use super::{UsageError, categorize};
use crate::chat::completion::{
    AnswerRecord, ChatAnswer, ChunkSender, CompletionJob, ResponderError, StreamEvent,
};
use crate::policy::{Policy, Subject};

tokio::task_local! {
    static CURRENT: Arc<Notes>;
}

/// What the agent noted while answering.
#[derive(Debug, Default)]
struct Notes {
    state: Mutex<NoteState>,
}

#[derive(Debug, Default)]
struct NoteState {
    tools: Vec<String>,
    slash_command: Option<String>,
    resource: Option<Subject>,
    first_chunk: Option<Instant>,
    /// Whether the question is to be categorised, when the agent read the
    /// flags already (else the record reads the switch itself).
    categorize: Option<bool>,
}

impl Notes {
    fn with<T>(&self, f: impl FnOnce(&mut NoteState) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut state)
    }
}

/// Notes that the agent runs the tool `name` for the current answer (each
/// tool is recorded once, in the order first run).
pub fn note_tool(name: &str) {
    let _ = CURRENT.try_with(|notes| {
        notes.with(|s| {
            if !s.tools.iter().any(|t| t == name) {
                s.tools.push(name.to_owned());
            }
        })
    });
}

/// Notes the slash command (its word, without the slash) the answer runs.
pub fn note_slash_command(word: &str) {
    let _ = CURRENT.try_with(|notes| notes.with(|s| s.slash_command = Some(word.to_owned())));
}

/// Notes the page resource the answer used (one the user may read, in a
/// group or project with Duo on): its group or project is where the
/// question counts.
pub fn note_resource(resource: Option<Subject>) {
    let _ = CURRENT.try_with(|notes| notes.with(|s| s.resource = resource));
}

/// Notes whether the current answer's question is to be categorised
/// (`categorize::wanted_in`, from the flags the agent read anyway).
pub fn note_categorization(wanted: bool) {
    let _ = CURRENT.try_with(|notes| notes.with(|s| s.categorize = Some(wanted)));
}

/// One answer being recorded.
pub struct Recording {
    request_id: uuid::Uuid,
    thread_id: i64,
    user_id: i64,
    question_chars: usize,
    started: Instant,
    started_at: DateTime<Utc>,
    notes: Arc<Notes>,
}

impl Recording {
    /// Starts recording the answer to `job`'s question.
    pub fn start(job: &CompletionJob) -> Self {
        Self {
            request_id: job.request_id,
            thread_id: job.thread_id,
            user_id: job.user_id,
            question_chars: job.content.chars().count(),
            started: Instant::now(),
            started_at: Utc::now(),
            notes: Arc::new(Notes::default()),
        }
    }

    /// A chunk sender that notes when the first text went out, passing
    /// every chunk on to `chunks` in order.
    pub fn timed(&self, chunks: ChunkSender) -> ChunkSender {
        let (sender, mut received) = ChunkSender::channel();
        let notes = self.notes.clone();
        tokio::spawn(async move {
            while let Some(event) = received.recv().await {
                if matches!(&event, StreamEvent::Text(text) if !text.is_empty()) {
                    notes.with(|s| {
                        s.first_chunk.get_or_insert_with(Instant::now);
                    });
                }
                // Nobody listening any more is fine: chunks are a courtesy.
                chunks.forward(event);
            }
        });
        sender
    }

    /// Runs `answer` with this recording collecting the agent's notes.
    pub async fn around<F: std::future::Future>(&self, answer: F) -> F::Output {
        CURRENT.scope(self.notes.clone(), answer).await
    }

    /// What the recording knows once the answer (or its failure) is in.
    fn facts(
        &self,
        result: &Result<ChatAnswer, ResponderError>,
        container: Option<Subject>,
    ) -> QuestionFacts {
        let total = self.started.elapsed();
        let (tools, slash_command, first_chunk) = self.notes.with(|s| {
            (
                s.tools.clone(),
                s.slash_command.clone(),
                s.first_chunk
                    .map(|t| t.saturating_duration_since(self.started)),
            )
        });
        let (error_code, answer_chars) = match result {
            Ok(answer) => (
                answer.error.as_ref().map(|e| e.code),
                if answer.error.is_some() {
                    0
                } else {
                    answer.content.chars().count()
                },
            ),
            // The worker stores A9999 when no attempt succeeds; a later
            // attempt that does overwrites this record.
            Err(_) => (Some(DuoErrorCode::A9999), 0),
        };
        QuestionFacts {
            request_id: self.request_id,
            thread_id: self.thread_id,
            user_id: self.user_id,
            container,
            at: self.started_at,
            slash_command: slash_command.map(|w| format!("/{w}")),
            tools,
            error_code: error_code.map(|c| c.to_string()),
            input_tokens: estimate_tokens(self.question_chars),
            output_tokens: estimate_tokens(answer_chars),
            tokens_estimated: true,
            first_token_ms: first_chunk.map(millis),
            total_ms: millis(total),
        }
    }

    /// The answer with its usage record attached, for the chat worker to
    /// write in the answer's own statement (one statement and one commit
    /// fewer per answer); a failed attempt's record is written here and now
    /// (a later attempt that answers overwrites it). Never fails or changes
    /// the answer: a problem is logged and the answer goes on unrecorded.
    pub async fn finish(
        self,
        pool: &Pool,
        policy: &Policy,
        result: Result<ChatAnswer, ResponderError>,
    ) -> Result<ChatAnswer, ResponderError> {
        let record = match self.record(pool, policy, &result).await {
            Ok(record) => record,
            Err(e) => {
                tracing::warn!(request_id = %self.request_id, error = %e, "usage not recorded");
                return result;
            }
        };
        match result {
            Ok(mut answer) => {
                answer.record = Some(Arc::new(record));
                Ok(answer)
            }
            Err(e) => {
                record.write_alone(pool).await;
                Err(e)
            }
        }
    }

    /// The record of `result`: a database read only for a page resource's
    /// container, or when the agent did not note the categorisation switch.
    async fn record(
        &self,
        pool: &Pool,
        policy: &Policy,
        result: &Result<ChatAnswer, ResponderError>,
    ) -> Result<UsageRecord, UsageError> {
        let (resource, categorize) = self.notes.with(|s| (s.resource, s.categorize));
        let container = match resource {
            Some(subject) => {
                let db = pool.get().await?;
                policy
                    .container_of(&*db, subject)
                    .await
                    .map_err(|e| UsageError::Invalid(e.to_string()))?
            }
            None => None,
        };
        let wanted = match categorize {
            Some(wanted) => wanted,
            None => categorize::wanted_for(&*pool.get().await?, self.user_id).await,
        };
        let job = if wanted {
            Some(categorize::job_values(self.request_id)?)
        } else {
            None
        };
        Ok(UsageRecord::new(self.facts(result, container), job))
    }
}

#[async_trait]
impl AnswerRecord for UsageRecord {
    fn ctes(&self, first: usize, answer: &str) -> String {
        store::record_ctes(first, Some(answer), self.categorizes())
    }

    fn variant(&self) -> (&'static str, usize) {
        ("usage", usize::from(self.categorizes()))
    }

    fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        UsageRecord::params(self)
    }

    async fn write_alone(&self, pool: &Pool) {
        let request_id = self.facts.request_id;
        match write(pool, self).await {
            Ok(created) => tracing::debug!(%request_id, created, "usage recorded"),
            Err(e) => tracing::warn!(%request_id, error = %e, "usage not recorded"),
        }
    }
}

/// Writes a question's usage record on its own statement (with the
/// categorisation of a new record queued in it). `true` when it created
/// the record.
async fn write(pool: &Pool, record: &UsageRecord) -> Result<bool, UsageError> {
    let db = pool.get().await?;
    match store::write_record(&*db, record).await {
        // Another run of this job created the record meanwhile: this one
        // updates it.
        Err(e) if store::is_race(&e) => Ok(store::write_record(&*db, record).await?),
        written => Ok(written?),
    }
}

/// About four characters per token: the usual rule of thumb for English
/// text with the tokenizers of current models. Rounded up.
pub fn estimate_tokens(chars: usize) -> i32 {
    i32::try_from(chars.div_ceil(4)).unwrap_or(i32::MAX)
}

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn notes_are_kept_only_inside_a_recording() {
        note_tool("issue_reader");
        let job = CompletionJob {
            content: "What is #1?".into(),
            ..Default::default()
        };
        let recording = Recording::start(&job);
        recording
            .around(async {
                note_tool("issue_reader");
                note_tool("gitlab_documentation");
                note_tool("issue_reader");
                note_slash_command("explain");
            })
            .await;
        let facts = recording.facts(&Ok(ChatAnswer::text("It is a bug.")), None);
        assert_eq!(facts.tools, vec!["issue_reader", "gitlab_documentation"]);
        assert_eq!(facts.slash_command.as_deref(), Some("/explain"));
        assert_eq!(facts.input_tokens, 3);
        assert_eq!(facts.output_tokens, 3);
        assert!(facts.tokens_estimated);
        assert_eq!(facts.error_code, None);
        assert_eq!(facts.first_token_ms, None);

        let failed = recording.facts(&Ok(ChatAnswer::failed(DuoErrorCode::A1000, "slow")), None);
        assert_eq!(failed.error_code.as_deref(), Some("A1000"));
        assert_eq!(failed.output_tokens, 0);
        let gone = recording.facts(&Err(ResponderError::Transient("db".into())), None);
        assert_eq!(gone.error_code.as_deref(), Some("A9999"));
    }

    #[tokio::test]
    async fn the_first_chunk_is_timed_and_every_chunk_passes_on_in_order() {
        let recording = Recording::start(&CompletionJob::default());
        let (out, mut received) = tokio::sync::mpsc::unbounded_channel();
        let timed = recording.timed(out.into());
        tokio::time::sleep(Duration::from_millis(20)).await;
        for text in ["a", "b", "c"] {
            timed.send(text.to_owned()).unwrap();
        }
        drop(timed);
        let mut got = Vec::new();
        while let Some(text) = received.recv().await {
            got.push(text);
        }
        assert_eq!(got, ["a", "b", "c"]);
        let facts = recording.facts(&Ok(ChatAnswer::text("abc")), None);
        assert!(facts.first_token_ms.unwrap() >= 20, "{facts:?}");
        assert!(facts.total_ms >= facts.first_token_ms.unwrap());
    }
}
