//! The `code_index` job: brings a project's index up to its default branch.
//!
//! - One job per project at a time: the queue keeps at most one pending or
//!   running job per dedupe key, and a run that ends while the branch moved
//!   on runs again; the periodic catch-up job covers a push that lands in
//!   the instant between the last check and the job's end.
//! - Incremental: only files changed between the indexed commit and the
//!   head are read; each file's chunks are replaced in one transaction, so a
//!   crash leaves every file either old or new, never half, and the rerun
//!   (from the same indexed commit) reuses what was already embedded.
//! - The indexed commit moves only when the whole run succeeded.
//! - Pipelined: chunks are cut into calls by estimated word pieces
//!   ([`super::batching`]), at most `DUO_CODE_INDEX_EMBED_IN_FLIGHT` calls
//!   are out at once while the next files are read, and each file is stored
//!   as soon as all its vectors are back; what waits is bounded by a few
//!   calls' worth of chunks, whatever the repository's size.
//! - Other branches ([`CodeIndexBranchJob`], see [`super::branches`]) run
//!   the same way into their own index, starting from the default branch's.

use crate::queries::Queries;
use async_trait::async_trait;
use job_queue::{EnqueueOptions, Job, JobContext, JobError, JobHandler};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use std::collections::{HashMap, VecDeque};
use tokio::task::{JoinError, JoinSet};

use super::batching::{Batcher, ChunkRef};
use super::branches;
use super::chunker::{self, Chunk};
use super::filters::{self, Exclusions};
use super::store::{self, IndexState, NewChunk};
use super::{CodeIndex, CodeIndexError};
use crate::gateway_client::{CodeEmbeddings, EmbeddingPurpose, GatewayAuth, GatewayError};
use crate::policy::{AiReader, DuoSwitchScope, Policy, Subject};
use crate::repositories::pushes::RepositoryPushed;

/// Index (or re-index) one project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeIndexJob {
    pub project_id: i64,
}

impl Job for CodeIndexJob {
    const KIND: &'static str = "code_index";
}

/// The queue the index's jobs run on (with the repositories' own).
pub const QUEUE: &str = "repositories";

/// Enqueues the project's index job unless one is pending or running;
/// `true` when this call created it.
pub async fn enqueue_index(
    db: &impl Queries,
    project_id: i64,
    max_attempts: i32,
) -> Result<bool, job_queue::QueueError> {
    let options = EnqueueOptions {
        max_attempts,
        ..EnqueueOptions::default()
    }
    .queue(QUEUE)
    .dedupe(format!("code_index:{project_id}"));
    Ok(
        crate::db::enqueue(db, &CodeIndexJob { project_id }, options)
            .await?
            .created,
    )
}

/// Index (or bring up to date) one branch other than the default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeIndexBranchJob {
    pub project_id: i64,
    pub branch: String,
}

impl Job for CodeIndexBranchJob {
    const KIND: &'static str = "code_index_branch";
}

/// Enqueues the branch's index job unless one is pending or running;
/// `true` when this call created it.
pub async fn enqueue_branch_index(
    db: &impl Queries,
    project_id: i64,
    branch: &str,
    max_attempts: i32,
) -> Result<bool, job_queue::QueueError> {
    let options = EnqueueOptions {
        max_attempts,
        ..EnqueueOptions::default()
    }
    .queue(QUEUE)
    .dedupe(format!("code_index_branch:{project_id}:{branch}"));
    let job = CodeIndexBranchJob {
        project_id,
        branch: branch.to_owned(),
    };
    Ok(crate::db::enqueue(db, &job, options).await?.created)
}

/// Queues a full re-index (the whole tree walked again) of one project by
/// its full path, or of every project with `None`; the worker runs it. The
/// paths queued.
pub async fn request_reindex(
    pool: &deadpool_postgres::Pool,
    full_path: Option<&str>,
    max_attempts: i32,
) -> Result<Vec<String>, CodeIndexError> {
    let db = pool.get().await?;
    let sql = format!(
        "{} SELECT p.id, paths.full_path || '/' || p.path FROM projects p
         JOIN paths ON paths.id = p.group_id
         WHERE $1::text IS NULL OR lower(paths.full_path || '/' || p.path) = lower($1)
         ORDER BY p.id",
        crate::namespaces::FULL_PATHS
    );
    let rows = db.query(&sql, &[&full_path]).await?;
    let mut queued = Vec::new();
    for row in rows {
        let id: i64 = row.get(0);
        store::request_full_walk(&*db, id).await?;
        enqueue_index(&*db, id, max_attempts).await?;
        queued.push(row.get(1));
    }
    Ok(queued)
}

/// Runs [`CodeIndexJob`]s.
pub struct CodeIndexHandler {
    pub index: CodeIndex,
}

