//! A project's repository over REST in GitLab's shapes: what every repository
//! endpoint shares (who may read or write, refs, errors), and the tree, file and
//! blob endpoints. Commits live in `repository_commits`, branches and tags in
//! `branches`.

use std::path::PathBuf;

use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::common::project_full_path;
use super::pagination::PageParams;
use super::{ApiError, optional_user, require_user};
use crate::app_state::AppState;
use crate::identity::tokens::AuthenticatedUser;
use crate::policy::{Ability, Actor, AiReader, PushAccess, Subject};
use crate::repositories::pushes::{self, RefUpdate};
use crate::repositories::writer::{self, FileAction, Signature};
use crate::repositories::{RepositoryError, reader};

/// What a workflow is told in a project whose Duo features are off.
const DUO_OFF: &str = "GitLab Duo features are turned off for this project or group";
/// What a workflow is told about a file kept from AI.
const EXCLUDED_FROM_DUO: &str =
    "The file is excluded from GitLab Duo by the project's context exclusion rules";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/projects/{id}/repository/tree", web::get().to(tree))
        .route(
            "/projects/{id}/repository/files/{file_path:.+}/raw",
            web::get().to(raw_file),
        )
        .route(
            "/projects/{id}/repository/files/{file_path:.+}",
            web::get().to(show_file),
        )
        .route(
            "/projects/{id}/repository/files/{file_path:.+}",
            web::post().to(create_file),
        )
        .route(
            "/projects/{id}/repository/files/{file_path:.+}",
            web::put().to(update_file),
        )
        .route(
            "/projects/{id}/repository/files/{file_path:.+}",
            web::delete().to(delete_file),
        )
        .route(
            "/projects/{id}/repository/blobs/{sha}/raw",
            web::get().to(raw_blob),
        )
        .route(
            "/projects/{id}/repository/blobs/{sha}",
            web::get().to(show_blob),
        )
        .configure(super::repository_commits::routes)
        .configure(super::branches::routes);
}

/// A project's repository the caller may read.
pub(super) struct Repo {
    pub project_id: i64,
    pub path: PathBuf,
    pub default_branch: String,
    pub full_path: String,
    pub user: Option<AuthenticatedUser>,
}

impl Repo {
    /// `https://host/acme/website`
    pub fn web_url(&self, state: &AppState) -> String {
        format!("{}{}", state.config.external_url.as_str(), self.full_path)
    }

    /// The commit `rev` names (the default branch when `None`); `missing` is the
    /// 404 to answer when it names nothing.
    pub async fn resolve(
        &self,
        rev: Option<&str>,
        missing: &'static str,
    ) -> Result<String, ApiError> {
        let rev = rev
            .filter(|r| !r.trim().is_empty())
            .unwrap_or(&self.default_branch)
            .to_owned();
        let path = self.path.clone();
        match blocking(move || reader::resolve(&path, &rev)).await {
            Ok(id) => Ok(id),
            // An ambiguous name is the caller's to fix; anything else names nothing.
            Err(ApiError::Invalid(msg)) => Err(ApiError::Invalid(msg)),
            Err(_) => Err(ApiError::NotFound(missing)),
        }
    }
}

/// Runs repository reading on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RepositoryError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(repository_error)
}

/// A repository failure as the API answers it.
pub(super) fn repository_error(e: RepositoryError) -> ApiError {
    match e {
        RepositoryError::NotFound(_) => ApiError::NotFound("File"),
        // GitLab's `render_api_error!(message, 400)`: `{"message": "..."}`.
        RepositoryError::Invalid(msg) => ApiError::Invalid(Value::String(msg)),
        RepositoryError::Conflict => ApiError::Invalid(Value::String(
            "The branch has changed since you started editing it".into(),
        )),
        other => ApiError::Internal(other.to_string()),
    }
}

/// The caller may read the project's code (404 "Project Not Found" otherwise,
/// as for a project that does not exist); the repository exists on disk.
pub(super) async fn readable_repo(
    state: &AppState,
    req: &HttpRequest,
    project_id: i64,
) -> Result<Repo, ApiError> {
    // The token's scope (`read_repository` reads here) is checked by
    // `optional_user`, as on every REST route.
    let user = optional_user(state, req).await?;
    let actor = user.as_ref().map(Actor::from);
    let db = state.pool.get().await?;
    if !state
        .policy
        .can(&*db, actor, Ability::ReadCode, Subject::Project(project_id))
        .await?
    {
        return Err(ApiError::NotFound("Project"));
    }
    let default_branch = crate::namespaces::projects::default_branch(&*db, project_id).await?;
    let full_path = project_full_path(&*db, project_id).await?;
    let path = state
        .repositories
        .ensure(project_id, &default_branch)
        .await
        .map_err(repository_error)?;
    Ok(Repo {
        project_id,
        path,
        default_branch,
        full_path,
        user,
    })
}

