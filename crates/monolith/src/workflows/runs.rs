//! Workflows the product runs itself (GitLab's workloads): started from the
//! REST API, GraphQL or a button, queued within the instance's limits, run by
//! a [`Runner`] in legs, and ending in a branch and a merge request.
//!
//! - A leg is a row of `duo_workflow_workloads`: `queued` until admitted
//!   (at most `per_user` running legs per user and `per_instance` in all;
//!   the rest wait in order), `running` while a worker runs it, then
//!   `finished`, `paused` (waiting for an approval), `failed` or `cancelled`.
//! - Admission ([`dispatch`]) runs under one advisory lock, so two workers
//!   never admit past the limits; each admitted leg becomes a
//!   [`DuoWorkflowLeg`] job. A worker that dies mid-leg loses its job's lease
//!   and another worker runs the leg again from the last code checkpoint.
//! - Each leg gets its own token: an `ai_workflows` token bound to the
//!   workflow and its project (the service account's, acting for the user,
//!   when one is configured), revoked when the leg ends.
//! - The code lives between legs in the hidden ref
//!   `refs/workloads/<workflow id>` (not advertised to clones, removed with
//!   the workflow). When a software-development run finishes with changes,
//!   the monolith creates the branch `duo/workflow-<id>` at that commit and
//!   opens a merge request into the source branch, authored by the service
//!   account on behalf of the user; the default branch is never written.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use job_queue::{EnqueueOptions, JobContext, JobError, JobHandler};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::runners::{Answer, LegEnd, LegOutcome, LegSpec, RunLimits, Runner};
use super::{Caller, Status, WorkflowError};
use crate::queries::Queries;

/// The advisory lock key admission takes (any constant the rest of the
/// monolith does not use).
const ADMISSION_LOCK: i64 = 0x0064_756f_7275_6e73; // "duoruns"
/// How often a running leg looks for a stop or pause.
const WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// The queue legs run on.
pub const QUEUE: &str = "duo_workflow_runs";

/// The hidden ref a workflow's code is checkpointed to.
pub fn checkpoint_ref(workflow_id: i64) -> String {
    format!("refs/workloads/{workflow_id}")
}

/// The branch a finished run's work is published on.
pub fn result_branch(workflow_id: i64) -> String {
    format!("duo/workflow-{workflow_id}")
}

/// How many legs may run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    pub per_user: i64,
    pub per_instance: i64,
}

/// One leg of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Workload {
    pub id: i64,
    pub workflow_id: i64,
    pub leg: i32,
    pub runner: String,
    pub state: String,
    pub failure_reason: Option<String>,
    pub checkpoint_sha: Option<String>,
}

const WORKLOAD_COLUMNS: &str =
    "id, workflow_id, leg, runner, state, failure_reason, checkpoint_sha";

fn workload(row: &tokio_postgres::Row) -> Workload {
    Workload {
        id: row.get(0),
        workflow_id: row.get(1),
        leg: row.get(2),
        runner: row.get(3),
        state: row.get(4),
        failure_reason: row.get(5),
        checkpoint_sha: row.get(6),
    }
}

/// The job that runs one admitted leg.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DuoWorkflowLeg {
    pub workload_id: i64,
}

impl job_queue::Job for DuoWorkflowLeg {
    const KIND: &'static str = "duo_workflow_leg";
}

/// The periodic job that admits waiting legs (in case a worker died
/// between ending a leg and admitting the next).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DuoWorkflowDispatch {}

impl job_queue::Job for DuoWorkflowDispatch {
    const KIND: &'static str = "duo_workflow_dispatch";
}

/// Queues the next leg of a workflow, with the answer the user gave to the
/// request it paused on. Refused while a leg is queued or running.
pub async fn queue_leg(
    db: &impl Queries,
    workflow_id: i64,
    runner: &str,
    answer: Option<&Answer>,
) -> Result<Workload, WorkflowError> {
    let (answer, reject_message) = match answer {
        None => (None, None),
        Some(Answer::Approve) => (Some("approve"), None),
        Some(Answer::Reject(message)) => (Some("reject"), message.as_deref()),
    };
    let row = db
        .query_opt(
            &format!(
                "INSERT INTO duo_workflow_workloads (workflow_id, leg, runner, answer, reject_message)
                 SELECT $1, coalesce(max(leg), 0) + 1, $2, $3, $4
                 FROM duo_workflow_workloads WHERE workflow_id = $1
                 HAVING NOT coalesce(bool_or(state IN ('queued', 'running')), false)
                 RETURNING {WORKLOAD_COLUMNS}"
            ),
            &[&workflow_id, &runner, &answer, &reject_message],
        )
        .await?;
    match row {
        Some(row) => Ok(workload(&row)),
        None => Err(WorkflowError::Conflict(
            "the workflow is already queued or running".into(),
        )),
    }
}

