//! The `worker` role: runs `chat_completion` jobs from the PostgreSQL queue.
//!
//! For each job the handler asks a [`ChatResponder`] for the answer, streams its
//! chunks to the request's `clientSubscriptionId` (`chunkId` 1, 2, 3…), stores the
//! full answer once and broadcasts it. Durability lives here, not in responders:
//! - a request whose answer is already stored is skipped (a re-run after a crash);
//! - the answer is inserted with `ON CONFLICT DO NOTHING` on a unique index, so two
//!   runs racing each other (lease expired while the first still ran) store one;
//! - a [`ResponderError`] is retried by the queue; on the last attempt the user
//!   still gets a stored A9999 answer instead of silence.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use contracts::DuoErrorCode;
use deadpool_postgres::Pool;
use job_queue::{JobContext, JobError, JobHandler, Periodic, Registry, WorkerConfig, WorkerHandle};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::mpsc;

use crate::chat::completion::{ChatAnswer, ChatResponder, ResponderError};
use crate::chat::live::{self, LiveMessage};
use crate::chat::{self, ChatError, CompletionJob};
use crate::config::Config;

/// How long the chunk publisher may keep draining after the responder returned
/// (a responder that leaked its sender into a task must not hold the job forever).
const CHUNK_DRAIN_LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error(transparent)]
    Queue(#[from] job_queue::QueueError),
}

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
        _chunks: crate::chat::completion::ChunkSender,
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
            if chat::answer_exists(&*db, job.request_id)
                .await
                .map_err(JobError::retryable)?
            {
                tracing::info!(job_id = ctx.job_id, "request already answered; skipping");
                return Ok(());
            }
            if !chat::thread_exists(&*db, job.thread_id)
                .await
                .map_err(JobError::retryable)?
            {
                tracing::info!(job_id = ctx.job_id, "thread is gone; nothing to answer");
                return Ok(());
            }
        }

        let (chunks, received) = mpsc::unbounded_channel();
        let mut streaming = tokio::spawn(stream_chunks(ctx.pool.clone(), job.clone(), received));
        let result = self.responder.respond(&job, chunks).await;
        if tokio::time::timeout(CHUNK_DRAIN_LIMIT, &mut streaming)
            .await
            .is_err()
        {
            streaming.abort();
        }

        let answer = match result {
            Ok(answer) => answer,
            Err(e) if ctx.attempt < ctx.max_attempts => {
                return Err(JobError::retryable(e));
            }
            Err(e) => {
                tracing::warn!(job_id = ctx.job_id, error = %e, "no answer after the last attempt");
                ChatAnswer::failed(DuoErrorCode::A9999, e.to_string())
            }
        };
        store_and_broadcast(&ctx.pool, &job, answer, &self.docs_base_url)
            .await
            .map_err(JobError::retryable)
    }
}

