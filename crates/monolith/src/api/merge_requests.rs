//! Merge requests, their changes and their notes. There is no repository behind
//! the monolith: a merge request carries its diff as text (the `diff` field of the
//! create call, our addition), and the changes endpoints split it per file.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::common::{
    AUTHOR_COLUMNS, author, paged, project_full_path, readable_project, references, require_write,
    split_labels, ts,
};
use super::notes::{self, NewNote, NoteListParams, Noteable};
use super::pagination::PageParams;
use super::{ApiError, WRITE_SCOPES, diffs, require_user};
use crate::policy::{Ability, Actor, Subject, WriteAbility};
use crate::web::AppState;

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/projects/{id}/merge_requests",
        web::get().to(list_merge_requests),
    )
    .route(
        "/projects/{id}/merge_requests",
        web::post().to(create_merge_request),
    )
    .route(
        "/projects/{id}/merge_requests/{iid}",
        web::get().to(show_merge_request),
    )
    .route(
        "/projects/{id}/merge_requests/{iid}/changes",
        web::get().to(merge_request_changes),
    )
    .route(
        "/projects/{id}/merge_requests/{iid}/diffs",
        web::get().to(merge_request_diffs),
    )
    .route(
        "/projects/{id}/merge_requests/{iid}/notes",
        web::get().to(list_notes),
    )
    .route(
        "/projects/{id}/merge_requests/{iid}/notes",
        web::post().to(create_note),
    );
}

fn mr_sql() -> String {
    format!(
        "SELECT m.id, m.iid, m.project_id, m.title, m.description, m.state, m.source_branch, m.target_branch,
            m.labels, m.diff, m.created_at, m.updated_at, {AUTHOR_COLUMNS}
         FROM merge_requests m JOIN users u ON u.id = m.author_id"
    )
}

fn mr_json(row: &tokio_postgres::Row, base: &url::Url, full_path: &str) -> Value {
    let iid: i32 = row.get("iid");
    let state: String = row.get("state");
    // No state history is kept: a closed or merged request was closed or merged
    // at its last update.
    let closed = state == "closed";
    let merged = state == "merged";
    json!({
        "id": row.get::<_, i64>("id"),
        "iid": iid,
        "project_id": row.get::<_, i64>("project_id"),
        "title": row.get::<_, String>("title"),
        "description": row.get::<_, String>("description"),
        "state": state,
        "source_branch": row.get::<_, String>("source_branch"),
        "target_branch": row.get::<_, String>("target_branch"),
        "source_project_id": row.get::<_, i64>("project_id"),
        "target_project_id": row.get::<_, i64>("project_id"),
        "labels": row.get::<_, Vec<String>>("labels"),
        "draft": false,
        "work_in_progress": false,
        "author": author(row, base),
        "references": references(full_path, '!', iid),
        "web_url": format!("{}{full_path}/-/merge_requests/{iid}", base.as_str()),
        "created_at": ts(row, "created_at"),
        "updated_at": ts(row, "updated_at"),
        "closed_at": closed.then(|| ts(row, "updated_at")),
        "merged_at": merged.then(|| ts(row, "updated_at")),
    })
}

#[derive(Debug, Deserialize)]
struct ListParams {
    page: Option<usize>,
    per_page: Option<usize>,
    state: Option<String>,
}

async fn list_merge_requests(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<ListParams>,
) -> Result<HttpResponse, ApiError> {
    let project = path.into_inner();
    let user = readable_project(&state, &req, project).await?;
    let q = q.into_inner();
    let wanted = match q.state.as_deref() {
        None | Some("all") => None,
        Some(s @ ("opened" | "closed" | "merged" | "locked")) => Some(s.to_owned()),
        Some(_) => {
            return Err(ApiError::BadRequest(
                "state does not have a valid value".into(),
            ));
        }
    };
    let db = state.pool.get().await?;
    let full_path = project_full_path(&**db, project).await?;
    let rows = db
        .query(
            &format!(
                "{} WHERE m.project_id = $1 AND ($2::text IS NULL OR m.state = $2) ORDER BY m.id DESC",
                mr_sql()
            ),
            &[&project, &wanted],
        )
        .await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(
                &**db,
                user,
                Ability::ReadMergeRequest,
                Subject::MergeRequest(row.get("id")),
            )
            .await?
        {
            items.push(mr_json(&row, &state.config.external_url, &full_path));
        }
    }
    let page = PageParams {
        page: q.page,
        per_page: q.per_page,
    };
    Ok(paged(&req, page, items))
}

/// A merge request the caller may read, with its project's full path; 404 otherwise.
async fn find_merge_request(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    iid: i32,
) -> Result<(Option<Actor>, tokio_postgres::Row, String), ApiError> {
    let user = readable_project(state, req, project).await?;
    let db = state.pool.get().await?;
    let row = db
        .query_opt(
            &format!("{} WHERE m.project_id = $1 AND m.iid = $2", mr_sql()),
            &[&project, &iid],
        )
        .await?
        .ok_or(ApiError::NotFound("Merge Request"))?;
    if !state
        .policy
        .can(
            &**db,
            user,
            Ability::ReadMergeRequest,
            Subject::MergeRequest(row.get("id")),
        )
        .await?
    {
        return Err(ApiError::NotFound("Merge Request"));
    }
    let full_path = project_full_path(&**db, project).await?;
    Ok((user, row, full_path))
}

