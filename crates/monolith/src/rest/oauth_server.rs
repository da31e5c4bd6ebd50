//! The OAuth 2.1 endpoints MCP clients discover and use (the MCP
//! authorization specification): protected resource metadata (RFC 9728) for
//! `/api/v4/mcp`, authorization server metadata (RFC 8414), dynamic client
//! registration (RFC 7591), the token endpoint (authorization code with PKCE,
//! refresh) and revocation (RFC 7009). The consent page that issues codes is
//! a web page (`web::oauth_consent`); the rules are in
//! [`crate::identity::oauth_clients`].

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

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

fn oauth_error(status: actix_web::http::StatusCode, e: &OAuthError) -> HttpResponse {
    if let OAuthError::Token(inner) = e {
        tracing::error!(error = %inner, "OAuth request failed");
        return HttpResponse::InternalServerError()
            .json(json!({"error": "server_error", "error_description": "internal error"}));
    }
    HttpResponse::build(status)
        .insert_header(("Cache-Control", "no-store"))
        .json(json!({"error": e.code(), "error_description": e.to_string()}))
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

/// `POST /oauth/register` (RFC 7591): a public client, as GitLab registers
/// MCP clients (`client_name` required, scope `mcp`).
pub async fn register(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<RegistrationRequest>,
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
    let body = body.into_inner();
    let bad = |why: &str| {
        oauth_error(
            actix_web::http::StatusCode::BAD_REQUEST,
            &OAuthError::InvalidClientMetadata(why.to_owned()),
        )
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
        Err(e) => oauth_error(actix_web::http::StatusCode::BAD_REQUEST, &e),
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
/// for an access token of scope `mcp`.
pub async fn token(state: web::Data<AppState>, form: web::Form<TokenRequest>) -> HttpResponse {
    use actix_web::http::StatusCode;
    let form = form.into_inner();
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

/// `POST /oauth/revoke` (RFC 7009): 200 whether or not the token existed.
pub async fn revoke(state: web::Data<AppState>, form: web::Form<RevokeRequest>) -> HttpResponse {
    use actix_web::http::StatusCode;
    let form = form.into_inner();
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
