//! Discussions (threads) of merge requests and issues in GitLab's shapes:
//! list, show, start (on a diff line with `position`), reply, and resolve
//! (merge requests). Reading follows the notes' rules (internal notes only
//! for who may read them; a discussion with nothing readable is not found);
//! writing is commenting, as on the notes endpoints.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::item_access::Item;
use super::notes::{NoteTarget, Noteable, after_note, check_body, may_write_internal, note_json};
use super::pagination::{PageParams, paged};
use crate::app_state::AppState;
use crate::policy::Actor;
use crate::queries::Queries;
use crate::work_items::discussions::{self, Discussion, NewThreadNote, Position};
use crate::work_items::{Author, Kind};

/// GitLab's discussion entity.
fn discussion_json(discussion: &Discussion, noteable: &Noteable, base: &url::Url) -> Value {
    json!({
        "id": discussion.id,
        "individual_note": discussion.individual_note,
        "notes": discussion
            .notes
            .iter()
            .map(|n| note_json(n, noteable, base))
            .collect::<Vec<_>>(),
    })
}

/// The discussion with only the notes `user` may read; `None` when that
/// leaves nothing.
async fn readable(
    state: &AppState,
    db: &impl Queries,
    user: Option<Actor>,
    mut discussion: Discussion,
) -> Result<Option<Discussion>, ApiError> {
    discussion.notes = Item::NOTE
        .keep_readable(state, db, user, discussion.notes)
        .await?;
    Ok((!discussion.notes.is_empty()).then_some(discussion))
}

/// The discussion `discussion_id` of the item, as far as `user` may read it;
/// 404 otherwise.
async fn find_readable(
    state: &AppState,
    db: &impl Queries,
    user: Option<Actor>,
    noteable: &Noteable,
    discussion_id: &str,
) -> Result<Discussion, ApiError> {
    let found = discussions::find(db, noteable.domain(), discussion_id)
        .await?
        .ok_or(ApiError::NotFound("Discussion"))?;
    readable(state, db, user, found)
        .await?
        .ok_or(ApiError::NotFound("Discussion"))
}

/// `GET …/discussions`: paginated, oldest first.
pub(super) async fn list<T: NoteTarget<Path = (i64, i32)>>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let (user, noteable) = T::find(&state, &req, path.into_inner()).await?;
    let db = state.pool.get().await?;
    let mut items = Vec::new();
    for discussion in discussions::list(&*db, noteable.domain()).await? {
        if let Some(d) = readable(&state, &*db, user, discussion).await? {
            items.push(discussion_json(&d, &noteable, &state.config.external_url));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

/// `GET …/discussions/:discussion_id`.
pub(super) async fn show<T: NoteTarget<Path = (i64, i32)>>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid, discussion_id) = path.into_inner();
    let (user, noteable) = T::find(&state, &req, (project, iid)).await?;
    let db = state.pool.get().await?;
    let found = find_readable(&state, &*db, user, &noteable, &discussion_id).await?;
    Ok(HttpResponse::Ok().json(discussion_json(
        &found,
        &noteable,
        &state.config.external_url,
    )))
}

#[derive(Debug, Deserialize)]
pub(super) struct NewDiscussionParams {
    body: String,
    /// A line of the merge request's diff (JSON object or
    /// `position[new_path]=…` form keys).
    position: Option<Position>,
    internal: Option<bool>,
    /// GitLab's older name for `internal`.
    confidential: Option<bool>,
}

/// Whether `position` names a file of the diff (when the diff is known):
/// GitLab places a diff note on a file of the merge request.
fn check_position_file(position: &Position, files: &[(String, String)]) -> Result<(), ApiError> {
    if files.is_empty()
        || files
            .iter()
            .any(|(old, new)| *new == position.new_path || *old == position.old_path)
    {
        return Ok(());
    }
    Err(ApiError::BadRequest(format!(
        "position[new_path] {:?} is not a file of the merge request's diff",
        position.new_path
    )))
}

