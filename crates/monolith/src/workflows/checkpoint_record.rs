//! Stored checkpoints read back: the `Checkpoint` row with its writes, and
//! the lookups (a page, one by id, the newest). Below the checkpoint writer
//! and the live updates, which both read checkpoints: the writer publishes
//! through the live updates, and a live update reads the checkpoint it names.

use crate::queries::Queries;
use chrono::{DateTime, Utc};
use serde_json::Value;
use serde_json::value::RawValue;

use super::WorkflowError;

/// One stored checkpoint write.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointWrite {
    pub id: i64,
    pub thread_ts: String,
    pub task: String,
    pub idx: i32,
    pub channel: String,
    pub write_type: String,
    pub data: String,
}

/// One stored checkpoint with its writes.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub id: i64,
    pub workflow_id: i64,
    pub thread_ts: String,
    pub parent_ts: Option<String>,
    pub checkpoint_ns: String,
    /// The body as posted (a JSON object).
    pub checkpoint: Box<RawValue>,
    pub metadata: Value,
    pub created_at: DateTime<Utc>,
    pub writes: Vec<CheckpointWrite>,
}

pub(super) const CHECKPOINT_COLUMNS: &str =
    "id, workflow_id, thread_ts, parent_ts, checkpoint_ns, checkpoint, metadata, created_at";

pub(super) fn from_row(row: &tokio_postgres::Row) -> Result<Checkpoint, WorkflowError> {
    let text: String = row.get(5);
    let checkpoint = RawValue::from_string(text)
        .map_err(|e| WorkflowError::Stored(format!("checkpoint {}: {e}", row.get::<_, i64>(0))))?;
    Ok(Checkpoint {
        id: row.get(0),
        workflow_id: row.get(1),
        thread_ts: row.get(2),
        parent_ts: row.get(3),
        checkpoint_ns: row.get(4),
        checkpoint,
        metadata: row.get(6),
        created_at: row.get(7),
        writes: Vec::new(),
    })
}

/// A page of the workflow's checkpoints, newest first, with their writes, and
/// how many there are in all. `checkpoint_ns = None` lists every namespace.
pub async fn list(
    db: &impl Queries,
    workflow_id: i64,
    checkpoint_ns: Option<&str>,
    offset: i64,
    limit: i64,
) -> Result<(Vec<Checkpoint>, i64), WorkflowError> {
    let total: i64 = db
        .query_one(
            "SELECT count(*) FROM duo_workflows_checkpoints
             WHERE workflow_id = $1 AND ($2::text IS NULL OR checkpoint_ns = $2)",
            &[&workflow_id, &checkpoint_ns],
        )
        .await?
        .get(0);
    let rows = db
        .query(
            &format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM duo_workflows_checkpoints
                 WHERE workflow_id = $1 AND ($2::text IS NULL OR checkpoint_ns = $2)
                 ORDER BY id DESC OFFSET $3 LIMIT $4"
            ),
            &[&workflow_id, &checkpoint_ns, &offset.max(0), &limit.max(0)],
        )
        .await?;
    let mut checkpoints = rows.iter().map(from_row).collect::<Result<Vec<_>, _>>()?;
    attach_writes(db, workflow_id, &mut checkpoints).await?;
    Ok((checkpoints, total))
}

/// One checkpoint of the workflow by id.
pub async fn get(
    db: &impl Queries,
    workflow_id: i64,
    checkpoint_id: i64,
) -> Result<Option<Checkpoint>, WorkflowError> {
    let row = db
        .query_opt(
            &format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM duo_workflows_checkpoints
                 WHERE workflow_id = $1 AND id = $2"
            ),
            &[&workflow_id, &checkpoint_id],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let mut one = vec![from_row(&row)?];
    attach_writes(db, workflow_id, &mut one).await?;
    Ok(one.pop())
}

/// The newest checkpoint of the workflow, if any.
pub async fn latest(
    db: &impl Queries,
    workflow_id: i64,
) -> Result<Option<Checkpoint>, WorkflowError> {
    Ok(list(db, workflow_id, None, 0, 1).await?.0.pop())
}

async fn attach_writes(
    db: &impl Queries,
    workflow_id: i64,
    checkpoints: &mut [Checkpoint],
) -> Result<(), WorkflowError> {
    if checkpoints.is_empty() {
        return Ok(());
    }
    let thread_ts: Vec<&str> = checkpoints.iter().map(|c| c.thread_ts.as_str()).collect();
    let rows = db
        .query(
            "SELECT id, thread_ts, task, idx, channel, write_type, data
             FROM duo_workflows_checkpoint_writes
             WHERE workflow_id = $1 AND thread_ts = ANY($2) ORDER BY id",
            &[&workflow_id, &thread_ts],
        )
        .await?;
    for row in rows {
        let write = CheckpointWrite {
            id: row.get(0),
            thread_ts: row.get(1),
            task: row.get(2),
            idx: row.get(3),
            channel: row.get(4),
            write_type: row.get(5),
            data: row.get(6),
        };
        if let Some(c) = checkpoints
            .iter_mut()
            .find(|c| c.thread_ts == write.thread_ts)
        {
            c.writes.push(write);
        }
    }
    Ok(())
}
