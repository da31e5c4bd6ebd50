//! Group epics and their notes. As in GitLab, the epic endpoints take the epic's
//! `iid`, but the notes endpoints take its global `id`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::containers::{Container, readable_group};
use super::entities::{closed_by, references, user_basic};
use super::item_access::{Found, Item, find_readable};
use super::notes::{NoteTarget, Noteable};
use super::pagination::{PageParams, paged};
use crate::app_state::AppState;
use crate::policy::{Actor, WriteAbility};
use crate::work_items::Author;
use crate::work_items::epics::{self, Epic, EpicKey, NewEpic};

fn epic_json(epic: &Epic, base: &url::Url, full_path: &str) -> Value {
    let iid = epic.iid;
    json!({
        "id": epic.id,
        "iid": iid,
        "group_id": epic.group_id,
        "title": epic.title,
        "description": epic.description,
        "state": epic.state,
        "confidential": epic.confidential,
        "labels": epic.labels,
        "author": user_basic(&epic.author, base),
        "references": references(full_path, '&', iid),
        "web_url": format!("{}groups/{full_path}/-/epics/{iid}", base.as_str()),
        "created_at": epic.created_at,
        "updated_at": epic.updated_at,
        "closed_at": epic.closed_at,
        "closed_by": closed_by(epic.closed_by.as_ref(), base),
    })
}

pub(super) async fn list_epics(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let group = path.into_inner();
    let user = readable_group(&state, &req, group).await?;
    let db = state.pool.get().await?;
    let full_path = Container::Group(group).full_path(&*db).await?;
    let found = epics::list(&*db, group).await?;
    let readable = Item::EPIC.keep_readable(&state, &*db, user, found).await?;
    let items = readable
        .iter()
        .map(|e| epic_json(e, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(&req, q.into_inner(), items))
}

/// An epic of the group the caller may read, found by its iid or id.
pub(super) async fn find_epic(
    state: &AppState,
    req: &impl super::Caller,
    group: i64,
    key: EpicKey,
) -> Result<Found<Epic>, ApiError> {
    let container = Container::Group(group);
    find_readable(state, req, container, Item::EPIC, async |db| {
        epics::find(db, group, key).await
    })
    .await
}

pub(super) async fn show_epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (group, iid) = path.into_inner();
    let epic = find_epic(&state, &req, group, EpicKey::Iid(i64::from(iid))).await?;
    Ok(HttpResponse::Ok().json(epic_json(
        &epic.item,
        &state.config.external_url,
        &epic.full_path,
    )))
}

#[derive(Debug, Deserialize)]
pub(super) struct NewEpicParams {
    title: String,
    description: Option<String>,
    confidential: Option<bool>,
    labels: Option<super::params::LabelList>,
}

/// Creates an epic: planners and above in the group, and admins.
pub(super) async fn create_epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<NewEpicParams>,
) -> Result<HttpResponse, ApiError> {
    let group = path.into_inner();
    let me = Container::Group(group)
        .writer(&state, &req, WriteAbility::CreateEpic)
        .await?;
    let b = body.into_inner();
    if b.title.trim().is_empty() {
        return Err(ApiError::BadRequest("title is empty".into()));
    }
    let mut db = state.pool.get().await?;
    let epic = epics::create(
        &mut db,
        NewEpic {
            group,
            title: b.title,
            description: b.description.unwrap_or_default(),
            confidential: b.confidential.unwrap_or(false),
            labels: b.labels.unwrap_or_default().0,
            author: Author {
                id: me.author_id(),
                on_behalf_of: me.on_behalf_of(),
            },
        },
    )
    .await?;
    let full_path = Container::Group(group).full_path(&*db).await?;
    Ok(HttpResponse::Created().json(epic_json(&epic, &state.config.external_url, &full_path)))
}

/// Notes of an epic, which GitLab addresses by the epic's global id:
/// `/groups/{id}/epics/{epic_id}/notes`.
pub(super) struct EpicNotes;

impl NoteTarget for EpicNotes {
    type Path = (i64, i64);

    async fn find(
        state: &AppState,
        req: &impl super::Caller,
        (group, epic_id): (i64, i64),
    ) -> Result<(Option<Actor>, Noteable), ApiError> {
        let epic = find_epic(state, req, group, EpicKey::Id(epic_id)).await?;
        Ok((epic.user, Noteable::epic(epic_id, group)))
    }
}
