//! `/api/graphql` over HTTP (POST, batches) and WebSocket (subscriptions).

use actix_web::{HttpRequest, HttpResponse, web};

use super::limits::{self, Caller};
use super::*;
use crate::rest::{self, ApiError};

pub(crate) fn error_body(code: &str, message: &str) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({
        "errors": [{ "message": message, "extensions": { "code": code } }]
    }))
}

/// The user of a browser session, for requests from our own pages: same origin,
/// and (for POSTs) the session's CSRF token in `X-CSRF-Token`, as GitLab's
/// frontend sends it.
async fn session_user(
    state: &AppState,
    req: &HttpRequest,
    needs_csrf: bool,
) -> Result<Option<AuthenticatedUser>, ApiError> {
    use crate::identity::{request, sessions};
    let Some(session) = request::request_session(&state.pool, req).await? else {
        return Ok(None);
    };
    if !request::same_origin(req, &state.config.external_url) {
        return Err(ApiError::ForbiddenBecause("cross-origin request"));
    }
    if needs_csrf {
        let presented = req
            .headers()
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok());
        if !sessions::csrf_matches(&session.csrf_token, presented) {
            return Err(ApiError::ForbiddenBecause("invalid CSRF token"));
        }
    }
    Ok(Some(session.user))
}

/// Applies [`super::variables::normalize_json_variables`] to each request of a
/// body (one request or a batch).
fn normalize_all(schema: &Schema, body: &mut serde_json::Value) {
    let requests: Vec<&mut serde_json::Value> = match body {
        serde_json::Value::Array(items) => items.iter_mut().collect(),
        single => vec![single],
    };
    // Oversized batches and documents are refused by the limits next; no
    // work is spent on them here.
    if requests.len() > limits::MAX_BATCH_SIZE {
        return;
    }
    for request in requests {
        let Some(obj) = request.as_object_mut() else {
            continue;
        };
        let query = obj.get("query").and_then(|q| q.as_str()).map(str::to_owned);
        let operation = obj
            .get("operationName")
            .and_then(|q| q.as_str())
            .map(str::to_owned);
        if let (Some(query), Some(variables)) = (query, obj.get_mut("variables"))
            && query.len() <= limits::MAX_QUERY_BYTES
        {
            super::variables::normalize_json_variables(
                schema,
                &query,
                operation.as_deref(),
                variables,
            );
        }
    }
}

/// `POST /api/graphql`.
pub async fn handle(
    state: web::Data<AppState>,
    schema: web::Data<Schema>,
    req: HttpRequest,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let user = match rest::presented_user(&state, &req).await? {
        Some(user) => Some(user),
        None => session_user(&state, &req, true).await?,
    };
    // The door only: a token with none of these scopes has nothing to do
    // here. What each scope allows per field is `TokenAccess`'s to decide
    // (`ai_features` runs the AI mutations, never the admin ones).
    if let Some(u) = &user
        && !u.has_any_scope(&["api", "read_api", "ai_features"])
    {
        return Err(ApiError::InsufficientScope(
            "api read_api ai_features".into(),
        ));
    }
    // Parsed as plain JSON first: NUL characters are refused wherever they are,
    // before anything runs or counts against a rate limit.
    let json: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return Ok(error_body(
                "BAD_REQUEST",
                &format!("Invalid JSON body: {e}"),
            ));
        }
    };
    if limits::json_has_nul(&json) {
        return Ok(error_body(
            "GRAPHQL_VALIDATION_FAILED",
            "Invalid input: NUL characters are not allowed",
        ));
    }
    let mut json = json;
    normalize_all(&schema, &mut json);
    let batch: juniper::http::GraphQLBatchRequest = match serde_json::from_value(json) {
        Ok(b) => b,
        Err(e) => {
            return Ok(error_body(
                "BAD_REQUEST",
                &format!("Invalid JSON body: {e}"),
            ));
        }
    };
    let caller = match &user {
        None => Caller::Anonymous,
        Some(u) if u.admin => Caller::Admin,
        Some(_) => Caller::User,
    };
    let documents: Vec<(&str, Option<&str>)> = match &batch {
        juniper::http::GraphQLBatchRequest::Single(r) => {
            vec![(r.query.as_str(), r.operation_name.as_deref())]
        }
        juniper::http::GraphQLBatchRequest::Batch(rs) => rs
            .iter()
            .map(|r| (r.query.as_str(), r.operation_name.as_deref()))
            .collect(),
    };
    if let Err(e) = limits::check_batch(caller, &documents) {
        return Ok(error_body(e.code, &e.message));
    }
    let ctx = GqlContext::new(&state, user);
    let Ok(response) =
        tokio::time::timeout(state.config.graphql_timeout, batch.execute(&schema, &ctx)).await
    else {
        return Ok(error_body(
            "TIMEOUT",
            "Request timed out. Please try a less complex query or a smaller date range.",
        ));
    };
    // Successful responses need no patching, only a size check.
    let bytes = if response.is_ok() {
        serde_json::to_vec(&response)
    } else {
        let mut body = serde_json::to_value(&response)
            .map_err(|e| ApiError::Internal(format!("serialising a GraphQL response: {e}")))?;
        add_missing_codes(&mut body);
        serde_json::to_vec(&body)
    }
    .map_err(|e| ApiError::Internal(format!("serialising a GraphQL response: {e}")))?;
    if bytes.len() > caller.max_response_bytes() {
        return Ok(error_body(
            "RESPONSE_TOO_LARGE",
            &format!(
                "The response is larger than {} bytes; select fewer fields",
                caller.max_response_bytes()
            ),
        ));
    }
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(bytes))
}

