//! OAuth access tokens with the `ai_workflows` scope: what Duo Workflow's
//! service and executors call the REST API with. Minted per `direct_access`
//! call (and per executor socket), two hours long, stored only as SHA-256
//! digests, revocable. A composite token is owned by a service account and acts
//! on behalf of a human: the request runs as the human, and both must be allowed.

use crate::queries::Queries;
use chrono::{DateTime, Duration, Utc};
use rand::RngCore;
use subtle::ConstantTimeEq;

use super::credentials::{AuthenticatedUser, ServiceAccount, TokenError, digest};

/// The scope of Duo Workflow's tokens (GitLab's `ai_workflows`).
pub const AI_WORKFLOWS_SCOPE: &str = "ai_workflows";

/// Lifetime of a user's token (GitLab: 2 hours).
pub const USER_TOKEN_LIFETIME: Duration = Duration::hours(2);

/// Lifetime of a composite identity token (GitLab: 1 hour).
pub const COMPOSITE_TOKEN_LIFETIME: Duration = Duration::hours(1);

/// Length of the hex text of a token (32 random bytes).
const TOKEN_HEX_LEN: usize = 64;

/// A token just minted; the plain text exists only here.
#[derive(Debug, Clone)]
pub struct MintedToken {
    pub id: i64,
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

fn generate() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Mints an `ai_workflows` token for `user_id`, valid for `lifetime`.
pub async fn mint(
    client: &impl Queries,
    user_id: i64,
    lifetime: Duration,
) -> Result<MintedToken, TokenError> {
    insert(client, user_id, None, lifetime).await
}

/// Mints a composite token: owned by `service_account_id`, acting for `human_id`.
pub async fn mint_composite(
    client: &impl Queries,
    service_account_id: i64,
    human_id: i64,
    lifetime: Duration,
) -> Result<MintedToken, TokenError> {
    insert(client, service_account_id, Some(human_id), lifetime).await
}

/// Mints the token of one run of a workflow started in the product: owned by
/// the service account (acting for `human_id`) when there is one, else by the
/// human, and valid only for `workflow_id` in `project_id`.
pub async fn mint_for_run(
    client: &impl Queries,
    service_account_id: Option<i64>,
    human_id: i64,
    run: super::credentials::RunBinding,
    lifetime: Duration,
) -> Result<MintedToken, TokenError> {
    let (owner, on_behalf_of) = match service_account_id {
        Some(bot) => (bot, Some(human_id)),
        None => (human_id, None),
    };
    let minted = insert(client, owner, on_behalf_of, lifetime).await?;
    client
        .execute(
            "UPDATE oauth_access_tokens SET workflow_id = $2, project_id = $3 WHERE id = $1",
            &[&minted.id, &run.workflow_id, &run.project_id],
        )
        .await?;
    Ok(minted)
}

async fn insert(
    client: &impl Queries,
    owner: i64,
    on_behalf_of: Option<i64>,
    lifetime: Duration,
) -> Result<MintedToken, TokenError> {
    let token = generate();
    let mut scopes = vec![AI_WORKFLOWS_SCOPE.to_owned()];
    if let Some(human) = on_behalf_of {
        // GitLab's dynamic scope naming the human of a composite token.
        scopes.push(format!("user:{human}"));
    }
    let row = client
        .query_one(
            "INSERT INTO oauth_access_tokens (user_id, on_behalf_of_user_id, token_digest, scopes, expires_at)
             VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))
             RETURNING id, expires_at",
            &[
                &owner,
                &on_behalf_of,
                &digest(&token),
                &scopes,
                &(lifetime.num_seconds() as f64),
            ],
        )
        .await?;
    Ok(MintedToken {
        id: row.get(0),
        token,
        expires_at: row.get(1),
    })
}

