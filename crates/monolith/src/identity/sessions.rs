//! Browser sessions of the web pages: a random cookie value whose SHA-256 digest
//! is stored (like tokens, never the value itself), a CSRF token per session, a
//! sliding expiry, and a fresh session id at every sign-in (no fixation).

use crate::queries::Queries;
use rand::RngCore;

use super::credentials::{AuthenticatedUser, TokenError, digest};

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "_duo_session";
/// A session expires this long after it was last used (GitLab's one week).
pub const SESSION_LIFETIME_SECS: i64 = 7 * 24 * 3600;

/// A new session: the cookie value (shown once, to the browser) and its CSRF token.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub cookie_value: String,
    pub csrf_token: String,
}

/// A session found for a cookie.
#[derive(Debug, Clone)]
pub struct SessionUser {
    pub user: AuthenticatedUser,
    pub csrf_token: String,
}

/// A random, URL-safe secret of `bytes` random bytes.
pub fn random_secret(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut raw);
    hex::encode(raw)
}

/// Starts a session for `user_id`.
pub async fn create(client: &impl Queries, user_id: i64) -> Result<NewSession, TokenError> {
    let cookie_value = random_secret(32);
    let csrf_token = random_secret(32);
    client
        .execute(
            "INSERT INTO web_sessions (session_digest, user_id, csrf_token, expires_at)
             VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
            &[
                &digest(&cookie_value),
                &user_id,
                &csrf_token,
                &(SESSION_LIFETIME_SECS as f64),
            ],
        )
        .await?;
    Ok(NewSession {
        cookie_value,
        csrf_token,
    })
}

/// The signed-in user of a session cookie, or `None` (unknown, expired, or a
/// blocked user). Using a session extends it, at most once a minute.
pub async fn lookup(
    client: &impl Queries,
    cookie_value: &str,
) -> Result<Option<SessionUser>, TokenError> {
    if cookie_value.len() != 64 {
        return Ok(None);
    }
    let row = client
        .query_opt(
            "UPDATE web_sessions s
                SET last_seen_at = CASE WHEN s.last_seen_at < now() - interval '1 minute' THEN now() ELSE s.last_seen_at END,
                    expires_at = CASE WHEN s.last_seen_at < now() - interval '1 minute'
                                      THEN now() + make_interval(secs => $2) ELSE s.expires_at END
               FROM users u
              WHERE s.session_digest = $1 AND u.id = s.user_id
                AND s.expires_at > now() AND u.state = 'active'
             RETURNING u.id, u.username, u.admin, s.csrf_token",
            &[&digest(cookie_value), &(SESSION_LIFETIME_SECS as f64)],
        )
        .await?;
    Ok(row.map(|r| SessionUser {
        user: AuthenticatedUser {
            id: r.get(0),
            username: r.get(1),
            admin: r.get(2),
            // Not a token: nothing to revoke through the tokens API.
            token_id: 0,
            // A signed-in browser may do what the user may (as on GitLab).
            scopes: vec!["api".into()],
            service_account: None,
            run: None,
        },
        csrf_token: r.get(3),
    }))
}

/// Ends the session of this cookie (sign out).
pub async fn destroy(client: &impl Queries, cookie_value: &str) -> Result<(), TokenError> {
    client
        .execute(
            "DELETE FROM web_sessions WHERE session_digest = $1",
            &[&digest(cookie_value)],
        )
        .await?;
    Ok(())
}

/// Ends every session of a user (blocked, or password changed).
pub async fn destroy_all_for_user(client: &impl Queries, user_id: i64) -> Result<u64, TokenError> {
    Ok(client
        .execute("DELETE FROM web_sessions WHERE user_id = $1", &[&user_id])
        .await?)
}

/// Whether a presented CSRF token matches the session's, in constant time.
pub fn csrf_matches(expected: &str, presented: Option<&str>) -> bool {
    use subtle::ConstantTimeEq;
    match presented {
        Some(p) if p.len() == expected.len() => bool::from(p.as_bytes().ct_eq(expected.as_bytes())),
        _ => false,
    }
}
