//! OAuth 2.1 for MCP clients (the MCP authorization specification): public
//! clients registered dynamically (RFC 7591), the authorization code a user
//! grants one on the consent page, bound to a PKCE S256 challenge, exchanged
//! once for an access token (in `oauth_access_tokens`, scope `mcp`, two
//! hours) and a refresh token that rotates on each use. Codes and tokens are
//! stored as SHA-256 digests only. A code presented twice revokes what it
//! gave (RFC 6749 §4.1.2).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Duration;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::credentials::{TokenError, digest};
use super::sessions::random_secret;
use crate::queries::Queries;

/// This instance as an OAuth issuer: its external URL without the slash.
pub fn issuer(external_url: &url::Url) -> String {
    external_url.as_str().trim_end_matches('/').to_owned()
}

/// The MCP endpoint as a resource identifier (RFC 8707), under `external_url`.
pub fn mcp_resource(external_url: &url::Url) -> String {
    format!("{}/api/v4/mcp", issuer(external_url))
}

/// The one scope these clients may ask for.
pub const MCP_SCOPE: &str = "mcp";
/// How long a code may wait for its exchange.
const CODE_LIFETIME: Duration = Duration::minutes(10);
/// How long an access token lives (GitLab's OAuth tokens: two hours).
pub const ACCESS_TOKEN_LIFETIME: Duration = Duration::hours(2);
const MAX_REDIRECT_URIS: usize = 10;
const MAX_URI_CHARS: usize = 2000;
const MAX_NAME_CHARS: usize = 200;

/// Why a registration, a grant or an exchange was refused, in OAuth's words.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// RFC 7591 `invalid_redirect_uri`.
    #[error("{0}")]
    InvalidRedirectUri(String),
    /// RFC 7591 `invalid_client_metadata`.
    #[error("{0}")]
    InvalidClientMetadata(String),
    /// RFC 6749 `invalid_client`: no such client.
    #[error("unknown client")]
    InvalidClient,
    /// RFC 6749 `invalid_grant`: a bad, used or expired code or refresh
    /// token, or a verifier that does not match.
    #[error("{0}")]
    InvalidGrant(&'static str),
    /// RFC 6749 `invalid_request`.
    #[error("{0}")]
    InvalidRequest(String),
    /// RFC 6749 `invalid_scope`.
    #[error("only the mcp scope can be granted")]
    InvalidScope,
    #[error(transparent)]
    Token(#[from] TokenError),
}

impl From<tokio_postgres::Error> for OAuthError {
    fn from(e: tokio_postgres::Error) -> Self {
        OAuthError::Token(e.into())
    }
}

impl OAuthError {
    /// The `error` code of an OAuth error answer.
    pub fn code(&self) -> &'static str {
        match self {
            OAuthError::InvalidRedirectUri(_) => "invalid_redirect_uri",
            OAuthError::InvalidClientMetadata(_) => "invalid_client_metadata",
            OAuthError::InvalidClient => "invalid_client",
            OAuthError::InvalidGrant(_) => "invalid_grant",
            OAuthError::InvalidRequest(_) => "invalid_request",
            OAuthError::InvalidScope => "invalid_scope",
            OAuthError::Token(_) => "server_error",
        }
    }
}

/// A registered client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Application {
    pub id: i64,
    pub client_id: String,
    pub name: String,
    pub redirect_uris: Vec<String>,
    pub scopes: Vec<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

fn application(row: &tokio_postgres::Row) -> Application {
    Application {
        id: row.get("id"),
        client_id: row.get("uid"),
        name: row.get("name"),
        redirect_uris: row.get("redirect_uris"),
        scopes: row.get("scopes"),
        created_at: row.get("created_at"),
    }
}