/// `POST …/discussions`: starts a thread (on a diff line with `position`,
/// merge requests only); answers the new discussion.
pub(super) async fn create<T: NoteTarget<Path = (i64, i32)>>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    params: super::params::Params<NewDiscussionParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let me = super::Caller::writer(&req, &state).await?;
    let (user, noteable) = T::find(&state, &req, (project, iid)).await?;
    let p = params.into_inner();
    check_body(&p.body)?;
    let internal = p.internal.or(p.confidential).unwrap_or(false);
    if internal {
        may_write_internal(&state, &me, &noteable).await?;
    }
    if let Some(position) = &p.position {
        if noteable.kind != Kind::MergeRequest {
            return Err(ApiError::BadRequest(
                "position is only taken on merge requests".into(),
            ));
        }
        position.check()?;
        let files = super::merge_requests::changed_paths(&state, &req, project, iid).await?;
        check_position_file(position, &files)?;
    }
    let db = state.pool.get().await?;
    let note = discussions::start(
        &*db,
        NewThreadNote {
            noteable: noteable.domain(),
            author: Author {
                id: me.author_id(),
                on_behalf_of: me.on_behalf_of(),
            },
            body: p.body,
            internal,
            position: p.position,
            resolvable: noteable.domain().resolvable(),
        },
    )
    .await?;
    after_note(&*db, &noteable, &note, me.id).await;
    let created = find_readable(&state, &*db, user, &noteable, &note.discussion_id).await?;
    Ok(HttpResponse::Created().json(discussion_json(
        &created,
        &noteable,
        &state.config.external_url,
    )))
}

#[derive(Debug, Deserialize)]
pub(super) struct ReplyParams {
    body: String,
}

/// `POST …/discussions/:discussion_id/notes`: a reply in the thread (it
/// takes the thread's kind, internal flag and resolution); answers the note.
pub(super) async fn reply<T: NoteTarget<Path = (i64, i32)>>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32, String)>,
    params: super::params::Params<ReplyParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid, discussion_id) = path.into_inner();
    let me = super::Caller::writer(&req, &state).await?;
    let (user, noteable) = T::find(&state, &req, (project, iid)).await?;
    let body = params.into_inner().body;
    check_body(&body)?;
    let db = state.pool.get().await?;
    let thread = find_readable(&state, &*db, user, &noteable, &discussion_id).await?;
    if thread.internal() {
        may_write_internal(&state, &me, &noteable).await?;
    }
    let note = discussions::reply(
        &*db,
        noteable.domain(),
        &discussion_id,
        Author {
            id: me.author_id(),
            on_behalf_of: me.on_behalf_of(),
        },
        &body,
    )
    .await?
    .ok_or(ApiError::NotFound("Discussion"))?;
    after_note(&*db, &noteable, &note, me.id).await;
    Ok(HttpResponse::Created().json(note_json(&note, &noteable, &state.config.external_url)))
}

#[derive(Debug, Deserialize)]
pub(super) struct ResolveParams {
    resolved: bool,
}

/// `PUT …/discussions/:discussion_id` with `resolved`: who may resolve a
/// thread of a merge request (its starter, the merge request's author,
/// developers and above); a discussion that does not resolve is refused.
pub(super) async fn resolve<T: NoteTarget<Path = (i64, i32)>>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32, String)>,
    params: super::params::Params<ResolveParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid, discussion_id) = path.into_inner();
    let me = super::Caller::writer(&req, &state).await?;
    let (user, noteable) = T::find(&state, &req, (project, iid)).await?;
    let db = state.pool.get().await?;
    let thread = find_readable(&state, &*db, user, &noteable, &discussion_id).await?;
    let starter = thread.first().map_or(0, |n| n.author.id);
    let allowed = noteable.kind == Kind::MergeRequest
        && thread.resolvable()
        && state
            .policy
            .may_resolve_thread(&*db, Some(Actor::from(&me)), noteable.id, starter)
            .await?;
    if !allowed {
        return Err(ApiError::Forbidden);
    }
    discussions::resolve(
        &*db,
        noteable.domain(),
        &discussion_id,
        params.resolved,
        me.id,
    )
    .await?
    .ok_or(ApiError::NotFound("Discussion"))?;
    let updated = find_readable(&state, &*db, user, &noteable, &discussion_id).await?;
    Ok(HttpResponse::Ok().json(discussion_json(
        &updated,
        &noteable,
        &state.config.external_url,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_must_name_a_file_of_a_known_diff() {
        let position: Position = serde_json::from_value(json!({
            "base_sha": "aaaa", "start_sha": "bbbb", "head_sha": "cccc",
            "old_path": "a.rs", "new_path": "b.rs", "new_line": 1,
        }))
        .unwrap();
        assert!(check_position_file(&position, &[]).is_ok(), "diff unknown");
        assert!(check_position_file(&position, &[("a.rs".into(), "b.rs".into())]).is_ok());
        assert!(check_position_file(&position, &[("c.rs".into(), "c.rs".into())]).is_err());
    }
}
