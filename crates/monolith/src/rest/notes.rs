//! Notes (comments) on issues, merge requests and epics. Each noteable's module
//! says how its item is found and authorized ([`NoteTarget`]); the handlers here
//! list and create the notes of any of them.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::common::{author, paged, require_write, sort_order, ts};
use super::items::{Item, readable_rows};
use super::pagination::PageParams;
use super::{ApiError, WRITE_SCOPES, require_user};
use crate::app_state::AppState;
use crate::policy::{Actor, Subject, WriteAbility};

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

/// An item notes hang on, found from its notes route's path.
pub(super) trait NoteTarget: 'static {
    /// The route's path parameters, e.g. `(project, iid)`.
    type Path: DeserializeOwned;

    /// The caller (if any) and the item, once they may read it; 404 otherwise.
    async fn find(
        state: &AppState,
        req: &HttpRequest,
        path: Self::Path,
    ) -> Result<(Option<Actor>, Noteable), ApiError>;
}

/// The notes of an item the caller may read, newest first unless `sort=asc`;
/// internal notes only for those who may read them.
pub(super) async fn list<T: NoteTarget>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<T::Path>,
    params: web::Query<NoteListParams>,
) -> Result<HttpResponse, ApiError> {
    let (user, noteable) = T::find(&state, &req, path.into_inner()).await?;
    let order = sort_order(params.sort.as_deref())?;
    let db = state.pool.get().await?;
    let sql = format!(
        "{NOTE_SQL} WHERE n.noteable_type = $1 AND n.noteable_id = $2 ORDER BY n.created_at {order}, n.id {order}"
    );
    let rows = readable_rows(
        &state,
        &*db,
        user,
        Item::NOTE,
        &sql,
        &[&noteable.kind, &noteable.id],
    )
    .await?;
    let items = rows
        .iter()
        .map(|r| note_json(r, &noteable, &state.config.external_url))
        .collect();
    Ok(paged(
        &req,
        PageParams::new(params.page, params.per_page),
        items,
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct NewNote {
    body: String,
    internal: Option<bool>,
    /// GitLab's older name for `internal`.
    confidential: Option<bool>,
}

/// Adds a note by the caller to an item they may read.
pub(super) async fn create<T: NoteTarget>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<T::Path>,
    note: super::params::Params<NewNote>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let (_, noteable) = T::find(&state, &req, path.into_inner()).await?;
    let note = note.into_inner();
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
            &state,
            &me,
            WriteAbility::CreateInternalNote,
            noteable.container,
        )
        .await?;
    }
    let db = state.pool.get().await?;
    let id: i64 = db
        .query_one(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, body, internal, on_behalf_of_user_id)
             VALUES ($1, $2, $3, $4, $5, $6)
             RETURNING id",
            &[
                &noteable.kind,
                &noteable.id,
                &me.author_id(),
                &note.body,
                &internal,
                &me.on_behalf_of(),
            ],
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