#[async_trait]
impl JobHandler for CodeIndexHandler {
    type Job = CodeIndexJob;

    async fn run(&self, ctx: JobContext, job: CodeIndexJob) -> Result<(), JobError> {
        let result =
            within_job_timeout(&self.index, index_project(&self.index, job.project_id)).await;
        let Err(error) = result else {
            return Ok(());
        };
        let last = ctx.attempt >= ctx.max_attempts;
        tracing::warn!(
            project_id = job.project_id,
            attempt = ctx.attempt,
            error = %error,
            "indexing the repository failed"
        );
        let db = self.index.pool.get().await.map_err(JobError::retryable)?;
        store::record_error(
            &*db,
            job.project_id,
            &error.code().to_string(),
            &error.to_string(),
            last,
        )
        .await
        .map_err(JobError::retryable)?;
        // Recorded as `failed`: the next push or a re-index starts over.
        retry_unless_last(last, error)
    }
}

/// An index run bounded by the job timeout (a run past it is an error).
async fn within_job_timeout<T>(
    index: &CodeIndex,
    run: impl std::future::Future<Output = Result<T, CodeIndexError>>,
) -> Result<T, CodeIndexError> {
    let timeout = index.settings.job_timeout;
    tokio::time::timeout(timeout, run)
        .await
        .unwrap_or(Err(CodeIndexError::Timeout(timeout.as_secs())))
}

/// A failed run is retried, unless it was the last attempt (its error is
/// recorded by then).
fn retry_unless_last(last: bool, error: CodeIndexError) -> Result<(), JobError> {
    if last {
        Ok(())
    } else {
        Err(JobError::retryable(error))
    }
}

/// Runs [`CodeIndexBranchJob`]s.
pub struct CodeIndexBranchHandler {
    pub index: CodeIndex,
}

#[async_trait]
impl JobHandler for CodeIndexBranchHandler {
    type Job = CodeIndexBranchJob;

    async fn run(&self, ctx: JobContext, job: CodeIndexBranchJob) -> Result<(), JobError> {
        let run = index_branch(&self.index, job.project_id, &job.branch);
        let result = within_job_timeout(&self.index, run).await;
        let Err(error) = result else {
            return Ok(());
        };
        let last = ctx.attempt >= ctx.max_attempts;
        tracing::warn!(
            project_id = job.project_id,
            attempt = ctx.attempt,
            error = %error,
            "indexing a branch failed"
        );
        let db = self.index.pool.get().await.map_err(JobError::retryable)?;
        let row = branches::find(&*db, job.project_id, &job.branch)
            .await
            .map_err(JobError::retryable)?;
        if let Some(row) = row {
            branches::record_error(
                &*db,
                row.id,
                &error.code().to_string(),
                &error.to_string(),
                last,
            )
            .await
            .map_err(JobError::retryable)?;
        }
        retry_unless_last(last, error)
    }
}

/// Turns a push into an index run when the default branch moved, and into
/// a run of each indexed branch (a deleted branch's run drops its index).
pub struct RepositoryPushedHandler {
    pub max_attempts: i32,
}

#[async_trait]
impl JobHandler for RepositoryPushedHandler {
    type Job = RepositoryPushed;

    async fn run(&self, ctx: JobContext, job: RepositoryPushed) -> Result<(), JobError> {
        let db = ctx.pool.get().await.map_err(JobError::retryable)?;
        let exists = db
            .query_opt("SELECT 1 FROM projects WHERE id = $1", &[&job.project_id])
            .await
            .map_err(JobError::retryable)?
            .is_some();
        if !exists {
            return Ok(());
        }
        store::ensure_status(&*db, job.project_id)
            .await
            .map_err(JobError::retryable)?;
        let on = Policy::duo_switched_on(&*db, Subject::Project(job.project_id))
            .await
            .map_err(JobError::retryable)?;
        if on {
            enqueue_index(&*db, job.project_id, self.max_attempts)
                .await
                .map_err(JobError::retryable)?;
            let indexed = branches::of_project(&*db, job.project_id)
                .await
                .map_err(JobError::retryable)?;
            for row in indexed {
                enqueue_branch_index(&*db, job.project_id, &row.branch, self.max_attempts)
                    .await
                    .map_err(JobError::retryable)?;
            }
        } else {
            // Marked, so turning Duo on indexes what was pushed meanwhile.
            store::forget(&*db, &[job.project_id])
                .await
                .map_err(JobError::retryable)?;
        }
        Ok(())
    }
}

/// The periodic catch-up: projects whose index is behind their default branch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeIndexCatchUp {}

impl Job for CodeIndexCatchUp {
    const KIND: &'static str = "code_index_catch_up";
}

