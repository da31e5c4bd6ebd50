//! Branches and tags in GitLab's shapes.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::pagination::PageParams;
use super::repository_access::{
    Repo, blocking, readable_repo, record_update, repository_error, required, writable_repo,
};
use super::repository_commits::commit_json;
use crate::app_state::AppState;
use crate::policy::{Actor, PushAccess};
use crate::repositories::{reader, writer};

/// What the caller may do with branches, for the `can_push` field.
async fn push_access(state: &AppState, repo: &Repo) -> Result<PushAccess, ApiError> {
    let Some(user) = &repo.user else {
        return Ok(PushAccess::None);
    };
    let db = state.pool.get().await?;
    Ok(state
        .policy
        .push_access(&*db, Some(Actor::from(user)), repo.project_id)
        .await?)
}

async fn branch_json(
    state: &AppState,
    repo: &Repo,
    name: &str,
    target: &str,
    access: PushAccess,
    protect_default: bool,
) -> Result<Value, ApiError> {
    let (path, id) = (repo.path.clone(), target.to_owned());
    let commit = blocking(move || reader::commit(&path, &id)).await?;
    let default = name == repo.default_branch;
    let protected = default && protect_default;
    let can_push = match access {
        PushAccess::All => true,
        PushAccess::UnprotectedBranches => !protected,
        PushAccess::None => false,
    };
    Ok(json!({
        "name": name,
        "merged": false,
        "protected": protected,
        "default": default,
        "developers_can_push": !protected,
        "developers_can_merge": !protected,
        "can_push": can_push,
        "web_url": format!("{}/-/tree/{name}", repo.web_url(state)),
        "commit": commit_json(repo, state, &commit),
    }))
}

async fn protects_default(state: &AppState, project_id: i64) -> Result<bool, ApiError> {
    let db = state.pool.get().await?;
    Ok(crate::namespaces::projects::protects_default_branch(&*db, project_id).await?)
}

#[derive(Debug, Deserialize)]
pub(super) struct BranchList {
    search: Option<String>,
    page: Option<usize>,
    per_page: Option<usize>,
}

pub(super) async fn list_branches(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<i64>,
    q: web::Query<BranchList>,
) -> Result<HttpResponse, ApiError> {
    let repo = readable_repo(&state, &req, id.into_inner()).await?;
    let path = repo.path.clone();
    let refs = blocking(move || reader::refs(&path)).await?;
    let search = q.search.as_deref().map(str::to_lowercase);
    let names: Vec<(String, String)> = refs
        .branches
        .into_iter()
        .filter(|(name, _)| {
            search
                .as_deref()
                .is_none_or(|s| name.to_lowercase().contains(s))
        })
        .collect();
    let page = PageParams::new(q.page, q.per_page).resolve();
    let total = names.len();
    let access = push_access(&state, &repo).await?;
    let protect = protects_default(&state, repo.project_id).await?;
    let mut items = Vec::new();
    for (name, target) in page.slice(names) {
        items.push(branch_json(&state, &repo, &name, &target, access, protect).await?);
    }
    let mut response = HttpResponse::Ok();
    page.headers(&mut response, &req, total);
    Ok(response.json(items))
}

pub(super) async fn show_branch(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, name) = path.into_inner();
    let repo = readable_repo(&state, &req, project_id).await?;
    let p = repo.path.clone();
    let refs = blocking(move || reader::refs(&p)).await?;
    let target = refs
        .branches
        .get(&name)
        .ok_or(ApiError::NotFound("Branch"))?;
    let access = push_access(&state, &repo).await?;
    let protect = protects_default(&state, project_id).await?;
    Ok(HttpResponse::Ok().json(branch_json(&state, &repo, &name, target, access, protect).await?))
}

#[derive(Debug, Deserialize)]
pub(super) struct NewBranch {
    branch: Option<String>,
    #[serde(rename = "ref")]
    rev: Option<String>,
}

pub(super) async fn create_branch(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<i64>,
    body: super::params::Params<NewBranch>,
) -> Result<HttpResponse, ApiError> {
    let project_id = id.into_inner();
    let b = body.into_inner();
    let name = required(&b.branch, "branch")?.to_owned();
    let rev = required(&b.rev, "ref")?.to_owned();
    let (repo, me) = writable_repo(&state, &req, project_id, &name).await?;
    let update = writer::create_branch(&repo.path, &name, &rev)
        .await
        .map_err(|e| match e {
            crate::repositories::RepositoryError::Invalid(msg)
                if msg == "Invalid reference name" =>
            {
                ApiError::Invalid(Value::String(format!("Invalid reference name: {rev}")))
            }
            other => repository_error(other),
        })?;
    let target = update.after.clone();
    record_update(&state, project_id, me.author_id(), update).await?;
    let access = push_access(&state, &repo).await?;
    let protect = protects_default(&state, project_id).await?;
    Ok(HttpResponse::Created()
        .json(branch_json(&state, &repo, &name, &target, access, protect).await?))
}

pub(super) async fn delete_branch(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, name) = path.into_inner();
    let (repo, me) = writable_repo(&state, &req, project_id, &name).await?;
    if name == repo.default_branch {
        return Err(ApiError::MethodNotAllowed("Cannot remove HEAD branch"));
    }
    let p = repo.path.clone();
    let refs = blocking(move || reader::refs(&p)).await?;
    let target = refs
        .branches
        .get(&name)
        .ok_or(ApiError::NotFound("Branch"))?
        .clone();
    let update = writer::delete_branch(&repo.path, &name, &target)
        .await
        .map_err(repository_error)?;
    record_update(&state, project_id, me.author_id(), update).await?;
    Ok(HttpResponse::NoContent().finish())
}

pub(super) async fn list_tags(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<i64>,
    q: web::Query<BranchList>,
) -> Result<HttpResponse, ApiError> {
    let repo = readable_repo(&state, &req, id.into_inner()).await?;
    let path = repo.path.clone();
    let refs = blocking(move || reader::refs(&path)).await?;
    let page = PageParams::new(q.page, q.per_page).resolve();
    let tags: Vec<(String, String)> = refs.tags.into_iter().rev().collect();
    let total = tags.len();
    let mut items = Vec::new();
    for (name, target) in page.slice(tags) {
        let (p, id) = (repo.path.clone(), target.clone());
        let commit = blocking(move || reader::commit(&p, &id)).await?;
        items.push(json!({
            "name": name,
            "message": "",
            "target": target,
            "commit": commit_json(&repo, &state, &commit),
            "release": Value::Null,
            "protected": false,
            "created_at": Value::Null,
        }));
    }
    let mut response = HttpResponse::Ok();
    page.headers(&mut response, &req, total);
    Ok(response.json(items))
}
