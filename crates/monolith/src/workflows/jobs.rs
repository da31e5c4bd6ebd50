//! Duo Workflow's periodic queue jobs: `duo_workflow_stuck_workflows` fails
//! workflows stuck in `created` or `running`, `duo_workflow_checkpoint_retention`
//! deletes checkpoints past their retention ([`super::maintenance`] does the
//! work). The worker role registers them and schedules them (`crate::worker`);
//! the workflow runs' own jobs are in [`super::runs`].

use std::time::Duration;

use async_trait::async_trait;
use job_queue::{JobContext, JobError, JobHandler};
use serde::{Deserialize, Serialize};

/// The periodic job that fails workflows stuck in `created` or `running`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StuckWorkflows {}

impl job_queue::Job for StuckWorkflows {
    const KIND: &'static str = "duo_workflow_stuck_workflows";
}

pub struct StuckWorkflowsHandler {
    /// How long a workflow may sit in `created` or `running` untouched.
    pub stale_after: Duration,
}

#[async_trait]
impl JobHandler for StuckWorkflowsHandler {
    type Job = StuckWorkflows;

    async fn run(&self, ctx: JobContext, _job: StuckWorkflows) -> Result<(), JobError> {
        let mut client = ctx.pool.get().await.map_err(JobError::retryable)?;
        let failed = super::maintenance::fail_stuck(&mut client, self.stale_after)
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

pub struct CheckpointRetentionHandler {
    /// How many days a checkpoint is kept.
    pub days: i32,
}

#[async_trait]
impl JobHandler for CheckpointRetentionHandler {
    type Job = CheckpointRetention;

    async fn run(&self, ctx: JobContext, _job: CheckpointRetention) -> Result<(), JobError> {
        let db = ctx.pool.get().await.map_err(JobError::retryable)?;
        let deleted = super::maintenance::apply_retention(&*db, self.days)
            .await
            .map_err(JobError::retryable)?;
        tracing::info!(deleted, "old workflow checkpoints removed");
        Ok(())
    }
}