pub struct CodeIndexCatchUpHandler {
    pub index: CodeIndex,
}

#[async_trait]
impl JobHandler for CodeIndexCatchUpHandler {
    type Job = CodeIndexCatchUp;

    async fn run(&self, ctx: JobContext, _job: CodeIndexCatchUp) -> Result<(), JobError> {
        let db = ctx.pool.get().await.map_err(JobError::retryable)?;
        // Whatever way a switch was turned (an admin page, the API, a
        // group moved under one with Duo off), what is still indexed of a
        // project with Duo off goes here at the latest.
        let switches = Policy::duo_switches_under(&*db, DuoSwitchScope::Instance)
            .await
            .map_err(JobError::retryable)?;
        let off: Vec<i64> = switches
            .iter()
            .filter(|(_, on)| !on)
            .map(|(id, _)| *id)
            .collect();
        store::forget(&*db, &off)
            .await
            .map_err(JobError::retryable)?;
        let off_set: std::collections::HashSet<i64> = off.into_iter().collect();
        let rows = db
            .query(
                "SELECT s.project_id, s.indexed_commit, p.default_branch
                 FROM code_index_states s JOIN projects p ON p.id = s.project_id
                 WHERE s.state IN ('ready', 'pending') ORDER BY s.updated_at LIMIT 1000",
                &[],
            )
            .await
            .map_err(JobError::retryable)?;
        for row in rows {
            let project_id: i64 = row.get(0);
            if off_set.contains(&project_id) {
                continue;
            }
            let indexed: Option<String> = row.get(1);
            let branch: String = row.get(2);
            let head = head_commit(&self.index, project_id, &branch).await;
            if head.is_some() && head != indexed {
                enqueue_index(&*db, project_id, self.index.settings.max_attempts)
                    .await
                    .map_err(JobError::retryable)?;
            }
        }
        // Branch indexes behind their branch, or whose branch is gone (its
        // run drops the index).
        let rows = db
            .query(
                "SELECT project_id, branch, indexed_commit FROM code_index_branches
                 WHERE state IN ('ready', 'pending') ORDER BY updated_at LIMIT 1000",
                &[],
            )
            .await
            .map_err(JobError::retryable)?;
        for row in rows {
            let (project_id, branch, indexed): (i64, String, Option<String>) =
                (row.get(0), row.get(1), row.get(2));
            if off_set.contains(&project_id) {
                continue;
            }
            if head_commit(&self.index, project_id, &branch).await != indexed {
                enqueue_branch_index(&*db, project_id, &branch, self.index.settings.max_attempts)
                    .await
                    .map_err(JobError::retryable)?;
            }
        }
        Ok(())
    }
}

/// The commit `branch` points at; `None` when the branch (or the
/// repository) does not exist.
pub(super) async fn head_commit(
    index: &CodeIndex,
    project_id: i64,
    branch: &str,
) -> Option<String> {
    let path = index.repositories.path(project_id);
    let branch = branch.to_owned();
    tokio::task::spawn_blocking(move || {
        if !path.exists() {
            return None;
        }
        crate::repositories::reader::refs(&path)
            .ok()?
            .branches
            .get(&branch)
            .cloned()
    })
    .await
    .ok()
    .flatten()
}

/// What one run did (for tests, logs and the bench).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub files_seen: usize,
    pub files_embedded: usize,
    pub files_reused: usize,
    pub files_removed: usize,
    pub chunks_embedded: usize,
    pub embedding_calls: usize,
}

impl std::ops::AddAssign for RunSummary {
    fn add_assign(&mut self, other: Self) {
        self.files_seen += other.files_seen;
        self.files_embedded += other.files_embedded;
        self.files_reused += other.files_reused;
        self.files_removed += other.files_removed;
        self.chunks_embedded += other.chunks_embedded;
        self.embedding_calls += other.embedding_calls;
    }
}

