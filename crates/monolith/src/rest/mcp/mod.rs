//! The MCP server at `/api/v4/mcp`: the Model Context Protocol over streamable
//! HTTP, so any MCP client (Claude Code, Cursor, VS Code, an SDK) works with
//! issues, merge requests, pipelines and code search as its user.
//!
//! The protocol (JSON-RPC 2.0, `initialize`, version negotiation, sessions,
//! `tools/list`, `tools/call`, SSE or JSON answers) is the Rust MCP SDK's
//! (`rmcp`); this module puts it behind GitLab's authentication and limits:
//!
//! - a token with the `mcp` scope (a personal access token or an OAuth token
//!   from [`crate::identity::oauth_clients`]); none or a bad one is a 401 whose
//!   `WWW-Authenticate` names the protected resource metadata (RFC 9728), a
//!   token without the scope a 403 `insufficient_scope`;
//! - the request body's size, requests per token per minute, a tool call's
//!   time and its answer's size ([`crate::config::McpServerConfig`]), each
//!   refusal a JSON-RPC error body;
//! - every tool call in the audit log (tool, outcome, time; never content).
//!
//! The tools ([`tools`]) run through the REST floor as [`McpCaller`].
//!
//! A session's `tools/call`, `tools/list` and `ping` are answered as one JSON
//! object by a session-less twin of the service ([`DIRECT`]) rather than as
//! an event stream through the session's worker: they need nothing of the
//! session, the specification lets the server answer any request either way,
//! and the worker's round trips were most of what a tool call cost over REST.
//! Since rmcp's idle timer no longer sees those calls, sessions are closed
//! after five idle minutes here ([`IdleSessions`]).

pub mod tools;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{
    SessionId, SessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use super::ApiError;
use crate::app_state::AppState;
use crate::audit::TokenKind;
use crate::identity::request::presented_token;
use crate::identity::tokens::{AuthenticatedUser, TokenError};
use crate::policy::Actor;
use tools::ToolError;

/// The header naming a session (streamable HTTP).
const HEADER_SESSION_ID: &str = "mcp-session-id";

/// The scope a token needs here (GitLab's `mcp`).
pub const MCP_SCOPE: &str = "mcp";

/// Where the protected resource metadata of `/api/v4/mcp` lives (RFC 9728:
/// the well-known prefix before the resource's path).
pub const RESOURCE_METADATA_PATH: &str = "/.well-known/oauth-protected-resource/api/v4/mcp";

/// The caller of a tool: the token's user, whose `mcp` scope was checked.
/// It reads and writes through the REST floor like a request would.
#[derive(Debug, Clone)]
pub struct McpCaller {
    pub user: AuthenticatedUser,
    /// Which table `user.token_id` numbers (for the audit log).
    pub token_kind: TokenKind,
}

impl McpCaller {
    pub fn actor(&self) -> Actor {
        Actor::from(&self.user)
    }
}

impl super::Caller for McpCaller {
    async fn reader(&self, _state: &AppState) -> Result<Option<AuthenticatedUser>, ApiError> {
        Ok(Some(self.user.clone()))
    }

    async fn writer(&self, _state: &AppState) -> Result<AuthenticatedUser, ApiError> {
        Ok(self.user.clone())
    }
}

/// Why a request never reached the protocol.
#[derive(Debug, thiserror::Error)]
enum McpHttpError {
    #[error("401 Unauthorized")]
    Unauthorized,
    #[error("403 Forbidden - Your account has been blocked.")]
    Blocked,
    #[error("the token needs the mcp scope")]
    InsufficientScope,
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("more than {0} requests this minute from this token")]
    RateLimited(u32, u64),
    #[error("the request body could not be read")]
    Body,
    #[error("internal error")]
    Internal(String),
}

