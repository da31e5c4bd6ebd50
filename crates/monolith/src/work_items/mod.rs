//! Work items: issues, merge requests (and their reviewers), epics, their
//! notes and discussions, and the CI pipelines and jobs (builds) of a
//! project. Their SQL lives here and nowhere else: REST, the web pages and the chat tools call these functions and
//! render what comes back, so a column or a join changes in one place.
//!
//! Finding is kept apart from access: the lookups say nothing about who may
//! see a row, and callers ask the policy before showing anything (the chat
//! tools and the page context through [`ai::read_for_ai`], which asks it).

pub mod ai;
pub mod ai_serialization;
pub mod builds;
pub mod discussions;
pub mod epics;
pub mod issues;
pub mod merge_requests;
pub mod notes;
pub mod position;
pub mod reviewers;
pub mod updates;

use serde::Deserialize;

use crate::db::DbError;
use crate::policy::Subject;

pub use ai::{AiReadError, read_for_ai};

/// The items that take notes, edits and a state: each has its own table and
/// a number (`iid`) within its project (its group for epics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Issue,
    MergeRequest,
    Epic,
}

impl Kind {
    fn table(self) -> &'static str {
        match self {
            Kind::Issue => "issues",
            Kind::MergeRequest => "merge_requests",
            Kind::Epic => "epics",
        }
    }

    /// GitLab's name of the type, as notes record it (`noteable_type`).
    pub fn noteable_type(self) -> &'static str {
        match self {
            Kind::Issue => "Issue",
            Kind::MergeRequest => "MergeRequest",
            Kind::Epic => "Epic",
        }
    }

    /// What the policy calls the item with this id.
    pub fn subject(self, id: i64) -> Subject {
        match self {
            Kind::Issue => Subject::Issue(id),
            Kind::MergeRequest => Subject::MergeRequest(id),
            Kind::Epic => Subject::Epic(id),
        }
    }

    /// Epics live in groups; issues and merge requests in projects.
    pub fn in_group(self) -> bool {
        self == Kind::Epic
    }
}

/// The id of the item of `kind` numbered `iid` in its project (group for
/// epics), if there is one. Says nothing about access.
pub async fn id_by_iid(
    db: &impl crate::queries::Queries,
    kind: Kind,
    container: i64,
    iid: i32,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let sql = match kind {
        Kind::Issue => "SELECT id FROM issues WHERE project_id = $1 AND iid = $2",
        Kind::Epic => "SELECT id FROM epics WHERE group_id = $1 AND iid = $2",
        Kind::MergeRequest => "SELECT id FROM merge_requests WHERE project_id = $1 AND iid = $2",
    };
    Ok(db
        .query_opt(sql, &[&container, &iid])
        .await?
        .map(|r| r.get(0)))
}

/// An issue, merge request or epic as its web page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemView {
    pub id: i64,
    pub title: String,
    pub description: String,
    pub state: String,
}

/// The item of `kind` numbered `iid` in its project (group for epics), as
/// its page shows it. Says nothing about access.
pub async fn view_by_iid(
    db: &impl crate::queries::Queries,
    kind: Kind,
    container: i64,
    iid: i32,
) -> Result<Option<ItemView>, tokio_postgres::Error> {
    let sql = match kind {
        Kind::Issue => {
            "SELECT id, title, description, state FROM issues WHERE project_id = $1 AND iid = $2"
        }
        Kind::MergeRequest => {
            "SELECT id, title, description, state FROM merge_requests WHERE project_id = $1 AND iid = $2"
        }
        Kind::Epic => {
            "SELECT id, title, description, state FROM epics WHERE group_id = $1 AND iid = $2"
        }
    };
    Ok(db
        .query_opt(sql, &[&container, &iid])
        .await?
        .map(|r| ItemView {
            id: r.get(0),
            title: r.get(1),
            description: r.get(2),
            state: r.get(3),
        }))
}

/// A user as an item shows them: its author, who closed it, its assignees.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct UserRef {
    pub id: i64,
    pub username: String,
    pub name: String,
    pub state: String,
}

impl UserRef {
    /// From the `<prefix>_id`, `<prefix>_username`, `<prefix>_name` and
    /// `<prefix>_state` columns of `row`.
    fn from_columns(row: &tokio_postgres::Row, prefix: &str) -> UserRef {
        UserRef {
            id: row.get(format!("{prefix}_id").as_str()),
            username: row.get(format!("{prefix}_username").as_str()),
            name: row.get(format!("{prefix}_name").as_str()),
            state: row.get(format!("{prefix}_state").as_str()),
        }
    }

    /// The closer of a row selected with [`CLOSED_BY_COLUMNS`], if any.
    fn closer(row: &tokio_postgres::Row) -> Option<UserRef> {
        row.get::<_, Option<i64>>("closed_by_id")
            .map(|_| UserRef::from_columns(row, "closed_by"))
    }
}

/// Author columns for a query joining `users u`.
const AUTHOR_COLUMNS: &str = "u.id AS author_id, u.username AS author_username, u.name AS author_name, u.state AS author_state";

/// Closer columns for a query with `LEFT JOIN users cb ON cb.id = <item>.closed_by_id`.
const CLOSED_BY_COLUMNS: &str = "cb.id AS closed_by_id, cb.username AS closed_by_username, cb.name AS closed_by_name, cb.state AS closed_by_state";

/// Anything stored with an id, which is what the policy is asked about.
pub trait Identified {
    fn id(&self) -> i64;
}

/// Who creates an item: its author (the service account of a composite
/// identity, else the user) and the human a composite identity acts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Author {
    pub id: i64,
    pub on_behalf_of: Option<i64>,
}

/// The order of a list by creation: newest first (GitLab's default) or oldest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortOrder {
    Asc,
    #[default]
    Desc,
}

impl SortOrder {
    fn sql(self) -> &'static str {
        match self {
            SortOrder::Asc => "ASC",
            SortOrder::Desc => "DESC",
        }
    }
}

/// Why a write to a work item did not happen; the REST layer answers each
/// with GitLab's status and body.
#[derive(Debug, thiserror::Error)]
pub enum WorkItemError {
    /// A parameter out of its values, in Grape's words (`{"error": "..."}`).
    #[error("{0}")]
    BadRequest(String),
    /// A model validation of one field (`{"message": {field: [error]}}`).
    #[error("{field} {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// Another item already holds what this one asks for.
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl WorkItemError {
    fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        WorkItemError::Invalid {
            field,
            message: message.into(),
        }
    }

    /// A constraint violation (unknown foreign key, duplicate) becomes `err`;
    /// other database failures stay database errors.
    fn on_constraint(err: WorkItemError) -> impl FnOnce(tokio_postgres::Error) -> WorkItemError {
        move |e| {
            if e.code().is_some() { err } else { e.into() }
        }
    }
}

impl From<tokio_postgres::Error> for WorkItemError {
    fn from(e: tokio_postgres::Error) -> Self {
        WorkItemError::Db(DbError::Query(e))
    }
}

impl From<deadpool_postgres::PoolError> for WorkItemError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        WorkItemError::Db(DbError::Checkout(e))
    }
}
