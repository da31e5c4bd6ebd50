//! Commits in GitLab's shapes: the log, one commit with its stats, its diff,
//! the comparison of two revisions, and commits with several file actions.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::pagination::PageParams;
use super::repository_access::{
    MAX_DIFF_FILES, Repo, author, blocking, decode_content, readable_repo, record_update,
    repository_error, required, writable_repo,
};
use crate::app_state::AppState;
use crate::repositories::reader::{self, CommitInfo, FileChange};
use crate::repositories::writer::{self, FileAction};

/// Most commits a comparison lists.
const MAX_COMPARE_COMMITS: usize = 100;

pub(super) fn commit_json(repo: &Repo, state: &AppState, c: &CommitInfo) -> Value {
    json!({
        "id": c.id,
        "short_id": &c.id[..c.id.len().min(8)],
        "created_at": c.committed_date.to_rfc3339(),
        "parent_ids": c.parent_ids,
        "title": c.title,
        "message": c.message,
        "author_name": c.author_name,
        "author_email": c.author_email,
        "authored_date": c.authored_date.to_rfc3339(),
        "committer_name": c.committer_name,
        "committer_email": c.committer_email,
        "committed_date": c.committed_date.to_rfc3339(),
        "trailers": {},
        "extended_trailers": {},
        "web_url": format!("{}/-/commit/{}", repo.web_url(state), c.id),
    })
}

pub(super) fn diff_json(d: &FileChange) -> Value {
    json!({
        "diff": d.diff,
        "new_path": d.new_path,
        "old_path": d.old_path,
        "a_mode": d.a_mode,
        "b_mode": d.b_mode,
        "new_file": d.new_file,
        "renamed_file": d.renamed_file,
        "deleted_file": d.deleted_file,
        "generated_file": false,
    })
}

#[derive(Debug, Deserialize)]
pub(super) struct LogParams {
    ref_name: Option<String>,
    path: Option<String>,
    since: Option<String>,
    until: Option<String>,
    page: Option<usize>,
    per_page: Option<usize>,
}

/// An ISO 8601 time as seconds since the epoch (a date alone is midnight UTC).
fn timestamp(value: Option<&str>, name: &str) -> Result<Option<i64>, ApiError> {
    let Some(v) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(v) {
        return Ok(Some(t.timestamp()));
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).map(|t| t.and_utc().timestamp()));
    }
    Err(ApiError::BadRequest(format!("{name} is invalid")))
}

pub(super) async fn list_commits(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<i64>,
    q: web::Query<LogParams>,
) -> Result<HttpResponse, ApiError> {
    let q = q.into_inner();
    let since = timestamp(q.since.as_deref(), "since")?;
    let until = timestamp(q.until.as_deref(), "until")?;
    let repo = readable_repo(&state, &req, id.into_inner()).await?;
    // An empty repository, or an unknown ref, has no commits (GitLab answers []
    // for the latter too, and 404 only for a project it cannot see).
    let start = match repo.resolve(q.ref_name.as_deref(), "Commit").await {
        Ok(id) => id,
        Err(ApiError::NotFound(_)) => {
            return Ok(super::pagination::paged(
                &req,
                PageParams::new(q.page, q.per_page),
                vec![],
            ));
        }
        Err(e) => return Err(e),
    };
    let page = PageParams::new(q.page, q.per_page).resolve();
    let query = reader::LogQuery {
        path: q.path.clone().filter(|p| !p.is_empty()),
        since,
        until,
        skip: (page.page - 1) * page.per_page,
        limit: page.per_page,
    };
    let path = repo.path.clone();
    let (commits, more) = blocking(move || reader::log(&path, &start, &query)).await?;
    let items: Vec<Value> = commits
        .iter()
        .map(|c| commit_json(&repo, &state, c))
        .collect();
    // The walk stops at the page: GitLab's commit list also keeps-set headers
    // without a total (counting a large history would cost a full walk).
    let mut response = HttpResponse::Ok();
    response.insert_header(("X-Page", page.page.to_string()));
    response.insert_header(("X-Per-Page", page.per_page.to_string()));
    response.insert_header((
        "X-Next-Page",
        if more {
            (page.page + 1).to_string()
        } else {
            String::new()
        },
    ));
    response.insert_header((
        "X-Prev-Page",
        if page.page > 1 {
            (page.page - 1).to_string()
        } else {
            String::new()
        },
    ));
    Ok(response.json(items))
}