impl McpHttpError {
    fn response(&self, state: &AppState) -> HttpResponse {
        let metadata = format!(
            "{}{RESOURCE_METADATA_PATH}",
            crate::identity::oauth_clients::issuer(&state.config.external_url)
        );
        // JSON-RPC's error shape (no id: the request was not read), so an MCP
        // client shows the reason.
        let rpc = |code: i64| json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": self.to_string()}});
        match self {
            McpHttpError::Unauthorized => HttpResponse::Unauthorized()
                .insert_header((
                    "WWW-Authenticate",
                    format!(r#"Bearer resource_metadata="{metadata}", scope="{MCP_SCOPE}""#),
                ))
                .json(rpc(-32001)),
            McpHttpError::Blocked => HttpResponse::Forbidden().json(rpc(-32001)),
            McpHttpError::InsufficientScope => HttpResponse::Forbidden()
                .insert_header((
                    "WWW-Authenticate",
                    format!(
                        r#"Bearer error="insufficient_scope", scope="{MCP_SCOPE}", resource_metadata="{metadata}""#
                    ),
                ))
                .json(rpc(-32001)),
            McpHttpError::TooLarge(_) => HttpResponse::PayloadTooLarge().json(rpc(-32600)),
            McpHttpError::RateLimited(_, retry) => HttpResponse::TooManyRequests()
                .insert_header(("Retry-After", retry.to_string()))
                .json(rpc(-32000)),
            McpHttpError::Body => HttpResponse::BadRequest().json(rpc(-32700)),
            McpHttpError::Internal(detail) => {
                tracing::error!(error = %detail, "MCP request failed");
                HttpResponse::InternalServerError().json(rpc(-32603))
            }
        }
    }
}

/// Requests per token per minute, counted in this process (cheap, and
/// enough to stop one token flooding a replica).
static LIMITER: LazyLock<crate::rate_limit::PerMinute<Vec<u8>>> = LazyLock::new(Default::default);

/// The sessions of this process (protocol versions before 2026-07-28).
static SESSIONS: LazyLock<Arc<LocalSessionManager>> = LazyLock::new(|| {
    let mut sessions = LocalSessionManager::default();
    // Closed by `IDLE` instead: rmcp's timer would close a session whose
    // requests all went to `DIRECT` while it is in use.
    sessions.session_config.keep_alive = None;
    Arc::new(sessions)
});

fn protocol_config() -> StreamableHttpServerConfig {
    // Our own body limit applies first (`DUO_MCP_MAX_REQUEST_BYTES`).
    StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_max_request_body_bytes(usize::MAX)
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        .disable_allowed_hosts()
}

/// The protocol side, shared by every request of this process. Stateless
/// requests (protocol 2026-07-28) get plain JSON answers; a session's go
/// through the session's worker and answer as an SSE stream, as rmcp does.
static SERVICE: LazyLock<StreamableHttpService<McpTools, LocalSessionManager>> =
    LazyLock::new(|| {
        StreamableHttpService::new(|| Ok(McpTools), SESSIONS.clone(), protocol_config())
    });

/// The same protocol without sessions, for the requests of a session that
/// need nothing of it ([`needs_no_session`]): rmcp validates them as it
/// validates a session's (protocol version header, the standard headers
/// against the body) and answers one JSON object.
static DIRECT: LazyLock<StreamableHttpService<McpTools, NeverSessionManager>> =
    LazyLock::new(|| {
        StreamableHttpService::new(
            || Ok(McpTools),
            Arc::new(NeverSessionManager::default()),
            protocol_config().with_legacy_session_mode(false),
        )
    });

/// Whether `body` is a request whose answer needs nothing of its session:
/// no server-to-client request, notification or stream to resume belongs to
/// it, so a JSON answer is the whole answer.
fn needs_no_session(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
        id: Option<serde::de::IgnoredAny>,
    }
    // An object: serde would read the struct from an array too.
    body.trim_ascii_start().first() == Some(&b'{')
        && serde_json::from_slice::<Peek>(body).is_ok_and(|m| {
            m.id.is_some()
                && matches!(
                    m.method.as_deref(),
                    Some("tools/call" | "tools/list" | "ping")
                )
        })
}