/// Indexes the project up to its default branch, again while it keeps moving.
pub async fn index_project(
    index: &CodeIndex,
    project_id: i64,
) -> Result<RunSummary, CodeIndexError> {
    let mut total = RunSummary::default();
    for _ in 0..5 {
        let db = index.pool.get().await?;
        let Some(project) = db
            .query_opt(
                "SELECT default_branch FROM projects WHERE id = $1",
                &[&project_id],
            )
            .await?
        else {
            return Ok(total);
        };
        let branch: String = project.get(0);
        // Duo off for the project (or a group above it, or the instance):
        // nothing of it is embedded, and what was embedded goes.
        let Some(code) = index
            .policy
            .code_for_ai(&*db, AiReader::Indexer, project_id)
            .await?
        else {
            store::forget(&*db, &[project_id]).await?;
            tracing::info!(
                project_id,
                "Duo is off for the project: its index is dropped"
            );
            return Ok(total);
        };
        let status = store::status(&*db, project_id).await?;
        drop(db);
        let head = head_commit(index, project_id, &branch).await;
        let indexed = status.as_ref().and_then(|s| s.indexed_commit.clone());
        let model = status.as_ref().and_then(|s| s.embedding_model.clone());
        if head.is_some()
            && head == indexed
            && status
                .as_ref()
                .is_some_and(|s| s.state == IndexState::Ready)
        {
            return Ok(total);
        }
        let db = index.pool.get().await?;
        store::set_state(&*db, project_id, IndexState::Indexing).await?;
        drop(db);
        let Some(head) = head else {
            // An empty repository: nothing to search, and nothing wrong.
            let db = index.pool.get().await?;
            store::prune(&*db, project_id, None, "", Some(&[])).await?;
            db.execute(
                "UPDATE code_index_states SET state = 'ready', indexed_commit = NULL,
                     chunk_count = 0, file_count = 0, last_error = NULL, last_error_code = NULL,
                     updated_at = now(), indexed_at = now()
                 WHERE project_id = $1",
                &[&project_id],
            )
            .await?;
            return Ok(total);
        };
        let run = Run {
            index,
            project_id,
            branch: None,
            exclusions: code.exclusions().clone(),
            model,
            dimensions: None,
            summary: RunSummary::default(),
        };
        let summary = match run.execute(indexed.as_deref(), &head).await {
            Err(CodeIndexError::DuoSwitchedOff) => {
                // Turned off under the run: it stopped at its next write.
                let db = index.pool.get().await?;
                store::forget(&*db, &[project_id]).await?;
                tracing::info!(project_id, "Duo was turned off while indexing: stopped");
                return Ok(total);
            }
            other => other?,
        };
        total += summary;
        let db = index.pool.get().await?;
        let status = store::status(&*db, project_id).await?;
        if status.is_some_and(|s| {
            s.state == IndexState::Ready && s.indexed_commit.as_deref() == Some(head.as_str())
        }) {
            let now = head_commit(index, project_id, &branch).await;
            if now.as_deref() == Some(head.as_str()) {
                tracing::info!(
                    project_id,
                    files_embedded = total.files_embedded,
                    chunks_embedded = total.chunks_embedded,
                    "repository indexed"
                );
                return Ok(total);
            }
        }
    }
    Ok(total)
}

/// Indexes one branch other than the default up to its head, again while
/// it keeps moving. A branch whose index was evicted does nothing; one that
/// no longer exists (or became the default) loses its index.
pub async fn index_branch(
    index: &CodeIndex,
    project_id: i64,
    branch: &str,
) -> Result<RunSummary, CodeIndexError> {
    let mut total = RunSummary::default();
    for _ in 0..5 {
        let db = index.pool.get().await?;
        let Some(row) = branches::find(&*db, project_id, branch).await? else {
            return Ok(total);
        };
        let Some(project) = db
            .query_opt(
                "SELECT default_branch FROM projects WHERE id = $1",
                &[&project_id],
            )
            .await?
        else {
            return Ok(total);
        };
        if project.get::<_, String>(0) == branch {
            branches::drop_branch(&*db, row.id).await?;
            return Ok(total);
        }
        let Some(code) = index
            .policy
            .code_for_ai(&*db, AiReader::Indexer, project_id)
            .await?
        else {
            store::forget(&*db, &[project_id]).await?;
            return Ok(total);
        };
        let default_status = store::status(&*db, project_id).await?;
        drop(db);
        let Some(head) = head_commit(index, project_id, branch).await else {
            // The branch was deleted: its index goes with it.
            let db = index.pool.get().await?;
            branches::drop_branch(&*db, row.id).await?;
            tracing::info!(project_id, branch, "branch deleted: its index is dropped");
            return Ok(total);
        };
        if row.state == IndexState::Ready && row.indexed_commit.as_deref() == Some(head.as_str()) {
            return Ok(total);
        }
        let git_dir = index.repositories.path(project_id);
        let mut db = index.pool.get().await?;
        branches::set_state(&*db, row.id, IndexState::Indexing).await?;
        let (mut indexed, mut model) = (row.indexed_commit.clone(), row.embedding_model.clone());
        if indexed.is_none() || model.is_none() {
            // A new branch starts as a copy of the default branch's index
            // and then indexes only the difference.
            let seed = default_status
                .filter(|s| s.searchable())
                .and_then(|s| Some((s.indexed_commit?, s.embedding_model?)));
            if let Some((commit, seed_model)) = seed
                && commit_exists(&git_dir, &commit).await
            {
                let tx = db.transaction().await?;
                if !(branches::hold(&tx, row.id).await?
                    && Policy::duo_switched_on(&tx, Subject::Project(project_id)).await?)
                {
                    return Ok(total);
                }
                branches::seed_from_default(&tx, row.id, project_id, &seed_model, &commit).await?;
                tx.commit().await?;
                indexed = Some(commit);
                model = Some(seed_model);
            }
        }
        drop(db);
        let run = Run {
            index,
            project_id,
            branch: Some(row.id),
            exclusions: code.exclusions().clone(),
            model,
            dimensions: None,
            summary: RunSummary::default(),
        };
        match run.execute(indexed.as_deref(), &head).await {
            Err(CodeIndexError::DuoSwitchedOff) => {
                let db = index.pool.get().await?;
                store::forget(&*db, &[project_id]).await?;
                return Ok(total);
            }
            Err(CodeIndexError::BranchDropped) => return Ok(total),
            other => total += other?,
        }
        if head_commit(index, project_id, branch).await.as_deref() == Some(head.as_str()) {
            tracing::info!(
                project_id,
                branch,
                files_embedded = total.files_embedded,
                files_reused = total.files_reused,
                "branch indexed"
            );
            return Ok(total);
        }
    }
    Ok(total)
}

