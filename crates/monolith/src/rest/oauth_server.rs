//! The OAuth 2.1 endpoints MCP clients discover and use (the MCP
//! authorization specification): protected resource metadata (RFC 9728) for
//! `/api/v4/mcp`, authorization server metadata (RFC 8414), dynamic client
//! registration (RFC 7591), the token endpoint (authorization code with PKCE,
//! refresh) and revocation (RFC 7009). The consent page that issues codes is
//! a web page (`web::oauth_consent`); the rules are in
//! [`crate::identity::oauth_clients`].

use actix_web::error::{JsonPayloadError, UrlencodedError};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app_state::AppState;
use crate::identity::oauth_clients::{self as clients, OAuthError};

/// Registrations one address may make per minute: the endpoint is open to
/// anyone, as the specification wants, so it is bounded here.
const REGISTRATIONS_PER_MINUTE: u32 = 20;

static REGISTRATIONS: std::sync::LazyLock<crate::rate_limit::PerMinute<String>> =
    std::sync::LazyLock::new(Default::default);

fn base(state: &AppState) -> String {
    clients::issuer(&state.config.external_url)
}

/// The MCP endpoint as a resource identifier.
pub fn mcp_resource(state: &AppState) -> String {
    clients::mcp_resource(&state.config.external_url)
}

/// RFC 9728 metadata of the MCP endpoint (named in its 401's challenge).
pub async fn protected_resource(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "resource": mcp_resource(&state),
        "authorization_servers": [base(&state)],
        "scopes_supported": [clients::MCP_SCOPE],
        "bearer_methods_supported": ["header"],
        "resource_name": "GitLab MCP server",
    }))
}

/// RFC 8414 metadata of this instance as an authorization server.
pub async fn authorization_server(state: web::Data<AppState>) -> HttpResponse {
    let base = base(&state);
    HttpResponse::Ok().json(json!({
        "issuer": base,
        "authorization_endpoint": format!("{base}/oauth/authorize"),
        "token_endpoint": format!("{base}/oauth/token"),
        "registration_endpoint": format!("{base}/oauth/register"),
        "revocation_endpoint": format!("{base}/oauth/revoke"),
        "scopes_supported": [clients::MCP_SCOPE],
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
    }))
}

fn oauth_error(status: StatusCode, e: &OAuthError) -> HttpResponse {
    if let OAuthError::Token(inner) = e {
        tracing::error!(error = %inner, "OAuth request failed");
        return HttpResponse::InternalServerError()
            .json(json!({"error": "server_error", "error_description": "internal error"}));
    }
    HttpResponse::build(status)
        .insert_header(("Cache-Control", "no-store"))
        .json(json!({"error": e.code(), "error_description": e.to_string()}))
}

/// Why a JSON body could not be read, in words for the client (not actix's).
fn json_body_problem(e: &actix_web::Error) -> String {
    match e.as_error::<JsonPayloadError>() {
        Some(JsonPayloadError::ContentType) => "the body must be application/json".into(),
        Some(
            JsonPayloadError::Overflow { limit }
            | JsonPayloadError::OverflowKnownLength { limit, .. },
        ) => format!("the body is larger than {limit} bytes"),
        Some(JsonPayloadError::Deserialize(inner)) => format!("the body is not JSON: {inner}"),
        _ => "the body could not be read".into(),
    }
}

/// Why a form body could not be read, in words for the client.
fn form_body_problem(e: &actix_web::Error) -> String {
    match e.as_error::<UrlencodedError>() {
        Some(UrlencodedError::ContentType) => {
            "the body must be application/x-www-form-urlencoded".into()
        }
        Some(UrlencodedError::Overflow { limit, .. }) => {
            format!("the body is larger than {limit} bytes")
        }
        // `serde_urlencoded`'s words: a parameter sent twice (RFC 6749 allows
        // each once), one that is not UTF-8...
        Some(UrlencodedError::Parse(inner)) => format!("the form could not be read: {inner}"),
        _ => "the body could not be read".into(),
    }
}

