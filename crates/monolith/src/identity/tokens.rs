//! Personal access tokens: random secrets stored only as SHA-256 digests.

use crate::queries::Queries;
use chrono::{DateTime, NaiveDate, Utc};
use rand::RngCore;
use subtle::ConstantTimeEq;

pub use super::credentials::{AuthenticatedUser, RunBinding, ServiceAccount, TokenError, digest};

/// GitLab's prefix, so secret scanners recognise our tokens too.
pub const TOKEN_PREFIX: &str = "glpat-";

/// Scopes a personal access token may carry.
pub const KNOWN_SCOPES: &[&str] = &[
    "api",
    "read_api",
    "read_user",
    "ai_features",
    "sudo",
    "read_repository",
    "write_repository",
    // The MCP server's tools (and nothing else of the API), as GitLab's.
    "mcp",
];

#[derive(Debug, Clone)]
pub struct CreatedToken {
    pub id: i64,
    /// The plain token; shown once.
    pub token: String,
}

fn generate() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

pub async fn create(
    client: &impl Queries,
    user_id: i64,
    name: &str,
    scopes: &[String],
    expires_at: Option<NaiveDate>,
) -> Result<CreatedToken, TokenError> {
    if scopes.is_empty() {
        return Err(TokenError::NoScopes);
    }
    if let Some(bad) = scopes.iter().find(|s| !KNOWN_SCOPES.contains(&s.as_str())) {
        return Err(TokenError::UnknownScope(bad.clone()));
    }
    let token = generate();
    let row = client
        .query_one(
            "INSERT INTO personal_access_tokens (user_id, name, token_digest, scopes, expires_at)
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
            &[&user_id, &name, &digest(&token), &scopes, &expires_at],
        )
        .await?;
    Ok(CreatedToken {
        id: row.get(0),
        token,
    })
}

/// Stores a token whose plain text the caller chose (the demo seed prints stable
/// tokens so it can be re-run); otherwise identical to [`create`].
pub async fn create_with_secret(
    client: &impl Queries,
    user_id: i64,
    name: &str,
    token: &str,
    scopes: &[String],
) -> Result<i64, TokenError> {
    let row = client
        .query_one(
            "INSERT INTO personal_access_tokens (user_id, name, token_digest, scopes)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (token_digest) DO UPDATE SET revoked = false, scopes = EXCLUDED.scopes
             RETURNING id",
            &[&user_id, &name, &digest(token), &scopes],
        )
        .await?;
    Ok(row.get(0))
}

pub async fn revoke(client: &impl Queries, token_id: i64) -> Result<bool, TokenError> {
    let n = client
        .execute(
            "UPDATE personal_access_tokens SET revoked = true WHERE id = $1",
            &[&token_id],
        )
        .await?;
    Ok(n == 1)
}

/// Resolves a presented token to its user, or explains why it cannot be used.
pub async fn authenticate(
    client: &impl Queries,
    presented: &str,
) -> Result<AuthenticatedUser, TokenError> {
    let presented = presented.trim();
    // `ai_workflows` OAuth tokens (the Duo Workflow service presents one on
    // every call) are told apart by their shape, without a query: look them up
    // first so those calls cost one lookup, not two.
    if let Some(user) = super::oauth::authenticate(client, presented).await? {
        return Ok(user);
    }
    let wanted = digest(presented);
    let row = client
        .query_opt(
            "SELECT t.id, t.token_digest, t.scopes, t.expires_at, t.revoked,
                    u.id, u.username, u.admin, u.state,
                    t.last_used_at IS NULL OR t.last_used_at < now() - interval '10 minutes'
             FROM personal_access_tokens t JOIN users u ON u.id = t.user_id
             WHERE t.token_digest = $1",
            &[&wanted],
        )
        .await?;
    let Some(row) = row else {
        return Err(TokenError::Invalid);
    };
    let stored: Vec<u8> = row.get(1);
    // The index lookup already matched; compare again in constant time so the
    // decision itself never depends on how many bytes agree.
    if !bool::from(stored.ct_eq(&wanted)) {
        return Err(TokenError::Invalid);
    }
    let expires_at: Option<NaiveDate> = row.get(3);
    let revoked: bool = row.get(4);
    if revoked || expires_at.is_some_and(|d| d <= Utc::now().date_naive()) {
        return Err(TokenError::Invalid);
    }
    let state: String = row.get(8);
    if state != "active" {
        return Err(TokenError::Blocked);
    }
    let token_id: i64 = row.get(0);
    // At most every 10 minutes, as GitLab: a write per request would cost
    // every API call a row update (and a round trip).
    if row.get::<_, bool>(9) {
        client
            .execute(
                "UPDATE personal_access_tokens SET last_used_at = now()
                 WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '10 minutes')",
                &[&token_id],
            )
            .await?;
    }
    Ok(AuthenticatedUser {
        id: row.get(5),
        username: row.get(6),
        admin: row.get(7),
        token_id,
        scopes: row.get(2),
        service_account: None,
        run: None,
    })
}