/// Whether a redirect URI may be registered: `https`, `http` to a loopback
/// host (a native client's local listener, RFC 8252 §7.3), or a private-use
/// scheme in reverse-domain form (RFC 8252 §7.1); never a fragment, and
/// never a scheme a browser would run or read locally.
pub fn check_redirect_uri(uri: &str) -> Result<(), OAuthError> {
    let refuse = |why: &str| Err(OAuthError::InvalidRedirectUri(format!("{uri}: {why}")));
    if uri.len() > MAX_URI_CHARS || uri.contains(['\0', ' ', '\n', '\r']) {
        return refuse("is not a valid URI");
    }
    let Ok(parsed) = url::Url::parse(uri) else {
        return refuse("is not a valid URI");
    };
    if parsed.fragment().is_some() {
        return refuse("must not have a fragment");
    }
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(&parsed) => Ok(()),
        "http" => refuse("http is only allowed to a loopback address"),
        "javascript" | "data" | "file" | "vbscript" | "about" | "blob" | "ftp" | "ws" | "wss" => {
            refuse("this scheme is not allowed")
        }
        scheme if scheme.contains('.') => Ok(()),
        _ => refuse("use https, http to a loopback address, or a reverse-domain scheme"),
    }
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Whether `presented` is one of the client's redirect URIs: exactly, or for
/// a loopback `http` URI the same but for the port (a native client listens
/// on whatever port is free, RFC 8252 §7.3).
pub fn redirect_uri_matches(app: &Application, presented: &str) -> bool {
    app.redirect_uris.iter().any(|registered| {
        if registered == presented {
            return true;
        }
        let (Ok(r), Ok(p)) = (url::Url::parse(registered), url::Url::parse(presented)) else {
            return false;
        };
        r.scheme() == "http"
            && p.scheme() == "http"
            && is_loopback(&r)
            && r.host() == p.host()
            && r.path() == p.path()
            && r.query() == p.query()
    })
}

/// The scopes asked for (space-separated, `None` for the default): only `mcp`.
pub fn check_scope(requested: Option<&str>) -> Result<Vec<String>, OAuthError> {
    let asked: Vec<&str> = requested
        .map(|s| s.split_whitespace().collect())
        .unwrap_or_default();
    if asked.iter().all(|s| *s == MCP_SCOPE) {
        Ok(vec![MCP_SCOPE.to_owned()])
    } else {
        Err(OAuthError::InvalidScope)
    }
}

/// Registers a public client (no secret: it proves itself with PKCE).
pub async fn register(
    db: &impl Queries,
    name: &str,
    redirect_uris: &[String],
    scope: Option<&str>,
) -> Result<Application, OAuthError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS || name.contains('\0') {
        return Err(OAuthError::InvalidClientMetadata(format!(
            "client_name is required (at most {MAX_NAME_CHARS} characters)"
        )));
    }
    if redirect_uris.is_empty() || redirect_uris.len() > MAX_REDIRECT_URIS {
        return Err(OAuthError::InvalidRedirectUri(format!(
            "give 1 to {MAX_REDIRECT_URIS} redirect_uris"
        )));
    }
    for uri in redirect_uris {
        check_redirect_uri(uri)?;
    }
    let scopes = check_scope(scope)?;
    let client_id = random_secret(16);
    let row = db
        .query_one(
            "INSERT INTO oauth_applications (uid, name, redirect_uris, scopes)
             VALUES ($1, $2, $3, $4) RETURNING *",
            &[&client_id, &name, &redirect_uris, &scopes],
        )
        .await?;
    Ok(application(&row))
}

pub async fn find(db: &impl Queries, client_id: &str) -> Result<Option<Application>, OAuthError> {
    if client_id.len() > 64 {
        return Ok(None);
    }
    Ok(db
        .query_opt(
            "SELECT * FROM oauth_applications WHERE uid = $1",
            &[&client_id],
        )
        .await?
        .map(|r| application(&r)))
}