/// RFC 6749's `invalid_request`: a token or revocation request whose form
/// could not be read.
fn malformed_form(e: &actix_web::Error) -> HttpResponse {
    oauth_error(
        StatusCode::BAD_REQUEST,
        &OAuthError::InvalidRequest(form_body_problem(e)),
    )
}

#[derive(Debug, Deserialize)]
pub struct RegistrationRequest {
    client_name: Option<String>,
    #[serde(default)]
    redirect_uris: Vec<String>,
    scope: Option<String>,
    token_endpoint_auth_method: Option<String>,
    grant_types: Option<Vec<String>>,
    response_types: Option<Vec<String>>,
}

/// The registration request of a body: a JSON object (RFC 7591 section
/// 3.1); anything else is why not. Read as a `Value` first because serde
/// would also take a struct from a JSON array, field by field in order.
fn registration_request(body: Value) -> Result<RegistrationRequest, String> {
    if !body.is_object() {
        return Err("the client metadata must be a JSON object".into());
    }
    serde_json::from_value(body).map_err(|e| format!("the client metadata is not valid: {e}"))
}

/// `POST /oauth/register` (RFC 7591): a public client, as GitLab registers
/// MCP clients (`client_name` required, scope `mcp`). A body that is not a
/// JSON object is RFC 7591's `invalid_client_metadata` error, in JSON, like
/// every other refusal here.
pub async fn register(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: Result<web::Json<Value>, actix_web::Error>,
) -> HttpResponse {
    let address = req
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    if let Err(retry) = REGISTRATIONS.take(address, REGISTRATIONS_PER_MINUTE) {
        return HttpResponse::TooManyRequests()
            .insert_header(("Retry-After", retry.to_string()))
            .json(json!({"error": "slow_down", "error_description": "too many registrations from this address"}));
    }
    let bad = |why: &str| {
        oauth_error(
            StatusCode::BAD_REQUEST,
            &OAuthError::InvalidClientMetadata(why.to_owned()),
        )
    };
    let body = match body
        .map_err(|e| json_body_problem(&e))
        .and_then(|json| registration_request(json.into_inner()))
    {
        Ok(body) => body,
        Err(why) => return bad(&why),
    };
    if body
        .token_endpoint_auth_method
        .as_deref()
        .is_some_and(|m| m != "none")
    {
        return bad("only public clients (token_endpoint_auth_method none) can register");
    }
    if body.grant_types.as_ref().is_some_and(|g| {
        g.iter()
            .any(|t| t != "authorization_code" && t != "refresh_token")
    }) {
        return bad("grant_types may be authorization_code and refresh_token");
    }
    if body
        .response_types
        .as_ref()
        .is_some_and(|r| r.iter().any(|t| t != "code"))
    {
        return bad("response_types may only be code");
    }
    let Ok(db) = state.pool.get().await else {
        return HttpResponse::ServiceUnavailable().finish();
    };
    let name = body.client_name.unwrap_or_default();
    match clients::register(&*db, &name, &body.redirect_uris, body.scope.as_deref()).await {
        Ok(app) => HttpResponse::Created()
            .insert_header(("Cache-Control", "no-store"))
            .json(json!({
                "client_id": app.client_id,
                "client_id_issued_at": app.created_at.timestamp(),
                "client_name": app.name,
                "redirect_uris": app.redirect_uris,
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "none",
                "scope": app.scopes.join(" "),
            })),
        Err(e) => oauth_error(StatusCode::BAD_REQUEST, &e),
    }
}

#[derive(Debug, Deserialize)]
pub struct TokenRequest {
    grant_type: Option<String>,
    client_id: Option<String>,
    code: Option<String>,
    redirect_uri: Option<String>,
    code_verifier: Option<String>,
    refresh_token: Option<String>,
    resource: Option<String>,
}