async fn show_merge_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let (_, row, full_path) = find_merge_request(&state, &req, project, iid).await?;
    Ok(HttpResponse::Ok().json(mr_json(&row, &state.config.external_url, &full_path)))
}

#[derive(Debug, Deserialize)]
struct NewMergeRequest {
    source_branch: String,
    target_branch: String,
    title: String,
    description: Option<String>,
    labels: Option<String>,
    /// Our addition: the change as a unified diff (there is no repository to
    /// compute it from).
    diff: Option<String>,
}

fn validate(b: &NewMergeRequest) -> Result<(), ApiError> {
    for (name, value) in [
        ("title", &b.title),
        ("source_branch", &b.source_branch),
        ("target_branch", &b.target_branch),
    ] {
        if value.trim().is_empty() {
            return Err(ApiError::BadRequest(format!("{name} is empty")));
        }
    }
    if b.source_branch == b.target_branch {
        return Err(ApiError::invalid(
            "validate_branches",
            "You can't use same project/branch for source and target",
        ));
    }
    if let Some(diff) = b.diff.as_deref()
        && !diff.trim().is_empty()
        && diffs::parse(diff).is_empty()
    {
        return Err(ApiError::invalid(
            "diff",
            "is not a unified diff (no file header found)",
        ));
    }
    Ok(())
}

/// Opens a merge request: developers and above, and admins.
async fn create_merge_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<NewMergeRequest>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let project = path.into_inner();
    readable_project(&state, &req, project).await?;
    require_write(
        &state,
        &me,
        WriteAbility::CreateMergeRequest,
        Subject::Project(project),
    )
    .await?;
    let b = body.into_inner();
    validate(&b)?;
    let labels = split_labels(b.labels.as_deref());
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    // Serialises iid allocation and the open-duplicate check per project.
    tx.execute(
        "SELECT 1 FROM projects WHERE id = $1 FOR UPDATE",
        &[&project],
    )
    .await?;
    if let Some(open) = tx
        .query_opt(
            "SELECT iid FROM merge_requests WHERE project_id = $1 AND source_branch = $2 AND target_branch = $3
             AND state = 'opened' ORDER BY iid LIMIT 1",
            &[&project, &b.source_branch, &b.target_branch],
        )
        .await?
    {
        let iid: i32 = open.get(0);
        return Err(ApiError::Conflict(format!(
            "Another open merge request already exists for this source branch: !{iid}"
        )));
    }
    let id: i64 = tx
        .query_one(
            "INSERT INTO merge_requests (project_id, iid, title, description, author_id, source_branch, target_branch, diff, labels)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM merge_requests WHERE project_id = $1), $2, $3, $4, $5, $6, $7, $8)
             RETURNING id",
            &[
                &project,
                &b.title,
                &b.description.unwrap_or_default(),
                &me.id,
                &b.source_branch,
                &b.target_branch,
                &b.diff.unwrap_or_default(),
                &labels,
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    let row = db
        .query_one(&format!("{} WHERE m.id = $1", mr_sql()), &[&id])
        .await?;
    let full_path = project_full_path(&**db, project).await?;
    Ok(HttpResponse::Created().json(mr_json(&row, &state.config.external_url, &full_path)))
}

/// The merge request with its `changes` (GitLab's older, unpaginated form).
async fn merge_request_changes(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let (_, row, full_path) = find_merge_request(&state, &req, project, iid).await?;
    let changes = diffs::parse(row.get::<_, &str>("diff"));
    let mut body = mr_json(&row, &state.config.external_url, &full_path);
    if let Some(obj) = body.as_object_mut() {
        obj.insert("changes_count".into(), json!(changes.len().to_string()));
        obj.insert("changes".into(), json!(changes));
        obj.insert("overflow".into(), json!(false));
    }
    Ok(HttpResponse::Ok().json(body))
}

#[derive(Debug, Deserialize)]
struct DiffParams {
    page: Option<usize>,
    per_page: Option<usize>,
}

/// The per-file diffs of the merge request, paginated.
async fn merge_request_diffs(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    q: web::Query<DiffParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let (_, row, _) = find_merge_request(&state, &req, project, iid).await?;
    let items = diffs::parse(row.get::<_, &str>("diff"))
        .into_iter()
        .map(|d| json!(d))
        .collect();
    let page = PageParams {
        page: q.page,
        per_page: q.per_page,
    };
    Ok(paged(&req, page, items))
}

async fn list_notes(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    q: web::Query<NoteListParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let (user, row, _) = find_merge_request(&state, &req, project, iid).await?;
    let noteable = Noteable::merge_request(row.get("id"), iid, project);
    notes::list(&state, &req, user, noteable, q.into_inner()).await
}

async fn create_note(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    body: web::Json<NewNote>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let (project, iid) = path.into_inner();
    let (_, row, _) = find_merge_request(&state, &req, project, iid).await?;
    let noteable = Noteable::merge_request(row.get("id"), iid, project);
    notes::create(&state, &me, noteable, body.into_inner()).await
}
