//! What every kind of credential (personal access token, OAuth token, browser
//! session) shares: the user it authenticates, why one is refused, and the
//! digest it is stored as. Its own module, so the kinds need not import each
//! other for it.

use sha2::{Digest, Sha256};

use crate::db::DbError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedUser {
    pub id: i64,
    pub username: String,
    pub admin: bool,
    pub token_id: i64,
    pub scopes: Vec<String>,
    /// Composite identity: the service account whose token acts for this user
    /// (see [`super::oauth`]); `None` for the user's own credentials.
    pub service_account: Option<ServiceAccount>,
    /// A token minted for one run of a workflow started in the product
    /// reaches only that workflow's project.
    pub run: Option<RunBinding>,
}

/// The workflow and project a run's token is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunBinding {
    pub workflow_id: i64,
    pub project_id: i64,
}

/// The service account of a composite identity token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    pub id: i64,
    pub username: String,
    pub admin: bool,
}

impl AuthenticatedUser {
    pub fn has_any_scope(&self, wanted: &[&str]) -> bool {
        self.scopes.iter().any(|s| wanted.contains(&s.as_str()))
    }

    /// Who authors what this caller writes: the service account of a
    /// composite identity, else the user.
    pub fn author_id(&self) -> i64 {
        self.service_account.as_ref().map_or(self.id, |s| s.id)
    }

    /// The human a composite identity writes on behalf of.
    pub fn on_behalf_of(&self) -> Option<i64> {
        self.service_account.as_ref().map(|_| self.id)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Unknown, expired or revoked token: GitLab answers 401 for all three.
    #[error("invalid token")]
    Invalid,
    /// The token is fine but its user may not sign in.
    #[error("user is blocked")]
    Blocked,
    #[error("unknown scope {0}")]
    UnknownScope(String),
    #[error("a token needs at least one scope")]
    NoScopes,
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<tokio_postgres::Error> for TokenError {
    fn from(e: tokio_postgres::Error) -> Self {
        TokenError::Db(DbError::Query(e))
    }
}

/// The SHA-256 digest a credential is stored as (never the credential itself).
pub fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}
