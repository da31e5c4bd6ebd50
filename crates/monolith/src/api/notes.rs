//! Notes (comments) on issues, merge requests and epics. The handlers of each
//! noteable find and authorize the item; these functions list and create its notes.

use actix_web::{HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::common::{author, paged, require_write, ts};
use super::pagination::PageParams;
use crate::policy::{Ability, Actor, Subject, WriteAbility};
use crate::tokens::AuthenticatedUser;
use crate::web::AppState;

/// The item notes belong to, as GitLab names its type.
#[derive(Debug, Clone, Copy)]
pub(super) struct Noteable {
    pub kind: &'static str,
    pub id: i64,
    /// The item's iid, where GitLab shows one (`noteable_iid`).
    pub iid: Option<i32>,
    /// The project or group the item lives in.
    pub container: Subject,
}

impl Noteable {
    pub fn issue(id: i64, iid: i32, project: i64) -> Self {
        Noteable {
            kind: "Issue",
            id,
            iid: Some(iid),
            container: Subject::Project(project),
        }
    }

    pub fn merge_request(id: i64, iid: i32, project: i64) -> Self {
        Noteable {
            kind: "MergeRequest",
            id,
            iid: Some(iid),
            container: Subject::Project(project),
        }
    }

    pub fn epic(id: i64, group: i64) -> Self {
        Noteable {
            kind: "Epic",
            id,
            iid: None,
            container: Subject::Group(group),
        }
    }

    /// GitLab keeps internal notes for issues and epics.
    fn supports_internal(&self) -> bool {
        self.kind != "MergeRequest"
    }
}

const NOTE_SQL: &str = "SELECT n.id, n.body, n.noteable_type, n.noteable_id, n.internal, n.system, n.created_at, n.updated_at,
        u.id AS author_id, u.username AS author_username, u.name AS author_name, u.state AS author_state
    FROM notes n JOIN users u ON u.id = n.author_id";

fn note_json(row: &tokio_postgres::Row, noteable: &Noteable, base: &url::Url) -> Value {
    let project_id = match noteable.container {
        Subject::Project(id) => Some(id),
        _ => None,
    };
    json!({
        "id": row.get::<_, i64>("id"),
        "type": Value::Null,
        "body": row.get::<_, String>("body"),
        "attachment": Value::Null,
        "author": author(row, base),
        "created_at": ts(row, "created_at"),
        "updated_at": ts(row, "updated_at"),
        "system": row.get::<_, bool>("system"),
        "noteable_id": row.get::<_, i64>("noteable_id"),
        "noteable_type": row.get::<_, String>("noteable_type"),
        "project_id": project_id,
        "noteable_iid": noteable.iid,
        "resolvable": false,
        "internal": row.get::<_, bool>("internal"),
        "confidential": row.get::<_, bool>("internal"),
    })
}

#[derive(Debug, Deserialize)]
pub(super) struct NoteListParams {
    page: Option<usize>,
    per_page: Option<usize>,
    sort: Option<String>,
}

/// The notes of an item the caller may read, newest first unless `sort=asc`;
/// internal notes only for those who may read them.
pub(super) async fn list(
    state: &AppState,
    req: &HttpRequest,
    user: Option<Actor>,
    noteable: Noteable,
    params: NoteListParams,
) -> Result<HttpResponse, ApiError> {
    let order = match params.sort.as_deref() {
        None | Some("desc") => "DESC",
        Some("asc") => "ASC",
        Some(_) => {
            return Err(ApiError::BadRequest(
                "sort does not have a valid value".into(),
            ));
        }
    };
    let db = state.pool.get().await?;
    let rows = db
        .query(
            &format!(
                "{NOTE_SQL} WHERE n.noteable_type = $1 AND n.noteable_id = $2 ORDER BY n.created_at {order}, n.id {order}"
            ),
            &[&noteable.kind, &noteable.id],
        )
        .await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(&**db, user, Ability::ReadNote, Subject::Note(row.get("id")))
            .await?
        {
            items.push(note_json(&row, &noteable, &state.config.external_url));
        }
    }
    let page = PageParams {
        page: params.page,
        per_page: params.per_page,
    };
    Ok(paged(req, page, items))
}

#[derive(Debug, Deserialize)]
pub(super) struct NewNote {
    body: String,
    internal: Option<bool>,
    /// GitLab's older name for `internal`.
    confidential: Option<bool>,
}

/// Adds a note by `me` to an item they may read (the caller checked that).
pub(super) async fn create(
    state: &AppState,
    me: &AuthenticatedUser,
    noteable: Noteable,
    note: NewNote,
) -> Result<HttpResponse, ApiError> {
    if note.body.trim().is_empty() {
        return Err(ApiError::BadRequest("body is missing".into()));
    }
    let internal = note.internal.or(note.confidential).unwrap_or(false);
    if internal {
        if !noteable.supports_internal() {
            return Err(ApiError::invalid(
                "internal",
                "can only be set on issues and epics",
            ));
        }
        require_write(
            state,
            me,
            WriteAbility::CreateInternalNote,
            noteable.container,
        )
        .await?;
    }
    let db = state.pool.get().await?;
    let id: i64 = db
        .query_one(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, body, internal) VALUES ($1, $2, $3, $4, $5)
             RETURNING id",
            &[&noteable.kind, &noteable.id, &me.id, &note.body, &internal],
        )
        .await?
        .get(0);
    let row = db
        .query_one(&format!("{NOTE_SQL} WHERE n.id = $1"), &[&id])
        .await?;
    Ok(HttpResponse::Created().json(note_json(&row, &noteable, &state.config.external_url)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_notes_are_for_issues_and_epics() {
        assert!(Noteable::issue(1, 1, 1).supports_internal());
        assert!(Noteable::epic(1, 1).supports_internal());
        assert!(!Noteable::merge_request(1, 1, 1).supports_internal());
    }
}
