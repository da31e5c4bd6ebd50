//! Discussions (threads) on issues and merge requests, as GitLab keeps them:
//! every note carries a discussion id; a plain comment is a discussion of
//! its own (an "individual note"), a thread is started on purpose
//! (`DiscussionNote`) or on a line of a merge request's diff (`DiffNote`,
//! with a [`Position`]), and replies join it. Threads on merge requests are
//! resolvable; resolving one marks all its notes.
//!
//! Who may read, write or resolve is the policy's decision, asked by the
//! caller (REST, the web pages); the review bot's job calls these directly
//! for its own notes.

use std::collections::HashMap;

use tokio_postgres::types::Json;

pub use super::position::Position;

use super::notes::{self, Note, note_sql};
use super::{Author, Kind, WorkItemError};
use crate::queries::Queries;

/// The item a discussion is on (an issue or a merge request, by id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Noteable {
    pub kind: Kind,
    pub id: i64,
}

impl Noteable {
    pub fn issue(id: i64) -> Self {
        Noteable {
            kind: Kind::Issue,
            id,
        }
    }

    pub fn merge_request(id: i64) -> Self {
        Noteable {
            kind: Kind::MergeRequest,
            id,
        }
    }

    /// GitLab resolves threads on merge requests only.
    pub fn resolvable(self) -> bool {
        self.kind == Kind::MergeRequest
    }
}

/// One discussion: its notes, oldest first (never empty as read here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discussion {
    /// GitLab's 40-hex discussion id.
    pub id: String,
    /// A plain comment, not a thread (GitLab's `individual_note`).
    pub individual_note: bool,
    pub notes: Vec<Note>,
}

impl Discussion {
    /// The note that started it.
    pub fn first(&self) -> Option<&Note> {
        self.notes.first()
    }

    /// Whether the discussion can be resolved (a thread on a merge request).
    pub fn resolvable(&self) -> bool {
        self.notes.iter().any(|n| n.resolvable)
    }

    /// Resolvable, and every resolvable note of it resolved.
    pub fn resolved(&self) -> bool {
        self.resolvable()
            && self
                .notes
                .iter()
                .filter(|n| n.resolvable)
                .all(|n| n.resolved_at.is_some())
    }

    /// Internal threads (issues) are internal from their first note.
    pub fn internal(&self) -> bool {
        self.first().is_some_and(|n| n.internal)
    }
}

/// The first note of a new thread.
#[derive(Debug, Clone)]
pub struct NewThreadNote {
    pub noteable: Noteable,
    pub author: Author,
    pub body: String,
    /// Internal (issues and epics): only reporters and above read the thread.
    pub internal: bool,
    /// On a line of the merge request's diff (a `DiffNote`); `None` starts a
    /// `DiscussionNote`. Check it with [`Position::check`] first.
    pub position: Option<Position>,
    /// Whether the thread can be resolved; taken on merge requests only.
    pub resolvable: bool,
}

/// Starts a discussion with `new` as its first note (a fresh discussion id)
/// and reads the note back.
pub async fn start(db: &impl Queries, new: NewThreadNote) -> Result<Note, tokio_postgres::Error> {
    let note_type = if new.position.is_some() {
        "DiffNote"
    } else {
        "DiscussionNote"
    };
    let resolvable = new.resolvable && new.noteable.resolvable();
    let position = new.position.map(Json);
    let id: i64 = db
        .query_one(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, on_behalf_of_user_id, body, internal,
                                note_type, position, resolvable)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             RETURNING id",
            &[
                &new.noteable.kind.noteable_type(),
                &new.noteable.id,
                &new.author.id,
                &new.author.on_behalf_of,
                &new.body,
                &new.internal,
                &note_type,
                &position,
                &resolvable,
            ],
        )
        .await?
        .get(0);
    notes::by_id(db, id).await
}

