//! What the periodic jobs do: fail workflows stuck in `created` or `running`
//! (GitLab's `CleanStuckWorkflowsService`), and drop checkpoints past their
//! retention.

use std::time::Duration;

use serde_json::json;

use super::record::{COLUMNS, from_row};
use super::{Caller, Status, WorkflowError, audit, live};

/// Fails (`drop`) every workflow in `created` or `running` whose last update is
/// older than `stale_after` and that no live run holds; returns their ids.
/// Each workflow moves in its own statement guarded by its status, so a
/// workflow that moved meanwhile is left alone.
pub async fn fail_stuck(
    client: &mut deadpool_postgres::Client,
    stale_after: Duration,
) -> Result<Vec<i64>, WorkflowError> {
    let tx = client.transaction().await?;
    let rows = tx
        .query(
            &format!(
                "UPDATE duo_workflows_workflows w SET status = $1, updated_at = now()
                 WHERE w.status IN ($2, $3)
                   AND w.updated_at < now() - make_interval(secs => $4)
                   AND NOT EXISTS (SELECT 1 FROM duo_workflows_run_leases l
                                   WHERE l.workflow_id = w.id AND l.expires_at > now())
                 RETURNING {COLUMNS}"
            ),
            &[
                &Status::Failed.code(),
                &Status::Created.code(),
                &Status::Running.code(),
                &stale_after.as_secs_f64(),
            ],
        )
        .await?;
    let mut ids = Vec::with_capacity(rows.len());
    for row in &rows {
        let workflow = from_row(row);
        audit(
            &tx,
            Some(workflow.id),
            "duo_session_dropped_as_stuck",
            Caller {
                user_id: workflow.user_id,
                service_account_id: workflow.service_account_id,
            },
            json!({ "event": "drop", "stale_after_secs": stale_after.as_secs() }),
        )
        .await?;
        live::publish_status(&tx, &workflow).await?;
        ids.push(workflow.id);
    }
    tx.commit().await?;
    Ok(ids)
}

/// Deletes checkpoints (and writes) older than `days` and long-expired
/// workflow tokens.
pub async fn apply_retention(
    db: &impl crate::queries::Queries,
    days: i32,
) -> Result<u64, WorkflowError> {
    let gone = super::checkpoints::apply_retention(db, days).await?;
    crate::identity::oauth::purge_expired(db)
        .await
        .map_err(|e| match e {
            crate::identity::tokens::TokenError::Db(db) => WorkflowError::Db(db),
            other => WorkflowError::BadRequest(other.to_string()),
        })?;
    Ok(gone)
}