/// A file to bring into the index.
#[derive(Debug, Clone)]
struct FileEntry {
    path: String,
    blob_id: String,
    size: u64,
}

/// What changed: files to (re)index and paths that left the tree.
#[derive(Debug, Default)]
struct Changes {
    upserts: Vec<FileEntry>,
    deletions: Vec<String>,
    /// Every indexable path of the tree (full walks only), to drop the rest.
    full_tree: Option<Vec<String>>,
}

/// A file chunked and waiting for its vectors.
struct Pending {
    path: String,
    blob_id: String,
    language: &'static str,
    chunks: Vec<Chunk>,
}

struct Run<'a> {
    index: &'a CodeIndex,
    project_id: i64,
    /// The branch index written (`code_index_branches.id`); `None`: the
    /// default branch's.
    branch: Option<i64>,
    exclusions: Exclusions,
    /// The model the stored vectors come from (learnt from the first answer
    /// of the gateway when nothing is stored yet).
    model: Option<String>,
    dimensions: Option<i32>,
    summary: RunSummary,
}

impl Run<'_> {
    async fn execute(
        mut self,
        indexed: Option<&str>,
        head: &str,
    ) -> Result<RunSummary, CodeIndexError> {
        let git_dir = self.index.repositories.path(self.project_id);
        let mut changes = match indexed {
            Some(from) if self.model.is_some() && commit_exists(&git_dir, from).await => {
                diff_changes(&git_dir, from, head).await?
            }
            _ => tree_changes(&git_dir, head, self.index.settings.max_files).await?,
        };
        match self.apply(&git_dir, &changes).await {
            Err(CodeIndexError::ModelChanged) => {
                // Vectors of two models cannot be compared: start over with
                // the whole tree under the new one.
                tracing::info!(
                    project_id = self.project_id,
                    "embedding model changed; re-indexing"
                );
                self.model = None;
                changes = tree_changes(&git_dir, head, self.index.settings.max_files).await?;
                self.apply(&git_dir, &changes).await?;
            }
            other => other?,
        }
        let model = self.model.clone().unwrap_or_default();
        let db = self.index.pool.get().await?;
        store::prune(
            &*db,
            self.project_id,
            self.branch,
            &model,
            changes.full_tree.as_deref(),
        )
        .await?;
        match self.branch {
            None => store::finish(&*db, self.project_id, head, &model, self.dimensions).await?,
            Some(id) => branches::finish(&*db, id, head, &model).await?,
        }
        Ok(self.summary)
    }

    async fn apply(
        &mut self,
        git_dir: &std::path::Path,
        changes: &Changes,
    ) -> Result<(), CodeIndexError> {
        let max_bytes = self.index.settings.max_file_bytes;
        let mut calls = self.embedding_calls().await?;
        for entry in &changes.upserts {
            self.summary.files_seen += 1;
            let mut db = self.index.pool.get().await?;
            if filters::path_skip(&entry.path, entry.size, max_bytes, &self.exclusions).is_some() {
                store::remove_file(&*db, self.project_id, self.branch, &entry.path).await?;
                continue;
            }
            if let Some(model) = &self.model {
                // The file's old chunks go and the copies come in one transaction.
                let tx = db.transaction().await?;
                still_on(&tx, self.project_id, self.branch).await?;
                let reused = store::reuse_blob(
                    &tx,
                    self.project_id,
                    self.branch,
                    &entry.path,
                    &entry.blob_id,
                    model,
                )
                .await?;
                tx.commit().await?;
                if reused {
                    self.summary.files_reused += 1;
                    continue;
                }
            }
            drop(db);
            let bytes = {
                let dir = git_dir.to_owned();
                let blob = entry.blob_id.clone();
                tokio::task::spawn_blocking(move || {
                    crate::repositories::reader::blob(&dir, &blob, max_bytes)
                })
                .await
                .map_err(|e| crate::repositories::RepositoryError::Read(e.to_string()))??
            };
            if filters::content_skip(&bytes).is_some() {
                let db = self.index.pool.get().await?;
                store::remove_file(&*db, self.project_id, self.branch, &entry.path).await?;
                continue;
            }
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let language = chunker::language_of(&entry.path);
            let chunks = tokio::task::spawn_blocking(move || chunker::chunk(language, &text))
                .await
                .map_err(|e| crate::repositories::RepositoryError::Read(e.to_string()))?;
            let file = Pending {
                path: entry.path.clone(),
                blob_id: entry.blob_id.clone(),
                language,
                chunks,
            };
            if file.chunks.is_empty() {
                self.store_file(file, Vec::new()).await?;
            } else {
                calls.queue(file);
            }
            // Calls go out (and answers are stored) while the next files are
            // read; this waits only when as many calls as allowed are out.
            self.pump(&mut calls, false).await?;
        }
        self.pump(&mut calls, true).await?;
        // Deletions last: a renamed file's new path has already taken the
        // old path's vectors.
        let db = self.index.pool.get().await?;
        for path in &changes.deletions {
            store::remove_file(&*db, self.project_id, self.branch, path).await?;
            self.summary.files_removed += 1;
        }
        Ok(())
    }

    /// The run's embedding calls, none made yet.
    async fn embedding_calls(&self) -> Result<EmbeddingCalls, CodeIndexError> {
        let settings = &self.index.settings;
        let db = self.index.pool.get().await?;
        Ok(EmbeddingCalls {
            auth: super::embedding_auth(&*db, 0, Uuid::new_v4()).await?,
            model: self.index.embedding_model(&*db).await?,
            batcher: Batcher::new(
                settings.embed_batch_tokens,
                settings.embed_batch,
                settings.embed_in_flight.max(2),
            ),
            files: HashMap::new(),
            next_file: 0,
            ready: VecDeque::new(),
            out: JoinSet::new(),
            max_out: settings.embed_in_flight.max(1),
        })
    }

    /// Sends what is ready while fewer calls than allowed are out, and
    /// stores what came back. Returns when no call can go out without
    /// waiting for an answer, except `finishing`: then it returns when every
    /// chunk has its vector and every file is stored.
    async fn pump(
        &mut self,
        calls: &mut EmbeddingCalls,
        finishing: bool,
    ) -> Result<(), CodeIndexError> {
        loop {
            while let Some(answered) = calls.out.try_join_next() {
                self.receive(calls, answered).await?;
            }
            if calls.ready.is_empty() {
                calls.ready.extend(calls.batcher.take_batches(finishing));
            }
            if calls.out.len() < calls.max_out
                && let Some(batch) = calls.ready.pop_front()
            {
                self.send(calls, batch).await?;
                continue;
            }
            let wait = !calls.ready.is_empty() || (finishing && !calls.out.is_empty());
            if !wait {
                return Ok(());
            }
            match calls.out.join_next().await {
                Some(answered) => self.receive(calls, answered).await?,
                None => return Ok(()),
            }
        }
    }

    async fn send(
        &mut self,
        calls: &mut EmbeddingCalls,
        batch: Vec<ChunkRef>,
    ) -> Result<(), CodeIndexError> {
        // Asked again before each call: a switch turned off mid-run lets
        // at most the calls already on their way through.
        let db = self.index.pool.get().await?;
        if !Policy::duo_switched_on(&*db, Subject::Project(self.project_id)).await? {
            return Err(CodeIndexError::DuoSwitchedOff);
        }
        drop(db);
        let texts: Vec<String> = batch
            .iter()
            .filter_map(|c| {
                let file = &calls.files.get(&c.file)?.file;
                Some(chunker::embedding_text(
                    &file.path,
                    file.chunks.get(c.chunk)?,
                ))
            })
            .collect();
        let gateway = self.index.gateway.clone();
        let auth = calls.auth.clone();
        let model = calls.model.clone();
        calls.out.spawn(async move {
            let answer = gateway
                .code_embeddings(&auth, EmbeddingPurpose::Index, &texts, model.as_ref())
                .await;
            (batch, answer)
        });
        Ok(())
    }

    /// Puts an answer's vectors in place and stores each file that has all
    /// of its own.
    async fn receive(
        &mut self,
        calls: &mut EmbeddingCalls,
        answered: Result<(Vec<ChunkRef>, Result<CodeEmbeddings, GatewayError>), JoinError>,
    ) -> Result<(), CodeIndexError> {
        let (batch, answer) =
            answered.map_err(|e| GatewayError::Body(format!("an embedding call stopped: {e}")))?;
        let answer = answer?;
        self.summary.embedding_calls += 1;
        match &self.model {
            Some(model) if *model != answer.model => return Err(CodeIndexError::ModelChanged),
            Some(_) => {}
            None => {
                // Recorded at once, so a crashed run's successor reuses
                // what this one stored.
                let db = self.index.pool.get().await?;
                match self.branch {
                    None => {
                        db.execute(
                            "UPDATE code_index_states SET embedding_model = $2
                             WHERE project_id = $1",
                            &[&self.project_id, &answer.model],
                        )
                        .await?;
                    }
                    Some(id) => branches::set_model(&*db, id, &answer.model).await?,
                }
                self.model = Some(answer.model.clone());
            }
        }
        if answer.vectors.len() != batch.len() {
            return Err(GatewayError::Body(format!(
                "{} vectors for {} texts",
                answer.vectors.len(),
                batch.len()
            ))
            .into());
        }
        if let Some(first) = answer.vectors.first() {
            self.dimensions = Some(first.len() as i32);
        }
        let mut complete = Vec::new();
        for (place, vector) in batch.iter().zip(answer.vectors) {
            let Some(waiting) = calls.files.get_mut(&place.file) else {
                continue;
            };
            if let Some(slot) = waiting.vectors.get_mut(place.chunk)
                && slot.replace(vector).is_none()
            {
                waiting.missing -= 1;
                if waiting.missing == 0 {
                    complete.push(place.file);
                }
            }
        }
        for id in complete {
            if let Some(waiting) = calls.files.remove(&id) {
                let vectors = waiting.vectors.into_iter().flatten().collect();
                self.store_file(waiting.file, vectors).await?;
            }
        }
        Ok(())
    }

    /// Replaces the file's chunks with these, in one transaction.
    async fn store_file(
        &mut self,
        file: Pending,
        vectors: Vec<Vec<f32>>,
    ) -> Result<(), CodeIndexError> {
        let model = self.model.clone().unwrap_or_default();
        let chunks: Vec<NewChunk> = file
            .chunks
            .into_iter()
            .zip(vectors)
            .map(|(chunk, embedding)| NewChunk {
                chunk,
                language: file.language.to_owned(),
                embedding,
            })
            .collect();
        let mut db = self.index.pool.get().await?;
        let tx = db.transaction().await?;
        still_on(&tx, self.project_id, self.branch).await?;
        store::replace_file(
            &tx,
            self.project_id,
            self.branch,
            &file.path,
            &file.blob_id,
            &model,
            &chunks,
        )
        .await?;
        tx.commit().await?;
        self.summary.files_embedded += 1;
        self.summary.chunks_embedded += chunks.len();
        Ok(())
    }
}

