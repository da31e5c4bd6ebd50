//! Who is calling: authentication (JWT / JWKS, Cloud Connector headers) and
//! the caller's unit primitives.

mod authenticator;
pub mod jwks;
pub mod jwt;
pub mod middleware;

pub use authenticator::{AuthError, Authenticator, RequestHeaders};

use contracts::UnitPrimitive;
use std::collections::BTreeSet;

/// The authenticated caller of one request.
#[derive(Debug, Clone, Default)]
pub struct GatewayUser {
    /// Debug users (authentication bypass) may use everything.
    pub is_debug: bool,
    /// The `scopes` claim: unit primitive names (unknown names are kept as text).
    pub scopes: BTreeSet<String>,
    pub claims: UserClaims,
}

#[derive(Debug, Clone, Default)]
pub struct UserClaims {
    pub subject: Option<String>,
    pub issuer: Option<String>,
    pub gitlab_realm: Option<String>,
    pub gitlab_instance_id: Option<String>,
    pub duo_seat_count: Option<String>,
}

impl GatewayUser {
    pub fn debug() -> Self {
        Self {
            is_debug: true,
            ..Self::default()
        }
    }

    pub fn with_scopes<I, S>(scopes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            scopes: scopes.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    pub fn can(&self, unit_primitive: UnitPrimitive) -> bool {
        self.can_str(unit_primitive.as_str())
    }

    pub fn can_str(&self, unit_primitive: &str) -> bool {
        self.is_debug || self.scopes.contains(unit_primitive)
    }
}
