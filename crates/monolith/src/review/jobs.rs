//! The worker's handlers for reviews and mentions (queue [`QUEUE`]).

use std::sync::Arc;

use async_trait::async_trait;
use job_queue::{JobContext, JobError, JobHandler};

use super::reviewer::ReviewServices;
pub use super::triggers::QUEUE;
use super::triggers::{MentionAsked, PipelineFailed, ReviewRequested};

pub struct ReviewHandler {
    pub services: Arc<ReviewServices>,
}

#[async_trait]
impl JobHandler for ReviewHandler {
    type Job = ReviewRequested;

    async fn run(&self, ctx: JobContext, job: ReviewRequested) -> Result<(), JobError> {
        tracing::info!(
            job_id = ctx.job_id,
            project_id = job.project_id,
            merge_request_iid = job.merge_request_iid,
            trigger = job.trigger.as_str(),
            "reviewing a merge request"
        );
        super::reviewer::run(&self.services, &job)
            .await
            .map_err(JobError::retryable)
    }
}

pub struct MentionHandler {
    pub services: Arc<ReviewServices>,
}

#[async_trait]
impl JobHandler for MentionHandler {
    type Job = MentionAsked;

    async fn run(&self, ctx: JobContext, job: MentionAsked) -> Result<(), JobError> {
        tracing::info!(
            job_id = ctx.job_id,
            project_id = job.project_id,
            noteable_type = %job.noteable_type,
            "answering a mention"
        );
        super::mentions::run(&self.services, &job)
            .await
            .map_err(JobError::retryable)
    }
}

pub struct PipelineFixHandler {
    pub services: Arc<ReviewServices>,
}

#[async_trait]
impl JobHandler for PipelineFixHandler {
    type Job = PipelineFailed;

    async fn run(&self, ctx: JobContext, job: PipelineFailed) -> Result<(), JobError> {
        tracing::info!(
            job_id = ctx.job_id,
            project_id = job.project_id,
            pipeline_id = job.pipeline_id,
            "starting a fix run for a failed pipeline"
        );
        super::pipeline_fix::run(&self.services, &job)
            .await
            .map_err(JobError::retryable)
    }
}