/// `POST /oauth/token`: a code (with its PKCE verifier) or a refresh token
/// for an access token of scope `mcp`. A form that cannot be read is
/// RFC 6749's `invalid_request`, in JSON.
pub async fn token(
    state: web::Data<AppState>,
    form: Result<web::Form<TokenRequest>, actix_web::Error>,
) -> HttpResponse {
    let form = match form {
        Ok(form) => form.into_inner(),
        Err(e) => return malformed_form(&e),
    };
    let missing = |name: &str| {
        oauth_error(
            StatusCode::BAD_REQUEST,
            &OAuthError::InvalidRequest(format!("{name} is required")),
        )
    };
    if let Some(resource) = form.resource.as_deref()
        && resource.trim_end_matches('/') != mcp_resource(&state)
    {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            &OAuthError::InvalidRequest(format!("resource must be {}", mcp_resource(&state))),
        );
    }
    let Some(client_id) = form.client_id.as_deref() else {
        return missing("client_id");
    };
    let Ok(db) = state.pool.get().await else {
        return HttpResponse::ServiceUnavailable().finish();
    };
    let app = match clients::find(&*db, client_id).await {
        Ok(Some(app)) => app,
        Ok(None) => return oauth_error(StatusCode::UNAUTHORIZED, &OAuthError::InvalidClient),
        Err(e) => return oauth_error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    };
    let issued = match form.grant_type.as_deref() {
        Some("authorization_code") => {
            let (Some(code), Some(redirect_uri), Some(verifier)) = (
                form.code.as_deref(),
                form.redirect_uri.as_deref(),
                form.code_verifier.as_deref(),
            ) else {
                return missing("code, redirect_uri and code_verifier");
            };
            clients::exchange_code(&*db, &app, code, redirect_uri, verifier).await
        }
        Some("refresh_token") => {
            let Some(refresh) = form.refresh_token.as_deref() else {
                return missing("refresh_token");
            };
            clients::refresh(&*db, &app, refresh).await
        }
        _ => {
            return HttpResponse::BadRequest().json(json!({
                "error": "unsupported_grant_type",
                "error_description": "grant_type must be authorization_code or refresh_token",
            }));
        }
    };
    match issued {
        Ok(t) => HttpResponse::Ok()
            .insert_header(("Cache-Control", "no-store"))
            .json(json!({
                "access_token": t.access_token,
                "token_type": "Bearer",
                "expires_in": t.expires_in,
                "refresh_token": t.refresh_token,
                "scope": t.scopes.join(" "),
                "created_at": chrono::Utc::now().timestamp(),
            })),
        Err(e) => oauth_error(StatusCode::BAD_REQUEST, &e),
    }
}

#[derive(Debug, Deserialize)]
pub struct RevokeRequest {
    token: Option<String>,
    client_id: Option<String>,
}

/// `POST /oauth/revoke` (RFC 7009): 200 whether or not the token existed;
/// a form that cannot be read is `invalid_request`, in JSON.
pub async fn revoke(
    state: web::Data<AppState>,
    form: Result<web::Form<RevokeRequest>, actix_web::Error>,
) -> HttpResponse {
    let form = match form {
        Ok(form) => form.into_inner(),
        Err(e) => return malformed_form(&e),
    };
    let (Some(token), Some(client_id)) = (form.token.as_deref(), form.client_id.as_deref()) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            &OAuthError::InvalidRequest("token and client_id are required".into()),
        );
    };
    let Ok(db) = state.pool.get().await else {
        return HttpResponse::ServiceUnavailable().finish();
    };
    match clients::find(&*db, client_id).await {
        Ok(Some(app)) => match clients::revoke_token(&*db, &app, token).await {
            Ok(()) => HttpResponse::Ok().json(json!({})),
            Err(e) => oauth_error(StatusCode::INTERNAL_SERVER_ERROR, &e),
        },
        Ok(None) => oauth_error(StatusCode::UNAUTHORIZED, &OAuthError::InvalidClient),
        Err(e) => oauth_error(StatusCode::INTERNAL_SERVER_ERROR, &e),
    }
}
