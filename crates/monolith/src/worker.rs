//! The `worker` role: registers the job handlers of each domain with the
//! PostgreSQL queue and runs them: chat completions and thread retention
//! ([`crate::chat::jobs`]), the code index's jobs
//! ([`crate::code_index::indexer`]), Duo Workflow's periodic jobs
//! ([`crate::workflows::jobs`]) and the workflow runs
//! ([`crate::workflows::runs`]). The handlers live with their domains.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use job_queue::{Periodic, Registry, WorkerConfig, WorkerHandle};
use secrecy::ExposeSecret;

use crate::chat::completion::ChatResponder;
use crate::chat::jobs::{CompletionHandler, ThreadRetention, ThreadRetentionHandler};
use crate::config::Config;
use crate::workflows::jobs::{
    CheckpointRetention, CheckpointRetentionHandler, StuckWorkflows, StuckWorkflowsHandler,
};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error(transparent)]
    Queue(#[from] job_queue::QueueError),
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
    /// Code reviews and answers to mentions by the review bot; `None` runs
    /// neither.
    pub review: Option<Arc<crate::review::ReviewServices>>,
}

/// What the worker role runs besides chat answers and the periodic jobs.
#[derive(Default)]
pub struct WorkerParts {
    pub code_index: Option<crate::code_index::CodeIndex>,
    pub workflow_runs: Option<Arc<crate::workflows::runs::RunContext>>,
    pub review: Option<Arc<crate::review::ReviewServices>>,
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
            review: None,
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
        responder: responder.clone(),
        docs_base_url,
    });
    registry.register(ThreadRetentionHandler);
    let mut queue = settings.queue;
    crate::ai_usage::categorize::register(&mut registry, &mut queue, responder.categorizer());
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
        registry.register(crate::code_index::indexer::CodeIndexBranchHandler {
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
    if let Some(review) = settings.review {
        use crate::review::jobs;
        registry.register(jobs::ReviewHandler {
            services: review.clone(),
        });
        registry.register(jobs::MentionHandler {
            services: review.clone(),
        });
        registry.register(jobs::PipelineFixHandler { services: review });
        if !queue.queues.iter().any(|q| q == jobs::QUEUE) {
            queue.queues.push(jobs::QUEUE.to_owned());
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
    parts: WorkerParts,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WorkerError> {
    crate::db::migrate_exclusively(&pool).await?;
    let settings = WorkerSettings {
        code_index: parts.code_index,
        workflow_runs: parts.workflow_runs,
        review: parts.review,
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