/// The commit `sha` names (a commit id, branch or tag), read.
async fn find_commit(repo: &Repo, sha: &str) -> Result<CommitInfo, ApiError> {
    let id = repo.resolve(Some(sha), "Commit").await?;
    let path = repo.path.clone();
    blocking(move || reader::commit(&path, &id))
        .await
        .map_err(|_| ApiError::NotFound("Commit"))
}

/// The changes a commit made against its first parent.
pub(super) async fn changes_of(repo: &Repo, c: &CommitInfo) -> Result<Vec<FileChange>, ApiError> {
    reader::diff(
        &repo.path,
        c.parent_ids.first().map(String::as_str),
        &c.id,
        MAX_DIFF_FILES,
    )
    .await
    .map_err(repository_error)
}

pub(super) async fn show_commit(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, sha) = path.into_inner();
    let repo = readable_repo(&state, &req, project_id).await?;
    let commit = find_commit(&repo, &sha).await?;
    Ok(HttpResponse::Ok().json(commit_with_stats(&repo, &state, &commit).await?))
}

/// A single commit's JSON: the list fields plus `stats`, as GitLab shows one commit.
async fn commit_with_stats(
    repo: &Repo,
    state: &AppState,
    commit: &CommitInfo,
) -> Result<Value, ApiError> {
    let (additions, deletions) = state
        .repositories
        .commit_stats(
            &repo.path,
            &commit.id,
            commit.parent_ids.first().map(String::as_str),
        )
        .await
        .map_err(repository_error)?;
    let mut body = commit_json(repo, state, commit);
    if let Some(map) = body.as_object_mut() {
        map.insert(
            "stats".into(),
            json!({ "additions": additions, "deletions": deletions, "total": additions + deletions }),
        );
        map.insert("status".into(), Value::Null);
        map.insert("last_pipeline".into(), Value::Null);
        map.insert("project_id".into(), json!(repo.project_id));
    }
    Ok(body)
}

#[derive(Debug, Deserialize)]
pub(super) struct PageOnly {
    page: Option<usize>,
    per_page: Option<usize>,
}