/// How long a session may go unused before it is closed.
const SESSION_IDLE: Duration = Duration::from_secs(300);
/// How often idle sessions are looked for (on a request, so an instance no
/// one calls does no work).
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// When each session was last used.
struct IdleSessions {
    used: Mutex<HashMap<SessionId, Instant>>,
    swept: Mutex<Instant>,
}

static IDLE: LazyLock<IdleSessions> = LazyLock::new(|| IdleSessions::new(Instant::now()));

impl IdleSessions {
    fn new(now: Instant) -> Self {
        IdleSessions {
            used: Mutex::default(),
            swept: Mutex::new(now),
        }
    }

    fn touch(&self, id: &SessionId, now: Instant) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.insert(id.clone(), now);
    }

    fn forget(&self, id: &SessionId) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.remove(id);
    }

    /// The sessions unused for [`SESSION_IDLE`] at `now`, forgotten here;
    /// looked for once every [`SWEEP_EVERY`] at most, none in between.
    fn expired(&self, now: Instant) -> Vec<SessionId> {
        {
            let mut swept = self.swept.lock().unwrap_or_else(PoisonError::into_inner);
            if now.saturating_duration_since(*swept) < SWEEP_EVERY {
                return Vec::new();
            }
            *swept = now;
        }
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let idle: Vec<SessionId> = used
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(**at) >= SESSION_IDLE)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &idle {
            used.remove(id);
        }
        idle
    }
}

/// Closes the sessions idle too long, off the request's path.
fn close_idle_sessions() {
    let idle = IDLE.expired(Instant::now());
    if idle.is_empty() {
        return;
    }
    tokio::spawn(async move {
        for id in idle {
            if let Err(e) = SESSIONS.close_session(&id).await {
                tracing::warn!(error = %e, "an idle MCP session could not be closed");
            }
        }
    });
}

/// `POST`, `GET` and `DELETE /api/v4/mcp`.
pub(super) async fn handle(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    match serve(&state, &req, payload).await {
        Ok(response) => response,
        Err(e) => e.response(&state),
    }
}

/// The token's user and the kind of token. The kind is known by which
/// lookup found it: OAuth access tokens first, as
/// [`crate::identity::tokens::authenticate`] does (only a token of their
/// shape costs that query), then personal access tokens through it.
async fn lookup(
    state: &AppState,
    token: &str,
) -> Result<(AuthenticatedUser, TokenKind), TokenError> {
    let db = state.pool.get().await.map_err(crate::db::DbError::from)?;
    if let Some(user) = crate::identity::oauth::authenticate(&*db, token).await? {
        return Ok((user, TokenKind::OAuthAccessToken));
    }
    let user = crate::identity::tokens::authenticate(&*db, token).await?;
    Ok((user, TokenKind::PersonalAccessToken))
}

async fn authenticate(state: &AppState, token: &str) -> Result<McpCaller, McpHttpError> {
    let (user, token_kind) = match lookup(state, token).await {
        Ok(found) => found,
        Err(TokenError::Invalid) => return Err(McpHttpError::Unauthorized),
        Err(TokenError::Blocked) => return Err(McpHttpError::Blocked),
        Err(e) => return Err(McpHttpError::Internal(e.to_string())),
    };
    if !user.has_any_scope(&[MCP_SCOPE]) {
        return Err(McpHttpError::InsufficientScope);
    }
    Ok(McpCaller { user, token_kind })
}

