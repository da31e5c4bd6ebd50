//! Issues of a project: lookups, lists, creation, and the short forms the
//! web pages show.

use chrono::{DateTime, NaiveDate, Utc};
use tokio_postgres::types::Json;

use super::{AUTHOR_COLUMNS, Author, CLOSED_BY_COLUMNS, Identified, UserRef, WorkItemError};
use crate::queries::Queries;

/// One issue with its author, closer and assignees.
#[derive(Debug, Clone, PartialEq)]
pub struct Issue {
    pub id: i64,
    pub iid: i32,
    pub project_id: i64,
    pub title: String,
    pub description: String,
    /// `opened` or `closed`.
    pub state: String,
    pub confidential: bool,
    pub labels: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When it was closed (an issue closed before closing was recorded
    /// counts as closed at its last update).
    pub closed_at: Option<DateTime<Utc>>,
    pub due_date: Option<NaiveDate>,
    pub author: UserRef,
    pub closed_by: Option<UserRef>,
    /// By user id.
    pub assignees: Vec<UserRef>,
}

impl Identified for Issue {
    fn id(&self) -> i64 {
        self.id
    }
}

fn issue_sql() -> String {
    format!(
        "SELECT i.id, i.iid, i.project_id, i.title, i.description, i.state, i.confidential, i.labels,
            i.created_at, i.updated_at, coalesce(i.closed_at, CASE WHEN i.state = 'closed' THEN i.updated_at END) AS closed_at, i.due_date, {AUTHOR_COLUMNS}, {CLOSED_BY_COLUMNS},
            coalesce((SELECT json_agg(json_build_object('id', au.id, 'username', au.username, 'name', au.name,
                                                        'state', au.state) ORDER BY au.id)
                      FROM issue_assignees a JOIN users au ON au.id = a.user_id WHERE a.issue_id = i.id),
                     '[]'::json) AS assignees
         FROM issues i JOIN users u ON u.id = i.author_id LEFT JOIN users cb ON cb.id = i.closed_by_id"
    )
}

fn from_row(row: &tokio_postgres::Row) -> Result<Issue, tokio_postgres::Error> {
    let Json(assignees) = row.try_get::<_, Json<Vec<UserRef>>>("assignees")?;
    Ok(Issue {
        id: row.get("id"),
        iid: row.get("iid"),
        project_id: row.get("project_id"),
        title: row.get("title"),
        description: row.get("description"),
        state: row.get("state"),
        confidential: row.get("confidential"),
        labels: row.get("labels"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        closed_at: row.get("closed_at"),
        due_date: row.get("due_date"),
        author: UserRef::from_columns(row, "author"),
        closed_by: UserRef::closer(row),
        assignees,
    })
}

fn from_rows(rows: &[tokio_postgres::Row]) -> Result<Vec<Issue>, tokio_postgres::Error> {
    rows.iter().map(from_row).collect()
}

/// GitLab's `labels` filter of an issue list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelFilter {
    /// Issues without labels.
    None,
    /// Issues with at least one label.
    Any,
    /// Issues carrying every one of these (none: every issue).
    All(Vec<String>),
}

/// Which issues of a project a list shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueFilter {
    /// `opened` or `closed`; `None` for both.
    pub state: Option<String>,
    pub labels: LabelFilter,
}

/// The project's issues that pass `filter`, newest first.
pub async fn list(
    db: &impl Queries,
    project: i64,
    filter: &IssueFilter,
) -> Result<Vec<Issue>, tokio_postgres::Error> {
    let (mode, labels) = match &filter.labels {
        LabelFilter::None => ("none", Vec::new()),
        LabelFilter::Any => ("any", Vec::new()),
        LabelFilter::All(labels) => ("all", labels.clone()),
    };
    let sql = format!(
        "{} WHERE i.project_id = $1 AND ($2::text IS NULL OR i.state = $2)
         AND CASE $3::text WHEN 'none' THEN cardinality(i.labels) = 0
                           WHEN 'any' THEN cardinality(i.labels) > 0
                           ELSE i.labels @> $4::text[] END
         ORDER BY i.id DESC",
        issue_sql()
    );
    let rows = db
        .query(&sql, &[&project, &filter.state, &mode, &labels])
        .await?;
    from_rows(&rows)
}

/// The issue numbered `iid` in the project.
pub async fn by_iid(
    db: &impl Queries,
    project: i64,
    iid: i32,
) -> Result<Option<Issue>, tokio_postgres::Error> {
    let sql = format!("{} WHERE i.project_id = $1 AND i.iid = $2", issue_sql());
    db.query_opt(&sql, &[&project, &iid])
        .await?
        .as_ref()
        .map(from_row)
        .transpose()
}

/// The issue with this id.
pub async fn by_id(db: &impl Queries, id: i64) -> Result<Option<Issue>, tokio_postgres::Error> {
    let sql = format!("{} WHERE i.id = $1", issue_sql());
    db.query_opt(&sql, &[&id])
        .await?
        .as_ref()
        .map(from_row)
        .transpose()
}

/// What a new issue is made of.
#[derive(Debug, Clone)]
pub struct NewIssue {
    pub project: i64,
    pub title: String,
    pub description: String,
    pub confidential: bool,
    pub labels: Vec<String>,
    pub assignee_ids: Vec<i64>,
    pub author: Author,
}

/// Creates the issue with the project's next iid; an assignee who is not a
/// user refuses the whole issue.
pub async fn create(
    client: &mut deadpool_postgres::Client,
    new: NewIssue,
) -> Result<Issue, WorkItemError> {
    let tx = client.transaction().await?;
    // Serialise iid allocation per project.
    tx.execute(
        "SELECT 1 FROM projects WHERE id = $1 FOR UPDATE",
        &[&new.project],
    )
    .await?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO issues (project_id, iid, title, description, author_id, confidential, labels, on_behalf_of_user_id)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM issues WHERE project_id = $1), $2, $3, $4, $5, $6, $7)
             RETURNING id",
            &[
                &new.project,
                &new.title,
                &new.description,
                &new.author.id,
                &new.confidential,
                &new.labels,
                &new.author.on_behalf_of,
            ],
        )
        .await?
        .get(0);
    for assignee in &new.assignee_ids {
        tx.execute(
            "INSERT INTO issue_assignees (issue_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&id, assignee],
        )
        .await
        .map_err(WorkItemError::on_constraint(WorkItemError::BadRequest(
            "assignee_ids is invalid".into(),
        )))?;
    }
    tx.commit().await?;
    let sql = format!("{} WHERE i.id = $1", issue_sql());
    Ok(from_row(&client.query_one(&sql, &[&id]).await?)?)
}

/// An issue as a project page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueLine {
    pub id: i64,
    pub iid: i32,
    pub title: String,
    pub state: String,
}

/// The project's `limit` newest issues, by iid.
pub async fn newest_lines(
    db: &impl Queries,
    project: i64,
    limit: i64,
) -> Result<Vec<IssueLine>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT id, iid, title, state FROM issues WHERE project_id = $1 ORDER BY iid DESC LIMIT $2",
            &[&project, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| IssueLine {
            id: r.get(0),
            iid: r.get(1),
            title: r.get(2),
            state: r.get(3),
        })
        .collect())
}
