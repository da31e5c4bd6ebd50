//! CI pipelines and jobs. Reading them needs `read_build` on the project (reporter
//! access in private projects): an unreadable project answers 404, a readable one
//! whose CI the caller may not see 403, as GitLab does.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::containers::{Container, project_full_path, readable_project};
use super::item_access::{Found, Item, find_readable};
use super::pagination::{PageParams, paged};
use super::param_values::sort_order;
use crate::app_state::AppState;
use crate::policy::{Ability, Subject, WriteAbility};
use crate::work_items::builds::{self, ImportedJob, Job, Pipeline, PipelineFilter, STATUSES};

/// Checks the caller may read the project's CI; returns the project's full path.
pub(super) async fn readable_ci(
    state: &AppState,
    req: &impl super::Caller,
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

pub(super) fn pipeline_json(pipeline: &Pipeline, base: &url::Url, full_path: &str) -> Value {
    let id = pipeline.id;
    json!({
        "id": id,
        "iid": pipeline.iid,
        "project_id": pipeline.project_id,
        "sha": pipeline.sha,
        "ref": pipeline.git_ref,
        "status": pipeline.status,
        // Imported from a CI system outside GitLab (see `POST .../jobs/import`).
        "source": "external",
        "created_at": pipeline.created_at,
        "updated_at": pipeline.finished_at.unwrap_or(pipeline.created_at),
        "finished_at": pipeline.finished_at,
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
pub(super) struct PipelineParams {
    page: Option<usize>,
    per_page: Option<usize>,
    status: Option<String>,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    sha: Option<String>,
    sort: Option<String>,
}

pub(super) async fn list_pipelines(
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
    let filter = PipelineFilter {
        status: q.status,
        git_ref: q.git_ref,
        sha: q.sha,
    };
    let db = state.pool.get().await?;
    let items = builds::pipelines(&*db, project, &filter, order)
        .await?
        .iter()
        .map(|p| pipeline_json(p, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

pub(super) async fn show_pipeline(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (project, pipeline) = path.into_inner();
    let full_path = readable_ci(&state, &req, project).await?;
    let db = state.pool.get().await?;
    let pipeline = builds::pipeline(&*db, project, pipeline)
        .await?
        .ok_or(ApiError::NotFound("Pipeline"))?;
    Ok(HttpResponse::Ok().json(pipeline_json(
        &pipeline,
        &state.config.external_url,
        &full_path,
    )))
}

// ---- jobs -----------------------------------------------------------------------

fn job_json(job: &Job, base: &url::Url, full_path: &str) -> Value {
    let id = job.id;
    json!({
        "id": id,
        "name": job.name,
        "stage": job.stage,
        "status": job.status,
        "ref": job.git_ref,
        "tag": false,
        "allow_failure": false,
        "pipeline": {
            "id": job.pipeline_id,
            "project_id": job.project_id,
            "ref": job.git_ref,
            "sha": job.sha,
            "status": job.pipeline_status,
        },
        "web_url": format!("{}{full_path}/-/jobs/{id}", base.as_str()),
        "created_at": job.created_at,
        "finished_at": job.finished_at,
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
pub(super) struct JobListParams {
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
    let wanted = scopes(req.query_string())?;
    let items = jobs_of(state, req, project, pipeline, &wanted).await?;
    Ok(paged(req, PageParams::new(q.page, q.per_page), items))
}

/// The jobs of the project (of one pipeline when given) with one of the
/// `wanted` statuses (any when empty), once the caller may read its CI.
pub(super) async fn jobs_of(
    state: &AppState,
    req: &impl super::Caller,
    project: i64,
    pipeline: Option<i64>,
    wanted: &[String],
) -> Result<Vec<Value>, ApiError> {
    let full_path = readable_ci(state, req, project).await?;
    let db = state.pool.get().await?;
    if let Some(pipeline) = pipeline
        && !builds::pipeline_exists(&*db, project, pipeline).await?
    {
        return Err(ApiError::NotFound("Pipeline"));
    }
    Ok(builds::jobs(&*db, project, pipeline, wanted)
        .await?
        .iter()
        .map(|j| job_json(j, &state.config.external_url, &full_path))
        .collect())
}

pub(super) async fn list_jobs(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<JobListParams>,
) -> Result<HttpResponse, ApiError> {
    jobs_where(&state, &req, path.into_inner(), None, q.into_inner()).await
}

pub(super) async fn pipeline_jobs(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
    q: web::Query<JobListParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, pipeline) = path.into_inner();
    jobs_where(&state, &req, project, Some(pipeline), q.into_inner()).await
}

#[derive(Deserialize)]
pub(super) struct ImportedJobParams {
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
pub(super) async fn import_job(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<ImportedJobParams>,
) -> Result<HttpResponse, ApiError> {
    let project = path.into_inner();
    let me = Container::Project(project)
        .writer(&state, &req, WriteAbility::ImportJob)
        .await?;
    let b = body.into_inner();
    if !STATUSES.contains(&b.status.as_str()) {
        return Err(ApiError::BadRequest(
            "status does not have a valid value".into(),
        ));
    }
    let mut db = state.pool.get().await?;
    let job = builds::import(
        &mut db,
        project,
        ImportedJob {
            name: b.name,
            stage: b.stage,
            status: b.status,
            git_ref: b.git_ref.unwrap_or_else(|| "main".into()),
            sha: b.sha.unwrap_or_else(|| "0000000".into()),
            log: b.log.unwrap_or_default(),
        },
    )
    .await?;
    if job.status == "failed"
        && let Err(e) =
            crate::review::triggers::job_failed(&*db, project, job.pipeline_id, job.id, me.id).await
    {
        // The job is stored; only the fix flow is missed.
        tracing::warn!(project_id = project, error = %e, "the failed-pipeline trigger could not be queued");
    }
    let full_path = Container::Project(project).full_path(&*db).await?;
    Ok(HttpResponse::Created().json(job_json(&job, &state.config.external_url, &full_path)))
}

/// A job of the project the caller may read; 404 otherwise.
async fn find_job(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    job: i64,
) -> Result<Found<Job>, ApiError> {
    let container = Container::Project(project);
    find_readable(state, req, container, Item::JOB, async |db| {
        builds::job(db, project, job).await
    })
    .await
}

pub(super) async fn show_job(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (project, job) = path.into_inner();
    let job = find_job(&state, &req, project, job).await?;
    Ok(HttpResponse::Ok().json(job_json(
        &job.item,
        &state.config.external_url,
        &job.full_path,
    )))
}

pub(super) async fn job_trace(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (project, job) = path.into_inner();
    let job = find_job(&state, &req, project, job).await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(job.item.log))
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
