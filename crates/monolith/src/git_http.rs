//! Git's smart HTTP protocol at GitLab's URLs
//! (`/<namespace>/<project>.git/info/refs`, `git-upload-pack`,
//! `git-receive-pack`): the caller is authenticated (HTTP Basic with a personal
//! access token as the password) and authorized by the policy here, then the
//! system's `git http-backend` does the protocol work (GitLab's Workhorse and
//! Radicle's httpd take the same approach).
//!
//! A request body counts against `DUO_GIT_MAX_PUSH_BYTES` as git reads it: a
//! gzip body is inflated here, measured, and cut off past the limit (git is
//! never handed a compressed body to inflate on its own), and git itself
//! refuses a larger pack (`receive.maxInputSize`).
//!
//! After an accepted push the ref changes are recorded and a
//! `repository_pushed` job is enqueued, by a task that owns the git process, so
//! a client that hangs up early cannot lose the record of a push that landed.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine as _;
use futures::StreamExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::{mpsc, oneshot};

use crate::app_state::AppState;
use crate::identity::tokens::{self, AuthenticatedUser, TokenError};
use crate::policy::{Ability, Actor, PushAccess, Subject};
use crate::repositories::http_backend::{self, BodyEncoding, CgiHead, CgiRequest, Service};
use crate::repositories::{pushes, reader};

/// Token scopes that allow clone and fetch.
const READ_SCOPES: &[&str] = &["api", "read_repository", "write_repository"];
/// Token scopes that allow push.
const WRITE_SCOPES: &[&str] = &["api", "write_repository"];
/// How long a request waits for a free git process slot before a 503.
const SLOT_WAIT: Duration = Duration::from_secs(30);
/// GitLab's answer when a repository does not exist or may not be read.
const NOT_FOUND: &str =
    "The project you were looking for could not be found or you don't have permission to view it.";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/{repo:.+}/info/refs", web::get().to(info_refs))
        .route("/{repo:.+}/git-upload-pack", web::post().to(upload_pack))
        .route("/{repo:.+}/git-receive-pack", web::post().to(receive_pack));
}

/// A refusal, as plain text (git prints it to the user).
#[derive(Debug)]
enum GitHttpError {
    /// No or bad credentials: git asks for them.
    Challenge(&'static str),
    Forbidden(String),
    NotFound,
    Busy,
    TooLarge,
    BadRequest(&'static str),
    /// A `Content-Encoding` git never sends.
    UnsupportedEncoding,
    Internal(String),
}

impl GitHttpError {
    fn response(&self) -> HttpResponse {
        let (status, text) = match self {
            GitHttpError::Challenge(text) => (StatusCode::UNAUTHORIZED, (*text).to_owned()),
            GitHttpError::Forbidden(text) => (StatusCode::FORBIDDEN, text.clone()),
            GitHttpError::NotFound => (StatusCode::NOT_FOUND, NOT_FOUND.to_owned()),
            GitHttpError::Busy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "Too many git operations at once; try again shortly.".to_owned(),
            ),
            GitHttpError::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "The request is larger than this instance accepts (measured once inflated); nothing was written.".to_owned(),
            ),
            GitHttpError::UnsupportedEncoding => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Only gzip-encoded or plain request bodies are accepted.".to_owned(),
            ),
            GitHttpError::BadRequest(text) => (StatusCode::BAD_REQUEST, (*text).to_owned()),
            GitHttpError::Internal(detail) => {
                tracing::error!(error = %detail, "git request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Internal server error".to_owned(),
                )
            }
        };
        let mut builder = HttpResponse::build(status);
        builder.content_type("text/plain; charset=utf-8");
        if status == StatusCode::UNAUTHORIZED {
            builder.insert_header(("WWW-Authenticate", "Basic realm=\"GitLab\""));
        }
        builder.body(text)
    }
}

macro_rules! internal_from {
    ($($t:ty),*) => {$(
        impl From<$t> for GitHttpError {
            fn from(e: $t) -> Self {
                GitHttpError::Internal(e.to_string())
            }
        }
    )*};
}