/// A personal access token as the tokens API shows it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: i64,
    pub name: String,
    pub revoked: bool,
    pub created_at: DateTime<Utc>,
    pub scopes: Vec<String>,
    pub user_id: i64,
    pub last_used_at: Option<DateTime<Utc>>,
    pub expires_at: Option<NaiveDate>,
}

impl TokenRecord {
    /// Neither revoked nor expired.
    pub fn active(&self) -> bool {
        !self.revoked && self.expires_at.is_none_or(|d| d > Utc::now().date_naive())
    }
}

const TOKEN_COLUMNS: &str =
    "id, name, revoked, created_at, scopes, user_id, last_used_at, expires_at";

fn record_from_row(row: &tokio_postgres::Row) -> TokenRecord {
    TokenRecord {
        id: row.get("id"),
        name: row.get("name"),
        revoked: row.get("revoked"),
        created_at: row.get("created_at"),
        scopes: row.get("scopes"),
        user_id: row.get("user_id"),
        last_used_at: row.get("last_used_at"),
        expires_at: row.get("expires_at"),
    }
}

/// The token with this id, whoever owns it.
pub async fn record(
    db: &impl Queries,
    id: i64,
) -> Result<Option<TokenRecord>, tokio_postgres::Error> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM personal_access_tokens WHERE id = $1");
    Ok(db
        .query_opt(&sql, &[&id])
        .await?
        .as_ref()
        .map(record_from_row))
}

/// Which tokens a list shows; every field left `None` lets all through.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenFilter<'a> {
    pub owner: Option<i64>,
    pub revoked: Option<bool>,
    /// Active (neither revoked nor expired) or not.
    pub active: Option<bool>,
    /// An `ILIKE` pattern matched against the token's name.
    pub name_pattern: Option<&'a str>,
}

/// Tokens matching `filter`, newest first.
pub async fn records(
    db: &impl Queries,
    filter: &TokenFilter<'_>,
) -> Result<Vec<TokenRecord>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {TOKEN_COLUMNS} FROM personal_access_tokens
         WHERE ($1::bigint IS NULL OR user_id = $1)
           AND ($2::boolean IS NULL OR revoked = $2)
           AND ($3::boolean IS NULL
                OR $3 = (NOT revoked AND (expires_at IS NULL OR expires_at > current_date)))
           AND ($4::text IS NULL OR name ILIKE $4)
         ORDER BY id DESC"
    );
    let rows = db
        .query(
            &sql,
            &[
                &filter.owner,
                &filter.revoked,
                &filter.active,
                &filter.name_pattern,
            ],
        )
        .await?;
    Ok(rows.iter().map(record_from_row).collect())
}

/// The owner of token `id`; `None` for no such token.
pub async fn owner_of(db: &impl Queries, id: i64) -> Result<Option<i64>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT user_id FROM personal_access_tokens WHERE id = $1",
            &[&id],
        )
        .await?
        .map(|r| r.get(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_prefixed_and_distinct() {
        let a = generate();
        let b = generate();
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 48);
        assert_ne!(a, b);
        assert_eq!(digest(&a).len(), 32);
    }
}
