//! CI pipelines and jobs. Reading them needs `read_build` on the project (reporter
//! access in private projects): an unreadable project answers 404, a readable one
//! whose CI the caller may not see 403, as GitLab does.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::common::{Container, paged, project_full_path, readable_project, sort_order, ts};
use super::items::{Found, Item, created, find_readable};
use super::pagination::PageParams;
use crate::app_state::AppState;
use crate::policy::{Ability, Subject, WriteAbility};

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/projects/{id}/pipelines", web::get().to(list_pipelines))
        .route(
            "/projects/{id}/pipelines/{pipeline_id}",
            web::get().to(show_pipeline),
        )
        .route(
            "/projects/{id}/pipelines/{pipeline_id}/jobs",
            web::get().to(pipeline_jobs),
        )
        .route("/projects/{id}/jobs", web::get().to(list_jobs))
        .route("/projects/{id}/jobs/import", web::post().to(import_job))
        .route("/projects/{id}/jobs/{job_id}", web::get().to(show_job))
        .route(
            "/projects/{id}/jobs/{job_id}/trace",
            web::get().to(job_trace),
        );
}

const STATUSES: &[&str] = &[
    "created", "pending", "running", "success", "failed", "canceled", "skipped", "manual",
];

/// Checks the caller may read the project's CI; returns the project's full path.
async fn readable_ci(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
) -> Result<String, ApiError> {
    let user = readable_project(state, req, project).await?;
    let db = state.pool.get().await?;
    if !state
        .policy
        .can(&*db, user, Ability::ReadBuild, Subject::Project(project))
        .await?
    {
        return Err(ApiError::Forbidden);
    }
    project_full_path(&*db, project).await
}

// ---- pipelines ------------------------------------------------------------------

/// Pipelines have no iid column: it is their position among the project's
/// pipelines, which only ever grow.
const PIPELINE_SQL: &str = "SELECT p.id, p.project_id, p.ref, p.sha, p.status, p.created_at,
        (SELECT count(*) FROM ci_pipelines o WHERE o.project_id = p.project_id AND o.id <= p.id)::int AS iid,
        (SELECT max(b.finished_at) FROM ci_builds b WHERE b.pipeline_id = p.id) AS finished_at
    FROM ci_pipelines p";

fn pipeline_json(row: &tokio_postgres::Row, base: &url::Url, full_path: &str) -> Value {
    let id: i64 = row.get("id");
    let created_at = ts(row, "created_at");
    let finished_at: Option<DateTime<Utc>> = row.get("finished_at");
    json!({
        "id": id,
        "iid": row.get::<_, i32>("iid"),
        "project_id": row.get::<_, i64>("project_id"),
        "sha": row.get::<_, String>("sha"),
        "ref": row.get::<_, String>("ref"),
        "status": row.get::<_, String>("status"),
        // Imported from a CI system outside GitLab (see `POST .../jobs/import`).
        "source": "external",
        "created_at": created_at,
        "updated_at": finished_at.unwrap_or(created_at),
        "finished_at": finished_at,
        "web_url": format!("{}{full_path}/-/pipelines/{id}", base.as_str()),
    })
}

fn check_status(status: Option<&str>) -> Result<(), ApiError> {
    match status {
        Some(s) if !STATUSES.contains(&s) => Err(ApiError::BadRequest(
            "status does not have a valid value".into(),
        )),
        _ => Ok(()),
    }
}

#[derive(Debug, Deserialize)]
struct PipelineParams {
    page: Option<usize>,
    per_page: Option<usize>,
    status: Option<String>,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    sha: Option<String>,
    sort: Option<String>,
}