/// A file whose chunks are out for embedding.
struct Waiting {
    file: Pending,
    vectors: Vec<Option<Vec<f32>>>,
    missing: usize,
}

/// One run's embedding calls: the chunks waiting to go, the calls out (at
/// most `max_out`; dropping this aborts them) and the files waiting for
/// their vectors.
struct EmbeddingCalls {
    auth: GatewayAuth,
    model: Option<contracts::ModelMetadata>,
    batcher: Batcher,
    files: HashMap<usize, Waiting>,
    next_file: usize,
    /// Cut by the batcher, not sent yet.
    ready: VecDeque<Vec<ChunkRef>>,
    out: JoinSet<(Vec<ChunkRef>, Result<CodeEmbeddings, GatewayError>)>,
    max_out: usize,
}

impl EmbeddingCalls {
    fn queue(&mut self, file: Pending) {
        let id = self.next_file;
        self.next_file += 1;
        let tokens: Vec<usize> = file
            .chunks
            .iter()
            .map(|c| chunker::estimated_tokens(&chunker::embedding_text(&file.path, c)))
            .collect();
        self.batcher.push(id, tokens);
        let missing = file.chunks.len();
        self.files.insert(
            id,
            Waiting {
                file,
                vectors: vec![None; missing],
                missing,
            },
        );
    }
}