/// The newest leg of a workflow.
pub async fn latest(
    db: &impl Queries,
    workflow_id: i64,
) -> Result<Option<Workload>, WorkflowError> {
    Ok(db
        .query_opt(
            &format!(
                "SELECT {WORKLOAD_COLUMNS} FROM duo_workflow_workloads
                 WHERE workflow_id = $1 ORDER BY leg DESC LIMIT 1"
            ),
            &[&workflow_id],
        )
        .await?
        .as_ref()
        .map(workload))
}

/// The 1-based place of a queued leg among those waiting; `None` once it
/// was admitted.
pub async fn queue_position(
    db: &impl Queries,
    workload_id: i64,
) -> Result<Option<i64>, WorkflowError> {
    let row = db
        .query_one(
            "SELECT CASE WHEN l.state = 'queued' THEN
                 (SELECT count(*) FROM duo_workflow_workloads q
                  WHERE q.state = 'queued' AND (q.created_at, q.id) <= (l.created_at, l.id))
             END
             FROM duo_workflow_workloads l WHERE l.id = $1",
            &[&workload_id],
        )
        .await?;
    Ok(row.get(0))
}

/// Admits waiting legs, oldest first, within the limits, and enqueues a job
/// for each; returns their ids.
pub async fn dispatch(
    client: &mut deadpool_postgres::Client,
    limits: AdmissionLimits,
) -> Result<Vec<i64>, WorkflowError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ADMISSION_LOCK])
        .await?;
    let running = tx
        .query(
            "SELECT w.user_id, count(*) FROM duo_workflow_workloads l
             JOIN duo_workflows_workflows w ON w.id = l.workflow_id
             WHERE l.state = 'running' GROUP BY w.user_id",
            &[],
        )
        .await?;
    let mut per_user: std::collections::HashMap<i64, i64> =
        running.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut total: i64 = per_user.values().sum();
    let waiting = tx
        .query(
            "SELECT l.id, w.user_id FROM duo_workflow_workloads l
             JOIN duo_workflows_workflows w ON w.id = l.workflow_id
             WHERE l.state = 'queued' ORDER BY l.created_at, l.id",
            &[],
        )
        .await?;
    let mut admitted = Vec::new();
    for row in &waiting {
        if total >= limits.per_instance {
            break;
        }
        let (id, user): (i64, i64) = (row.get(0), row.get(1));
        let mine = per_user.entry(user).or_insert(0);
        if *mine >= limits.per_user {
            continue;
        }
        tx.execute(
            "UPDATE duo_workflow_workloads SET state = 'running', started_at = now() WHERE id = $1",
            &[&id],
        )
        .await?;
        crate::db::enqueue(
            &tx,
            &DuoWorkflowLeg { workload_id: id },
            EnqueueOptions::default()
                .queue(QUEUE)
                .dedupe(format!("duo_workflow_leg:{id}")),
        )
        .await?;
        *mine += 1;
        total += 1;
        admitted.push(id);
    }
    tx.commit().await?;
    Ok(admitted)
}

/// Cancels a workflow's waiting leg (a stop before it was admitted).
pub async fn cancel_queued(db: &impl Queries, workflow_id: i64) -> Result<u64, WorkflowError> {
    Ok(db
        .execute(
            "UPDATE duo_workflow_workloads SET state = 'cancelled', finished_at = now()
             WHERE workflow_id = $1 AND state = 'queued'",
            &[&workflow_id],
        )
        .await?)
}

/// What the leg job needs besides the database.
pub struct RunContext {
    pub runner: Arc<dyn Runner>,
    pub policy: crate::policy::Policy,
    pub keys: crate::identity::jwt::SharedKeyRing,
    pub config: crate::config::Config,
    pub models: crate::ai_models::ModelStore,
    pub repositories: crate::repositories::storage::Repositories,
    pub limits: RunLimits,
    pub admission: AdmissionLimits,
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("runner", &self.runner.name())
            .field("limits", &self.limits)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

/// Runs [`DuoWorkflowLeg`] jobs.
pub struct LegHandler {
    pub context: Arc<RunContext>,
}

/// Admits waiting legs on [`DuoWorkflowDispatch`].
pub struct DispatchHandler {
    pub admission: AdmissionLimits,
}

#[async_trait]
impl JobHandler for DispatchHandler {
    type Job = DuoWorkflowDispatch;