async fn list_pipelines(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<PipelineParams>,
) -> Result<HttpResponse, ApiError> {
    let project = path.into_inner();
    let full_path = readable_ci(&state, &req, project).await?;
    let q = q.into_inner();
    check_status(q.status.as_deref())?;
    let order = sort_order(q.sort.as_deref())?;
    let db = state.pool.get().await?;
    let rows = db
        .query(
            &format!(
                "{PIPELINE_SQL} WHERE p.project_id = $1 AND ($2::text IS NULL OR p.status = $2)
                 AND ($3::text IS NULL OR p.ref = $3) AND ($4::text IS NULL OR p.sha = $4)
                 ORDER BY p.id {order}"
            ),
            &[&project, &q.status, &q.git_ref, &q.sha],
        )
        .await?;
    let items = rows
        .iter()
        .map(|r| pipeline_json(r, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

async fn show_pipeline(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (project, pipeline) = path.into_inner();
    let full_path = readable_ci(&state, &req, project).await?;
    let db = state.pool.get().await?;
    let row = db
        .query_opt(
            &format!("{PIPELINE_SQL} WHERE p.id = $1 AND p.project_id = $2"),
            &[&pipeline, &project],
        )
        .await?
        .ok_or(ApiError::NotFound("Pipeline"))?;
    Ok(HttpResponse::Ok().json(pipeline_json(&row, &state.config.external_url, &full_path)))
}

// ---- jobs -----------------------------------------------------------------------

const JOB_SQL: &str = "SELECT b.id, b.name, b.stage, b.status, b.project_id, b.pipeline_id, b.created_at, b.finished_at, b.log,
        p.ref, p.sha, p.status AS pipeline_status
    FROM ci_builds b JOIN ci_pipelines p ON p.id = b.pipeline_id";

fn job_json(row: &tokio_postgres::Row, base: &url::Url, full_path: &str) -> Value {
    let id: i64 = row.get("id");
    json!({
        "id": id,
        "name": row.get::<_, String>("name"),
        "stage": row.get::<_, String>("stage"),
        "status": row.get::<_, String>("status"),
        "ref": row.get::<_, String>("ref"),
        "tag": false,
        "allow_failure": false,
        "pipeline": {
            "id": row.get::<_, i64>("pipeline_id"),
            "project_id": row.get::<_, i64>("project_id"),
            "ref": row.get::<_, String>("ref"),
            "sha": row.get::<_, String>("sha"),
            "status": row.get::<_, String>("pipeline_status"),
        },
        "web_url": format!("{}{full_path}/-/jobs/{id}", base.as_str()),
        "created_at": ts(row, "created_at"),
        "finished_at": row.get::<_, Option<DateTime<Utc>>>("finished_at"),
    })
}

/// `scope` or `scope[]`, once or repeated: the job statuses to keep.
fn scopes(query: &str) -> Result<Vec<String>, ApiError> {
    let wanted: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "scope" || k == "scope[]")
        .map(|(_, v)| v.into_owned())
        .collect();
    if let Some(bad) = wanted.iter().find(|s| !STATUSES.contains(&s.as_str())) {
        return Err(ApiError::BadRequest(format!(
            "scope does not have a valid value: {bad}"
        )));
    }
    Ok(wanted)
}

#[derive(Debug, Deserialize)]
struct JobListParams {
    page: Option<usize>,
    per_page: Option<usize>,
}

async fn jobs_where(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    pipeline: Option<i64>,
    q: JobListParams,
) -> Result<HttpResponse, ApiError> {
    let full_path = readable_ci(state, req, project).await?;
    let wanted = scopes(req.query_string())?;
    let db = state.pool.get().await?;
    if let Some(pipeline) = pipeline
        && db
            .query_opt(
                "SELECT 1 FROM ci_pipelines WHERE id = $1 AND project_id = $2",
                &[&pipeline, &project],
            )
            .await?
            .is_none()
    {
        return Err(ApiError::NotFound("Pipeline"));
    }
    let rows = db
        .query(
            &format!(
                "{JOB_SQL} WHERE b.project_id = $1 AND ($2::bigint IS NULL OR b.pipeline_id = $2)
                 AND (cardinality($3::text[]) = 0 OR b.status = ANY($3)) ORDER BY b.id DESC"
            ),
            &[&project, &pipeline, &wanted],
        )
        .await?;
    let items = rows
        .iter()
        .map(|r| job_json(r, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(req, PageParams::new(q.page, q.per_page), items))
}

async fn list_jobs(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<JobListParams>,
) -> Result<HttpResponse, ApiError> {
    jobs_where(&state, &req, path.into_inner(), None, q.into_inner()).await
}

async fn pipeline_jobs(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
    q: web::Query<JobListParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, pipeline) = path.into_inner();
    jobs_where(&state, &req, project, Some(pipeline), q.into_inner()).await
}

#[derive(Deserialize)]
struct ImportedJob {
    name: String,
    stage: String,
    status: String,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    sha: Option<String>,
    log: Option<String>,
}

/// GitLab has no API to create CI jobs; this documented endpoint imports a finished
/// job and its log (a pipeline is created for it). Maintainers and admins only.
async fn import_job(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<ImportedJob>,
) -> Result<HttpResponse, ApiError> {
    let project = path.into_inner();
    Container::Project(project)
        .writer(&state, &req, WriteAbility::ImportJob)
        .await?;
    let b = body.into_inner();
    if !STATUSES.contains(&b.status.as_str()) {
        return Err(ApiError::BadRequest(
            "status does not have a valid value".into(),
        ));
    }
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    let pipeline: i64 = tx
        .query_one(
            "INSERT INTO ci_pipelines (project_id, ref, sha, status) VALUES ($1, $2, $3, $4) RETURNING id",
            &[&project, &b.git_ref.unwrap_or_else(|| "main".into()), &b.sha.unwrap_or_else(|| "0000000".into()), &b.status],
        )
        .await?
        .get(0);
    let id: i64 = tx
        .query_one(
            "INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status, log, finished_at)
             VALUES ($1, $2, $3, $4, $5, $6, now()) RETURNING id",
            &[
                &project,
                &pipeline,
                &b.name,
                &b.stage,
                &b.status,
                &b.log.unwrap_or_default(),
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    let sql = format!("{JOB_SQL} WHERE b.id = $1");
    created(
        &state,
        &*db,
        Container::Project(project),
        &sql,
        id,
        job_json,
    )
    .await
}

/// A job of the project the caller may read; 404 otherwise.
async fn find_job(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    job: i64,
) -> Result<Found, ApiError> {
    let sql = format!("{JOB_SQL} WHERE b.project_id = $1 AND b.id = $2");
    let project = Container::Project(project);
    find_readable(state, req, project, Item::JOB, &sql, &job).await
}

async fn show_job(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (project, job) = path.into_inner();
    let job = find_job(&state, &req, project, job).await?;
    Ok(HttpResponse::Ok().json(job.json(&state, job_json)))
}

async fn job_trace(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (project, job) = path.into_inner();
    let job = find_job(&state, &req, project, job).await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(job.row.get::<_, String>("log")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_accept_both_spellings_and_refuse_unknown_statuses() {
        assert_eq!(
            scopes("scope[]=failed&scope=success&page=2").unwrap(),
            vec!["failed", "success"]
        );
        assert_eq!(scopes("scope%5B%5D=failed").unwrap(), vec!["failed"]);
        assert!(scopes("").unwrap().is_empty());
        assert!(scopes("scope=exploded").is_err());
    }
}
