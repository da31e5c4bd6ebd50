//! One live run per workflow: a lease row in PostgreSQL. The holder renews it
//! while the run lasts and deletes it at the end; a holder that died stops
//! renewing and the lease lapses, so the next run may take it.

use std::time::Duration;

use crate::queries::Queries;
use uuid::Uuid;

use super::WorkflowError;

/// A held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub workflow_id: i64,
    pub holder: Uuid,
}

/// Takes the workflow's lease for `ttl`, unless a live one is held by someone
/// else (then `None`). Atomic: of two racing callers exactly one gets it.
pub async fn acquire(
    db: &impl Queries,
    workflow_id: i64,
    ttl: Duration,
) -> Result<Option<Lease>, WorkflowError> {
    acquire_taking_over(db, workflow_id, ttl, None).await
}

/// [`acquire`], also taking a live lease over from `previous` when that is
/// its holder (a run that ended without giving the lease back; whoever names
/// it learnt the id when that run took the lease).
pub async fn acquire_taking_over(
    db: &impl Queries,
    workflow_id: i64,
    ttl: Duration,
    previous: Option<Uuid>,
) -> Result<Option<Lease>, WorkflowError> {
    let holder = Uuid::new_v4();
    let row = db
        .query_opt(
            "INSERT INTO duo_workflows_run_leases (workflow_id, holder, expires_at)
             VALUES ($1, $2, now() + make_interval(secs => $3))
             ON CONFLICT (workflow_id) DO UPDATE
               SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at, acquired_at = now()
               WHERE duo_workflows_run_leases.expires_at <= now()
                  OR duo_workflows_run_leases.holder = $4
             RETURNING holder",
            &[&workflow_id, &holder, &ttl.as_secs_f64(), &previous],
        )
        .await?;
    Ok(row
        .filter(|r| r.get::<_, Uuid>(0) == holder)
        .map(|_| Lease {
            workflow_id,
            holder,
        }))
}

/// Extends the lease; `false` when it was lost (it lapsed and another run took it).
pub async fn renew(db: &impl Queries, lease: &Lease, ttl: Duration) -> Result<bool, WorkflowError> {
    let n = db
        .execute(
            "UPDATE duo_workflows_run_leases SET expires_at = now() + make_interval(secs => $3)
             WHERE workflow_id = $1 AND holder = $2",
            &[&lease.workflow_id, &lease.holder, &ttl.as_secs_f64()],
        )
        .await?;
    Ok(n == 1)
}

/// Gives the lease up (only if still ours).
pub async fn release(db: &impl Queries, lease: &Lease) -> Result<(), WorkflowError> {
    db.execute(
        "DELETE FROM duo_workflows_run_leases WHERE workflow_id = $1 AND holder = $2",
        &[&lease.workflow_id, &lease.holder],
    )
    .await?;
    Ok(())
}

/// Whether a live run holds the workflow.
pub async fn is_held(db: &impl Queries, workflow_id: i64) -> Result<bool, WorkflowError> {
    Ok(db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM duo_workflows_run_leases WHERE workflow_id = $1 AND expires_at > now())",
            &[&workflow_id],
        )
        .await?
        .get(0))
}

/// Whether `holder` holds the workflow's live lease.
pub async fn held_by(
    db: &impl Queries,
    workflow_id: i64,
    holder: Uuid,
) -> Result<bool, WorkflowError> {
    Ok(db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM duo_workflows_run_leases
                            WHERE workflow_id = $1 AND holder = $2 AND expires_at > now())",
            &[&workflow_id, &holder],
        )
        .await?
        .get(0))
}

/// A run that names its lease (`run_id`) may write to the workflow only
/// while it holds it: a run that lost it (it lapsed and another run took the
/// workflow over) is a zombie, refused. Writes naming no run are checked as
/// before (socket runs hold their lease on the monolith's side).
pub async fn check_writer(
    db: &impl Queries,
    workflow_id: i64,
    run_id: Option<Uuid>,
) -> Result<(), WorkflowError> {
    match run_id {
        Some(holder) if !held_by(db, workflow_id, holder).await? => Err(WorkflowError::Conflict(
            format!("This run no longer holds workflow {workflow_id}: another run took it over"),
        )),
        _ => Ok(()),
    }
}

/// `(workflow id, run id)` of a run-lock path
/// (`/api/v4/ai/duo_workflows/workflows/<id>/run_lock[/<run id>]`), for the
/// socket bridge, which answers its own executor's lock requests.
pub fn lock_path(path: &str) -> Option<(i64, Option<&str>)> {
    let rest = path
        .split('?')
        .next()?
        .strip_prefix("/api/v4/ai/duo_workflows/workflows/")?;
    let (id, rest) = rest.split_once('/')?;
    let id = id.parse().ok()?;
    match rest.strip_prefix("run_lock")? {
        "" => Some((id, None)),
        run => {
            let run = run.strip_prefix('/')?;
            (!run.is_empty() && !run.contains('/')).then_some((id, Some(run)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_paths_are_recognised() {
        let base = "/api/v4/ai/duo_workflows/workflows";
        assert_eq!(lock_path(&format!("{base}/7/run_lock")), Some((7, None)));
        assert_eq!(
            lock_path(&format!("{base}/7/run_lock/abc")),
            Some((7, Some("abc")))
        );
        assert_eq!(lock_path(&format!("{base}/7/run_lock/abc/x")), None);
        assert_eq!(lock_path(&format!("{base}/7/checkpoints")), None);
        assert_eq!(lock_path(&format!("{base}/x/run_lock")), None);
    }
}