/// The S256 challenge of a PKCE verifier.
pub fn s256(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// A verifier as RFC 7636 §4.1 has it: 43 to 128 unreserved characters.
fn valid_verifier(verifier: &str) -> bool {
    (43..=128).contains(&verifier.len())
        && verifier
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// What a user's consent grants the client.
#[derive(Debug, Clone)]
pub struct NewGrant<'a> {
    pub app: &'a Application,
    pub user_id: i64,
    pub redirect_uri: &'a str,
    pub code_challenge: &'a str,
    pub scopes: &'a [String],
    pub resource: Option<&'a str>,
}

/// Records the consent; returns the code for the client (shown once).
pub async fn grant(db: &impl Queries, new: NewGrant<'_>) -> Result<String, OAuthError> {
    let code = random_secret(32);
    db.execute(
        "INSERT INTO oauth_access_grants
             (application_id, user_id, code_digest, redirect_uri, code_challenge, scopes, resource, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8))",
        &[
            &new.app.id,
            &new.user_id,
            &digest(&code),
            &new.redirect_uri,
            &new.code_challenge,
            &new.scopes,
            &new.resource,
            &(CODE_LIFETIME.num_seconds() as f64),
        ],
    )
    .await?;
    Ok(code)
}

/// An access token and its refresh token, as the token endpoint answers.
#[derive(Debug, Clone)]
pub struct IssuedTokens {
    pub access_token: String,
    pub refresh_token: String,
    pub expires_in: i64,
    pub scopes: Vec<String>,
}

async fn issue(
    db: &impl Queries,
    app_id: i64,
    user_id: i64,
    grant_id: Option<i64>,
    scopes: &[String],
) -> Result<IssuedTokens, OAuthError> {
    let access_token = random_secret(32);
    let refresh_token = random_secret(32);
    db.execute(
        "INSERT INTO oauth_access_tokens
             (user_id, token_digest, scopes, expires_at, application_id, grant_id)
         VALUES ($1, $2, $3, now() + make_interval(secs => $4), $5, $6)",
        &[
            &user_id,
            &digest(&access_token),
            &scopes,
            &(ACCESS_TOKEN_LIFETIME.num_seconds() as f64),
            &app_id,
            &grant_id,
        ],
    )
    .await?;
    db.execute(
        "INSERT INTO oauth_refresh_tokens (application_id, user_id, grant_id, token_digest, scopes)
         VALUES ($1, $2, $3, $4, $5)",
        &[
            &app_id,
            &user_id,
            &grant_id,
            &digest(&refresh_token),
            &scopes,
        ],
    )
    .await?;
    Ok(IssuedTokens {
        access_token,
        refresh_token,
        expires_in: ACCESS_TOKEN_LIFETIME.num_seconds(),
        scopes: scopes.to_vec(),
    })
}

/// Exchanges a code: the client's, unexpired, never used, for the same
/// redirect URI, with the verifier of its challenge. A code used twice
/// revokes every token it gave.
pub async fn exchange_code(
    db: &impl Queries,
    app: &Application,
    code: &str,
    redirect_uri: &str,
    verifier: &str,
) -> Result<IssuedTokens, OAuthError> {
    if !valid_verifier(verifier) {
        return Err(OAuthError::InvalidGrant(
            "code_verifier must be 43 to 128 unreserved characters",
        ));
    }
    let Some(row) = db
        .query_opt(
            "SELECT g.id, g.user_id, g.redirect_uri, g.code_challenge, g.scopes,
                    g.expires_at > now(), u.state
             FROM oauth_access_grants g JOIN users u ON u.id = g.user_id
             WHERE g.code_digest = $1 AND g.application_id = $2",
            &[&digest(code), &app.id],
        )
        .await?
    else {
        return Err(OAuthError::InvalidGrant("the code is not valid"));
    };
    let grant_id: i64 = row.get(0);
    // Spend the code first, whatever follows: one attempt per code; a code
    // spent already (now or by a concurrent exchange) revokes what it gave.
    let spent = db
        .execute(
            "UPDATE oauth_access_grants SET used_at = now() WHERE id = $1 AND used_at IS NULL",
            &[&grant_id],
        )
        .await?;
    if spent == 0 {
        revoke_grant(db, grant_id).await?;
        return Err(OAuthError::InvalidGrant("the code was used already"));
    }
    if !row.get::<_, bool>(5) {
        return Err(OAuthError::InvalidGrant("the code has expired"));
    }
    if row.get::<_, String>(2) != redirect_uri {
        return Err(OAuthError::InvalidGrant(
            "redirect_uri differs from the authorization request's",
        ));
    }
    let challenge: String = row.get(3);
    if !bool::from(s256(verifier).as_bytes().ct_eq(challenge.as_bytes())) {
        return Err(OAuthError::InvalidGrant(
            "code_verifier does not match the code_challenge",
        ));
    }
    if row.get::<_, String>(6) != "active" {
        return Err(OAuthError::InvalidGrant("the user is blocked"));
    }
    let scopes: Vec<String> = row.get(4);
    issue(db, app.id, row.get(1), Some(grant_id), &scopes).await
}

