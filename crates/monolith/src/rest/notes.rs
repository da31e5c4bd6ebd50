//! Notes (comments) on issues, merge requests and epics. Each noteable's module
//! says how its item is found and authorized ([`NoteTarget`]); the handlers here
//! list and create the notes of any of them.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::ApiError;
use super::containers::require_write;
use super::entities::user_basic;
use super::item_access::Item;
use super::pagination::{PageParams, paged};
use super::param_values::sort_order;
use crate::app_state::AppState;
use crate::policy::{Actor, Subject, WriteAbility};
use crate::work_items::discussions;
use crate::work_items::notes::{self, NewNote, Note};
use crate::work_items::{Author, Kind};

/// The item notes belong to, as GitLab names its type.
#[derive(Debug, Clone, Copy)]
pub(super) struct Noteable {
    pub kind: Kind,
    pub id: i64,
    /// The item's iid, where GitLab shows one (`noteable_iid`).
    pub iid: Option<i32>,
    /// The project or group the item lives in.
    pub container: Subject,
}

impl Noteable {
    pub fn issue(id: i64, iid: i32, project: i64) -> Self {
        Noteable {
            kind: Kind::Issue,
            id,
            iid: Some(iid),
            container: Subject::Project(project),
        }
    }

    pub fn merge_request(id: i64, iid: i32, project: i64) -> Self {
        Noteable {
            kind: Kind::MergeRequest,
            id,
            iid: Some(iid),
            container: Subject::Project(project),
        }
    }

    pub fn epic(id: i64, group: i64) -> Self {
        Noteable {
            kind: Kind::Epic,
            id,
            iid: None,
            container: Subject::Group(group),
        }
    }

    /// GitLab keeps internal notes for issues and epics.
    pub fn supports_internal(&self) -> bool {
        self.kind != Kind::MergeRequest
    }

    /// The project the item lives in (`None` for epics).
    pub fn project(&self) -> Option<i64> {
        match self.container {
            Subject::Project(id) => Some(id),
            _ => None,
        }
    }

    /// The item as the discussions domain names it.
    pub fn domain(&self) -> discussions::Noteable {
        discussions::Noteable {
            kind: self.kind,
            id: self.id,
        }
    }
}

/// GitLab's note entity: `position` only on diff notes, the resolution only
/// on resolvable notes (as `API::Entities::Note` exposes them).
pub(super) fn note_json(note: &Note, noteable: &Noteable, base: &url::Url) -> Value {
    let mut v = json!({
        "id": note.id,
        "type": note.note_type,
        "body": note.body,
        "attachment": Value::Null,
        "author": user_basic(&note.author, base),
        "created_at": note.created_at,
        "updated_at": note.updated_at,
        "system": note.system,
        "noteable_id": note.noteable_id,
        "noteable_type": note.noteable_type,
        "project_id": noteable.project(),
        "noteable_iid": noteable.iid,
        "resolvable": note.resolvable,
        "internal": note.internal,
        "confidential": note.internal,
    });
    let Some(obj) = v.as_object_mut() else {
        return v;
    };
    if let Some(position) = &note.position {
        if note.noteable_type == "MergeRequest" {
            obj.insert("commit_id".into(), Value::Null);
        }
        let mut position = json!(position);
        if let Some(p) = position.as_object_mut() {
            p.insert("line_range".into(), Value::Null);
        }
        obj.insert("position".into(), position);
    }
    if note.resolvable {
        obj.insert("resolved".into(), json!(note.resolved()));
        obj.insert(
            "resolved_by".into(),
            note.resolved_by
                .as_ref()
                .map_or(Value::Null, |u| user_basic(u, base)),
        );
        obj.insert("resolved_at".into(), json!(note.resolved_at));
    }
    v
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
        req: &impl super::Caller,
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
    let order = sort_order(params.sort.as_deref())?;
    let items = notes_of::<T>(&state, &req, path.into_inner(), order).await?;
    Ok(paged(
        &req,
        PageParams::new(params.page, params.per_page),
        items,
    ))
}

/// The notes the caller may read of an item they may read.
pub(super) async fn notes_of<T: NoteTarget>(
    state: &AppState,
    req: &impl super::Caller,
    path: T::Path,
    order: crate::work_items::SortOrder,
) -> Result<Vec<Value>, ApiError> {
    let (user, noteable) = T::find(state, req, path).await?;
    let db = state.pool.get().await?;
    let found = notes::list(&*db, noteable.kind, noteable.id, order).await?;
    let readable = Item::NOTE.keep_readable(state, &*db, user, found).await?;
    Ok(readable
        .iter()
        .map(|n| note_json(n, &noteable, &state.config.external_url))
        .collect())
}

#[derive(Debug, Deserialize)]
pub(super) struct NewNoteParams {
    pub body: String,
    pub internal: Option<bool>,
    /// GitLab's older name for `internal`.
    pub confidential: Option<bool>,
}

/// `POST .../notes`.
pub(super) async fn create<T: NoteTarget>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<T::Path>,
    note: super::params::Params<NewNoteParams>,
) -> Result<HttpResponse, ApiError> {
    let created = note_created::<T>(&state, &req, path.into_inner(), note.into_inner()).await?;
    Ok(HttpResponse::Created().json(created))
}

/// Adds a note by the caller to an item they may read.
pub(super) async fn note_created<T: NoteTarget>(
    state: &AppState,
    req: &impl super::Caller,
    path: T::Path,
    note: NewNoteParams,
) -> Result<Value, ApiError> {
    let me = req.writer(state).await?;
    let (_, noteable) = T::find(state, req, path).await?;
    check_body(&note.body)?;
    let internal = note.internal.or(note.confidential).unwrap_or(false);
    if internal {
        may_write_internal(state, &me, &noteable).await?;
    }
    let db = state.pool.get().await?;
    let created = notes::create(
        &*db,
        NewNote {
            kind: noteable.kind,
            item: noteable.id,
            body: note.body,
            internal,
            author: Author {
                id: me.author_id(),
                on_behalf_of: me.on_behalf_of(),
            },
        },
    )
    .await?;
    after_note(&*db, &noteable, &created, me.id).await;
    Ok(note_json(&created, &noteable, &state.config.external_url))
}

/// A note's body: GitLab refuses a blank one.
pub(super) fn check_body(body: &str) -> Result<(), ApiError> {
    if body.trim().is_empty() {
        return Err(ApiError::BadRequest("body is missing".into()));
    }
    Ok(())
}

/// Whether `me` may write an internal note on the item: issues and epics
/// keep them, for reporters and above.
pub(super) async fn may_write_internal(
    state: &AppState,
    me: &crate::identity::tokens::AuthenticatedUser,
    noteable: &Noteable,
) -> Result<(), ApiError> {
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
    .await
}

/// What follows a note written through the API on an issue or merge
/// request: Duo's answer when it mentions the review bot. `requester` is the
/// person behind the write (the human of a composite identity).
pub(super) async fn after_note(
    db: &impl crate::queries::Queries,
    noteable: &Noteable,
    note: &Note,
    requester: i64,
) {
    let (Some(project), Some(iid)) = (noteable.project(), noteable.iid) else {
        return;
    };
    super::duo_events::note_created(
        db,
        project,
        noteable.kind.noteable_type(),
        iid,
        note.id,
        requester,
        &note.body,
    )
    .await;
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