/// Publishes each chunk, numbered from 1, to the request's `clientSubscriptionId`.
async fn stream_chunks(
    pool: Pool,
    job: CompletionJob,
    mut received: mpsc::UnboundedReceiver<String>,
) {
    let Some(client_id) = job.client_subscription_id.as_deref() else {
        // Nobody can subscribe to this request's chunks: just drain them.
        while received.recv().await.is_some() {}
        return;
    };
    let mut chunk_id = 0;
    let mut db = None;
    while let Some(text) = received.recv().await {
        chunk_id += 1;
        if db.is_none() {
            db = pool.get().await.ok();
        }
        let Some(client) = db.as_ref() else {
            continue;
        };
        let message = LiveMessage::chunk(job.thread_id, job.request_id, chunk_id, text);
        if let Err(e) = live::publish_to_client(&***client, job.user_id, client_id, &message).await
        {
            // Chunks are a courtesy; the stored answer is what counts.
            tracing::debug!(error = %e, "publishing a chunk failed");
        }
    }
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
/// `clientSubscriptionId`, both at commit.
pub async fn store_and_broadcast(
    pool: &Pool,
    job: &CompletionJob,
    answer: ChatAnswer,
    docs_base_url: &str,
) -> Result<(), ChatError> {
    if let Some(error) = &answer.error {
        tracing::info!(request_id = %job.request_id, code = %error.code, "answering with an error");
        tracing::debug!(detail = %error.detail, "error detail");
    }
    let details = error_details(&answer, docs_base_url);
    let content = if details.is_some() {
        String::new()
    } else {
        answer.content
    };
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let Some(stored) = chat::store_answer_once(
        &tx,
        job.thread_id,
        job.request_id,
        &content,
        details,
        answer.extras,
    )
    .await?
    else {
        tracing::info!(request_id = %job.request_id, "answer already stored by another run");
        return Ok(());
    };
    let live = LiveMessage::stored(stored);
    live::publish_to_user(&tx, job.user_id, &live).await?;
    if let Some(client_id) = job.client_subscription_id.as_deref() {
        live::publish_to_client(&tx, job.user_id, client_id, &live).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The periodic job that deletes idle conversation threads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ThreadRetention {}

impl job_queue::Job for ThreadRetention {
    const KIND: &'static str = "chat_thread_retention";
}

struct ThreadRetentionHandler;

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

/// The periodic job that fails workflows stuck in `created` or `running`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StuckWorkflows {}

impl job_queue::Job for StuckWorkflows {
    const KIND: &'static str = "duo_workflow_stuck_workflows";
}

struct StuckWorkflowsHandler {
    stale_after: Duration,
}

#[async_trait]
impl JobHandler for StuckWorkflowsHandler {
    type Job = StuckWorkflows;

    async fn run(&self, ctx: JobContext, _job: StuckWorkflows) -> Result<(), JobError> {
        let mut client = ctx.pool.get().await.map_err(JobError::retryable)?;
        let failed = crate::workflows::maintenance::fail_stuck(&mut client, self.stale_after)
            .await
            .map_err(JobError::retryable)?;
        if !failed.is_empty() {
            tracing::info!(count = failed.len(), "stuck workflows failed");
        }
        Ok(())
    }
}

/// The periodic job that deletes workflow checkpoints past their retention.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointRetention {}

impl job_queue::Job for CheckpointRetention {
    const KIND: &'static str = "duo_workflow_checkpoint_retention";
}

struct CheckpointRetentionHandler {
    days: i32,
}

#[async_trait]
impl JobHandler for CheckpointRetentionHandler {
    type Job = CheckpointRetention;

    async fn run(&self, ctx: JobContext, _job: CheckpointRetention) -> Result<(), JobError> {
        let db = ctx.pool.get().await.map_err(JobError::retryable)?;
        let deleted = crate::workflows::maintenance::apply_retention(&*db, self.days)
            .await
            .map_err(JobError::retryable)?;
        tracing::info!(deleted, "old workflow checkpoints removed");
        Ok(())
    }
}

/// Settings of one worker process.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub queue: WorkerConfig,
    pub retention_every: Duration,
    /// Duo Workflow's periodic jobs (stuck workflows, checkpoint retention);
    /// `None` schedules neither.
    pub workflows: Option<crate::config::DuoWorkflowConfig>,
    /// The code index's jobs (indexing on push, catch-up); `None` runs neither.
    pub code_index: Option<crate::code_index::CodeIndex>,
    /// Workflows the product runs itself (their legs and admission); `None`
    /// runs none.
    pub workflow_runs: Option<Arc<crate::workflows::runs::RunContext>>,
}

impl WorkerSettings {
    pub fn from_config(config: &Config) -> Self {
        Self {
            queue: WorkerConfig {
                concurrency: config.worker_concurrency,
                lease: config.job_lease,
                // Three renewals per lease: one lost heartbeat does not lose the job.
                heartbeat: (config.job_lease / 3).max(Duration::from_millis(100)),
                shutdown_grace: config.shutdown_grace,
                ..WorkerConfig::default()
            },
            retention_every: config.thread_retention_interval,
            workflows: Some(config.duo_workflow.clone()),
            code_index: None,
            workflow_runs: None,
        }
    }
}

/// Starts the completion and retention handlers on `pool`; stop with
/// [`WorkerHandle::shutdown`].
pub fn spawn(
    pool: Pool,
    database_url: &str,
    responder: Arc<dyn ChatResponder>,
    docs_base_url: String,
    settings: WorkerSettings,
) -> Result<WorkerHandle, WorkerError> {
    let mut registry = Registry::new();
    registry.register(CompletionHandler {
        responder,
        docs_base_url,
    });
    registry.register(ThreadRetentionHandler);
    let mut queue = settings.queue;
    queue.periodic.push(Periodic::new(
        &ThreadRetention {},
        settings.retention_every,
    )?);
    if let Some(workflows) = &settings.workflows {
        registry.register(StuckWorkflowsHandler {
            stale_after: workflows.stuck_after,
        });
        registry.register(CheckpointRetentionHandler {
            days: workflows.checkpoint_retention_days,
        });
        queue.periodic.push(Periodic::new(
            &StuckWorkflows {},
            workflows.stuck_check_interval,
        )?);
        queue.periodic.push(Periodic::new(
            &CheckpointRetention {},
            workflows.retention_interval,
        )?);
    }
    if let Some(index) = settings.code_index {
        let max_attempts = index.settings.max_attempts;
        let catch_up = index.settings.catch_up_interval;
        registry.register(crate::code_index::indexer::RepositoryPushedHandler { max_attempts });
        registry.register(crate::code_index::indexer::CodeIndexCatchUpHandler {
            index: index.clone(),
        });
        registry.register(crate::code_index::indexer::CodeIndexHandler { index });
        queue.periodic.push(Periodic::new(
            &crate::code_index::indexer::CodeIndexCatchUp {},
            catch_up,
        )?);
        if !queue
            .queues
            .iter()
            .any(|q| q == crate::code_index::indexer::QUEUE)
        {
            queue
                .queues
                .push(crate::code_index::indexer::QUEUE.to_owned());
        }
    }
    if let Some(runs) = settings.workflow_runs {
        use crate::workflows::runs;
        registry.register(runs::DispatchHandler {
            admission: runs.admission,
        });
        queue.periodic.push(Periodic::new(
            &runs::DuoWorkflowDispatch {},
            runs.config.duo_workflow.runs.dispatch_interval,
        )?);
        registry.register(runs::LegHandler { context: runs });
        if !queue.queues.iter().any(|q| q == runs::QUEUE) {
            queue.queues.push(runs::QUEUE.to_owned());
        }
    }
    Ok(job_queue::Worker::new(pool, database_url, registry, queue).spawn())
}

/// The `worker` role: migrates, runs jobs until `shutdown` resolves, then
/// finishes or releases the jobs in flight.
pub async fn run(
    config: &Config,
    pool: Pool,
    responder: Arc<dyn ChatResponder>,
    code_index: Option<crate::code_index::CodeIndex>,
    workflow_runs: Option<Arc<crate::workflows::runs::RunContext>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    crate::db::migrate_exclusively(&pool).await?;
    let settings = WorkerSettings {
        code_index,
        workflow_runs,
        ..WorkerSettings::from_config(config)
    };
    let handle = spawn(
        pool,
        config.database_url.expose_secret(),
        responder,
        config.docs_base_url.to_string(),
        settings,
    )?;
    tracing::info!(
        concurrency = config.worker_concurrency,
        "worker role running"
    );
    shutdown.await;
    tracing::info!("worker stopping");
    handle.shutdown().await;
    Ok(())
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
}
