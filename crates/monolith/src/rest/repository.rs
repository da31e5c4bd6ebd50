//! A project's repository over REST in GitLab's shapes: the tree, file and
//! blob endpoints. What every repository endpoint shares lives in
//! `repository_access`; commits in `repository_commits`, branches and tags in
//! `branches`.

use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::pagination::PageParams;
use super::repository_access::{
    Repo, author, blocking, decode_content, readable_repo, record_update, repository_error,
    required, writable_repo,
};
use super::{ApiError, optional_user};
use crate::app_state::AppState;
use crate::policy::{Ability, Actor, AiReader, Subject};
use crate::repositories::reader;
use crate::repositories::writer::{self, FileAction};

/// What a workflow is told in a project whose Duo features are off.
use super::workflow_tools::DUO_OFF;
/// What a workflow is told about a file kept from AI.
const EXCLUDED_FROM_DUO: &str =
    "The file is excluded from GitLab Duo by the project's context exclusion rules";

/// `file_path` as it arrived (URL-encoded, `%2F` for `/`), decoded.
pub(super) fn decoded_path(raw: &str) -> Result<String, ApiError> {
    let decoded = crate::percent::decode(raw)
        .ok_or_else(|| ApiError::BadRequest("file_path is invalid".into()))?;
    reader::clean_path(&decoded).map_err(repository_error)
}

/// The encoded `file_path` segment straight from the request URL (actix would
/// decode `%2F` inside the match otherwise inconsistently).
fn raw_file_path(req: &HttpRequest) -> Option<String> {
    let path = req.uri().path();
    let start = path.find("/repository/files/")? + "/repository/files/".len();
    let rest = &path[start..];
    Some(rest.strip_suffix("/raw").unwrap_or(rest).to_owned())
}

// ---- tree -----------------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub(super) struct TreeQuery {
    path: Option<String>,
    #[serde(rename = "ref")]
    rev: Option<String>,
    recursive: Option<String>,
    page: Option<usize>,
    per_page: Option<usize>,
}

pub(super) async fn tree(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<i64>,
    q: web::Query<TreeQuery>,
) -> Result<HttpResponse, ApiError> {
    let repo = readable_repo(&state, &req, id.into_inner()).await?;
    let q = q.into_inner();
    let commit = repo.resolve(q.rev.as_deref(), "Tree").await?;
    let dir = q.path.clone().unwrap_or_default();
    let recursive = super::params::flag(q.recursive.as_deref());
    let path = repo.path.clone();
    let entries = blocking(move || reader::tree(&path, &commit, &dir, recursive))
        .await
        .map_err(|e| match e {
            ApiError::Invalid(m) => ApiError::Invalid(m),
            _ => ApiError::NotFound("Tree"),
        })?;
    let items = entries
        .into_iter()
        .map(|e| {
            json!({ "id": e.id, "name": e.name, "type": e.kind, "path": e.path, "mode": e.mode })
        })
        .collect();
    Ok(super::pagination::paged(
        &req,
        PageParams::new(q.page, q.per_page),
        items,
    ))
}

// ---- files ----------------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub(super) struct RefQuery {
    #[serde(rename = "ref")]
    rev: Option<String>,
}

/// The file, the commit it was read at, and (when asked: it walks history) the
/// last commit that changed it.
async fn read_file(
    state: &AppState,
    req: &HttpRequest,
    project_id: i64,
    rev: Option<String>,
    require_ref: bool,
    with_last_commit: bool,
) -> Result<(Repo, String, String, reader::FileBlob, String), ApiError> {
    let raw = raw_file_path(req).ok_or(ApiError::NotFound("File"))?;
    let file_path = decoded_path(&raw)?;
    if require_ref && rev.as_deref().is_none_or(|r| r.trim().is_empty()) {
        return Err(ApiError::BadRequest("ref is missing".into()));
    }
    let repo = readable_repo(state, req, project_id).await?;
    let rev_name = rev.unwrap_or_else(|| repo.default_branch.clone());
    let commit = repo.resolve(Some(&rev_name), "File").await?;
    let (path, c, f, max) = (
        repo.path.clone(),
        commit.clone(),
        file_path.clone(),
        state.config.max_blob_bytes,
    );
    let blob = blocking(move || reader::file(&path, &c, &f, max)).await?;
    let last = if with_last_commit {
        state
            .repositories
            .last_commit_for_path(&repo.path, &commit, &file_path)
            .await
            .map_err(repository_error)?
            .unwrap_or_else(|| commit.clone())
    } else {
        commit.clone()
    };
    Ok((repo, rev_name, commit, blob, last))
}

