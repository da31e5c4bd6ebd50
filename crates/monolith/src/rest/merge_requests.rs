//! Merge requests, their changes and their notes. There is no repository behind
//! the monolith: a merge request carries its diff as text (the `diff` field of the
//! create call, our addition), and the changes endpoints split it per file.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::containers::{Container, readable_project};
use super::entities::{closed_by, references, user_basic};
use super::item_access::{Found, Item, find_readable};
use super::notes::{NoteTarget, Noteable};
use super::pagination::{PageParams, paged};
use super::param_values::state_filter;
use super::{ApiError, diffs};
use crate::app_state::AppState;
use crate::identity::users;
use crate::policy::{Actor, WriteAbility};
use crate::work_items::merge_requests::{self, MergeRequest, NewMergeRequest};
use crate::work_items::{Author, reviewers};

pub(super) fn mr_json(mr: &MergeRequest, base: &url::Url, full_path: &str) -> Value {
    let iid = mr.iid;
    // No merge history is kept: a merged request was merged at its last update.
    let merged = mr.state == "merged";
    json!({
        "id": mr.id,
        "iid": iid,
        "project_id": mr.project_id,
        "title": mr.title,
        "description": mr.description,
        "state": mr.state,
        "source_branch": mr.source_branch,
        "target_branch": mr.target_branch,
        "source_project_id": mr.project_id,
        "target_project_id": mr.project_id,
        "labels": mr.labels,
        "draft": false,
        "work_in_progress": false,
        "author": user_basic(&mr.author, base),
        "reviewers": mr.reviewers.iter().map(|r| user_basic(r, base)).collect::<Vec<_>>(),
        "references": references(full_path, '!', iid),
        "web_url": format!("{}{full_path}/-/merge_requests/{iid}", base.as_str()),
        "created_at": mr.created_at,
        "updated_at": mr.updated_at,
        "closed_at": mr.closed_at,
        "closed_by": closed_by(mr.closed_by.as_ref(), base),
        "merged_at": merged.then_some(mr.updated_at),
    })
}

/// The merge request in its REST shape.
pub(super) fn found_json(state: &AppState, found: &Found<MergeRequest>) -> Value {
    mr_json(&found.item, &state.config.external_url, &found.full_path)
}

#[derive(Debug, Deserialize)]
pub(super) struct ListParams {
    page: Option<usize>,
    per_page: Option<usize>,
    state: Option<String>,
    source_branch: Option<String>,
    target_branch: Option<String>,
}

