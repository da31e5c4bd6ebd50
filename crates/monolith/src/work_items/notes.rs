//! Notes (comments) on issues, merge requests and epics. Whether a note may
//! be read (internal notes) is the policy's `ReadNote`; callers filter.
//! Every note belongs to a discussion (a plain note to its own); threads,
//! diff notes and resolution are [`super::discussions`].

use chrono::{DateTime, Utc};

use super::position::Position;
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
    /// GitLab's 40-hex id of the discussion the note belongs to.
    pub discussion_id: String,
    /// `DiffNote`, `DiscussionNote`, or `None` for a plain comment.
    pub note_type: Option<String>,
    /// Where a diff note sits in the merge request's diff.
    pub position: Option<Position>,
    pub resolvable: bool,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolved_by: Option<UserRef>,
}

impl Note {
    /// A resolvable note that was resolved.
    pub fn resolved(&self) -> bool {
        self.resolvable && self.resolved_at.is_some()
    }
}

impl Identified for Note {
    fn id(&self) -> i64 {
        self.id
    }
}

/// Every column of a note, for queries that add their own `WHERE` and order.
pub(super) fn note_sql() -> String {
    format!(
        "SELECT n.id, n.body, n.noteable_type, n.noteable_id, n.internal, n.system, n.created_at, n.updated_at,
        n.discussion_id, n.note_type, n.position, n.resolvable, n.resolved_at,
        rb.id AS resolved_by_id, rb.username AS resolved_by_username, rb.name AS resolved_by_name,
        rb.state AS resolved_by_state,
        {AUTHOR_COLUMNS}
    FROM notes n JOIN users u ON u.id = n.author_id LEFT JOIN users rb ON rb.id = n.resolved_by_id"
    )
}

pub(super) fn from_row(row: &tokio_postgres::Row) -> Note {
    let position: Option<serde_json::Value> = row.get("position");
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
        discussion_id: row.get("discussion_id"),
        note_type: row.get("note_type"),
        // A stored position of another shape (an image note, say) is left out
        // rather than failing the whole list.
        position: position.and_then(|p| serde_json::from_value(p).ok()),
        resolvable: row.get("resolvable"),
        resolved_at: row.get("resolved_at"),
        resolved_by: row
            .get::<_, Option<i64>>("resolved_by_id")
            .map(|_| UserRef::from_columns(row, "resolved_by")),
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

/// Adds the note (a plain comment, in a discussion of its own) and reads it
/// back.
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
    by_id(db, id).await
}

/// The note with this id, which must exist (one just written).
pub(super) async fn by_id(db: &impl Queries, id: i64) -> Result<Note, tokio_postgres::Error> {
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
