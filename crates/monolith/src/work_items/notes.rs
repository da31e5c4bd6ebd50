//! Notes (comments) on issues, merge requests and epics. Whether a note may
//! be read (internal notes) is the policy's `ReadNote`; callers filter.

use chrono::{DateTime, Utc};

use super::{AUTHOR_COLUMNS, Author, Identified, Kind, SortOrder, UserRef};
use crate::queries::Queries;

/// One note with its author.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub id: i64,
    pub body: String,
    /// GitLab's type name of the item it is on (`Issue`, `MergeRequest`, `Epic`).
    pub noteable_type: String,
    pub noteable_id: i64,
    pub internal: bool,
    /// Written by GitLab itself (a state change), not by a person.
    pub system: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub author: UserRef,
}

impl Identified for Note {
    fn id(&self) -> i64 {
        self.id
    }
}

fn note_sql() -> String {
    format!(
        "SELECT n.id, n.body, n.noteable_type, n.noteable_id, n.internal, n.system, n.created_at, n.updated_at,
        {AUTHOR_COLUMNS}
    FROM notes n JOIN users u ON u.id = n.author_id"
    )
}

fn from_row(row: &tokio_postgres::Row) -> Note {
    Note {
        id: row.get("id"),
        body: row.get("body"),
        noteable_type: row.get("noteable_type"),
        noteable_id: row.get("noteable_id"),
        internal: row.get("internal"),
        system: row.get("system"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        author: UserRef::from_columns(row, "author"),
    }
}

/// Every note on the item, by creation in `order`.
pub async fn list(
    db: &impl Queries,
    kind: Kind,
    item: i64,
    order: SortOrder,
) -> Result<Vec<Note>, tokio_postgres::Error> {
    let order = order.sql();
    let sql = format!(
        "{} WHERE n.noteable_type = $1 AND n.noteable_id = $2 ORDER BY n.created_at {order}, n.id {order}",
        note_sql()
    );
    let rows = db.query(&sql, &[&kind.noteable_type(), &item]).await?;
    Ok(rows.iter().map(from_row).collect())
}

/// What a new note is made of.
#[derive(Debug, Clone)]
pub struct NewNote {
    pub kind: Kind,
    pub item: i64,
    pub body: String,
    pub internal: bool,
    pub author: Author,
}

/// Adds the note and reads it back.
pub async fn create(db: &impl Queries, new: NewNote) -> Result<Note, tokio_postgres::Error> {
    let id: i64 = db
        .query_one(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, body, internal, on_behalf_of_user_id)
             VALUES ($1, $2, $3, $4, $5, $6)
             RETURNING id",
            &[
                &new.kind.noteable_type(),
                &new.item,
                &new.author.id,
                &new.body,
                &new.internal,
                &new.author.on_behalf_of,
            ],
        )
        .await?
        .get(0);
    let row = db
        .query_one(&format!("{} WHERE n.id = $1", note_sql()), &[&id])
        .await?;
    Ok(from_row(&row))
}

/// A note a person wrote, as pages and prompts quote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comment {
    pub id: i64,
    pub author_username: String,
    pub body: String,
}

impl Identified for Comment {
    fn id(&self) -> i64 {
        self.id
    }
}

/// The notes people wrote on the item (system notes left out), oldest
/// first, at most `limit` of them (all when `None`).
pub async fn comments(
    db: &impl Queries,
    kind: Kind,
    item: i64,
    limit: Option<i64>,
) -> Result<Vec<Comment>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT n.id, u.username, n.body FROM notes n JOIN users u ON u.id = n.author_id
             WHERE n.noteable_type = $1 AND n.noteable_id = $2 AND NOT n.system
             ORDER BY n.id LIMIT $3",
            &[&kind.noteable_type(), &item, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Comment {
            id: r.get(0),
            author_username: r.get(1),
            body: r.get(2),
        })
        .collect())
}
