//! CI pipelines and jobs (builds) of a project. They come from a CI system
//! outside GitLab through the documented import endpoint; nothing here runs
//! them.

use chrono::{DateTime, Utc};

use super::{Identified, SortOrder, WorkItemError};
use crate::queries::Queries;

/// The statuses a pipeline or job may have.
pub const STATUSES: &[&str] = &[
    "created", "pending", "running", "success", "failed", "canceled", "skipped", "manual",
];

/// One pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipeline {
    pub id: i64,
    /// Its position among the project's pipelines.
    pub iid: i32,
    pub project_id: i64,
    pub git_ref: String,
    pub sha: String,
    pub status: String,
    pub created_at: DateTime<Utc>,
    /// When its last job finished.
    pub finished_at: Option<DateTime<Utc>>,
}

/// Pipelines have no iid column: it is their position among the project's
/// pipelines, which only ever grow.
const PIPELINE_SQL: &str = "SELECT p.id, p.project_id, p.ref, p.sha, p.status, p.created_at,
        (SELECT count(*) FROM ci_pipelines o WHERE o.project_id = p.project_id AND o.id <= p.id)::int AS iid,
        (SELECT max(b.finished_at) FROM ci_builds b WHERE b.pipeline_id = p.id) AS finished_at
    FROM ci_pipelines p";

fn pipeline_from_row(row: &tokio_postgres::Row) -> Pipeline {
    Pipeline {
        id: row.get("id"),
        iid: row.get("iid"),
        project_id: row.get("project_id"),
        git_ref: row.get("ref"),
        sha: row.get("sha"),
        status: row.get("status"),
        created_at: row.get("created_at"),
        finished_at: row.get("finished_at"),
    }
}

/// Which pipelines of a project a list shows; `None` matches any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineFilter {
    pub status: Option<String>,
    pub git_ref: Option<String>,
    pub sha: Option<String>,
}

/// The project's pipelines that pass `filter`, by id in `order`.
pub async fn pipelines(
    db: &impl Queries,
    project: i64,
    filter: &PipelineFilter,
    order: SortOrder,
) -> Result<Vec<Pipeline>, tokio_postgres::Error> {
    let order = order.sql();
    let rows = db
        .query(
            &format!(
                "{PIPELINE_SQL} WHERE p.project_id = $1 AND ($2::text IS NULL OR p.status = $2)
                 AND ($3::text IS NULL OR p.ref = $3) AND ($4::text IS NULL OR p.sha = $4)
                 ORDER BY p.id {order}"
            ),
            &[&project, &filter.status, &filter.git_ref, &filter.sha],
        )
        .await?;
    Ok(rows.iter().map(pipeline_from_row).collect())
}

/// The project's pipeline with this id.
pub async fn pipeline(
    db: &impl Queries,
    project: i64,
    id: i64,
) -> Result<Option<Pipeline>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            &format!("{PIPELINE_SQL} WHERE p.id = $1 AND p.project_id = $2"),
            &[&id, &project],
        )
        .await?
        .as_ref()
        .map(pipeline_from_row))
}

/// Whether the project has a pipeline with this id.
pub async fn pipeline_exists(
    db: &impl Queries,
    project: i64,
    id: i64,
) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM ci_pipelines WHERE id = $1 AND project_id = $2",
            &[&id, &project],
        )
        .await?
        .is_some())
}

/// One job with what it shows of its pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: i64,
    pub name: String,
    pub stage: String,
    pub status: String,
    pub project_id: i64,
    pub pipeline_id: i64,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub log: String,
    /// The pipeline's ref, sha and status.
    pub git_ref: String,
    pub sha: String,
    pub pipeline_status: String,
}

impl Identified for Job {
    fn id(&self) -> i64 {
        self.id
    }
}

const JOB_SQL: &str = "SELECT b.id, b.name, b.stage, b.status, b.project_id, b.pipeline_id, b.created_at, b.finished_at, b.log,
        p.ref, p.sha, p.status AS pipeline_status
    FROM ci_builds b JOIN ci_pipelines p ON p.id = b.pipeline_id";

fn job_from_row(row: &tokio_postgres::Row) -> Job {
    Job {
        id: row.get("id"),
        name: row.get("name"),
        stage: row.get("stage"),
        status: row.get("status"),
        project_id: row.get("project_id"),
        pipeline_id: row.get("pipeline_id"),
        created_at: row.get("created_at"),
        finished_at: row.get("finished_at"),
        log: row.get("log"),
        git_ref: row.get("ref"),
        sha: row.get("sha"),
        pipeline_status: row.get("pipeline_status"),
    }
}

/// The project's jobs (of one pipeline when given) whose status is one of
/// `statuses` (any when empty), newest first.
pub async fn jobs(
    db: &impl Queries,
    project: i64,
    pipeline: Option<i64>,
    statuses: &[String],
) -> Result<Vec<Job>, tokio_postgres::Error> {
    let rows = db
        .query(
            &format!(
                "{JOB_SQL} WHERE b.project_id = $1 AND ($2::bigint IS NULL OR b.pipeline_id = $2)
                 AND (cardinality($3::text[]) = 0 OR b.status = ANY($3)) ORDER BY b.id DESC"
            ),
            &[&project, &pipeline, &statuses],
        )
        .await?;
    Ok(rows.iter().map(job_from_row).collect())
}

/// The project's job with this id.
pub async fn job(
    db: &impl Queries,
    project: i64,
    id: i64,
) -> Result<Option<Job>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            &format!("{JOB_SQL} WHERE b.project_id = $1 AND b.id = $2"),
            &[&project, &id],
        )
        .await?
        .as_ref()
        .map(job_from_row))
}

/// A finished job from a CI system outside GitLab, with its log.
#[derive(Debug, Clone)]
pub struct ImportedJob {
    pub name: String,
    pub stage: String,
    pub status: String,
    pub git_ref: String,
    pub sha: String,
    pub log: String,
}

/// Stores the job in a pipeline of its own, finished now.
pub async fn import(
    client: &mut deadpool_postgres::Client,
    project: i64,
    job: ImportedJob,
) -> Result<Job, WorkItemError> {
    let tx = client.transaction().await?;
    let pipeline: i64 = tx
        .query_one(
            "INSERT INTO ci_pipelines (project_id, ref, sha, status) VALUES ($1, $2, $3, $4) RETURNING id",
            &[&project, &job.git_ref, &job.sha, &job.status],
        )
        .await?
        .get(0);
    let id: i64 = tx
        .query_one(
            "INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status, log, finished_at)
             VALUES ($1, $2, $3, $4, $5, $6, now()) RETURNING id",
            &[
                &project,
                &pipeline,
                &job.name,
                &job.stage,
                &job.status,
                &job.log,
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    let row = client
        .query_one(&format!("{JOB_SQL} WHERE b.id = $1"), &[&id])
        .await?;
    Ok(job_from_row(&row))
}

/// A job's status and log, for explaining why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLog {
    pub status: String,
    pub log: String,
}

/// The status and log of the job with this id.
pub async fn status_and_log(
    db: &impl Queries,
    id: i64,
) -> Result<Option<JobLog>, tokio_postgres::Error> {
    Ok(db
        .query_opt("SELECT status, log FROM ci_builds WHERE id = $1", &[&id])
        .await?
        .map(|r| JobLog {
            status: r.get(0),
            log: r.get(1),
        }))
}