/// First thing in a transaction that stores chunks: holds the project's
/// index state, or the branch's row (turning Duo off, evicting or dropping
/// the branch waits for this transaction, then removes what it stored) and
/// checks that Duo is still on, else [`CodeIndexError::DuoSwitchedOff`]
/// ([`CodeIndexError::BranchDropped`] when the branch's row is gone).
async fn still_on(
    tx: &impl Queries,
    project_id: i64,
    branch: Option<i64>,
) -> Result<(), CodeIndexError> {
    if let Some(id) = branch
        && !branches::hold(tx, id).await?
    {
        return Err(CodeIndexError::BranchDropped);
    }
    let held = match branch {
        None => store::hold_state(tx, project_id).await?,
        Some(_) => true,
    };
    if held && Policy::duo_switched_on(tx, Subject::Project(project_id)).await? {
        Ok(())
    } else {
        Err(CodeIndexError::DuoSwitchedOff)
    }
}

async fn commit_exists(git_dir: &std::path::Path, sha: &str) -> bool {
    let dir = git_dir.display().to_string();
    let spec = format!("{sha}^{{commit}}");
    crate::repositories::git::git(&["--git-dir", &dir, "cat-file", "-e", &spec])
        .await
        .is_ok()
}

/// Every blob of the tree at `head` (at most `max_files`, in path order).
async fn tree_changes(
    git_dir: &std::path::Path,
    head: &str,
    max_files: usize,
) -> Result<Changes, CodeIndexError> {
    let dir = git_dir.display().to_string();
    let raw = crate::repositories::git::git(&[
        "--git-dir",
        &dir,
        "ls-tree",
        "-r",
        "-z",
        "-l",
        "--full-tree",
        head,
    ])
    .await?;
    let mut upserts = Vec::new();
    for record in raw.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        // "<mode> <type> <id> <size>\t<path>"
        let record = String::from_utf8_lossy(record);
        let Some((meta, path)) = record.split_once('\t') else {
            continue;
        };
        let fields: Vec<&str> = meta.split_whitespace().collect();
        if fields.len() < 4 || fields[1] != "blob" || fields[0] == "120000" {
            continue;
        }
        upserts.push(FileEntry {
            path: path.to_owned(),
            blob_id: fields[2].to_owned(),
            size: fields[3].parse().unwrap_or(u64::MAX),
        });
    }
    if upserts.len() > max_files {
        tracing::warn!(
            files = upserts.len(),
            max_files,
            "repository has more files than are indexed"
        );
        upserts.truncate(max_files);
    }
    let full_tree = upserts.iter().map(|f| f.path.clone()).collect();
    Ok(Changes {
        upserts,
        deletions: Vec::new(),
        full_tree: Some(full_tree),
    })
}

