//! A job queue and a pub/sub bus on PostgreSQL alone.
//!
//! **Jobs** live in `background_jobs` ([`MIGRATION_SQL`], or call [`migrate`];
//! versioned migrations include the steps [`SCHEMA_V1_SQL`], [`CLAIM_ORDER_SQL`]
//! one migration each). A job has a queue, a kind, a JSONB payload, a
//! priority (higher runs first), a `run_at`, attempts and a dedupe key.
//!
//! ```ignore
//! #[derive(Serialize, Deserialize)]
//! struct Cleanup { days: u32 }
//! impl Job for Cleanup { const KIND: &'static str = "cleanup"; }
//!
//! struct CleanupHandler;
//! #[async_trait]
//! impl JobHandler for CleanupHandler {
//!     type Job = Cleanup;
//!     async fn run(&self, ctx: JobContext, job: Cleanup) -> Result<(), JobError> { Ok(()) }
//! }
//!
//! enqueue(&client, &Cleanup { days: 30 }, EnqueueOptions::default()).await?;
//! let mut registry = Registry::new();
//! registry.register(CleanupHandler);
//! let worker = Worker::new(pool, database_url, registry, WorkerConfig::default()).spawn();
//! worker.shutdown().await; // stop claiming, finish or release running jobs
//! ```
//!
//! Semantics: workers claim with `FOR UPDATE SKIP LOCKED` (any number of worker
//! processes on one database), as many jobs as they have free slots in one statement
//! that also marks the jobs finished since the last one done, hold a lease renewed by a heartbeat while the handler
//! runs (a job whose worker died is claimed again once its lease expires), retry
//! failures with exponential backoff computed in SQL, and mark a job `dead` after
//! `max_attempts`. An insert wakes idle workers through `NOTIFY background_jobs`;
//! polling is the fallback. A dedupe key is unique among pending/running jobs:
//! enqueueing a duplicate returns the existing id. [`Periodic`] jobs are enqueued once
//! per period by whichever worker gets there first. [`Registry::run_inline`] runs a
//! job in-process right away (development mode).
//!
//! **Pub/sub** ([`pubsub`]): [`pubsub::publish`] sends JSON on a topic through
//! `NOTIFY` (large payloads go by id through `pubsub_messages`), and a
//! [`pubsub::Subscriber`] fans notifications out to in-process broadcast receivers,
//! so every web replica sees every message.

mod job;
mod listener;
pub mod pubsub;
mod store;
mod worker;

pub use job::Job;
pub use store::{
    ENQUEUE_SQL, EnqueueOptions, Enqueued, JobRow, JobState, JobValues, QueueStats, enqueue,
    enqueue_prepared, enqueue_raw, job_by_id, purge_finished, queue_stats,
};
pub use worker::{JobContext, JobHandler, Periodic, Registry, Worker, WorkerConfig, WorkerHandle};

/// The whole current schema of the queue and pub/sub tables; idempotent. For
/// new databases (tests, standalone use).
pub const MIGRATION_SQL: &str = concat!(
    include_str!("schema.sql"),
    "\n",
    include_str!("claim_order.sql"),
    "\n",
    include_str!("trace_context.sql")
);

/// The schema in the steps it grew by, for applications that keep versioned
/// migrations (each step is frozen once released; each is idempotent).
pub const SCHEMA_V1_SQL: &str = include_str!("schema.sql");
/// Step 2: pending jobs indexed in claim order.
pub const CLAIM_ORDER_SQL: &str = include_str!("claim_order.sql");
/// Step 3: each job keeps the `traceparent` of whoever enqueued it.
pub const TRACE_CONTEXT_SQL: &str = include_str!("trace_context.sql");

/// The NOTIFY channel that wakes workers.
pub const JOBS_CHANNEL: &str = "background_jobs";

/// Errors of the queue's own operations.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("database error: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("connection pool error: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("payload (de)serialisation failed: {0}")]
    Payload(#[from] serde_json::Error),
}

/// What a handler reports when a job fails. Every error is retried until
/// `max_attempts`, except [`JobError::Permanent`], which goes to the dead set at once.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("{0}")]
    Retryable(String),
    #[error("permanent failure: {0}")]
    Permanent(String),
}

impl JobError {
    pub fn retryable(e: impl std::fmt::Display) -> Self {
        Self::Retryable(e.to_string())
    }
    pub fn permanent(e: impl std::fmt::Display) -> Self {
        Self::Permanent(e.to_string())
    }
}

/// Creates the tables on `client` (for tests and standalone use).
pub async fn migrate(client: &tokio_postgres::Client) -> Result<(), QueueError> {
    client.batch_execute(MIGRATION_SQL).await?;
    Ok(())
}
