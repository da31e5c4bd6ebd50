//! Group epics and their notes. As in GitLab, the epic endpoints take the epic's
//! `iid`, but the notes endpoints take its global `id`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::common::{
    AUTHOR_COLUMNS, CLOSED_BY_COLUMNS, Container, author, closed_by, paged, readable_group,
    references, ts,
};
use super::items::{Found, Item, created, find_readable, readable_rows};
use super::notes::{self, NoteTarget, Noteable};
use super::pagination::PageParams;
use crate::app_state::AppState;
use crate::policy::{Actor, WriteAbility};

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/groups/{id}/epics", web::get().to(list_epics))
        .route("/groups/{id}/epics", web::post().to(create_epic))
        .route("/groups/{id}/epics/{iid}", web::get().to(show_epic))
        .route(
            "/groups/{id}/epics/{iid}",
            web::put().to(super::item_updates::update_epic),
        )
        .route(
            "/groups/{id}/epics/{epic_id}/notes",
            web::get().to(notes::list::<EpicNotes>),
        )
        .route(
            "/groups/{id}/epics/{epic_id}/notes",
            web::post().to(notes::create::<EpicNotes>),
        );
}

fn epic_sql() -> String {
    format!(
        "SELECT e.id, e.iid, e.group_id, e.title, e.description, e.state, e.confidential, e.labels,
            e.created_at, e.updated_at, coalesce(e.closed_at, CASE WHEN e.state = 'closed' THEN e.updated_at END) AS closed_at, {AUTHOR_COLUMNS}, {CLOSED_BY_COLUMNS}
         FROM epics e JOIN users u ON u.id = e.author_id LEFT JOIN users cb ON cb.id = e.closed_by_id"
    )
}

fn epic_json(row: &tokio_postgres::Row, base: &url::Url, full_path: &str) -> Value {
    let iid: i32 = row.get("iid");
    let state: String = row.get("state");
    json!({
        "id": row.get::<_, i64>("id"),
        "iid": iid,
        "group_id": row.get::<_, i64>("group_id"),
        "title": row.get::<_, String>("title"),
        "description": row.get::<_, String>("description"),
        "state": state,
        "confidential": row.get::<_, bool>("confidential"),
        "labels": row.get::<_, Vec<String>>("labels"),
        "author": author(row, base),
        "references": references(full_path, '&', iid),
        "web_url": format!("{}groups/{full_path}/-/epics/{iid}", base.as_str()),
        "created_at": ts(row, "created_at"),
        "updated_at": ts(row, "updated_at"),
        "closed_at": row.get::<_, Option<chrono::DateTime<chrono::Utc>>>("closed_at"),
        "closed_by": closed_by(row, base),
    })
}

async fn list_epics(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let group = path.into_inner();
    let user = readable_group(&state, &req, group).await?;
    let db = state.pool.get().await?;
    let full_path = Container::Group(group).full_path(&*db).await?;
    let sql = format!("{} WHERE e.group_id = $1 ORDER BY e.id DESC", epic_sql());
    let rows = readable_rows(&state, &*db, user, Item::EPIC, &sql, &[&group]).await?;
    let items = rows
        .iter()
        .map(|r| epic_json(r, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(&req, q.into_inner(), items))
}

/// An epic of the group the caller may read, found by `column` (`iid` or `id`).
pub(super) async fn find_epic(
    state: &AppState,
    req: &HttpRequest,
    group: i64,
    column: &'static str,
    key: i64,
) -> Result<Found, ApiError> {
    let filter = match column {
        "iid" => "e.iid::bigint = $2",
        _ => "e.id = $2",
    };
    let sql = format!("{} WHERE e.group_id = $1 AND {filter}", epic_sql());
    find_readable(state, req, Container::Group(group), Item::EPIC, &sql, &key).await
}

pub(super) async fn show_epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (group, iid) = path.into_inner();
    let epic = find_epic(&state, &req, group, "iid", i64::from(iid)).await?;
    Ok(HttpResponse::Ok().json(epic.json(&state, epic_json)))
}

#[derive(Debug, Deserialize)]
struct NewEpic {
    title: String,
    description: Option<String>,
    confidential: Option<bool>,
    labels: Option<super::params::LabelList>,
}

/// Creates an epic: planners and above in the group, and admins.
async fn create_epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<NewEpic>,
) -> Result<HttpResponse, ApiError> {
    let group = path.into_inner();
    let me = Container::Group(group)
        .writer(&state, &req, WriteAbility::CreateEpic)
        .await?;
    let b = body.into_inner();
    if b.title.trim().is_empty() {
        return Err(ApiError::BadRequest("title is empty".into()));
    }
    let labels = b.labels.clone().unwrap_or_default().0;
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    // Serialises iid allocation per group.
    tx.execute("SELECT 1 FROM groups WHERE id = $1 FOR UPDATE", &[&group])
        .await?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO epics (group_id, iid, title, description, author_id, confidential, labels, on_behalf_of_user_id)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM epics WHERE group_id = $1), $2, $3, $4, $5, $6, $7)
             RETURNING id",
            &[
                &group,
                &b.title,
                &b.description.unwrap_or_default(),
                &me.author_id(),
                &b.confidential.unwrap_or(false),
                &labels,
                &me.on_behalf_of(),
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    let sql = format!("{} WHERE e.id = $1", epic_sql());
    created(&state, &*db, Container::Group(group), &sql, id, epic_json).await
}

/// Notes of an epic, which GitLab addresses by the epic's global id:
/// `/groups/{id}/epics/{epic_id}/notes`.
struct EpicNotes;

impl NoteTarget for EpicNotes {
    type Path = (i64, i64);

    async fn find(
        state: &AppState,
        req: &HttpRequest,
        (group, epic_id): (i64, i64),
    ) -> Result<(Option<Actor>, Noteable), ApiError> {
        let epic = find_epic(state, req, group, "id", epic_id).await?;
        Ok((epic.user, Noteable::epic(epic_id, group)))
    }
}
