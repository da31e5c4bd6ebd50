//! Group epics and their notes. As in GitLab, the epic endpoints take the epic's
//! `iid`, but the notes endpoints take its global `id`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::common::{
    AUTHOR_COLUMNS, author, group_full_path, paged, readable_group, references, require_write,
    split_labels, ts,
};
use super::notes::{self, NewNote, NoteListParams, Noteable};
use super::pagination::PageParams;
use super::{ApiError, WRITE_SCOPES, require_user};
use crate::policy::{Ability, Actor, Subject, WriteAbility};
use crate::web::AppState;

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/groups/{id}/epics", web::get().to(list_epics))
        .route("/groups/{id}/epics", web::post().to(create_epic))
        .route("/groups/{id}/epics/{iid}", web::get().to(show_epic))
        .route(
            "/groups/{id}/epics/{epic_id}/notes",
            web::get().to(list_notes),
        )
        .route(
            "/groups/{id}/epics/{epic_id}/notes",
            web::post().to(create_note),
        );
}

fn epic_sql() -> String {
    format!(
        "SELECT e.id, e.iid, e.group_id, e.title, e.description, e.state, e.confidential, e.labels,
            e.created_at, e.updated_at, {AUTHOR_COLUMNS}
         FROM epics e JOIN users u ON u.id = e.author_id"
    )
}

fn epic_json(row: &tokio_postgres::Row, base: &url::Url, full_path: &str) -> Value {
    let iid: i32 = row.get("iid");
    let state: String = row.get("state");
    let closed = state == "closed";
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
        "closed_at": closed.then(|| ts(row, "updated_at")),
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
    let full_path = group_full_path(&**db, group).await?;
    let rows = db
        .query(
            &format!("{} WHERE e.group_id = $1 ORDER BY e.id DESC", epic_sql()),
            &[&group],
        )
        .await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(&**db, user, Ability::ReadEpic, Subject::Epic(row.get("id")))
            .await?
        {
            items.push(epic_json(&row, &state.config.external_url, &full_path));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

/// An epic of the group the caller may read, found by `column` (`iid` or `id`).
async fn find_epic(
    state: &AppState,
    req: &HttpRequest,
    group: i64,
    column: &'static str,
    key: i64,
) -> Result<(Option<Actor>, tokio_postgres::Row, String), ApiError> {
    let user = readable_group(state, req, group).await?;
    let db = state.pool.get().await?;
    let filter = match column {
        "iid" => "e.iid::bigint = $2",
        _ => "e.id = $2",
    };
    let row = db
        .query_opt(
            &format!("{} WHERE e.group_id = $1 AND {filter}", epic_sql()),
            &[&group, &key],
        )
        .await?
        .ok_or(ApiError::NotFound("Epic"))?;
    if !state
        .policy
        .can(&**db, user, Ability::ReadEpic, Subject::Epic(row.get("id")))
        .await?
    {
        return Err(ApiError::NotFound("Epic"));
    }
    let full_path = group_full_path(&**db, group).await?;
    Ok((user, row, full_path))
}

async fn show_epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (group, iid) = path.into_inner();
    let (_, row, full_path) = find_epic(&state, &req, group, "iid", i64::from(iid)).await?;
    Ok(HttpResponse::Ok().json(epic_json(&row, &state.config.external_url, &full_path)))
}

#[derive(Debug, Deserialize)]
struct NewEpic {
    title: String,
    description: Option<String>,
    confidential: Option<bool>,
    labels: Option<String>,
}

/// Creates an epic: planners and above in the group, and admins.
async fn create_epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<NewEpic>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let group = path.into_inner();
    readable_group(&state, &req, group).await?;
    require_write(&state, &me, WriteAbility::CreateEpic, Subject::Group(group)).await?;
    let b = body.into_inner();
    if b.title.trim().is_empty() {
        return Err(ApiError::BadRequest("title is empty".into()));
    }
    let labels = split_labels(b.labels.as_deref());
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    // Serialises iid allocation per group.
    tx.execute("SELECT 1 FROM groups WHERE id = $1 FOR UPDATE", &[&group])
        .await?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO epics (group_id, iid, title, description, author_id, confidential, labels)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM epics WHERE group_id = $1), $2, $3, $4, $5, $6)
             RETURNING id",
            &[
                &group,
                &b.title,
                &b.description.unwrap_or_default(),
                &me.id,
                &b.confidential.unwrap_or(false),
                &labels,
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    let row = db
        .query_one(&format!("{} WHERE e.id = $1", epic_sql()), &[&id])
        .await?;
    let full_path = group_full_path(&**db, group).await?;
    Ok(HttpResponse::Created().json(epic_json(&row, &state.config.external_url, &full_path)))
}

async fn list_notes(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
    q: web::Query<NoteListParams>,
) -> Result<HttpResponse, ApiError> {
    let (group, epic_id) = path.into_inner();
    let (user, _, _) = find_epic(&state, &req, group, "id", epic_id).await?;
    notes::list(
        &state,
        &req,
        user,
        Noteable::epic(epic_id, group),
        q.into_inner(),
    )
    .await
}

async fn create_note(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
    body: web::Json<NewNote>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let (group, epic_id) = path.into_inner();
    find_epic(&state, &req, group, "id", epic_id).await?;
    notes::create(
        &state,
        &me,
        Noteable::epic(epic_id, group),
        body.into_inner(),
    )
    .await
}