    async fn run(&self, ctx: JobContext, _job: DuoWorkflowDispatch) -> Result<(), JobError> {
        let mut db = ctx.pool.get().await.map_err(JobError::retryable)?;
        dispatch(&mut db, self.admission)
            .await
            .map_err(JobError::retryable)?;
        Ok(())
    }
}

/// A leg as the job reads it, with its workflow's facts.
struct LegFacts {
    workload: Workload,
    answer: Option<String>,
    reject_message: Option<String>,
    user_id: i64,
    service_account_id: Option<i64>,
    project_id: i64,
    project_path: String,
    default_branch: String,
    source_branch: Option<String>,
    goal: String,
    definition: String,
    status: i16,
    issue_id: Option<i64>,
}

impl LegFacts {
    /// The user's stored answer for this leg.
    fn decision(&self) -> Option<Answer> {
        match self.answer.as_deref() {
            Some("approve") => Some(Answer::Approve),
            Some("reject") => Some(Answer::Reject(self.reject_message.clone())),
            _ => None,
        }
    }
}

async fn leg_facts(db: &impl Queries, workload_id: i64) -> Result<Option<LegFacts>, WorkflowError> {
    let sql = format!(
        "{} SELECT l.id, l.workflow_id, l.leg, l.runner, l.state, l.failure_reason, l.checkpoint_sha,
                l.answer, l.reject_message, w.user_id, w.service_account_id, w.project_id,
                paths.full_path || '/' || p.path, p.default_branch, w.source_branch,
                w.goal, w.workflow_definition, w.status, w.issue_id
         FROM duo_workflow_workloads l
         JOIN duo_workflows_workflows w ON w.id = l.workflow_id
         JOIN projects p ON p.id = w.project_id
         JOIN paths ON paths.id = p.group_id
         WHERE l.id = $1",
        crate::namespaces::FULL_PATHS
    );
    let Some(row) = db.query_opt(&sql, &[&workload_id]).await? else {
        return Ok(None);
    };
    Ok(Some(LegFacts {
        workload: workload(&row),
        answer: row.get(7),
        reject_message: row.get(8),
        user_id: row.get(9),
        service_account_id: row.get(10),
        project_id: row.get(11),
        project_path: row.get(12),
        default_branch: row.get(13),
        source_branch: row.get(14),
        goal: row.get(15),
        definition: row.get(16),
        status: row.get(17),
        issue_id: row.get(18),
    }))
}

#[async_trait]
impl JobHandler for LegHandler {
    type Job = DuoWorkflowLeg;

