//! Who is calling: authentication (JWT / JWKS, Cloud Connector headers) and
//! the caller's unit primitives.

mod authenticator;
pub mod jwks;
pub mod jwt;
pub mod middleware;
pub mod verified_tokens;

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
    /// The token's `model_endpoints`, normalized: what its requests may name.
    pub model_endpoints: Vec<String>,
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

    /// What this caller's requests may name as a model endpoint.
    pub fn endpoint_guard<'a>(
        &'a self,
        policy: &'a crate::providers::EgressPolicy,
    ) -> crate::providers::EndpointGuard<'a> {
        crate::providers::EndpointGuard {
            vouched: &self.model_endpoints,
            debug: self.is_debug,
            policy,
        }
    }
}

/// The `model_endpoints` claim in the form requests are compared in;
/// entries that are not endpoints are dropped.
pub fn vouched_endpoints(claim: Option<Vec<String>>) -> Vec<String> {
    claim
        .unwrap_or_default()
        .iter()
        .filter_map(|e| crate::providers::egress::normalize_endpoint(e))
        .collect()
}
