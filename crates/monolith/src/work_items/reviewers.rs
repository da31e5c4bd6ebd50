//! A merge request's reviewers and where each stands with their review
//! (GitLab's `merge_request_reviewers`). Who may set them, and who may be
//! one, is the policy's decision, asked before.

use chrono::{DateTime, Utc};

use super::{UserRef, WorkItemError};
use crate::queries::Queries;

/// GitLab's reviewer states.
pub const STATES: &[&str] = &[
    "unreviewed",
    "review_started",
    "reviewed",
    "requested_changes",
    "approved",
    "unapproved",
];

/// One reviewer of a merge request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewer {
    pub user: UserRef,
    /// One of [`STATES`].
    pub state: String,
    pub created_at: DateTime<Utc>,
}

/// The merge request's reviewers, in the order they were added.
pub async fn list(
    db: &impl Queries,
    merge_request: i64,
) -> Result<Vec<Reviewer>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT u.id, u.username, u.name, u.state, r.state, r.created_at
             FROM merge_request_reviewers r JOIN users u ON u.id = r.user_id
             WHERE r.merge_request_id = $1 ORDER BY r.created_at, r.user_id",
            &[&merge_request],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Reviewer {
            user: UserRef {
                id: r.get(0),
                username: r.get(1),
                name: r.get(2),
                state: r.get(3),
            },
            state: r.get(4),
            created_at: r.get(5),
        })
        .collect())
}

/// Makes `user_ids` the merge request's reviewers (GitLab's `reviewer_ids`:
/// the list replaces the old one; those kept keep their state) and returns
/// the ids newly added, in the order given. The users must exist.
pub async fn set(
    db: &impl Queries,
    merge_request: i64,
    user_ids: &[i64],
) -> Result<Vec<i64>, WorkItemError> {
    let mut wanted: Vec<i64> = Vec::with_capacity(user_ids.len());
    for id in user_ids {
        if !wanted.contains(id) {
            wanted.push(*id);
        }
    }
    // One statement, so the removal and the additions land together.
    let rows = db
        .query(
            "WITH removed AS (
                 DELETE FROM merge_request_reviewers
                 WHERE merge_request_id = $1 AND user_id <> ALL($2::bigint[])
             )
             INSERT INTO merge_request_reviewers (merge_request_id, user_id)
             SELECT $1, wanted.id FROM unnest($2::bigint[]) AS wanted(id)
             ON CONFLICT (merge_request_id, user_id) DO NOTHING
             RETURNING user_id",
            &[&merge_request, &wanted],
        )
        .await
        .map_err(WorkItemError::on_constraint(WorkItemError::BadRequest(
            "reviewer_ids is invalid".into(),
        )))?;
    let added: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    Ok(wanted.into_iter().filter(|id| added.contains(id)).collect())
}

/// Asks `user_id` for a review: adds them as a reviewer, or asks again
/// (their state back to `unreviewed`) when they already are one (GitLab's
/// "re-request review"). Other reviewers stay.
pub async fn request(
    db: &impl Queries,
    merge_request: i64,
    user_id: i64,
) -> Result<(), WorkItemError> {
    db.execute(
        "INSERT INTO merge_request_reviewers (merge_request_id, user_id) VALUES ($1, $2)
         ON CONFLICT (merge_request_id, user_id) DO UPDATE SET state = 'unreviewed'",
        &[&merge_request, &user_id],
    )
    .await
    .map_err(WorkItemError::on_constraint(WorkItemError::BadRequest(
        "reviewer_ids is invalid".into(),
    )))?;
    Ok(())
}

/// Sets where reviewer `user_id` stands (one of [`STATES`], e.g.
/// `review_started`, then `reviewed`); `false` when they are not a reviewer
/// of the merge request.
pub async fn set_state(
    db: &impl Queries,
    merge_request: i64,
    user_id: i64,
    state: &str,
) -> Result<bool, WorkItemError> {
    if !STATES.contains(&state) {
        return Err(WorkItemError::BadRequest(
            "state does not have a valid value".into(),
        ));
    }
    let changed = db
        .execute(
            "UPDATE merge_request_reviewers SET state = $3 WHERE merge_request_id = $1 AND user_id = $2",
            &[&merge_request, &user_id, &state],
        )
        .await?;
    Ok(changed > 0)
}