async fn read_body(mut payload: web::Payload, limit: usize) -> Result<Bytes, McpHttpError> {
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| McpHttpError::Body)?;
        if body.len() + chunk.len() > limit {
            return Err(McpHttpError::TooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

async fn serve(
    state: &web::Data<AppState>,
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, McpHttpError> {
    let limits = &state.config.mcp;
    if req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|len| len > limits.max_request_bytes)
    {
        return Err(McpHttpError::TooLarge(limits.max_request_bytes));
    }
    // Counted before the token is looked up, so a flood costs no query; keyed
    // by the token itself (personal and OAuth tokens number their ids
    // separately, so an id would share one budget between two users).
    let Some(token) = presented_token(req) else {
        return Err(McpHttpError::Unauthorized);
    };
    LIMITER
        .take(
            crate::identity::credentials::digest(&token),
            limits.requests_per_minute,
        )
        .map_err(|retry| McpHttpError::RateLimited(limits.requests_per_minute, retry))?;
    let caller = authenticate(state, &token).await?;
    let body = read_body(payload, limits.max_request_bytes).await?;
    close_idle_sessions();
    // A session this process knows (only those: an id a client made up costs
    // no memory here).
    let session = match req
        .headers()
        .get(HEADER_SESSION_ID)
        .and_then(|v| v.to_str().ok())
    {
        Some(id) => {
            let id = SessionId::from(id);
            SESSIONS
                .has_session(&id)
                .await
                .unwrap_or(false)
                .then_some(id)
        }
        None => None,
    };
    if let Some(id) = &session {
        IDLE.touch(id, Instant::now());
    }
    let direct = session.is_some()
        && req.method() == actix_web::http::Method::POST
        && needs_no_session(&body);

    let mut builder = http::Request::builder()
        .method(req.method().as_str())
        .uri(req.uri().to_string());
    for (name, value) in req.headers() {
        builder = builder.header(name.as_str(), value.as_bytes());
    }
    let mut request = builder
        .body(Full::new(body))
        .map_err(|e| McpHttpError::Internal(e.to_string()))?;
    request.extensions_mut().insert(caller);
    request.extensions_mut().insert(state.clone());

    let response = if direct {
        DIRECT.handle(request).await
    } else {
        SERVICE.handle(request).await
    };
    let (parts, body) = response.into_parts();
    if parts.status.is_success() {
        if let Some(created) = parts
            .headers
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            IDLE.touch(&SessionId::from(created), Instant::now());
        } else if let Some(id) = &session
            && req.method() == actix_web::http::Method::DELETE
        {
            IDLE.forget(id);
        }
    }
    let status =
        StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = HttpResponse::build(status);
    for (name, value) in &parts.headers {
        out.append_header((name.as_str(), value.as_bytes()));
    }
    let streaming = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if streaming {
        let stream = body
            .into_data_stream()
            .map(|chunk| chunk.map_err(|never| match never {}));
        Ok(out.streaming::<_, std::convert::Infallible>(stream))
    } else {
        let bytes = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_else(|never| match never {});
        Ok(out.body(bytes))
    }
}

/// The MCP handler: the server's description, the catalogue and tool calls.
#[derive(Clone, Copy)]
struct McpTools;

impl McpTools {
    fn request_parts(
        context: &RequestContext<RoleServer>,
    ) -> Result<(McpCaller, web::Data<AppState>), ErrorData> {
        let parts = context
            .extensions
            .get::<http::request::Parts>()
            .ok_or_else(|| ErrorData::internal_error("request without its HTTP parts", None))?;
        let caller = parts
            .extensions
            .get::<McpCaller>()
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("request without a caller", None))?;
        let state = parts
            .extensions
            .get::<web::Data<AppState>>()
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("request without state", None))?;
        Ok((caller, state))
    }
}