/// Adds a reply by `author` to the discussion `discussion_id` of `noteable`
/// and reads it back; `None` when the noteable has no such discussion. The
/// reply takes its thread's kind of note (a diff note keeps the position),
/// internal flag, resolvability and resolution. Replying to a plain comment
/// turns it into a thread, as GitLab does; system notes take no replies.
pub async fn reply(
    db: &impl Queries,
    noteable: Noteable,
    discussion_id: &str,
    author: Author,
    body: &str,
) -> Result<Option<Note>, WorkItemError> {
    let Some(first) = db
        .query_opt(
            "SELECT system FROM notes
             WHERE noteable_type = $1 AND noteable_id = $2 AND discussion_id = $3
             ORDER BY created_at, id LIMIT 1",
            &[&noteable.kind.noteable_type(), &noteable.id, &discussion_id],
        )
        .await?
    else {
        return Ok(None);
    };
    if first.get::<_, bool>(0) {
        return Err(WorkItemError::BadRequest(
            "Discussion can not be replied to.".into(),
        ));
    }
    // One statement: the thread's conversion and the reply happen together.
    let id: i64 = db
        .query_one(
            "WITH first AS (
                 SELECT note_type, position, resolvable, internal, resolved_at, resolved_by_id FROM notes
                 WHERE noteable_type = $1 AND noteable_id = $2 AND discussion_id = $3
                 ORDER BY created_at, id LIMIT 1
             ), converted AS (
                 UPDATE notes SET note_type = 'DiscussionNote', resolvable = $7
                 WHERE noteable_type = $1 AND noteable_id = $2 AND discussion_id = $3 AND note_type IS NULL
             )
             INSERT INTO notes (noteable_type, noteable_id, author_id, on_behalf_of_user_id, body, discussion_id,
                                note_type, position, resolvable, internal, resolved_at, resolved_by_id)
             SELECT $1, $2, $4, $5, $6, $3,
                    coalesce(f.note_type, 'DiscussionNote'), f.position,
                    CASE WHEN f.note_type IS NULL THEN $7 ELSE f.resolvable END,
                    f.internal, f.resolved_at, f.resolved_by_id
             FROM first f
             RETURNING id",
            &[
                &noteable.kind.noteable_type(),
                &noteable.id,
                &discussion_id,
                &author.id,
                &author.on_behalf_of,
                &body,
                &noteable.resolvable(),
            ],
        )
        .await?
        .get(0);
    Ok(Some(notes::by_id(db, id).await?))
}

/// Groups notes (ordered by creation) into discussions, ordered by their
/// first note.
fn group(notes: Vec<Note>) -> Vec<Discussion> {
    let mut discussions: Vec<Discussion> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for note in notes {
        match index.get(&note.discussion_id) {
            Some(&at) => discussions[at].notes.push(note),
            None => {
                index.insert(note.discussion_id.clone(), discussions.len());
                discussions.push(Discussion {
                    id: note.discussion_id.clone(),
                    individual_note: note.note_type.is_none(),
                    notes: vec![note],
                });
            }
        }
    }
    discussions
}

/// Every discussion of `noteable`, in creation order, each with its notes
/// oldest first (internal ones included: callers filter what the reader may
/// not see).
pub async fn list(
    db: &impl Queries,
    noteable: Noteable,
) -> Result<Vec<Discussion>, tokio_postgres::Error> {
    let sql = format!(
        "{} WHERE n.noteable_type = $1 AND n.noteable_id = $2 ORDER BY n.created_at, n.id",
        note_sql()
    );
    let rows = db
        .query(&sql, &[&noteable.kind.noteable_type(), &noteable.id])
        .await?;
    Ok(group(rows.iter().map(notes::from_row).collect()))
}

/// The discussion `discussion_id` of `noteable`, if it has one.
pub async fn find(
    db: &impl Queries,
    noteable: Noteable,
    discussion_id: &str,
) -> Result<Option<Discussion>, tokio_postgres::Error> {
    let sql = format!(
        "{} WHERE n.noteable_type = $1 AND n.noteable_id = $2 AND n.discussion_id = $3
         ORDER BY n.created_at, n.id",
        note_sql()
    );
    let rows = db
        .query(
            &sql,
            &[&noteable.kind.noteable_type(), &noteable.id, &discussion_id],
        )
        .await?;
    Ok(group(rows.iter().map(notes::from_row).collect())
        .into_iter()
        .next())
}

/// Resolves (or, with `resolved: false`, reopens) the discussion as
/// `by_user` and reads it back; `None` when `noteable` has no such
/// discussion, a bad request when it is not resolvable. Notes resolved
/// before keep who resolved them and when, as in GitLab.
pub async fn resolve(
    db: &impl Queries,
    noteable: Noteable,
    discussion_id: &str,
    resolved: bool,
    by_user: i64,
) -> Result<Option<Discussion>, WorkItemError> {
    let Some(discussion) = find(db, noteable, discussion_id).await? else {
        return Ok(None);
    };
    if !discussion.resolvable() {
        return Err(WorkItemError::BadRequest(
            "The discussion is not resolvable".into(),
        ));
    }
    let kind = noteable.kind.noteable_type();
    if resolved {
        db.execute(
            "UPDATE notes SET resolved_at = now(), resolved_by_id = $4
             WHERE noteable_type = $1 AND noteable_id = $2 AND discussion_id = $3 AND resolvable
               AND resolved_at IS NULL",
            &[&kind, &noteable.id, &discussion_id, &by_user],
        )
        .await?;
    } else {
        db.execute(
            "UPDATE notes SET resolved_at = NULL, resolved_by_id = NULL
             WHERE noteable_type = $1 AND noteable_id = $2 AND discussion_id = $3",
            &[&kind, &noteable.id, &discussion_id],
        )
        .await?;
    }
    Ok(find(db, noteable, discussion_id).await?)
}