/// A signed-in caller with an `api` token who may push to `branch` (404 when the
/// project is not readable, 403 when they may not push there).
pub(super) async fn writable_repo(
    state: &AppState,
    req: &HttpRequest,
    project_id: i64,
    branch: &str,
) -> Result<(Repo, AuthenticatedUser), ApiError> {
    let me = require_user(state, req, super::WRITE_SCOPES).await?;
    let repo = readable_repo(state, req, project_id).await?;
    let db = state.pool.get().await?;
    let access = state
        .policy
        .push_access(&*db, Some(Actor::from(&me)), project_id)
        .await?;
    let allowed = match access {
        PushAccess::All => true,
        PushAccess::UnprotectedBranches => branch != repo.default_branch,
        PushAccess::None => false,
    };
    if !allowed {
        return Err(ApiError::ForbiddenBecause(
            "You are not allowed to push into this branch",
        ));
    }
    Ok((repo, me))
}

/// Records a ref change made through the API exactly as a push would be.
pub(super) async fn record_update(
    state: &AppState,
    project_id: i64,
    pusher: i64,
    update: RefUpdate,
) -> Result<(), ApiError> {
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    pushes::record(&tx, project_id, Some(pusher), &[update])
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    tx.commit().await?;
    Ok(())
}

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

fn truthy(v: Option<&str>) -> bool {
    matches!(v, Some("true" | "1" | "yes"))
}

async fn tree(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<i64>,
    q: web::Query<TreeQuery>,
) -> Result<HttpResponse, ApiError> {
    let repo = readable_repo(&state, &req, id.into_inner()).await?;
    let q = q.into_inner();
    let commit = repo.resolve(q.rev.as_deref(), "Tree").await?;
    let dir = q.path.clone().unwrap_or_default();
    let recursive = truthy(q.recursive.as_deref());
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
    Ok(super::common::paged(
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

async fn show_file(
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

async fn raw_file(
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

async fn show_blob(
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

async fn raw_blob(
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

/// `content` in its declared encoding (`text`, the default, or `base64`).
pub(super) fn decode_content(
    content: Option<&str>,
    encoding: Option<&str>,
) -> Result<Vec<u8>, ApiError> {
    let content = content.unwrap_or_default();
    match encoding.unwrap_or("text") {
        "text" => Ok(content.as_bytes().to_vec()),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(content.trim())
            .map_err(|_| ApiError::BadRequest("content is not valid base64".into())),
        _ => Err(ApiError::BadRequest(
            "encoding does not have a valid value".into(),
        )),
    }
}

/// The commit's author: the caller, or the name and email they gave.
pub(super) async fn author(
    state: &AppState,
    me: &AuthenticatedUser,
    name: Option<String>,
    email: Option<String>,
) -> Result<Signature, ApiError> {
    let db = state.pool.get().await?;
    let (own_name, own_email) =
        crate::identity::users::name_and_email(&*db, me.author_id()).await?;
    // A composite identity commits as its service account, whatever the
    // request names (a run may not sign as someone else).
    let (name, email) = match me.service_account {
        Some(_) => (None, None),
        None => (name, email),
    };
    Ok(Signature {
        name: name.filter(|n| !n.trim().is_empty()).unwrap_or(own_name),
        email: email.filter(|e| !e.trim().is_empty()).unwrap_or(own_email),
        when: None,
    })
}

pub(super) fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, ApiError> {
    value
        .as_deref()
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| ApiError::BadRequest(format!("{name} is missing")))
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

async fn create_file(
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

async fn update_file(
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

async fn delete_file(
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

/// The repository fields of a project's JSON: `default_branch`,
/// `http_url_to_repo` and `empty_repo`.
pub(super) fn project_repository_fields(
    state: &AppState,
    project: &mut Value,
    project_id: i64,
    full_path: &str,
    default_branch: &str,
) {
    if let Some(map) = project.as_object_mut() {
        map.insert("default_branch".into(), json!(default_branch));
        map.insert(
            "http_url_to_repo".into(),
            json!(format!(
                "{}{full_path}.git",
                state.config.external_url.as_str()
            )),
        );
        map.insert(
            "empty_repo".into(),
            json!(state.repositories.looks_empty(project_id)),
        );
    }
}