impl ServerHandler for McpTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "GitLab MCP server",
                tools::SERVER_VERSION,
            ))
            .with_instructions(
                "Tools of a GitLab Duo instance: issues, merge requests, pipelines, notes, \
                 search and semantic code search, each answering what the token's user may read.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::CATALOGUE.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (caller, state) = Self::request_parts(&context)?;
        let name = request.name.to_string();
        if !tools::exists(&name) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool: {name}"),
                None,
            ));
        }
        let arguments = request.arguments.unwrap_or_default();
        let limits = state.config.mcp.clone();
        let started = Instant::now();
        let outcome = tokio::time::timeout(
            limits.tool_timeout,
            tools::call(&state, &caller, &name, &arguments),
        )
        .await;
        let (result, label) = match outcome {
            Err(_) => (
                CallToolResult::error(vec![ContentBlock::text(format!(
                    "the tool call took longer than {} s and was stopped",
                    limits.tool_timeout.as_secs()
                ))]),
                "timeout",
            ),
            Ok(Ok(value)) => (
                CallToolResult::success(answer(value, limits.max_answer_bytes)),
                "ok",
            ),
            Ok(Err(ToolError::Arguments(message))) => {
                audit(&state, &caller, &name, "invalid_arguments", started);
                return Err(ErrorData::invalid_params(message, None));
            }
            Ok(Err(ToolError::Api(ApiError::Internal(detail)))) => {
                tracing::error!(tool = %name, error = %detail, "MCP tool failed");
                (
                    CallToolResult::error(vec![ContentBlock::text("500 Internal Server Error")]),
                    "error",
                )
            }
            Ok(Err(e)) => (
                CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
                "refused",
            ),
        };
        audit(&state, &caller, &name, label, started);
        Ok(result.into())
    }
}

/// The tool's value as the client gets it: text (JSON unless it is text
/// already), at most `max` bytes. A list too long keeps its first items and
/// says how many were left out, so the JSON stays whole.
fn answer(value: Value, max: usize) -> Vec<ContentBlock> {
    let text = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.len() <= max {
        return vec![ContentBlock::text(text)];
    }
    if let Value::Array(items) = value {
        let total = items.len();
        let mut kept: Vec<Value> = Vec::new();
        let mut size = 2;
        for item in items {
            let len = item.to_string().len() + 1;
            if size + len > max {
                break;
            }
            size += len;
            kept.push(item);
        }
        let note = format!(
            "The answer was cut to {max} bytes: {} of {total} items are shown; ask for a smaller page (per_page) to see the rest.",
            kept.len()
        );
        return vec![
            ContentBlock::text(Value::Array(kept).to_string()),
            ContentBlock::text(note),
        ];
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    vec![
        ContentBlock::text(text[..cut].to_owned()),
        ContentBlock::text(format!(
            "The answer was cut to {max} bytes of {}.",
            text.len()
        )),
    ]
}

/// Tool calls on their way to the audit log. They are written together,
/// one INSERT per [`AUDIT_BATCH_AFTER`], instead of one per call: on a busy
/// server that write was a tenth of a tool call's time (measured with
/// `./dev bench mcp`), and a row now lands within that delay instead.
static AUDIT_QUEUE: Mutex<Vec<crate::audit::McpToolCall>> = Mutex::new(Vec::new());
const AUDIT_BATCH_AFTER: Duration = Duration::from_millis(50);

/// Records the call in the audit log, off the answer's path.
fn audit(
    state: &AppState,
    caller: &McpCaller,
    tool: &str,
    outcome: &'static str,
    started: Instant,
) {
    let entry = crate::audit::McpToolCall {
        user_id: caller.user.id,
        token_id: caller.user.token_id,
        token_kind: caller.token_kind,
        tool: tool.to_owned(),
        outcome,
        duration_ms: i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX),
    };
    tracing::info!(tool, outcome, user_id = caller.user.id, "MCP tool call");
    let first = {
        let mut queue = AUDIT_QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
        queue.push(entry);
        queue.len() == 1
    };
    // The call that finds the queue empty schedules its writing; the others
    // ride along.
    if first {
        let pool = state.pool.clone();
        tokio::spawn(async move {
            tokio::time::sleep(AUDIT_BATCH_AFTER).await;
            let batch =
                std::mem::take(&mut *AUDIT_QUEUE.lock().unwrap_or_else(PoisonError::into_inner));
            write_audit(&pool, &batch).await;
        });
    }
}