pub(super) async fn commit_diff(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
    q: web::Query<PageOnly>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, sha) = path.into_inner();
    let repo = readable_repo(&state, &req, project_id).await?;
    let commit = find_commit(&repo, &sha).await?;
    let changes = changes_of(&repo, &commit).await?;
    let items = changes.iter().map(diff_json).collect();
    Ok(super::pagination::paged(
        &req,
        PageParams::new(q.page, q.per_page),
        items,
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct CompareParams {
    from: Option<String>,
    to: Option<String>,
    straight: Option<String>,
}

pub(super) async fn compare(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<i64>,
    q: web::Query<CompareParams>,
) -> Result<HttpResponse, ApiError> {
    let q = q.into_inner();
    let from_name = required(&q.from, "from")?.to_owned();
    let to_name = required(&q.to, "to")?.to_owned();
    let repo = readable_repo(&state, &req, id.into_inner()).await?;
    let from = repo.resolve(Some(&from_name), "Ref").await?;
    let to = repo.resolve(Some(&to_name), "Ref").await?;
    let straight = super::params::flag(q.straight.as_deref());
    // Like GitLab (and `git diff a...b`): changes since the common ancestor,
    // unless `straight` asks for the two trees compared directly.
    let base = if straight {
        Some(from.clone())
    } else {
        reader::merge_base(&repo.path, &from, &to)
            .await
            .map_err(repository_error)?
    };
    let commits = reader::commits_between(&repo.path, &from, &to, MAX_COMPARE_COMMITS)
        .await
        .map_err(repository_error)?;
    let diffs = reader::diff(&repo.path, base.as_deref(), &to, MAX_DIFF_FILES)
        .await
        .map_err(repository_error)?;
    let head = match commits.first() {
        Some(c) => commit_json(&repo, &state, c),
        None => Value::Null,
    };
    Ok(HttpResponse::Ok().json(json!({
        "commit": head,
        "commits": commits.iter().rev().map(|c| commit_json(&repo, &state, c)).collect::<Vec<_>>(),
        "diffs": diffs.iter().map(diff_json).collect::<Vec<_>>(),
        "compare_timeout": false,
        "compare_same_ref": from == to,
        "web_url": format!("{}/-/compare/{}...{}", repo.web_url(&state), from_name, to_name),
    })))
}

#[derive(Debug, Deserialize)]
struct CommitAction {
    action: Option<String>,
    file_path: Option<String>,
    previous_path: Option<String>,
    content: Option<String>,
    encoding: Option<String>,
    execute_filemode: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(super) struct NewCommit {
    branch: Option<String>,
    commit_message: Option<String>,
    start_branch: Option<String>,
    start_sha: Option<String>,
    actions: Option<Vec<CommitAction>>,
    author_email: Option<String>,
    author_name: Option<String>,
}

fn file_action(a: CommitAction) -> Result<FileAction, ApiError> {
    let path = a
        .file_path
        .clone()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::BadRequest("actions[file_path] is missing".into()))?;
    let content = || decode_content(a.content.as_deref(), a.encoding.as_deref());
    Ok(match a.action.as_deref() {
        Some("create") => FileAction::Create {
            path,
            content: content()?,
            executable: a.execute_filemode.unwrap_or(false),
        },
        Some("update") => FileAction::Update {
            path,
            content: content()?,
        },
        Some("delete") => FileAction::Delete { path },
        Some("move") => FileAction::Move {
            previous_path: a
                .previous_path
                .clone()
                .filter(|p| !p.is_empty())
                .ok_or_else(|| ApiError::BadRequest("actions[previous_path] is missing".into()))?,
            path,
            content: match a.content {
                Some(_) => Some(content()?),
                None => None,
            },
        },
        Some("chmod") => FileAction::Chmod {
            path,
            executable: a.execute_filemode.unwrap_or(false),
        },
        _ => {
            return Err(ApiError::BadRequest(
                "actions[action] does not have a valid value".into(),
            ));
        }
    })
}

pub(super) async fn create_commit(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<i64>,
    body: super::params::Params<NewCommit>,
) -> Result<HttpResponse, ApiError> {
    let project_id = id.into_inner();
    let b = body.into_inner();
    let branch = required(&b.branch, "branch")?.to_owned();
    let message = required(&b.commit_message, "commit_message")?.to_owned();
    let actions = b
        .actions
        .ok_or_else(|| ApiError::BadRequest("actions is missing".into()))?
        .into_iter()
        .map(file_action)
        .collect::<Result<Vec<_>, _>>()?;
    let (repo, me) = writable_repo(&state, &req, project_id, &branch).await?;
    let request = writer::CommitRequest {
        branch,
        start: b.start_sha.or(b.start_branch),
        message,
        author: author(&state, &me, b.author_name, b.author_email).await?,
        actions,
    };
    let committed = writer::commit(&repo.path, &request)
        .await
        .map_err(repository_error)?;
    let commit_id = committed.commit_id.clone();
    record_update(&state, project_id, me.author_id(), committed.update).await?;
    let commit = find_commit(&repo, &commit_id).await?;
    Ok(HttpResponse::Created().json(commit_with_stats(&repo, &state, &commit).await?))
}
