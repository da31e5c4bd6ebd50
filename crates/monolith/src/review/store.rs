//! What the review keeps and reads besides the merge request itself: its
//! records (`duo_code_reviews`), the bot's open threads from earlier
//! reviews.

use crate::queries::Queries;
use crate::work_items::discussions::{self, Noteable};
use crate::work_items::position::Position;

/// One review's outcome, written when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub status: &'static str,
    pub head_sha: Option<String>,
    pub files_reviewed: i32,
    pub files_skipped: Vec<String>,
    pub comments: i32,
    pub resolved: i32,
    pub detail: String,
}

/// Starts a review record (status `running`).
pub async fn start(
    db: &impl Queries,
    project_id: i64,
    merge_request_id: i64,
    requester_id: i64,
    trigger: &str,
) -> Result<i64, tokio_postgres::Error> {
    Ok(db
        .query_one(
            "INSERT INTO duo_code_reviews (project_id, merge_request_id, requester_id, trigger)
             VALUES ($1, $2, $3, $4) RETURNING id",
            &[&project_id, &merge_request_id, &requester_id, &trigger],
        )
        .await?
        .get(0))
}

pub async fn finish(
    db: &impl Queries,
    id: i64,
    outcome: &Outcome,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE duo_code_reviews SET status = $2, head_sha = $3, files_reviewed = $4, files_skipped = $5,
            comments = $6, resolved = $7, detail = $8, finished_at = now()
         WHERE id = $1",
        &[
            &id,
            &outcome.status,
            &outcome.head_sha,
            &outcome.files_reviewed,
            &outcome.files_skipped,
            &outcome.comments,
            &outcome.resolved,
            &outcome.detail,
        ],
    )
    .await?;
    Ok(())
}

/// The head commit the last finished review of the merge request read.
pub async fn last_reviewed_head(
    db: &impl Queries,
    merge_request_id: i64,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT head_sha FROM duo_code_reviews
             WHERE merge_request_id = $1 AND status = 'done' AND head_sha IS NOT NULL
             ORDER BY id DESC LIMIT 1",
            &[&merge_request_id],
        )
        .await?
        .map(|r| r.get(0)))
}

/// A thread the bot opened on a line and nobody resolved yet.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenThread {
    pub discussion_id: String,
    pub body: String,
    pub position: Position,
}

fn line(n: Option<i32>) -> Option<u32> {
    n.and_then(|n| u32::try_from(n).ok())
}

impl OpenThread {
    pub fn path(&self) -> &str {
        &self.position.new_path
    }

    pub fn new_line(&self) -> Option<u32> {
        line(self.position.new_line)
    }

    pub fn old_line(&self) -> Option<u32> {
        line(self.position.old_line)
    }

    pub fn head_sha(&self) -> &str {
        &self.position.head_sha
    }
}

/// The bot's unresolved diff threads on the merge request, oldest first.
pub async fn open_threads(
    db: &impl Queries,
    merge_request_id: i64,
    bot_id: i64,
) -> Result<Vec<OpenThread>, tokio_postgres::Error> {
    let discussions = discussions::list(db, Noteable::merge_request(merge_request_id)).await?;
    Ok(discussions
        .into_iter()
        .filter_map(|d| {
            let first = d.notes.into_iter().next()?;
            let open = first.author.id == bot_id && first.resolvable && !first.resolved();
            Some(OpenThread {
                discussion_id: d.id,
                body: first.body,
                position: first.position.filter(|_| open)?,
            })
        })
        .collect())
}