/// Files added, changed or deleted between two commits (renames as a
/// deletion and an addition: the blob id lets the addition reuse vectors).
async fn diff_changes(
    git_dir: &std::path::Path,
    from: &str,
    to: &str,
) -> Result<Changes, CodeIndexError> {
    let dir = git_dir.display().to_string();
    let raw = crate::repositories::git::git(&[
        "--git-dir",
        &dir,
        "diff-tree",
        "-r",
        "-z",
        "--no-renames",
        "--no-abbrev",
        from,
        to,
    ])
    .await?;
    let fields: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    let mut changes = Changes::default();
    let mut i = 0;
    while i + 1 < fields.len() {
        let meta = String::from_utf8_lossy(fields[i]).into_owned();
        if !meta.starts_with(':') {
            i += 1;
            continue;
        }
        let path = String::from_utf8_lossy(fields[i + 1]).into_owned();
        i += 2;
        // ":<old mode> <new mode> <old id> <new id> <status>"
        let parts: Vec<&str> = meta.trim_start_matches(':').split_whitespace().collect();
        if parts.len() < 5 {
            continue;
        }
        let (new_mode, new_id, status) = (parts[1], parts[3], parts[4]);
        if status.starts_with('D') || new_mode == "160000" || new_mode == "120000" {
            changes.deletions.push(path);
            continue;
        }
        changes.upserts.push(FileEntry {
            path,
            blob_id: new_id.to_owned(),
            size: 0,
        });
    }
    // Sizes come from the object headers (cheap, no content read).
    if !changes.upserts.is_empty() {
        let ids: Vec<String> = changes.upserts.iter().map(|f| f.blob_id.clone()).collect();
        let dir = git_dir.to_owned();
        let sizes = tokio::task::spawn_blocking(move || -> Vec<u64> {
            let Ok(repo) = crate::repositories::reader::open(&dir) else {
                return vec![u64::MAX; ids.len()];
            };
            ids.iter()
                .map(|id| {
                    gix::ObjectId::from_hex(id.as_bytes())
                        .ok()
                        .and_then(|oid| repo.find_header(oid).ok())
                        .map_or(u64::MAX, |h| h.size())
                })
                .collect()
        })
        .await
        .map_err(|e| crate::repositories::RepositoryError::Read(e.to_string()))?;
        for (file, size) in changes.upserts.iter_mut().zip(sizes) {
            file.size = size;
        }
    }
    Ok(changes)
}