pub(super) async fn show_file(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
    q: web::Query<RefQuery>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, _) = path.into_inner();
    let (_repo, rev, commit, blob, last) =
        read_file(&state, &req, project_id, q.into_inner().rev, true, true).await?;
    let file_path = decoded_path(&raw_file_path(&req).unwrap_or_default())?;
    let file_name = file_path.rsplit('/').next().unwrap_or_default().to_owned();
    Ok(HttpResponse::Ok().json(json!({
        "file_name": file_name,
        "file_path": file_path,
        "size": blob.size,
        "encoding": "base64",
        "content_sha256": hex::encode(Sha256::digest(&blob.content)),
        "ref": rev,
        "blob_id": blob.blob_id,
        "commit_id": commit,
        "last_commit_id": last,
        "execute_filemode": blob.mode == "100755",
        "content": base64::engine::general_purpose::STANDARD.encode(&blob.content),
    })))
}

/// Raw bytes, never rendered by a browser as a page of this origin.
pub(super) fn raw_response(content: Vec<u8>, blob_id: &str) -> HttpResponse {
    let probe = &content[..content.len().min(8000)];
    let content_type = if probe.contains(&0) || std::str::from_utf8(probe).is_err() {
        "application/octet-stream"
    } else {
        "text/plain; charset=utf-8"
    };
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("Content-Security-Policy", "default-src 'none'; sandbox"))
        .insert_header(("X-Gitlab-Blob-Id", blob_id.to_owned()))
        .body(content)
}

pub(super) async fn raw_file(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
    q: web::Query<RefQuery>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, _) = path.into_inner();
    workflow_may_read(&state, &req, project_id).await?;
    let (_repo, _rev, _commit, blob, _last) =
        read_file(&state, &req, project_id, q.into_inner().rev, false, false).await?;
    Ok(raw_response(blob.content, &blob.blob_id))
}

/// A Duo Workflow token reads a file only when it may go to a model: what
/// a workflow reads goes into its prompts, so the project's gate
/// (`Policy::code_for_ai`: Duo on, the exclusion rules) applies before the
/// file is opened. Other callers read as before.
async fn workflow_may_read(
    state: &AppState,
    req: &HttpRequest,
    project_id: i64,
) -> Result<(), ApiError> {
    let Some(user) = optional_user(state, req).await? else {
        return Ok(());
    };
    if !super::workflow_only(&user) {
        return Ok(());
    }
    let file = decoded_path(&raw_file_path(req).ok_or(ApiError::NotFound("File"))?)?;
    let db = state.pool.get().await?;
    let actor = Actor::from(&user);
    match state
        .policy
        .code_for_ai(&*db, AiReader::User(actor), project_id)
        .await?
    {
        Some(code) if code.allows(&file) => Ok(()),
        Some(_) => Err(ApiError::ForbiddenBecause(EXCLUDED_FROM_DUO)),
        None => {
            // Code the user cannot read is answered by the read itself (404,
            // as for anyone); readable code with Duo off stays closed.
            let readable = state
                .policy
                .can(
                    &*db,
                    Some(actor),
                    Ability::ReadCode,
                    Subject::Project(project_id),
                )
                .await?;
            if readable {
                Err(ApiError::ForbiddenBecause(DUO_OFF))
            } else {
                Ok(())
            }
        }
    }
}

// ---- blobs ----------------------------------------------------------------------