/// Whether `presented` looks like one of our OAuth tokens (saves a lookup for
/// personal access tokens and garbage).
pub fn looks_like_token(presented: &str) -> bool {
    presented.len() == TOKEN_HEX_LEN && presented.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The user an OAuth token acts as, or `None` when no such token exists.
/// Expired and revoked tokens are [`TokenError::Invalid`]; a blocked owner or
/// human is [`TokenError::Blocked`].
pub async fn authenticate(
    client: &impl Queries,
    presented: &str,
) -> Result<Option<AuthenticatedUser>, TokenError> {
    if !looks_like_token(presented) {
        return Ok(None);
    }
    let wanted = digest(presented);
    let Some(row) = client
        .query_opt(
            "SELECT t.id, t.token_digest, t.scopes, t.expires_at > now(), t.revoked_at IS NOT NULL,
                    owner.id, owner.username, owner.admin, owner.state, owner.service_account,
                    human.id, human.username, human.admin, human.state,
                    t.last_used_at IS NULL OR t.last_used_at < now() - interval '10 minutes',
                    t.workflow_id, t.project_id
             FROM oauth_access_tokens t
             JOIN users owner ON owner.id = t.user_id
             LEFT JOIN users human ON human.id = t.on_behalf_of_user_id
             WHERE t.token_digest = $1",
            &[&wanted],
        )
        .await?
    else {
        return Ok(None);
    };
    let stored: Vec<u8> = row.get(1);
    if !bool::from(stored.ct_eq(&wanted)) {
        return Err(TokenError::Invalid);
    }
    let live: bool = row.get(3);
    let revoked: bool = row.get(4);
    if !live || revoked {
        return Err(TokenError::Invalid);
    }
    if row.get::<_, String>(8) != "active" {
        return Err(TokenError::Blocked);
    }
    let token_id: i64 = row.get(0);
    // At most every 10 minutes, as GitLab: a write per request would cost
    // every API call a row update (and a round trip).
    if row.get::<_, bool>(14) {
        client
            .execute(
                "UPDATE oauth_access_tokens SET last_used_at = now()
                 WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '10 minutes')",
                &[&token_id],
            )
            .await?;
    }
    let scopes: Vec<String> = row.get(2);
    let human_id: Option<i64> = row.get(10);
    let run = match (row.get::<_, Option<i64>>(15), row.get::<_, Option<i64>>(16)) {
        (Some(workflow_id), Some(project_id)) => Some(super::credentials::RunBinding {
            workflow_id,
            project_id,
        }),
        _ => None,
    };
    let user = match human_id {
        // Composite identity: the request runs as the human; the service
        // account travels beside it so the policy can check both.
        Some(human_id) => {
            if row.get::<_, Option<String>>(13).as_deref() != Some("active") {
                return Err(TokenError::Blocked);
            }
            AuthenticatedUser {
                id: human_id,
                username: row.get::<_, Option<String>>(11).unwrap_or_default(),
                admin: row.get::<_, Option<bool>>(12).unwrap_or(false),
                token_id,
                scopes,
                service_account: Some(ServiceAccount {
                    id: row.get(5),
                    username: row.get(6),
                    admin: row.get(7),
                }),
                run,
            }
        }
        None => AuthenticatedUser {
            id: row.get(5),
            username: row.get(6),
            admin: row.get(7),
            token_id,
            scopes,
            service_account: None,
            run,
        },
    };
    Ok(Some(user))
}

/// What revoking a token by its text found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revocation {
    Revoked,
    /// No such live token.
    NotFound,
    /// The token belongs to someone else.
    NotOwner,
}

/// Revokes the OAuth token `presented` if the caller owns it (as its owner or
/// the human it acts for).
pub async fn revoke(
    client: &impl Queries,
    caller_id: i64,
    presented: &str,
) -> Result<Revocation, TokenError> {
    let presented = presented.trim();
    if !looks_like_token(presented) {
        return Ok(Revocation::NotFound);
    }
    let Some(row) = client
        .query_opt(
            "SELECT id, user_id, on_behalf_of_user_id FROM oauth_access_tokens
             WHERE token_digest = $1 AND revoked_at IS NULL AND expires_at > now()",
            &[&digest(presented)],
        )
        .await?
    else {
        return Ok(Revocation::NotFound);
    };
    let owner: i64 = row.get(1);
    let human: Option<i64> = row.get(2);
    if owner != caller_id && human != Some(caller_id) {
        return Ok(Revocation::NotOwner);
    }
    let id: i64 = row.get(0);
    client
        .execute(
            "UPDATE oauth_access_tokens SET revoked_at = now() WHERE id = $1",
            &[&id],
        )
        .await?;
    Ok(Revocation::Revoked)
}

/// Revokes a token by id (the socket's own token when the run ends).
pub async fn revoke_by_id(client: &impl Queries, id: i64) -> Result<(), TokenError> {
    client
        .execute(
            "UPDATE oauth_access_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
            &[&id],
        )
        .await?;
    Ok(())
}

/// Deletes tokens that expired more than a day ago (they can never be used).
pub async fn purge_expired(client: &impl Queries) -> Result<u64, TokenError> {
    Ok(client
        .execute(
            "DELETE FROM oauth_access_tokens WHERE expires_at < now() - interval '1 day'",
            &[],
        )
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_hex() {
        let a = generate();
        assert!(looks_like_token(&a));
        assert_ne!(a, generate());
        assert!(!looks_like_token("glpat-0123"));
        assert!(!looks_like_token(&"z".repeat(64)));
    }
}
