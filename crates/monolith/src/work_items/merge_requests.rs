//! Merge requests of a project: lookups, lists, creation, and the short
//! forms the web pages show. A merge request keeps the diff it was opened
//! with (the `diff` column) for when its branches are not in the repository.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Json;

use super::{AUTHOR_COLUMNS, Author, CLOSED_BY_COLUMNS, Identified, UserRef, WorkItemError};
use crate::queries::Queries;

/// One merge request with its author and closer.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeRequest {
    pub id: i64,
    pub iid: i32,
    pub project_id: i64,
    pub title: String,
    pub description: String,
    /// `opened`, `closed`, `merged` or `locked`.
    pub state: String,
    pub source_branch: String,
    pub target_branch: String,
    pub labels: Vec<String>,
    /// The unified diff stored when it was opened.
    pub diff: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    pub author: UserRef,
    pub closed_by: Option<UserRef>,
    /// In the order they were added (their states: [`super::reviewers`]).
    pub reviewers: Vec<UserRef>,
}

impl Identified for MergeRequest {
    fn id(&self) -> i64 {
        self.id
    }
}

fn merge_request_sql() -> String {
    format!(
        "SELECT m.id, m.iid, m.project_id, m.title, m.description, m.state, m.source_branch, m.target_branch,
            m.labels, m.diff, m.created_at, m.updated_at, coalesce(m.closed_at, CASE WHEN m.state = 'closed' THEN m.updated_at END) AS closed_at, {AUTHOR_COLUMNS}, {CLOSED_BY_COLUMNS},
            coalesce((SELECT json_agg(json_build_object('id', ru.id, 'username', ru.username, 'name', ru.name,
                                                        'state', ru.state) ORDER BY r.created_at, r.user_id)
                      FROM merge_request_reviewers r JOIN users ru ON ru.id = r.user_id WHERE r.merge_request_id = m.id),
                     '[]'::json) AS reviewers
         FROM merge_requests m JOIN users u ON u.id = m.author_id LEFT JOIN users cb ON cb.id = m.closed_by_id"
    )
}

fn from_row(row: &tokio_postgres::Row) -> Result<MergeRequest, tokio_postgres::Error> {
    let Json(reviewers) = row.try_get::<_, Json<Vec<UserRef>>>("reviewers")?;
    Ok(MergeRequest {
        id: row.get("id"),
        iid: row.get("iid"),
        project_id: row.get("project_id"),
        title: row.get("title"),
        description: row.get("description"),
        state: row.get("state"),
        source_branch: row.get("source_branch"),
        target_branch: row.get("target_branch"),
        labels: row.get("labels"),
        diff: row.get("diff"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        closed_at: row.get("closed_at"),
        author: UserRef::from_columns(row, "author"),
        closed_by: UserRef::closer(row),
        reviewers,
    })
}

/// The project's merge requests in `state` (all when `None`), newest first.
pub async fn list(
    db: &impl Queries,
    project: i64,
    state: Option<&str>,
) -> Result<Vec<MergeRequest>, tokio_postgres::Error> {
    let sql = format!(
        "{} WHERE m.project_id = $1 AND ($2::text IS NULL OR m.state = $2) ORDER BY m.id DESC",
        merge_request_sql()
    );
    let rows = db.query(&sql, &[&project, &state]).await?;
    rows.iter().map(from_row).collect()
}

/// The merge request numbered `iid` in the project.
pub async fn by_iid(
    db: &impl Queries,
    project: i64,
    iid: i32,
) -> Result<Option<MergeRequest>, tokio_postgres::Error> {
    let sql = format!(
        "{} WHERE m.project_id = $1 AND m.iid = $2",
        merge_request_sql()
    );
    db.query_opt(&sql, &[&project, &iid])
        .await?
        .as_ref()
        .map(from_row)
        .transpose()
}

/// What a new merge request is made of.
#[derive(Debug, Clone)]
pub struct NewMergeRequest {
    pub project: i64,
    pub title: String,
    pub description: String,
    pub source_branch: String,
    pub target_branch: String,
    pub diff: String,
    pub labels: Vec<String>,
    pub author: Author,
}

/// Opens the merge request with the project's next iid, unless one is
/// already open between the same branches (409, as GitLab).
pub async fn create(
    client: &mut deadpool_postgres::Client,
    new: NewMergeRequest,
) -> Result<MergeRequest, WorkItemError> {
    let tx = client.transaction().await?;
    // Serialises iid allocation and the open-duplicate check per project.
    tx.execute(
        "SELECT 1 FROM projects WHERE id = $1 FOR UPDATE",
        &[&new.project],
    )
    .await?;
    if let Some(open) = tx
        .query_opt(
            "SELECT iid FROM merge_requests WHERE project_id = $1 AND source_branch = $2 AND target_branch = $3
             AND state = 'opened' ORDER BY iid LIMIT 1",
            &[&new.project, &new.source_branch, &new.target_branch],
        )
        .await?
    {
        let iid: i32 = open.get(0);
        return Err(WorkItemError::Conflict(format!(
            "Another open merge request already exists for this source branch: !{iid}"
        )));
    }
    let id: i64 = tx
        .query_one(
            "INSERT INTO merge_requests (project_id, iid, title, description, author_id, source_branch, target_branch, diff, labels, on_behalf_of_user_id)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM merge_requests WHERE project_id = $1), $2, $3, $4, $5, $6, $7, $8, $9)
             RETURNING id",
            &[
                &new.project,
                &new.title,
                &new.description,
                &new.author.id,
                &new.source_branch,
                &new.target_branch,
                &new.diff,
                &new.labels,
                &new.author.on_behalf_of,
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    let sql = format!("{} WHERE m.id = $1", merge_request_sql());
    Ok(from_row(&client.query_one(&sql, &[&id]).await?)?)
}

/// A merge request as a project page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeRequestLine {
    pub iid: i32,
    pub title: String,
    pub state: String,
}

/// The project's `limit` newest merge requests, by iid.
pub async fn newest_lines(
    db: &impl Queries,
    project: i64,
    limit: i64,
) -> Result<Vec<MergeRequestLine>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT iid, title, state FROM merge_requests WHERE project_id = $1 ORDER BY iid DESC LIMIT $2",
            &[&project, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| MergeRequestLine {
            iid: r.get(0),
            title: r.get(1),
            state: r.get(2),
        })
        .collect())
}