async fn write_audit(pool: &deadpool_postgres::Pool, batch: &[crate::audit::McpToolCall]) {
    let db = match pool.get().await {
        Ok(db) => db,
        Err(e) => {
            tracing::warn!(error = %e, calls = batch.len(), "the MCP audit log could not be written");
            return;
        }
    };
    if crate::audit::record_mcp_tool_calls(&*db, batch)
        .await
        .is_ok()
    {
        return;
    }
    // One bad row (its user deleted meanwhile) must not lose the others.
    for call in batch {
        if let Err(e) = crate::audit::record_mcp_tool_call(&*db, call).await {
            tracing::warn!(error = %e, tool = %call.tool, "the MCP audit log could not be written");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(blocks: &[ContentBlock]) -> Vec<String> {
        blocks
            .iter()
            .map(|b| b.as_text().map(|t| t.text.clone()).unwrap_or_default())
            .collect()
    }

    #[test]
    fn sessions_unused_for_five_minutes_expire_once_and_others_stay() {
        let start = Instant::now();
        let idle = IdleSessions::new(start);
        let (old, busy): (SessionId, SessionId) = ("old".into(), "busy".into());
        idle.touch(&old, start);
        idle.touch(&busy, start);
        idle.touch(&busy, start + Duration::from_secs(200));
        // Not looked at again before SWEEP_EVERY, whatever their age.
        assert!(idle.expired(start + Duration::from_secs(10)).is_empty());
        assert_eq!(idle.expired(start + SESSION_IDLE), vec![old.clone()]);
        // Forgotten once expired; the busy one goes five minutes after its use.
        let later = start + SESSION_IDLE + SWEEP_EVERY;
        assert!(idle.expired(later).is_empty());
        let last = start + Duration::from_secs(200) + SESSION_IDLE + SWEEP_EVERY;
        assert_eq!(idle.expired(last), vec![busy]);
    }

    #[test]
    fn a_forgotten_session_never_expires() {
        let start = Instant::now();
        let idle = IdleSessions::new(start);
        let gone: SessionId = "gone".into();
        idle.touch(&gone, start);
        idle.forget(&gone);
        assert!(idle.expired(start + SESSION_IDLE * 2).is_empty());
    }

    #[test]
    fn only_a_sessions_pure_requests_skip_its_worker() {
        let request = |method: &str| {
            json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": {}}).to_string()
        };
        for method in ["tools/call", "tools/list", "ping"] {
            assert!(needs_no_session(request(method).as_bytes()), "{method}");
        }
        for method in ["initialize", "resources/list", "completion/complete"] {
            assert!(!needs_no_session(request(method).as_bytes()), "{method}");
        }
        // A notification (no id), an array, and what is not JSON stay with
        // the session's worker, which answers them as before.
        let cancelled = json!({"jsonrpc": "2.0", "method": "tools/call"}).to_string();
        assert!(!needs_no_session(cancelled.as_bytes()));
        assert!(!needs_no_session(br#"["tools/call", 3]"#));
        assert!(!needs_no_session(b"{tools/call"));
    }

    #[test]
    fn a_small_answer_is_whole_json() {
        let out = texts(&answer(json!({"a": 1}), 100));
        assert_eq!(out, vec![r#"{"a":1}"#.to_owned()]);
    }

    #[test]
    fn a_long_list_keeps_whole_items_and_says_so() {
        let items: Vec<Value> = (0..100)
            .map(|i| json!({"id": i, "pad": "x".repeat(20)}))
            .collect();
        let out = texts(&answer(Value::Array(items), 200));
        let kept: Vec<Value> = serde_json::from_str(&out[0]).unwrap();
        assert!(!kept.is_empty() && kept.len() < 100);
        assert!(out[0].len() <= 200);
        assert!(
            out[1].contains(&format!("{} of 100 items", kept.len())),
            "{}",
            out[1]
        );
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        let out = texts(&answer(Value::String("é".repeat(100)), 51));
        assert!(out[0].len() <= 51 && out[0].chars().all(|c| c == 'é'));
        assert!(out[1].contains("cut to 51 bytes of 200"));
    }
}