    async fn run(&self, ctx: JobContext, job: DuoWorkflowLeg) -> Result<(), JobError> {
        let context = &self.context;
        let facts = {
            let db = ctx.pool.get().await.map_err(JobError::retryable)?;
            leg_facts(&*db, job.workload_id)
                .await
                .map_err(JobError::retryable)?
        };
        let Some(facts) = facts else {
            return Ok(());
        };
        if facts.workload.state != "running" {
            return Ok(());
        }
        let terminal = Status::from_code(facts.status).is_some_and(Status::is_terminal);
        let outcome = if terminal {
            LegOutcome {
                end: LegEnd::Cancelled,
                log_tail: String::new(),
            }
        } else {
            match run_leg(context, &ctx.pool, &facts).await {
                Ok(outcome) => outcome,
                Err(reason) => LegOutcome {
                    end: LegEnd::Failed(reason),
                    log_tail: String::new(),
                },
            }
        };
        finish_leg(context, &ctx.pool, &facts, outcome)
            .await
            .map_err(JobError::retryable)?;
        let mut db = ctx.pool.get().await.map_err(JobError::retryable)?;
        dispatch(&mut db, context.admission)
            .await
            .map_err(JobError::retryable)?;
        Ok(())
    }
}

/// Mints the leg's credentials, runs it and watches for a stop meanwhile.
async fn run_leg(
    context: &RunContext,
    pool: &deadpool_postgres::Pool,
    facts: &LegFacts,
) -> Result<LegOutcome, String> {
    let workflow_id = facts.workload.workflow_id;
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let db = pool.get().await.map_err(|e| text(&e))?;
    let lifetime =
        chrono::Duration::from_std(context.limits.max_duration + Duration::from_secs(300))
            .unwrap_or(chrono::Duration::hours(2));
    let token = crate::identity::oauth::mint_for_run(
        &*db,
        facts.service_account_id,
        facts.user_id,
        crate::identity::tokens::RunBinding {
            workflow_id,
            project_id: facts.project_id,
        },
        lifetime,
    )
    .await
    .map_err(|e| text(&e))?;
    db.execute(
        "UPDATE duo_workflow_workloads SET token_id = $2 WHERE id = $1",
        &[&facts.workload.id, &token.id],
    )
    .await
    .map_err(|e| text(&e))?;
    let service = super::service::ServiceClient::new(
        &context.config.duo_workflow.service_url,
        context.config.duo_workflow.service_timeout,
    )
    .map_err(|e| text(&e))?;
    let session = super::access::service_session(
        &*db,
        &context.policy,
        &context.keys,
        &context.config,
        &context.models,
        &service,
        facts.user_id,
        &facts.definition,
    )
    .await
    .map_err(|e| format!("the workflow service could not be reached: {e}"))?;
    tracing::debug!(workflow_id, "leg: service session ready");
    let author = git_author(&*db, facts.service_account_id.unwrap_or(facts.user_id))
        .await
        .map_err(|e| text(&e))?;
    drop(db);
    let headers: serde_json::Map<String, serde_json::Value> = session
        .headers
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    let spec = LegSpec {
        workflow_id,
        workload_id: facts.workload.id,
        project_path: facts.project_path.clone(),
        source_ref: facts
            .source_branch
            .clone()
            .unwrap_or_else(|| facts.default_branch.clone()),
        checkpoint_ref: checkpoint_ref(workflow_id),
        definition: facts.definition.clone(),
        goal: facts.goal.clone(),
        gitlab_token: SecretString::from(token.token),
        service_token: SecretString::from(session.token.token),
        service_headers: SecretString::from(serde_json::Value::Object(headers).to_string()),
        answer: facts.decision(),
        git_author: author,
        limits: context.limits,
    };
    let cancel = CancellationToken::new();
    tracing::debug!(
        workflow_id,
        runner = context.runner.name(),
        "leg: handing over to the runner"
    );
    let watcher = tokio::spawn(watch_for_stop(
        pool.clone(),
        workflow_id,
        facts.workload.id,
        cancel.clone(),
    ));
    let outcome = context.runner.run_leg(&spec, cancel).await;
    watcher.abort();
    tracing::debug!(workflow_id, ?outcome, "leg: the runner is done");
    if let Ok(db) = pool.get().await {
        let _ = crate::identity::oauth::revoke_by_id(&*db, token.id).await;
    }
    outcome.map_err(|e| e.to_string())
}

/// What a user asked of a running leg through the events API: a stop or a
/// pause sent since the leg was queued (the workflow's status alone is not
/// enough: an executor starting up moves a stopped workflow back to running).
async fn halt_requested(
    db: &impl Queries,
    workload_id: i64,
) -> Result<Option<&'static str>, WorkflowError> {
    let row = db
        .query_one(
            "SELECT w.status,
                    (SELECT e.event_type FROM duo_workflows_events e
                     WHERE e.workflow_id = l.workflow_id AND e.event_type IN (0, 2)
                       AND e.created_at >= l.created_at
                     ORDER BY e.event_type DESC LIMIT 1)
             FROM duo_workflow_workloads l
             JOIN duo_workflows_workflows w ON w.id = l.workflow_id
             WHERE l.id = $1",
            &[&workload_id],
        )
        .await?;
    let event: Option<i16> = row.get(1);
    Ok(match (event, Status::from_code(row.get(0))) {
        (Some(2), _) | (None, Some(Status::Stopped)) => Some("stop"),
        (Some(_), _) | (None, Some(Status::Paused)) => Some("pause"),
        (None, Some(Status::Failed)) => Some("drop"),
        _ => None,
    })
}

/// Cancels the leg once a user stopped or paused it (events API), or its
/// workflow was moved there (status API).
async fn watch_for_stop(
    pool: deadpool_postgres::Pool,
    workflow_id: i64,
    workload_id: i64,
    cancel: CancellationToken,
) {
    loop {
        tokio::time::sleep(WATCH_INTERVAL).await;
        let Ok(db) = pool.get().await else { continue };
        if let Ok(Some(halt)) = halt_requested(&*db, workload_id).await {
            tracing::debug!(workflow_id, halt, "leg: halted, cancelling");
            cancel.cancel();
            return;
        }
    }
}