async fn read_blob(
    state: &AppState,
    req: &HttpRequest,
    project_id: i64,
    sha: String,
) -> Result<Vec<u8>, ApiError> {
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::NotFound("Blob"));
    }
    let repo = readable_repo(state, req, project_id).await?;
    let (path, max) = (repo.path.clone(), state.config.max_blob_bytes);
    blocking(move || reader::blob(&path, &sha, max))
        .await
        .map_err(|e| match e {
            ApiError::Invalid(m) => ApiError::Invalid(m),
            _ => ApiError::NotFound("Blob"),
        })
}

pub(super) async fn show_blob(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, sha) = path.into_inner();
    let content = read_blob(&state, &req, project_id, sha.clone()).await?;
    Ok(HttpResponse::Ok().json(json!({
        "size": content.len(),
        "encoding": "base64",
        "content": base64::engine::general_purpose::STANDARD.encode(&content),
        "sha": sha,
    })))
}

pub(super) async fn raw_blob(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, sha) = path.into_inner();
    let content = read_blob(&state, &req, project_id, sha.clone()).await?;
    Ok(raw_response(content, &sha))
}

// ---- file writes ------------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub(super) struct FileWrite {
    branch: Option<String>,
    start_branch: Option<String>,
    content: Option<String>,
    commit_message: Option<String>,
    encoding: Option<String>,
    author_email: Option<String>,
    author_name: Option<String>,
    execute_filemode: Option<bool>,
}

enum FileWriteKind {
    Create,
    Update,
    Delete,
}

async fn write_file(
    state: &AppState,
    req: &HttpRequest,
    project_id: i64,
    body: FileWrite,
    kind: FileWriteKind,
) -> Result<(String, String), ApiError> {
    let file_path = decoded_path(&raw_file_path(req).unwrap_or_default())?;
    let branch = required(&body.branch, "branch")?.to_owned();
    let message = required(&body.commit_message, "commit_message")?.to_owned();
    let action = match kind {
        FileWriteKind::Create => {
            required(&body.content, "content")?;
            FileAction::Create {
                path: file_path.clone(),
                content: decode_content(body.content.as_deref(), body.encoding.as_deref())?,
                executable: body.execute_filemode.unwrap_or(false),
            }
        }
        FileWriteKind::Update => {
            required(&body.content, "content")?;
            FileAction::Update {
                path: file_path.clone(),
                content: decode_content(body.content.as_deref(), body.encoding.as_deref())?,
            }
        }
        FileWriteKind::Delete => FileAction::Delete {
            path: file_path.clone(),
        },
    };
    let (repo, me) = writable_repo(state, req, project_id, &branch).await?;
    let request = writer::CommitRequest {
        branch: branch.clone(),
        start: body.start_branch.clone(),
        message,
        author: author(state, &me, body.author_name, body.author_email).await?,
        actions: vec![action],
    };
    let committed = writer::commit(&repo.path, &request)
        .await
        .map_err(repository_error)?;
    record_update(state, project_id, me.author_id(), committed.update).await?;
    Ok((file_path, branch))
}

pub(super) async fn create_file(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
    body: super::params::Params<FileWrite>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, _) = path.into_inner();
    let (file_path, branch) = write_file(
        &state,
        &req,
        project_id,
        body.into_inner(),
        FileWriteKind::Create,
    )
    .await?;
    Ok(HttpResponse::Created().json(json!({ "file_path": file_path, "branch": branch })))
}

pub(super) async fn update_file(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
    body: super::params::Params<FileWrite>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, _) = path.into_inner();
    let (file_path, branch) = write_file(
        &state,
        &req,
        project_id,
        body.into_inner(),
        FileWriteKind::Update,
    )
    .await?;
    Ok(HttpResponse::Ok().json(json!({ "file_path": file_path, "branch": branch })))
}

pub(super) async fn delete_file(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, String)>,
    body: super::params::Params<FileWrite>,
) -> Result<HttpResponse, ApiError> {
    let (project_id, _) = path.into_inner();
    write_file(
        &state,
        &req,
        project_id,
        body.into_inner(),
        FileWriteKind::Delete,
    )
    .await?;
    Ok(HttpResponse::NoContent().finish())
}
