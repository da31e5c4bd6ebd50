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
    let holder = Uuid::new_v4();
    let row = db
        .query_opt(
            "INSERT INTO duo_workflows_run_leases (workflow_id, holder, expires_at)
             VALUES ($1, $2, now() + make_interval(secs => $3))
             ON CONFLICT (workflow_id) DO UPDATE
               SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at, acquired_at = now()
               WHERE duo_workflows_run_leases.expires_at <= now()
             RETURNING holder",
            &[&workflow_id, &holder, &ttl.as_secs_f64()],
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
