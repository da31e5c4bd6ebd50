//! The token an HTTP request presents, and the user it belongs to.

use actix_web::HttpRequest;
use deadpool_postgres::Pool;

use super::tokens::{self, AuthenticatedUser, TokenError};
use crate::db::DbError;

/// The token a request presents: `PRIVATE-TOKEN` or `Authorization: Bearer`.
pub fn presented_token(req: &HttpRequest) -> Option<String> {
    let headers = req.headers();
    if let Some(v) = headers.get("private-token").and_then(|v| v.to_str().ok()) {
        return Some(v.trim().to_owned());
    }
    let auth = headers
        .get(actix_web::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, rest) = auth.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim().to_owned())
}

/// The owner of the request's token; `None` when no token was sent. An unknown,
/// expired or revoked token is [`TokenError::Invalid`], a blocked owner
/// [`TokenError::Blocked`].
pub async fn request_user(
    pool: &Pool,
    req: &HttpRequest,
) -> Result<Option<AuthenticatedUser>, TokenError> {
    let Some(token) = presented_token(req) else {
        return Ok(None);
    };
    let client = pool.get().await.map_err(DbError::from)?;
    tokens::authenticate(&*client, &token).await.map(Some)
}

/// The session cookie's value, when the request carries one.
pub fn session_cookie(req: &HttpRequest) -> Option<String> {
    req.cookie(super::sessions::SESSION_COOKIE)
        .map(|c| c.value().to_owned())
        .filter(|v| !v.is_empty())
}

/// The signed-in browser session of the request, if any.
pub async fn request_session(
    pool: &Pool,
    req: &HttpRequest,
) -> Result<Option<super::sessions::SessionUser>, TokenError> {
    let Some(cookie) = session_cookie(req) else {
        return Ok(None);
    };
    let client = pool.get().await.map_err(DbError::from)?;
    super::sessions::lookup(&*client, &cookie).await
}

/// Whether a cookie-authenticated request comes from our own pages: browsers
/// send `Origin` on cross-site requests and WebSocket upgrades; it must be this
/// instance's external URL (or absent, for same-origin navigations).
pub fn same_origin(req: &HttpRequest, external_url: &url::Url) -> bool {
    let Some(origin) = req.headers().get(actix_web::http::header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let ours = external_url.origin().ascii_serialization();
    origin.trim_end_matches('/') == ours
}