internal_from!(
    deadpool_postgres::PoolError,
    tokio_postgres::Error,
    crate::policy::PolicyError,
    crate::repositories::RepositoryError,
    tokio::task::JoinError
);

/// `acme/website.git` or `acme/website` → `acme/website`.
fn project_path(repo: &str) -> &str {
    repo.strip_suffix(".git").unwrap_or(repo)
}

/// The user of HTTP Basic credentials whose password is a personal access token
/// (any username: GitLab does not check it for tokens, and `oauth2` is common).
async fn basic_user(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Option<AuthenticatedUser>, GitHttpError> {
    let Some(header) = req.headers().get(actix_web::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let denied = GitHttpError::Challenge(
        "HTTP Basic: Access denied. If a password was provided for Git authentication, the password was incorrect or you're required to use a token instead of a password.",
    );
    let value = header
        .to_str()
        .map_err(|_| GitHttpError::BadRequest("bad Authorization header"))?;
    let Some((scheme, encoded)) = value.trim().split_once(' ') else {
        return Err(denied);
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(denied);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    let Some((_username, password)) = decoded.as_deref().and_then(|d| d.split_once(':')) else {
        return Err(denied);
    };
    if password.is_empty() || password.len() > 512 || password.contains('\0') {
        return Err(denied);
    }
    let db = state.pool.get().await?;
    // A run's own token (an OAuth token bound to one workflow and project)
    // clones its project and pushes its checkpoint; other OAuth tokens are
    // not git credentials.
    if crate::identity::oauth::looks_like_token(password) {
        return match crate::identity::oauth::authenticate(&*db, password).await {
            Ok(Some(user)) if user.run.is_some() => Ok(Some(user)),
            Ok(_) | Err(TokenError::Invalid) => Err(denied),
            Err(TokenError::Blocked) => Err(GitHttpError::Forbidden(
                "Your account has been blocked.".into(),
            )),
            Err(e) => Err(GitHttpError::Internal(e.to_string())),
        };
    }
    match tokens::authenticate(&*db, password).await {
        Ok(user) => Ok(Some(user)),
        Err(TokenError::Invalid) => Err(denied),
        Err(TokenError::Blocked) => Err(GitHttpError::Forbidden(
            "Your account has been blocked.".into(),
        )),
        Err(e) => Err(GitHttpError::Internal(e.to_string())),
    }
}

/// Who is asking for which project, after every check for `service` passed.
struct Authorized {
    project_id: i64,
    user: Option<AuthenticatedUser>,
    push: PushAccess,
    default_branch: String,
}

impl Authorized {
    /// Which refs git shows and lets be written: the workflows' hidden
    /// checkpoint refs (`refs/workloads/*`) are neither advertised nor
    /// writable, except a run's own, which its token fetches and pushes and
    /// is the only ref it may write.
    fn hidden_refs(&self) -> Vec<(String, String)> {
        let entry = |key: &str, value: String| (key.to_owned(), value);
        let mut config = vec![
            entry("uploadpack.hideRefs", "refs/workloads".into()),
            entry("receive.hideRefs", "refs/workloads".into()),
        ];
        if let Some(run) = self.user.as_ref().and_then(|u| u.run) {
            let own = format!("!refs/workloads/{}", run.workflow_id);
            config.push(entry("uploadpack.hideRefs", own.clone()));
            config.push(entry("receive.hideRefs", "refs".into()));
            config.push(entry("receive.hideRefs", own));
        }
        config
    }
}

async fn authorize(
    state: &AppState,
    req: &HttpRequest,
    repo: &str,
    service: Service,
) -> Result<Authorized, GitHttpError> {
    let user = basic_user(state, req).await?;
    if let Some(user) = user.as_ref().filter(|u| u.run.is_none()) {
        let wanted = match service {
            Service::UploadPack => READ_SCOPES,
            Service::ReceivePack => WRITE_SCOPES,
        };
        if !user.has_any_scope(wanted) {
            return Err(GitHttpError::Forbidden(format!(
                "The token does not have one of the scopes this needs: {}",
                wanted.join(", ")
            )));
        }
    }
    let actor = user.as_ref().map(Actor::from);
    let db = state.pool.get().await?;
    let mut project = crate::namespaces::project_id_by_full_path(&*db, project_path(repo)).await?;
    // A run's token knows only its own project.
    if let Some(run) = user.as_ref().and_then(|u| u.run)
        && project != Some(run.project_id)
    {
        project = None;
    }
    let readable = match project {
        Some(id) => {
            state
                .policy
                .can(&*db, actor, Ability::ReadCode, Subject::Project(id))
                .await?
        }
        None => false,
    };
    // Unknown and unreadable look the same; anonymous callers are asked to sign
    // in either way (so nobody learns which private projects exist). A member
    // who sees the project but not its code (a guest) is told so.
    let (Some(project_id), true) = (project, readable) else {
        let sees_project = match (project, actor) {
            (Some(id), Some(_)) => {
                state
                    .policy
                    .can(&*db, actor, Ability::ReadProject, Subject::Project(id))
                    .await?
            }
            _ => false,
        };
        return Err(match user {
            None => GitHttpError::Challenge("HTTP Basic: Access denied"),
            Some(_) if sees_project => GitHttpError::Forbidden(
                "You are not allowed to download code from this project.".into(),
            ),
            Some(_) => GitHttpError::NotFound,
        });
    };
    let push = match service {
        Service::UploadPack => PushAccess::None,
        Service::ReceivePack => {
            if user.is_none() {
                return Err(GitHttpError::Challenge("HTTP Basic: Access denied"));
            }
            let push = state.policy.push_access(&*db, actor, project_id).await?;
            if push == PushAccess::None {
                return Err(GitHttpError::Forbidden(
                    "You are not allowed to push code to this project.".into(),
                ));
            }
            push
        }
    };
    let default_branch: String = db
        .query_one(
            "SELECT default_branch FROM projects WHERE id = $1",
            &[&project_id],
        )
        .await?
        .get(0);
    Ok(Authorized {
        project_id,
        user,
        push,
        default_branch,
    })
}

#[derive(serde::Deserialize)]
struct InfoRefsQuery {
    service: Option<String>,
}

async fn info_refs(
    state: web::Data<AppState>,
    req: HttpRequest,
    repo: web::Path<String>,
    query: web::Query<InfoRefsQuery>,
) -> HttpResponse {
    // Only the smart protocol: the dumb one would serve files without our checks.
    let Some(service) = query.service.as_deref().and_then(Service::from_name) else {
        return GitHttpError::Forbidden("Only git's smart HTTP protocol is served.".into())
            .response();
    };
    serve(&state, &req, &repo, service, "info/refs", None)
        .await
        .unwrap_or_else(|e| e.response())
}

async fn upload_pack(
    state: web::Data<AppState>,
    req: HttpRequest,
    repo: web::Path<String>,
    body: web::Payload,
) -> HttpResponse {
    serve(
        &state,
        &req,
        &repo,
        Service::UploadPack,
        "git-upload-pack",
        Some(body),
    )
    .await
    .unwrap_or_else(|e| e.response())
}

async fn receive_pack(
    state: web::Data<AppState>,
    req: HttpRequest,
    repo: web::Path<String>,
    body: web::Payload,
) -> HttpResponse {
    serve(
        &state,
        &req,
        &repo,
        Service::ReceivePack,
        "git-receive-pack",
        Some(body),
    )
    .await
    .unwrap_or_else(|e| e.response())
}

async fn serve(
    state: &AppState,
    req: &HttpRequest,
    repo: &str,
    service: Service,
    endpoint: &str,
    body: Option<web::Payload>,
) -> Result<HttpResponse, GitHttpError> {
    let auth = authorize(state, req, repo, service).await?;
    let encoding = BodyEncoding::from_header(header_text(req, "content-encoding").as_deref())
        .ok_or(GitHttpError::UnsupportedEncoding)?;
    let limit = state.config.git_max_push_bytes;
    if header_text(req, "content-length")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > limit)
    {
        return Err(GitHttpError::TooLarge);
    }
    let repositories = state.repositories.clone();
    let path = repositories
        .ensure(auth.project_id, &auth.default_branch)
        .await?;
    let permit = repositories
        .slot(SLOT_WAIT)
        .await
        .ok_or(GitHttpError::Busy)?;

    let header = |name: &str| header_text(req, name);
    let mut extra_env = Vec::new();
    if service == Service::ReceivePack {
        let protected = auth.push == PushAccess::UnprotectedBranches;
        extra_env.push((
            "DUO_PROTECTED_REF".to_owned(),
            format!("refs/heads/{}", auth.default_branch),
        ));
        extra_env.push((
            "DUO_MAY_PUSH_PROTECTED".to_owned(),
            if protected { "0" } else { "1" }.to_owned(),
        ));
    }
    let request = CgiRequest {
        method: req.method().as_str().to_owned(),
        path_info: format!(
            "/{}/{endpoint}",
            crate::repositories::Repositories::relative_path(auth.project_id)
        ),
        query: req.query_string().to_owned(),
        content_type: header("content-type"),
        git_protocol: header("git-protocol"),
        remote_user: auth.user.as_ref().map(|u| u.username.clone()),
        remote_addr: req.peer_addr().map(|a| a.ip().to_string()),
        extra_env,
        max_input_bytes: limit,
        config: auth.hidden_refs(),
    };

    // A push is serialized per project, so the refs read before and after it
    // belong to this push alone (across web replicas too: an advisory lock).
    let push_lock =
        if service == Service::ReceivePack && req.method() == actix_web::http::Method::POST {
            let db = state.pool.get().await?;
            db.execute(
                "SELECT pg_advisory_lock(7373, $1::int)",
                &[&(auth.project_id as i32)],
            )
            .await?;
            Some(db)
        } else {
            None
        };
    let refs_before = if push_lock.is_some() {
        let p = path.clone();
        Some(tokio::task::spawn_blocking(move || reader::refs(&p)).await??)
    } else {
        None
    };

    let mut backend = http_backend::spawn(repositories.root(), &request)?;
    let (head_tx, head_rx) = oneshot::channel::<Result<CgiHead, String>>();
    let (chunk_tx, chunk_rx) = mpsc::channel::<Result<web::Bytes, std::io::Error>>(8);
    let mut stdout = backend.stdout;
    let mut child = backend.child;
    let pool = state.pool.clone();
    let project_id = auth.project_id;
    let pusher = auth.user.as_ref().map(|u| u.id);
    let repo_path = path.clone();
    // The task owns the git process: it reads the answer, hands it to the
    // response stream while the client listens, and after the process ends it
    // records the push (even when the client has gone) before the answer ends.
    tokio::spawn(async move {
        let _permit = permit;
        let head = http_backend::read_head(&mut stdout).await;
        let leftover = match head {
            Ok(head) => {
                let leftover = head.leftover.clone();
                let _ = head_tx.send(Ok(head));
                leftover
            }
            Err(e) => {
                let _ = head_tx.send(Err(e.to_string()));
                let _ = child.kill().await;
                release(push_lock).await;
                return;
            }
        };
        let mut listening = true;
        if !leftover.is_empty() {
            listening = chunk_tx.send(Ok(web::Bytes::from(leftover))).await.is_ok();
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            use tokio::io::AsyncReadExt as _;
            match stdout.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    if listening {
                        listening = chunk_tx
                            .send(Ok(web::Bytes::copy_from_slice(&buf[..n])))
                            .await
                            .is_ok();
                        // A fetch nobody reads any more is stopped; a push
                        // runs to its end so the repository stays whole.
                        if !listening && refs_before.is_none() {
                            let _ = child.kill().await;
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = chunk_tx.send(Err(e)).await;
                    break;
                }
            }
        }
        // A fetch's answer ends here; a push's only once the push is
        // recorded, so that when `git push` returns, the record and its job
        // exist.
        let chunk_tx = refs_before.is_some().then_some(chunk_tx);
        let _ = child.wait().await;
        if let Some(before) = refs_before
            && let Err(e) = record_push(&pool, project_id, pusher, &repo_path, &before).await
        {
            tracing::error!(project_id, error = %e, "recording a push failed");
        }
        drop(chunk_tx);
        release(push_lock).await;
    });

    // Feed the request body to git while the task above reads its answer.
    // Cut off past the limit, git sees a truncated pack and writes nothing
    // (incoming objects wait in a quarantine until the push is accepted).
    if let (Some(stdin), Some(body)) = (backend.stdin.take(), body) {
        match encoding {
            BodyEncoding::Identity => feed_plain(stdin, body, limit).await?,
            BodyEncoding::Gzip => feed_inflated(stdin, body, limit).await?,
        }
    }

    let head = head_rx
        .await
        .map_err(|e| GitHttpError::Internal(e.to_string()))?
        .map_err(GitHttpError::Internal)?;
    let mut response = HttpResponse::build(
        StatusCode::from_u16(head.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    );
    for (name, value) in &head.headers {
        response.insert_header((name.as_str(), value.as_str()));
    }
    Ok(response.streaming(tokio_stream::wrappers::ReceiverStream::new(chunk_rx)))
}

fn header_text(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Passes a plain body to git, at most `limit` bytes.
async fn feed_plain(
    mut stdin: tokio::process::ChildStdin,
    mut body: web::Payload,
    limit: u64,
) -> Result<(), GitHttpError> {
    let mut sent: u64 = 0;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| GitHttpError::Internal(e.to_string()))?;
        sent += chunk.len() as u64;
        if sent > limit {
            return Err(GitHttpError::TooLarge);
        }
        if stdin.write_all(&chunk).await.is_err() {
            // git stopped reading (it refused the request); its answer says why.
            break;
        }
    }
    Ok(())
}

/// Inflates a gzip body and passes it to git: the limit counts the
/// inflated bytes (what git would otherwise inflate unmeasured), and the
/// compressed ones too.
async fn feed_inflated(
    mut stdin: tokio::process::ChildStdin,
    mut body: web::Payload,
    limit: u64,
) -> Result<(), GitHttpError> {
    let http_backend::Gunzip { input, mut output } = http_backend::gunzip(limit);
    let feed = async move {
        let mut received: u64 = 0;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| GitHttpError::Internal(e.to_string()))?;
            received += chunk.len() as u64;
            if received > limit {
                return Err(GitHttpError::TooLarge);
            }
            if input.send(chunk).await.is_err() {
                // The inflater stopped (too large, corrupt, git done).
                break;
            }
        }
        Ok(())
    };
    // Owns the inflater's output: when it ends, the inflater ends too.
    let drain = async move {
        while let Some(piece) = output.recv().await {
            let piece = piece.map_err(|e| match e {
                http_backend::InflateError::TooLarge(_) => GitHttpError::TooLarge,
                http_backend::InflateError::Corrupt(_) => {
                    GitHttpError::BadRequest("The request body is not valid gzip.")
                }
            })?;
            if stdin.write_all(&piece).await.is_err() {
                break;
            }
        }
        Ok::<(), GitHttpError>(())
    };
    let (fed, drained) = futures::join!(feed, drain);
    drained?;
    fed
}

async fn release(lock: Option<deadpool_postgres::Object>) {
    if let Some(db) = lock
        && let Err(e) = db.execute("SELECT pg_advisory_unlock_all()", &[]).await
    {
        tracing::warn!(error = %e, "releasing a push lock failed");
    }
}

async fn record_push(
    pool: &deadpool_postgres::Pool,
    project_id: i64,
    pusher: Option<i64>,
    path: &std::path::Path,
    before: &reader::Refs,
) -> Result<(), String> {
    let p = path.to_owned();
    let after = tokio::task::spawn_blocking(move || reader::refs(&p))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let updates = pushes::ref_updates(before, &after);
    let mut db = pool.get().await.map_err(|e| e.to_string())?;
    let tx = db.transaction().await.map_err(|e| e.to_string())?;
    pushes::record(&tx, project_id, pusher, &updates)
        .await
        .map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}
