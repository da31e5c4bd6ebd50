//! Merge requests, their changes and their notes. There is no repository behind
//! the monolith: a merge request carries its diff as text (the `diff` field of the
//! create call, our addition), and the changes endpoints split it per file.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::common::{
    AUTHOR_COLUMNS, CLOSED_BY_COLUMNS, Container, author, closed_by, paged, readable_project,
    references, state_filter, ts,
};
use super::items::{Found, Item, created, find_readable, readable_rows};
use super::notes::{self, NoteTarget, Noteable};
use super::pagination::PageParams;
use super::{ApiError, diffs};
use crate::app_state::AppState;
use crate::policy::{Actor, WriteAbility};

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    let all = "/projects/{id}/merge_requests";
    let one = "/projects/{id}/merge_requests/{iid}";
    cfg.route(all, web::get().to(list_merge_requests))
        .route(all, web::post().to(create_merge_request))
        .route(one, web::get().to(show_merge_request))
        .route(
            one,
            web::put().to(super::item_updates::update_merge_request),
        )
        .route(
            &format!("{one}/changes"),
            web::get().to(merge_request_changes),
        )
        .route(&format!("{one}/diffs"), web::get().to(merge_request_diffs))
        .route(
            &format!("{one}/notes"),
            web::get().to(notes::list::<MergeRequestNotes>),
        )
        .route(
            &format!("{one}/notes"),
            web::post().to(notes::create::<MergeRequestNotes>),
        );
}

fn mr_sql() -> String {
    format!(
        "SELECT m.id, m.iid, m.project_id, m.title, m.description, m.state, m.source_branch, m.target_branch,
            m.labels, m.diff, m.created_at, m.updated_at, coalesce(m.closed_at, CASE WHEN m.state = 'closed' THEN m.updated_at END) AS closed_at, {AUTHOR_COLUMNS}, {CLOSED_BY_COLUMNS}
         FROM merge_requests m JOIN users u ON u.id = m.author_id LEFT JOIN users cb ON cb.id = m.closed_by_id"
    )
}

fn mr_json(row: &tokio_postgres::Row, base: &url::Url, full_path: &str) -> Value {
    let iid: i32 = row.get("iid");
    let state: String = row.get("state");
    // No merge history is kept: a merged request was merged at its last update.
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
        "closed_at": row.get::<_, Option<chrono::DateTime<chrono::Utc>>>("closed_at"),
        "closed_by": closed_by(row, base),
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
    let wanted = state_filter(
        q.state.as_deref(),
        &["opened", "closed", "merged", "locked"],
    )?;
    let db = state.pool.get().await?;
    let full_path = Container::Project(project).full_path(&*db).await?;
    let sql = format!(
        "{} WHERE m.project_id = $1 AND ($2::text IS NULL OR m.state = $2) ORDER BY m.id DESC",
        mr_sql()
    );
    let rows = readable_rows(
        &state,
        &*db,
        user,
        Item::MERGE_REQUEST,
        &sql,
        &[&project, &wanted],
    )
    .await?;
    let items = rows
        .iter()
        .map(|r| mr_json(r, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

/// A merge request the caller may read, with its project's full path; 404 otherwise.
pub(super) async fn find_merge_request(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    iid: i32,
) -> Result<Found, ApiError> {
    let sql = format!("{} WHERE m.project_id = $1 AND m.iid = $2", mr_sql());
    let project = Container::Project(project);
    find_readable(state, req, project, Item::MERGE_REQUEST, &sql, &iid).await
}

pub(super) async fn show_merge_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let mr = find_merge_request(&state, &req, project, iid).await?;
    Ok(HttpResponse::Ok().json(mr.json(&state, mr_json)))
}

#[derive(Debug, Deserialize)]
struct NewMergeRequest {
    source_branch: String,
    target_branch: String,
    title: String,
    description: Option<String>,
    labels: Option<super::params::LabelList>,
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
    body: super::params::Params<NewMergeRequest>,
) -> Result<HttpResponse, ApiError> {
    let project = path.into_inner();
    let me = Container::Project(project)
        .writer(&state, &req, WriteAbility::CreateMergeRequest)
        .await?;
    let b = body.into_inner();
    validate(&b)?;
    let labels = b.labels.clone().unwrap_or_default().0;
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
            "INSERT INTO merge_requests (project_id, iid, title, description, author_id, source_branch, target_branch, diff, labels, on_behalf_of_user_id)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM merge_requests WHERE project_id = $1), $2, $3, $4, $5, $6, $7, $8, $9)
             RETURNING id",
            &[
                &project,
                &b.title,
                &b.description.unwrap_or_default(),
                &me.author_id(),
                &b.source_branch,
                &b.target_branch,
                &b.diff.unwrap_or_default(),
                &labels,
                &me.on_behalf_of(),
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    let sql = format!("{} WHERE m.id = $1", mr_sql());
    created(&state, &*db, Container::Project(project), &sql, id, mr_json).await
}

/// The merge request's per-file changes: the real comparison of its branches
/// when the repository has both, else the diff stored with it.
async fn file_diffs(
    state: &AppState,
    project: i64,
    row: &tokio_postgres::Row,
) -> Result<Vec<diffs::FileDiff>, ApiError> {
    let source: String = row.get("source_branch");
    let target: String = row.get("target_branch");
    let compared = crate::repositories::branch_changes(
        &state.repositories,
        project,
        &source,
        &target,
        super::repository_commits::MAX_DIFF_FILES,
    )
    .await
    .map_err(super::repository::repository_error)?;
    Ok(match compared {
        Some(changes) => changes
            .into_iter()
            .map(|c| diffs::FileDiff {
                old_path: c.old_path,
                new_path: c.new_path,
                a_mode: c.a_mode,
                b_mode: c.b_mode,
                diff: c.diff,
                new_file: c.new_file,
                renamed_file: c.renamed_file,
                deleted_file: c.deleted_file,
                generated_file: false,
            })
            .collect(),
        None => diffs::parse(row.get::<_, &str>("diff")),
    })
}

/// The merge request with its `changes` (GitLab's older, unpaginated form).
async fn merge_request_changes(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let mr = find_merge_request(&state, &req, project, iid).await?;
    let changes = file_diffs(&state, project, &mr.row).await?;
    let mut body = mr.json(&state, mr_json);
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
    let mr = find_merge_request(&state, &req, project, iid).await?;
    let items = file_diffs(&state, project, &mr.row)
        .await?
        .into_iter()
        .map(|d| json!(d))
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

/// Notes of a merge request: `/projects/{id}/merge_requests/{iid}/notes`.
struct MergeRequestNotes;

impl NoteTarget for MergeRequestNotes {
    type Path = (i64, i32);

    async fn find(
        state: &AppState,
        req: &HttpRequest,
        (project, iid): (i64, i32),
    ) -> Result<(Option<Actor>, Noteable), ApiError> {
        let mr = find_merge_request(state, req, project, iid).await?;
        let noteable = Noteable::merge_request(mr.row.get("id"), iid, project);
        Ok((mr.user, noteable))
    }
}