async fn revoke_grant(db: &impl Queries, grant_id: i64) -> Result<(), OAuthError> {
    db.execute(
        "UPDATE oauth_access_tokens SET revoked_at = now() WHERE grant_id = $1 AND revoked_at IS NULL",
        &[&grant_id],
    )
    .await?;
    db.execute(
        "UPDATE oauth_refresh_tokens SET revoked_at = now() WHERE grant_id = $1 AND revoked_at IS NULL",
        &[&grant_id],
    )
    .await?;
    Ok(())
}

/// A new access token for a refresh token, which is spent and replaced.
pub async fn refresh(
    db: &impl Queries,
    app: &Application,
    refresh_token: &str,
) -> Result<IssuedTokens, OAuthError> {
    let Some(row) = db
        .query_opt(
            "UPDATE oauth_refresh_tokens r SET revoked_at = now()
             FROM users u
             WHERE r.token_digest = $1 AND r.application_id = $2 AND r.revoked_at IS NULL
               AND u.id = r.user_id
             RETURNING r.user_id, r.grant_id, r.scopes, u.state",
            &[&digest(refresh_token), &app.id],
        )
        .await?
    else {
        return Err(OAuthError::InvalidGrant("the refresh token is not valid"));
    };
    if row.get::<_, String>(3) != "active" {
        return Err(OAuthError::InvalidGrant("the user is blocked"));
    }
    let scopes: Vec<String> = row.get(2);
    issue(db, app.id, row.get(0), row.get(1), &scopes).await
}

/// RFC 7009: revokes an access or refresh token of the client. Unknown
/// tokens are no error (the answer must not tell).
pub async fn revoke_token(
    db: &impl Queries,
    app: &Application,
    token: &str,
) -> Result<(), OAuthError> {
    let wanted = digest(token.trim());
    db.execute(
        "UPDATE oauth_access_tokens SET revoked_at = now()
         WHERE token_digest = $1 AND application_id = $2 AND revoked_at IS NULL",
        &[&wanted, &app.id],
    )
    .await?;
    db.execute(
        "UPDATE oauth_refresh_tokens SET revoked_at = now()
         WHERE token_digest = $1 AND application_id = $2 AND revoked_at IS NULL",
        &[&wanted, &app.id],
    )
    .await?;
    Ok(())
}

/// An application as a user sees it among those they authorized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    pub app: Application,
    pub last_granted_at: chrono::DateTime<chrono::Utc>,
}

/// The applications holding a live refresh token of the user.
pub async fn authorized_by(db: &impl Queries, user_id: i64) -> Result<Vec<Authorized>, OAuthError> {
    let rows = db
        .query(
            "SELECT a.*, max(r.created_at) AS last_granted_at
             FROM oauth_applications a JOIN oauth_refresh_tokens r ON r.application_id = a.id
             WHERE r.user_id = $1 AND r.revoked_at IS NULL
             GROUP BY a.id ORDER BY last_granted_at DESC",
            &[&user_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Authorized {
            app: application(r),
            last_granted_at: r.get("last_granted_at"),
        })
        .collect())
}