/// Juniper's own parse and validation errors carry no `extensions.code`;
/// every error we send must, so clients can branch on it. A response without
/// `data` failed before execution.
pub(crate) fn add_missing_codes(body: &mut serde_json::Value) {
    let responses: Vec<&mut serde_json::Value> = match body {
        serde_json::Value::Array(items) => items.iter_mut().collect(),
        single => vec![single],
    };
    for response in responses {
        let code = if response.get("data").is_some_and(|d| !d.is_null()) {
            "INTERNAL_SERVER_ERROR"
        } else {
            "GRAPHQL_VALIDATION_FAILED"
        };
        let Some(errors) = response.get_mut("errors").and_then(|e| e.as_array_mut()) else {
            continue;
        };
        for error in errors {
            let Some(error) = error.as_object_mut() else {
                continue;
            };
            let extensions = error
                .entry("extensions")
                .or_insert_with(|| serde_json::json!({}));
            if let Some(extensions) = extensions.as_object_mut() {
                extensions
                    .entry("code")
                    .or_insert_with(|| serde_json::json!(code));
            }
        }
    }
}

/// `GET /api/graphql`: a WebSocket upgrade opens a subscription socket; anything
/// else is an ordinary request.
pub async fn handle_get(
    state: web::Data<AppState>,
    schema: web::Data<Schema>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let upgrade = req
        .headers()
        .get(actix_web::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if upgrade {
        return open_socket(state, schema, req, payload).await;
    }
    let body = payload.to_bytes().await?;
    Ok(handle(state, schema, req, body).await?)
}

/// Why a subscription socket was refused at `connection_init`; the text is what
/// the client reads.
#[derive(Debug, thiserror::Error)]
pub enum SocketAuthError {
    #[error("Unauthorized: send a personal access token as Authorization: Bearer <token>")]
    Unauthorized,
    #[error("Forbidden: the token needs the api, read_api or ai_features scope")]
    InsufficientScope,
    #[error("Forbidden: the user is blocked")]
    Blocked,
    #[error("Internal server error")]
    Internal,
}

/// The token in a `connection_init` payload: `{"Authorization": "Bearer <t>"}`
/// (any case), or `{"PRIVATE-TOKEN": "<t>"}`.
pub(crate) fn token_from_init(params: &juniper::Variables) -> Option<String> {
    use juniper::ScalarValue;
    let text = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_scalar())
            .and_then(|v| v.try_to_string())
    };
    if let Some(token) = text("private-token") {
        return Some(token.trim().to_owned());
    }
    let auth = text("authorization")?;
    let (scheme, rest) = auth.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim().to_owned())
}

/// Opens a `graphql-transport-ws` (or legacy `graphql-ws`) socket. The user is the
/// owner of the token in the upgrade request's headers, or else of the one in
/// the `connection_init` payload; a socket without a valid token is refused.
async fn open_socket(
    state: web::Data<AppState>,
    schema: web::Data<Schema>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let header_user = match rest::presented_user(&state, &req).await? {
        Some(user) => Some(user),
        // Browsers send the session cookie with the upgrade but cannot set
        // headers; the Origin check stops other sites from riding on it.
        None => session_user(&state, &req, false).await?,
    };
    let state = state.get_ref().clone();
    let state_lifecycle = state.lifecycle.clone();
    let keep_alive = state.config.ws_keep_alive;
    let init = move |params: juniper::Variables| async move {
        let user = match header_user {
            Some(user) => user,
            None => {
                let token = token_from_init(&params).ok_or(SocketAuthError::Unauthorized)?;
                let db = state
                    .pool
                    .get()
                    .await
                    .map_err(|_| SocketAuthError::Internal)?;
                crate::identity::tokens::authenticate(&*db, &token)
                    .await
                    .map_err(|e| match e {
                        crate::identity::tokens::TokenError::Invalid => {
                            SocketAuthError::Unauthorized
                        }
                        crate::identity::tokens::TokenError::Blocked => SocketAuthError::Blocked,
                        _ => SocketAuthError::Internal,
                    })?
            }
        };
        if !user.has_any_scope(&["api", "read_api", "ai_features"]) {
            return Err(SocketAuthError::InsufficientScope);
        }
        Ok(
            juniper_graphql_ws::ConnectionConfig::new(GqlContext::new(&state, Some(user)))
                .with_keep_alive_interval(keep_alive)
                // juniper would otherwise close a socket whose client sends no
                // pings of its own within one interval; graphql-ws clients
                // (GitLab's among them) do not ping by default, so open tabs
                // would lose their subscription after 15 s of quiet.
                .with_keep_alive_timeout(std::time::Duration::ZERO),
        )
    };
    let lifecycle = state_lifecycle;
    super::socket::serve(req, payload, schema.into_inner(), init, lifecycle).await
}
