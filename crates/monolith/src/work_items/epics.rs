//! Epics of a group: lookups, lists and creation. GitLab addresses an epic by
//! its `iid` in the epic endpoints and by its global `id` in the notes ones,
//! so both lookups exist.

use chrono::{DateTime, Utc};

use super::{AUTHOR_COLUMNS, Author, CLOSED_BY_COLUMNS, Identified, UserRef, WorkItemError};
use crate::queries::Queries;

/// One epic with its author and closer.
#[derive(Debug, Clone, PartialEq)]
pub struct Epic {
    pub id: i64,
    pub iid: i32,
    pub group_id: i64,
    pub title: String,
    pub description: String,
    /// `opened` or `closed`.
    pub state: String,
    pub confidential: bool,
    pub labels: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    pub author: UserRef,
    pub closed_by: Option<UserRef>,
}

impl Identified for Epic {
    fn id(&self) -> i64 {
        self.id
    }
}

fn epic_sql() -> String {
    format!(
        "SELECT e.id, e.iid, e.group_id, e.title, e.description, e.state, e.confidential, e.labels,
            e.created_at, e.updated_at, coalesce(e.closed_at, CASE WHEN e.state = 'closed' THEN e.updated_at END) AS closed_at, {AUTHOR_COLUMNS}, {CLOSED_BY_COLUMNS}
         FROM epics e JOIN users u ON u.id = e.author_id LEFT JOIN users cb ON cb.id = e.closed_by_id"
    )
}

fn from_row(row: &tokio_postgres::Row) -> Epic {
    Epic {
        id: row.get("id"),
        iid: row.get("iid"),
        group_id: row.get("group_id"),
        title: row.get("title"),
        description: row.get("description"),
        state: row.get("state"),
        confidential: row.get("confidential"),
        labels: row.get("labels"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        closed_at: row.get("closed_at"),
        author: UserRef::from_columns(row, "author"),
        closed_by: UserRef::closer(row),
    }
}

/// The group's epics, newest first.
pub async fn list(db: &impl Queries, group: i64) -> Result<Vec<Epic>, tokio_postgres::Error> {
    let sql = format!("{} WHERE e.group_id = $1 ORDER BY e.id DESC", epic_sql());
    let rows = db.query(&sql, &[&group]).await?;
    Ok(rows.iter().map(from_row).collect())
}

/// How a request names an epic of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpicKey {
    /// Its number in the group (the epic endpoints).
    Iid(i64),
    /// Its global id (the notes endpoints).
    Id(i64),
}

/// The group's epic named by `key`.
pub async fn find(
    db: &impl Queries,
    group: i64,
    key: EpicKey,
) -> Result<Option<Epic>, tokio_postgres::Error> {
    let (filter, key) = match key {
        EpicKey::Iid(iid) => ("e.iid::bigint = $2", iid),
        EpicKey::Id(id) => ("e.id = $2", id),
    };
    let sql = format!("{} WHERE e.group_id = $1 AND {filter}", epic_sql());
    Ok(db
        .query_opt(&sql, &[&group, &key])
        .await?
        .as_ref()
        .map(from_row))
}

/// What a new epic is made of.
#[derive(Debug, Clone)]
pub struct NewEpic {
    pub group: i64,
    pub title: String,
    pub description: String,
    pub confidential: bool,
    pub labels: Vec<String>,
    pub author: Author,
}

/// Creates the epic with the group's next iid.
pub async fn create(
    client: &mut deadpool_postgres::Client,
    new: NewEpic,
) -> Result<Epic, WorkItemError> {
    let tx = client.transaction().await?;
    // Serialises iid allocation per group.
    tx.execute(
        "SELECT 1 FROM groups WHERE id = $1 FOR UPDATE",
        &[&new.group],
    )
    .await?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO epics (group_id, iid, title, description, author_id, confidential, labels, on_behalf_of_user_id)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM epics WHERE group_id = $1), $2, $3, $4, $5, $6, $7)
             RETURNING id",
            &[
                &new.group,
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
    tx.commit().await?;
    let sql = format!("{} WHERE e.id = $1", epic_sql());
    Ok(from_row(&client.query_one(&sql, &[&id]).await?))
}