/// Takes back everything the user granted the application.
pub async fn revoke_authorization(
    db: &impl Queries,
    user_id: i64,
    app_id: i64,
) -> Result<u64, OAuthError> {
    let access = db
        .execute(
            "UPDATE oauth_access_tokens SET revoked_at = now()
             WHERE application_id = $1 AND user_id = $2 AND revoked_at IS NULL",
            &[&app_id, &user_id],
        )
        .await?;
    let refresh = db
        .execute(
            "UPDATE oauth_refresh_tokens SET revoked_at = now()
             WHERE application_id = $1 AND user_id = $2 AND revoked_at IS NULL",
            &[&app_id, &user_id],
        )
        .await?;
    Ok(access + refresh)
}

/// Every registered application with how many users hold a live grant, for
/// the admin.
pub async fn all(db: &impl Queries) -> Result<Vec<(Application, i64)>, OAuthError> {
    let rows = db
        .query(
            "SELECT a.*, (SELECT count(DISTINCT r.user_id) FROM oauth_refresh_tokens r
                          WHERE r.application_id = a.id AND r.revoked_at IS NULL) AS users
             FROM oauth_applications a ORDER BY a.id DESC LIMIT 500",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (application(r), r.get("users")))
        .collect())
}

/// Deletes an application and, with it, every code and token it holds.
pub async fn delete(db: &impl Queries, app_id: i64) -> Result<bool, OAuthError> {
    Ok(db
        .execute("DELETE FROM oauth_applications WHERE id = $1", &[&app_id])
        .await?
        > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_uris_are_https_loopback_or_private_use() {
        for ok in [
            "https://client.example/cb",
            "http://127.0.0.1:33418/callback",
            "http://localhost/cb",
            "http://[::1]:9000/cb",
            "com.example.app:/oauth",
        ] {
            assert!(check_redirect_uri(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://evil.example/cb",
            "javascript:alert(1)",
            "data:text/html,hi",
            "file:///etc/passwd",
            "https://client.example/cb#frag",
            "myapp:/cb",
            "not a uri",
        ] {
            assert!(check_redirect_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_redirects_match_on_any_port_others_exactly() {
        let app = Application {
            id: 1,
            client_id: "c".into(),
            name: "n".into(),
            redirect_uris: vec![
                "http://127.0.0.1:1000/cb".into(),
                "https://client.example/cb".into(),
            ],
            scopes: vec![MCP_SCOPE.into()],
            created_at: chrono::Utc::now(),
        };
        assert!(redirect_uri_matches(&app, "http://127.0.0.1:5555/cb"));
        assert!(!redirect_uri_matches(&app, "http://127.0.0.1:5555/other"));
        assert!(!redirect_uri_matches(&app, "http://localhost:1000/cb"));
        assert!(redirect_uri_matches(&app, "https://client.example/cb"));
        assert!(!redirect_uri_matches(&app, "https://client.example:444/cb"));
        assert!(!redirect_uri_matches(&app, "https://client.example/cb?x=1"));
    }

    #[test]
    fn pkce_s256_is_unpadded_base64url_of_sha256() {
        // Computed independently with Python's hashlib and base64.
        assert_eq!(
            s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r-wW1gFWFOEjXk"),
            "NPsYzawS-__wqk67X9gyb4dr3JBo3hnlEi5MNyD5jX0"
        );
        assert!(valid_verifier(
            "dBjftJeZ4CVP-mB92K27uhbUJU1p1r-wW1gFWFOEjXk"
        ));
        assert!(!valid_verifier("short"));
        assert!(!valid_verifier(&"a b".repeat(20)));
    }

    #[test]
    fn only_the_mcp_scope() {
        assert_eq!(check_scope(None).unwrap(), vec!["mcp"]);
        assert_eq!(check_scope(Some("mcp")).unwrap(), vec!["mcp"]);
        assert!(check_scope(Some("mcp api")).is_err());
    }
}