pub(super) async fn list_merge_requests(
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
    let mut found = merge_requests::list(&*db, project, wanted.as_deref()).await?;
    found.retain(|m| {
        q.source_branch
            .as_ref()
            .is_none_or(|b| *b == m.source_branch)
            && q.target_branch
                .as_ref()
                .is_none_or(|b| *b == m.target_branch)
    });
    let readable = Item::MERGE_REQUEST
        .keep_readable(&state, &*db, user, found)
        .await?;
    let items = readable
        .iter()
        .map(|m| mr_json(m, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

/// A merge request the caller may read, with its project's full path; 404 otherwise.
pub(super) async fn find_merge_request(
    state: &AppState,
    req: &impl super::Caller,
    project: i64,
    iid: i32,
) -> Result<Found<MergeRequest>, ApiError> {
    let container = Container::Project(project);
    find_readable(state, req, container, Item::MERGE_REQUEST, async |db| {
        merge_requests::by_iid(db, project, iid).await
    })
    .await
}

pub(super) async fn show_merge_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let mr = find_merge_request(&state, &req, project, iid).await?;
    Ok(HttpResponse::Ok().json(found_json(&state, &mr)))
}

#[derive(Debug, Deserialize)]
pub(super) struct NewMergeRequestParams {
    source_branch: String,
    target_branch: String,
    title: String,
    description: Option<String>,
    labels: Option<super::params::LabelList>,
    /// Our addition: the change as a unified diff (there is no repository to
    /// compute it from).
    diff: Option<String>,
    reviewer_ids: Option<Vec<i64>>,
}

fn validate(b: &NewMergeRequestParams) -> Result<(), ApiError> {
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
pub(super) async fn create_merge_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<NewMergeRequestParams>,
) -> Result<HttpResponse, ApiError> {
    let project = path.into_inner();
    let me = Container::Project(project)
        .writer(&state, &req, WriteAbility::CreateMergeRequest)
        .await?;
    let b = body.into_inner();
    validate(&b)?;
    let reviewer_ids = match &b.reviewer_ids {
        Some(ids) => Some(checked_reviewers(&state, Actor::from(&me), project, ids).await?),
        None => None,
    };
    let mut db = state.pool.get().await?;
    let mut mr = merge_requests::create(
        &mut db,
        NewMergeRequest {
            project,
            title: b.title,
            description: b.description.unwrap_or_default(),
            source_branch: b.source_branch,
            target_branch: b.target_branch,
            diff: b.diff.unwrap_or_default(),
            labels: b.labels.unwrap_or_default().0,
            author: Author {
                id: me.author_id(),
                on_behalf_of: me.on_behalf_of(),
            },
        },
    )
    .await?;
    if let Some(ids) = reviewer_ids {
        save_reviewers(&state, me.id, project, mr.iid, mr.id, &ids).await?;
        mr = merge_requests::by_iid(&*db, project, mr.iid)
            .await?
            .ok_or(ApiError::NotFound("Merge Request"))?;
    }
    let full_path = Container::Project(project).full_path(&*db).await?;
    Ok(HttpResponse::Created().json(mr_json(&mr, &state.config.external_url, &full_path)))
}

/// `reviewer_ids` once checked: the caller may set reviewers in the project
/// (developers and above), and each id (`0` dropped, GitLab's "none") is a
/// user who may review there; 403 and 400 otherwise.
pub(super) async fn checked_reviewers(
    state: &AppState,
    me: Actor,
    project: i64,
    ids: &[i64],
) -> Result<Vec<i64>, ApiError> {
    let db = state.pool.get().await?;
    if !state
        .policy
        .may_set_reviewers(&*db, Some(me), project)
        .await?
    {
        return Err(ApiError::Forbidden);
    }
    let ids: Vec<i64> = ids.iter().copied().filter(|id| *id != 0).collect();
    if ids.len() > MAX_REVIEWERS {
        return Err(ApiError::invalid(
            "reviewers",
            format!("maximum number of reviewers ({MAX_REVIEWERS}) exceeded"),
        ));
    }
    if let Some(unknown) = users::missing(&*db, &ids).await?.first() {
        return Err(ApiError::invalid(
            "reviewer_ids",
            format!("user {unknown} does not exist"),
        ));
    }
    for id in &ids {
        if !state.policy.may_review(&*db, *id, project).await? {
            return Err(ApiError::invalid(
                "reviewer_ids",
                format!("user {id} cannot read this project's merge requests"),
            ));
        }
    }
    Ok(ids)
}

/// GitLab's cap on a merge request's reviewers.
const MAX_REVIEWERS: usize = 200;

/// Makes checked `ids` the merge request's reviewers and starts Duo's review
/// when the review bot is among those newly added (`requester` asked).
pub(super) async fn save_reviewers(
    state: &AppState,
    requester: i64,
    project: i64,
    iid: i32,
    id: i64,
    ids: &[i64],
) -> Result<(), ApiError> {
    let db = state.pool.get().await?;
    let added = reviewers::set(&*db, id, ids).await?;
    super::duo_events::reviewers_added(&*db, project, iid, requester, &added).await;
    Ok(())
}

/// `GET …/merge_requests/:iid/reviewers`: each reviewer with their state.
pub(super) async fn merge_request_reviewers(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let mr = find_merge_request(&state, &req, project, iid).await?;
    let db = state.pool.get().await?;
    let base = &state.config.external_url;
    let items: Vec<Value> = reviewers::list(&*db, mr.item.id)
        .await?
        .iter()
        .map(|r| {
            json!({
                "user": user_basic(&r.user, base),
                "state": r.state,
                "created_at": r.created_at,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(items))
}

/// The merge request's per-file changes: the real comparison of its branches
/// when the repository has both, else the diff stored with it.
async fn file_diffs(
    state: &AppState,
    project: i64,
    mr: &MergeRequest,
) -> Result<Vec<diffs::FileDiff>, ApiError> {
    let compared = crate::repositories::branch_changes(
        &state.repositories,
        project,
        &mr.source_branch,
        &mr.target_branch,
        super::repository_access::MAX_DIFF_FILES,
    )
    .await
    .map_err(super::repository_access::repository_error)?;
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
        None => diffs::parse(&mr.diff),
    })
}

/// `(old_path, new_path)` of each file a merge request the caller may read
/// changes (a diff note must sit on one).
pub(super) async fn changed_paths(
    state: &AppState,
    req: &impl super::Caller,
    project: i64,
    iid: i32,
) -> Result<Vec<(String, String)>, ApiError> {
    let mr = find_merge_request(state, req, project, iid).await?;
    Ok(file_diffs(state, project, &mr.item)
        .await?
        .into_iter()
        .map(|f| (f.old_path, f.new_path))
        .collect())
}

/// The merge request with its `changes` (GitLab's older, unpaginated form).
pub(super) async fn merge_request_changes(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let mr = find_merge_request(&state, &req, project, iid).await?;
    let changes = file_diffs(&state, project, &mr.item).await?;
    let mut body = found_json(&state, &mr);
    if let Some(obj) = body.as_object_mut() {
        obj.insert("changes_count".into(), json!(changes.len().to_string()));
        obj.insert("changes".into(), json!(changes));
        obj.insert("overflow".into(), json!(false));
    }
    Ok(HttpResponse::Ok().json(body))
}

#[derive(Debug, Deserialize)]
pub(super) struct DiffParams {
    page: Option<usize>,
    per_page: Option<usize>,
}

/// The per-file diffs of the merge request, paginated.
pub(super) async fn merge_request_diffs(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    q: web::Query<DiffParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let items = diffs_of(&state, &req, project, iid).await?;
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

/// The per-file diffs of a merge request the caller may read.
pub(super) async fn diffs_of(
    state: &AppState,
    req: &impl super::Caller,
    project: i64,
    iid: i32,
) -> Result<Vec<Value>, ApiError> {
    let mr = find_merge_request(state, req, project, iid).await?;
    Ok(file_diffs(state, project, &mr.item)
        .await?
        .into_iter()
        .map(|d| json!(d))
        .collect())
}

/// The merge request's commits, newest first: those of its source branch
/// that its target branch lacks (none while either branch is missing).
pub(super) async fn merge_request_commits(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    q: web::Query<DiffParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let items = commits_of(&state, &req, project, iid).await?;
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

/// Most commits a merge request's commit list reads.
const MAX_MR_COMMITS: usize = 500;

pub(super) async fn commits_of(
    state: &AppState,
    req: &impl super::Caller,
    project: i64,
    iid: i32,
) -> Result<Vec<Value>, ApiError> {
    let mr = find_merge_request(state, req, project, iid).await?;
    let repo = super::repository_access::readable_repo(state, req, project).await?;
    let target = repo.resolve(Some(&mr.item.target_branch), "Ref").await;
    let source = repo.resolve(Some(&mr.item.source_branch), "Ref").await;
    let (Ok(target), Ok(source)) = (target, source) else {
        return Ok(Vec::new());
    };
    let commits =
        crate::repositories::reader::commits_between(&repo.path, &target, &source, MAX_MR_COMMITS)
            .await
            .map_err(super::repository_access::repository_error)?;
    Ok(commits
        .iter()
        .map(|c| super::repository_commits::commit_json(&repo, state, c))
        .collect())
}

/// The pipelines run for the merge request's source branch, newest first.
pub(super) async fn merge_request_pipelines(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    q: web::Query<DiffParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let items = pipelines_of(&state, &req, project, iid).await?;
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

pub(super) async fn pipelines_of(
    state: &AppState,
    req: &impl super::Caller,
    project: i64,
    iid: i32,
) -> Result<Vec<Value>, ApiError> {
    let mr = find_merge_request(state, req, project, iid).await?;
    let full_path = super::ci::readable_ci(state, req, project).await?;
    let filter = crate::work_items::builds::PipelineFilter {
        git_ref: Some(mr.item.source_branch.clone()),
        ..Default::default()
    };
    let db = state.pool.get().await?;
    Ok(crate::work_items::builds::pipelines(
        &*db,
        project,
        &filter,
        crate::work_items::SortOrder::Desc,
    )
    .await?
    .iter()
    .map(|p| super::ci::pipeline_json(p, &state.config.external_url, &full_path))
    .collect())
}

/// Notes of a merge request: `/projects/{id}/merge_requests/{iid}/notes`.
pub(super) struct MergeRequestNotes;

impl NoteTarget for MergeRequestNotes {
    type Path = (i64, i32);

    async fn find(
        state: &AppState,
        req: &impl super::Caller,
        (project, iid): (i64, i32),
    ) -> Result<(Option<Actor>, Noteable), ApiError> {
        let mr = find_merge_request(state, req, project, iid).await?;
        let noteable = Noteable::merge_request(mr.item.id, iid, project);
        Ok((mr.user, noteable))
    }
}