/// The checkpoint author: the service account's (or user's) name and email.
async fn git_author(db: &impl Queries, user_id: i64) -> Result<(String, String), WorkflowError> {
    let row = db
        .query_one("SELECT name, email FROM users WHERE id = $1", &[&user_id])
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Records how the leg ended and what follows from it: a failed workflow,
/// or (a finished software-development run with changes) a branch and a
/// merge request.
async fn finish_leg(
    context: &RunContext,
    pool: &deadpool_postgres::Pool,
    facts: &LegFacts,
    outcome: LegOutcome,
) -> Result<(), WorkflowError> {
    let workflow_id = facts.workload.workflow_id;
    let repository = context.repositories.path(facts.project_id);
    let checkpoint =
        crate::repositories::reader::ref_target(&repository, &checkpoint_ref(workflow_id))
            .ok()
            .flatten();
    let (state, reason) = match &outcome.end {
        LegEnd::Finished => ("finished", None),
        LegEnd::Paused => ("paused", None),
        LegEnd::Cancelled => ("cancelled", None),
        LegEnd::TimedOut => (
            "failed",
            Some(format!(
                "the run took longer than its limit of {} s",
                context.limits.max_duration.as_secs()
            )),
        ),
        LegEnd::Failed(reason) => ("failed", Some(reason.clone())),
    };
    let mut db = pool.get().await?;
    // The result is published before the leg is marked ended, so whoever
    // sees a finished leg finds its merge request. A failure to publish is
    // recorded on the leg; the run is not repeated for it.
    let mut reason = reason;
    if outcome.end == LegEnd::Finished
        && facts.definition == "software_development"
        && let Some(commit) = &checkpoint
        && let Err(e) = publish_result(context, &mut db, facts, commit).await
    {
        tracing::warn!(workflow_id, error = %e, "the run's merge request could not be opened");
        reason = Some(format!("the merge request could not be opened: {e}"));
    }
    db.execute(
        "UPDATE duo_workflow_workloads
         SET state = $2, failure_reason = $3, log_tail = $4, checkpoint_sha = $5, finished_at = now()
         WHERE id = $1",
        &[
            &facts.workload.id,
            &state,
            &reason,
            &super::runners::tail(&outcome.log_tail, 60_000),
            &checkpoint,
        ],
    )
    .await?;
    let caller = Caller {
        user_id: facts.user_id,
        service_account_id: facts.service_account_id,
    };
    match outcome.end {
        LegEnd::Cancelled => {
            // The executor may have moved the workflow on while it started:
            // it ends where the user asked.
            if let Some(halt @ ("stop" | "pause")) = halt_requested(&*db, facts.workload.id).await?
            {
                let _ = super::store::apply_status_event(&mut db, workflow_id, halt, caller, None)
                    .await;
            }
        }
        LegEnd::Failed(_) | LegEnd::TimedOut => {
            // A run that cannot go on ends FAILED with its reason.
            let _ =
                super::store::apply_status_event(&mut db, workflow_id, "drop", caller, None).await;
            super::audit(
                &*db,
                Some(workflow_id),
                "duo_run_failed",
                caller,
                serde_json::json!({ "reason": reason }),
            )
            .await?;
        }
        _ => {}
    }
    Ok(())
}

/// Puts a finished run's work on `duo/workflow-<id>` and opens a merge
/// request into the source branch, unless the run changed nothing.
async fn publish_result(
    context: &RunContext,
    db: &mut deadpool_postgres::Client,
    facts: &LegFacts,
    commit: &str,
) -> Result<(), WorkflowError> {
    let workflow_id = facts.workload.workflow_id;
    let repository = context.repositories.path(facts.project_id);
    let source = facts
        .source_branch
        .clone()
        .unwrap_or_else(|| facts.default_branch.clone());
    let stored = |e: crate::repositories::RepositoryError| WorkflowError::Stored(e.to_string());
    let base = crate::repositories::reader::resolve(&repository, &format!("refs/heads/{source}"))
        .map_err(stored)?;
    let git_dir = repository.display().to_string();
    let patch = crate::repositories::git::git(&[
        "--git-dir",
        &git_dir,
        "diff",
        "--no-color",
        "--no-ext-diff",
        "-M",
        &base,
        commit,
    ])
    .await
    .map_err(stored)?;
    let caller = Caller {
        user_id: facts.user_id,
        service_account_id: facts.service_account_id,
    };
    if patch.is_empty() {
        db.execute(
            "UPDATE duo_workflows_workflows SET summary = left($2, 1024) WHERE id = $1",
            &[
                &workflow_id,
                &"The run finished without changing any file: no merge request was opened.",
            ],
        )
        .await?;
        return super::audit(
            &**db,
            Some(workflow_id),
            "duo_run_without_changes",
            caller,
            serde_json::json!({}),
        )
        .await;
    }
    let branch = result_branch(workflow_id);
    let update = crate::repositories::writer::create_branch(&repository, &branch, commit)
        .await
        .map_err(stored)?;
    let author = facts.service_account_id.unwrap_or(facts.user_id);
    let on_behalf = facts.service_account_id.map(|_| facts.user_id);
    let title = format!("Duo Workflow: {}", first_line(&facts.goal, 200));
    let mut description = format!(
        "Opened by GitLab Duo for workflow {workflow_id} ({}/{}/-/workflows/{workflow_id}).\n\n**Goal:** {}\n",
        context.config.external_url.as_str().trim_end_matches('/'),
        facts.project_path,
        facts.goal
    );
    let tx = db.transaction().await?;
    if let Some(issue) = facts.issue_id {
        let iid: Option<i32> = tx
            .query_opt("SELECT iid FROM issues WHERE id = $1", &[&issue])
            .await?
            .map(|r| r.get(0));
        if let Some(iid) = iid {
            description.push_str(&format!("\nRelated to #{iid}.\n"));
        }
    }
    tx.execute(
        "SELECT 1 FROM projects WHERE id = $1 FOR UPDATE",
        &[&facts.project_id],
    )
    .await?;
    let merge_request: i64 = tx
        .query_one(
            "INSERT INTO merge_requests (project_id, iid, title, description, author_id, source_branch,
                                         target_branch, diff, labels, on_behalf_of_user_id)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM merge_requests WHERE project_id = $1),
                     $2, $3, $4, $5, $6, $7, '{}', $8)
             RETURNING id",
            &[
                &facts.project_id,
                &title,
                &description,
                &author,
                &branch,
                &source,
                &String::from_utf8_lossy(&patch).into_owned(),
                &on_behalf,
            ],
        )
        .await?
        .get(0);
    tx.execute(
        "UPDATE duo_workflows_workflows SET result_branch = $2, merge_request_id = $3 WHERE id = $1",
        &[&workflow_id, &branch, &merge_request],
    )
    .await?;
    crate::repositories::pushes::record(&tx, facts.project_id, Some(author), &[update]).await?;
    super::audit(
        &tx,
        Some(workflow_id),
        "duo_run_merge_request_opened",
        caller,
        serde_json::json!({ "branch": branch, "merge_request_id": merge_request }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

fn first_line(text: &str, max_chars: usize) -> String {
    let line = text.lines().next().unwrap_or_default().trim();
    line.chars().take(max_chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_the_refs_a_run_uses() {
        assert_eq!(checkpoint_ref(7), "refs/workloads/7");
        assert_eq!(result_branch(7), "duo/workflow-7");
        assert_eq!(first_line("Fix the bug\nmore", 200), "Fix the bug");
        assert_eq!(first_line("éé", 1), "é");
    }
}

/// Why runs cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum RunSetupError {
    #[error("{0} cannot be reached by a runner: it names no host and port")]
    Address(&'static str),
    #[error(transparent)]
    Runner(#[from] super::runners::RunnerError),
}

impl RunContext {
    /// The run context of a worker process, or `None` when runs are
    /// disabled (`DUO_WORKFLOW_RUNNER=disabled`).
    pub async fn from_config(
        config: &crate::config::Config,
        policy: crate::policy::Policy,
        keys: crate::identity::jwt::SharedKeyRing,
        models: crate::ai_models::ModelStore,
        repositories: crate::repositories::storage::Repositories,
    ) -> Result<Option<Self>, RunSetupError> {
        use crate::config::RunnerKind;
        let runs = &config.duo_workflow.runs;
        let runner: Arc<dyn Runner> = match runs.runner {
            RunnerKind::Disabled => return Ok(None),
            RunnerKind::Kubernetes => {
                let k8s = &runs.kubernetes;
                Arc::new(super::runners::kubernetes::KubernetesRunner::lazy(
                    super::runners::kubernetes::KubernetesRunnerConfig {
                        api_url: k8s.api_url.clone(),
                        namespace: k8s.namespace.clone(),
                        image: k8s.image.clone(),
                        gitlab_url: k8s.gitlab_url.as_str().trim_end_matches('/').to_owned(),
                        service_url: k8s.service_url.as_str().trim_end_matches('/').to_owned(),
                        cpu: k8s.cpu.clone(),
                    },
                ))
            }
            RunnerKind::Local => Arc::new(super::runners::local::LocalRunner::new(
                super::runners::local::LocalRunnerConfig {
                    executor: runs.executor.clone(),
                    bwrap: runs.bwrap.clone(),
                    prlimit: runs.prlimit.clone(),
                    work_dir: runs.work_dir.clone(),
                    gitlab_address: super::runners::relay::address_of(&runs.gitlab_url)
                        .ok_or(RunSetupError::Address("DUO_WORKFLOW_RUNNER_GITLAB_URL"))?,
                    service_address: super::runners::relay::address_of(
                        &config.duo_workflow.service_url,
                    )
                    .ok_or(RunSetupError::Address("DUO_WORKFLOW_SERVICE_URL"))?,
                },
            )),
        };
        Ok(Some(Self {
            runner,
            policy,
            keys,
            config: config.clone(),
            models,
            repositories,
            limits: RunLimits {
                max_duration: runs.max_duration,
                memory_bytes: runs.memory_mb * 1024 * 1024,
                cpu_seconds: runs.cpu_seconds,
                disk_bytes: runs.disk_mb * 1024 * 1024,
            },
            admission: AdmissionLimits {
                per_user: runs.per_user,
                per_instance: runs.per_instance,
            },
        }))
    }
}

/// A run the product was asked to start (or continue): its leg and, while
/// it waits, its place in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedRun {
    pub workload: Workload,
    pub position: Option<i64>,
}

impl StartedRun {
    /// GitLab's `workload: {id, message}`.
    pub fn workload_json(&self, follow_url: &str) -> serde_json::Value {
        let message = match self.position {
            Some(place) => {
                format!("The run is queued ({place} in line); follow it at {follow_url}")
            }
            None => format!("The run started; follow it at {follow_url}"),
        };
        serde_json::json!({ "id": self.workload.id, "message": message })
    }
}

/// The runner runs are handed to, as configured; `None` when runs are off.
pub fn configured_runner(config: &crate::config::Config) -> Option<&'static str> {
    use crate::config::RunnerKind;
    match config.duo_workflow.runs.runner {
        RunnerKind::Local => Some("local"),
        RunnerKind::Kubernetes => Some("kubernetes"),
        RunnerKind::Disabled => None,
    }
}

/// Queues the workflow's next leg (with the user's answer, after a pause)
/// and admits what the limits allow.
pub async fn start(
    pool: &deadpool_postgres::Pool,
    config: &crate::config::Config,
    workflow_id: i64,
    answer: Option<&Answer>,
) -> Result<StartedRun, WorkflowError> {
    let runner = configured_runner(config).ok_or_else(|| {
        WorkflowError::CannotRun(
            "Workflows cannot be run on this instance: no runner is configured (DUO_WORKFLOW_RUNNER)"
                .into(),
        )
    })?;
    let mut db = pool.get().await?;
    let workload = queue_leg(&*db, workflow_id, runner, answer).await?;
    let runs = &config.duo_workflow.runs;
    dispatch(
        &mut db,
        AdmissionLimits {
            per_user: runs.per_user,
            per_instance: runs.per_instance,
        },
    )
    .await?;
    let position = queue_position(&*db, workload.id).await?;
    Ok(StartedRun { workload, position })
}

/// What the product did with an event a user sent to one of its runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventReaction {
    /// Not a run of the product (an IDE or a hand-started executor reads
    /// its events itself), or an event runs do not act on.
    None,
    /// The workflow moved (stopped or paused); a running leg is cancelled by
    /// its watcher, a queued one never starts.
    Moved,
    /// The next leg was queued with the user's answer.
    Continued(StartedRun),
}

/// Acts on an event sent to a workflow the product runs: `stop` and `pause`
/// move the workflow (its running leg sees that and ends), `resume` answers
/// the approval the run waits for (or continues a paused run), `response`
/// and `message` turn the approval down with the user's words. The event
/// itself was stored by the caller; it is marked delivered here, as the
/// product has handed it on.
pub async fn react_to_event(
    pool: &deadpool_postgres::Pool,
    config: &crate::config::Config,
    workflow_id: i64,
    event: &super::events::Event,
    caller: Caller,
) -> Result<EventReaction, WorkflowError> {
    {
        let db = pool.get().await?;
        if latest(&*db, workflow_id).await?.is_none() {
            return Ok(EventReaction::None);
        }
    }
    match act_on_event(pool, config, workflow_id, event, caller).await {
        Ok(EventReaction::None) => Ok(EventReaction::None),
        Ok(reaction) => {
            let db = pool.get().await?;
            super::events::set_status(&*db, workflow_id, event.id, Some("delivered")).await?;
            Ok(reaction)
        }
        Err(refused) => {
            // Nothing would ever read a refused event: it is not kept.
            forget_event(&*pool.get().await?, event.id).await?;
            Err(refused)
        }
    }
}

/// The longest answer a leg carries to the run (what the user said instead).
pub const MAX_ANSWER_CHARS: usize = 4096;

async fn act_on_event(
    pool: &deadpool_postgres::Pool,
    config: &crate::config::Config,
    workflow_id: i64,
    event: &super::events::Event,
    caller: Caller,
) -> Result<EventReaction, WorkflowError> {
    let mut db = pool.get().await?;
    let status = {
        let row = db
            .query_one(
                "SELECT status FROM duo_workflows_workflows WHERE id = $1",
                &[&workflow_id],
            )
            .await?;
        Status::from_code(row.get(0))
    };
    let awaiting_approval = matches!(
        status,
        Some(
            Status::PlanApprovalRequired | Status::ToolCallApprovalRequired | Status::InputRequired
        )
    );
    Ok(match event.event_type {
        kind @ ("stop" | "pause") => {
            super::store::apply_status_event(&mut db, workflow_id, kind, caller, None).await?;
            cancel_queued(&*db, workflow_id).await?;
            EventReaction::Moved
        }
        "resume" if awaiting_approval => {
            drop(db);
            EventReaction::Continued(
                start(pool, config, workflow_id, Some(&Answer::Approve)).await?,
            )
        }
        "resume" if status == Some(Status::Paused) => {
            super::store::apply_status_event(&mut db, workflow_id, "resume", caller, None).await?;
            drop(db);
            EventReaction::Continued(start(pool, config, workflow_id, None).await?)
        }
        "response" | "message" if awaiting_approval => {
            drop(db);
            if event.message.chars().count() > MAX_ANSWER_CHARS {
                return Err(WorkflowError::invalid(
                    "message",
                    format!(
                        "is too long for an answer to a run (maximum is {MAX_ANSWER_CHARS} characters)"
                    ),
                ));
            }
            let words = Some(event.message.clone()).filter(|m| !m.trim().is_empty());
            EventReaction::Continued(
                start(pool, config, workflow_id, Some(&Answer::Reject(words))).await?,
            )
        }
        "resume" | "response" | "message" => {
            return Err(WorkflowError::Refused(format!(
                "The workflow is not waiting for an answer (status {})",
                status.map_or("unknown", Status::name)
            )));
        }
        _ => EventReaction::None,
    })
}

/// Drops an event the product refused: nothing would ever read it.
async fn forget_event(db: &impl Queries, event_id: i64) -> Result<(), WorkflowError> {
    db.execute(
        "DELETE FROM duo_workflows_events WHERE id = $1",
        &[&event_id],
    )
    .await?;
    Ok(())
}

/// Checks that a workflow can be run by the product before it is created:
/// a runner is configured, it belongs to a project with commits, and the
/// source branch (when one is named) is a branch of that project.
pub fn check_start(
    config: &crate::config::Config,
    repository: &std::path::Path,
    project_id: Option<i64>,
    source_branch: Option<&str>,
) -> Result<(), WorkflowError> {
    let cannot = |m: &str| Err(WorkflowError::CannotRun(m.to_owned()));
    if configured_runner(config).is_none() {
        return cannot(
            "Workflows cannot be run on this instance: no runner is configured (DUO_WORKFLOW_RUNNER)",
        );
    }
    if project_id.is_none() {
        return cannot("A workflow can only be started in a project");
    }
    let branches = match crate::repositories::reader::refs(repository) {
        Ok(refs) => refs.branches,
        Err(_) => return cannot("The project has no repository to work on"),
    };
    if branches.is_empty() {
        return cannot("The project's repository is empty");
    }
    if let Some(branch) = source_branch
        && !branches.contains_key(branch)
    {
        return cannot("The source branch does not exist in the project");
    }
    Ok(())
}

/// Deletes a workflow the product may have run: refused while a leg is
/// queued or running; otherwise its hidden checkpoint ref goes with it (the
/// result branch and merge request stay: they belong to the project now).
pub async fn delete_workflow(
    db: &impl Queries,
    repositories: &crate::repositories::storage::Repositories,
    workflow: &super::store::Workflow,
    caller: Caller,
) -> Result<(), WorkflowError> {
    let active: bool = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM duo_workflow_workloads
                            WHERE workflow_id = $1 AND state IN ('queued', 'running'))",
            &[&workflow.id],
        )
        .await?
        .get(0);
    if active {
        return Err(WorkflowError::Conflict(
            "The workflow is running: stop it before deleting it".into(),
        ));
    }
    if let Some(project) = workflow.project_id {
        let repository = repositories.path(project);
        let name = checkpoint_ref(workflow.id);
        if crate::repositories::reader::ref_target(&repository, &name)
            .ok()
            .flatten()
            .is_some()
        {
            let dir = repository.display().to_string();
            crate::repositories::git::git(&["--git-dir", &dir, "update-ref", "-d", &name])
                .await
                .map_err(|e| WorkflowError::Stored(e.to_string()))?;
        }
    }
    super::audit(
        db,
        None,
        "duo_session_deleted",
        caller,
        serde_json::json!({ "workflow_id": workflow.id }),
    )
    .await?;
    db.execute(
        "DELETE FROM duo_workflows_workflows WHERE id = $1",
        &[&workflow.id],
    )
    .await?;
    Ok(())
}
