//! From request headers to a [`GatewayUser`], in the order GitLab's gateway
//! checks things and with its exact messages.

use super::jwks::{KeyStore, KeyStoreError};
use super::jwt::{self, JwtError, TokenClaims, TokenRules};
use super::verified_tokens::{Kept, Verified, VerifiedTokens};
use super::{GatewayUser, UserClaims};
use crate::config::AuthConfig;
use crate::error::ApiError;
use std::sync::Arc;
use std::time::Duration;

pub const HEADER_BYPASS_AUTH: &str = "bypass-auth";
pub const HEADER_AUTHENTICATION_TYPE: &str = "x-gitlab-authentication-type";
pub const HEADER_REALM: &str = "x-gitlab-realm";
pub const HEADER_INSTANCE_ID: &str = "x-gitlab-instance-id";
pub const HEADER_GLOBAL_USER_ID: &str = "x-gitlab-global-user-id";
pub const HEADER_DUO_SEAT_COUNT: &str = "x-gitlab-duo-seat-count";

/// An authentication failure. Every variant but [`AuthError::NoKeys`] is a
/// 401 whose body is the display text.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("No authorization header presented")]
    MissingAuthorization,
    #[error("Invalid authorization header")]
    InvalidAuthorization,
    #[error("Invalid authentication token type - only OIDC is supported")]
    InvalidTokenType,
    #[error("Forbidden by auth provider")]
    Forbidden(#[source] JwtError),
    /// The header as GitLab spells it in the message.
    #[error("Header mismatch '{0}'")]
    HeaderMismatch(&'static str),
    /// No key to check signatures with: the gateway is misconfigured (500).
    #[error("no signing keys are configured or could be fetched")]
    NoKeys,
}

impl From<AuthError> for ApiError {
    fn from(err: AuthError) -> Self {
        match err {
            AuthError::NoKeys => ApiError::Internal(err.to_string()),
            other => ApiError::Unauthorized(other.to_string()),
        }
    }
}

/// Checks callers' credentials; build one per process and share it.
#[derive(Debug)]
pub struct Authenticator {
    bypass_external: bool,
    bypass_external_with_header: bool,
    service_name: String,
    rules: TokenRules,
    keys: KeyStore,
    verified: VerifiedTokens,
}

impl Authenticator {
    pub fn from_config(config: &AuthConfig) -> Result<Self, KeyStoreError> {
        Ok(Self::with_key_store(config, KeyStore::from_config(config)?))
    }

    /// As [`Authenticator::from_config`], with a key store set up by the caller.
    pub fn with_key_store(config: &AuthConfig, keys: KeyStore) -> Self {
        if config.bypass_external {
            tracing::warn!(
                "AIGW_AUTH__BYPASS_EXTERNAL is on: EVERY request is treated as an all-powerful debug user. Never use this outside development."
            );
        }
        if config.bypass_external_with_header {
            tracing::warn!(
                "AIGW_AUTH__BYPASS_EXTERNAL_WITH_HEADER is on: any request sending 'Bypass-Auth: true' skips authentication. Never use this outside development."
            );
        }
        if config.bypass_jwt_signature {
            tracing::warn!(
                "AIGW_AUTH__BYPASS_JWT_SIGNATURE is on: token signatures are NOT verified, anyone can forge a token. Never use this outside development."
            );
        }
        Self {
            bypass_external: config.bypass_external,
            bypass_external_with_header: config.bypass_external_with_header,
            service_name: config.service_name.clone(),
            rules: TokenRules {
                audience: config.service_name.clone(),
                leeway: config.leeway,
                verify_signature: !config.bypass_jwt_signature,
            },
            keys,
            verified: VerifiedTokens::default(),
        }
    }

    /// Shortens the minimum time between key refetches caused by unknown key ids.
    pub fn with_min_refresh_interval(mut self, interval: Duration) -> Self {
        self.keys = self.keys.with_min_refresh_interval(interval);
        self
    }

    pub fn key_store(&self) -> &KeyStore {
        &self.keys
    }

    /// How many checked tokens are kept for reuse.
    pub fn kept_tokens(&self) -> usize {
        self.verified.len()
    }

    pub async fn authenticate<H: RequestHeaders + ?Sized>(
        &self,
        headers: &H,
    ) -> Result<GatewayUser, AuthError> {
        if self.bypass_external {
            return Ok(GatewayUser::debug());
        }
        if self.bypass_external_with_header
            && header_str(headers, HEADER_BYPASS_AUTH)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return Ok(GatewayUser::debug());
        }

        let authorization = headers
            .raw("authorization")
            .ok_or(AuthError::MissingAuthorization)?;
        let authorization =
            std::str::from_utf8(authorization).map_err(|_| AuthError::InvalidAuthorization)?;
        let (scheme, token) = authorization
            .trim()
            .split_once(' ')
            .unwrap_or((authorization.trim(), ""));
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::InvalidAuthorization);
        }
        if header_str(headers, HEADER_AUTHENTICATION_TYPE) != Some("oidc") {
            return Err(AuthError::InvalidTokenType);
        }

        let verified = self.verified(token.trim()).await?;
        self.check_headers_match(&verified.claims, headers)?;
        log_bad_seat_count(headers);
        Ok(verified.user.clone())
    }

    /// The checked claims of `token` and the caller they make: kept from an
    /// earlier request while the token lasts and its key is unchanged
    /// ([`VerifiedTokens`]), else checked now.
    async fn verified(&self, token: &str) -> Result<Arc<Verified>, AuthError> {
        let now = jsonwebtoken::get_current_timestamp();
        if self.rules.verify_signature
            && let Some(kept) = self.verified.get(token, now)
        {
            // The key its id names now must be the one that verified it: a
            // key replaced in the issuer's set has the token checked again.
            let current = self.keys.key(&kept.key.kid).await;
            if current.is_some_and(|key| super::jwks::same_key(&key, &kept.key.key)) {
                return Ok(Arc::clone(&kept.verified));
            }
            self.verified.remove(token);
        }
        let (claims, key) = match jwt::validate(token, &self.keys, &self.rules).await {
            Ok(checked) => checked,
            Err(JwtError::NoKeys) => return Err(AuthError::NoKeys),
            Err(err) => {
                // Details help operators; callers only learn it was refused.
                tracing::debug!(error = %err, "token refused");
                return Err(AuthError::Forbidden(err));
            }
        };
        let verified = Arc::new(Verified {
            user: user_of(&claims),
            claims,
        });
        if let (Some(key), Some(exp)) = (key, verified.claims.exp) {
            let kept = Kept {
                verified: Arc::clone(&verified),
                key,
                usable_until: exp.saturating_add(self.rules.leeway.as_secs()),
            };
            self.verified.insert(token, kept, now);
        }
        Ok(verified)
    }

    /// Claims that are present must agree with the matching request headers.
    fn check_headers_match<H: RequestHeaders + ?Sized>(
        &self,
        claims: &TokenClaims,
        headers: &H,
    ) -> Result<(), AuthError> {
        let mismatch = |claim: &Option<String>, header: &str| match non_empty(claim) {
            Some(value) => header_str(headers, header) != Some(value),
            None => false,
        };
        if mismatch(&claims.gitlab_realm, HEADER_REALM) {
            return Err(AuthError::HeaderMismatch("X-Gitlab-Realm"));
        }
        if mismatch(&claims.gitlab_instance_id, HEADER_INSTANCE_ID) {
            return Err(AuthError::HeaderMismatch("X-Gitlab-Instance-Id"));
        }
        // Tokens the gateway issued itself are per user; the others come from
        // an instance and carry the instance id as subject.
        let self_signed = claims.iss.as_deref() == Some(self.service_name.as_str());
        if self_signed {
            if mismatch(&claims.sub, HEADER_GLOBAL_USER_ID) {
                return Err(AuthError::HeaderMismatch("X-Gitlab-Global-User-Id"));
            }
        } else if mismatch(&claims.sub, HEADER_INSTANCE_ID) {
            return Err(AuthError::HeaderMismatch("X-Gitlab-Instance-Id"));
        }
        if mismatch(&claims.gitlab_global_user_id, HEADER_GLOBAL_USER_ID) {
            return Err(AuthError::HeaderMismatch("X-Gitlab-Global-User-Id"));
        }
        Ok(())
    }
}

/// The caller a checked token makes.
fn user_of(claims: &TokenClaims) -> GatewayUser {
    GatewayUser {
        is_debug: false,
        model_endpoints: super::vouched_endpoints(claims.model_endpoints.clone()),
        scopes: claims.scopes.iter().flatten().cloned().collect(),
        claims: UserClaims {
            subject: claims.sub.clone(),
            issuer: claims.iss.clone(),
            gitlab_realm: claims.gitlab_realm.clone(),
            gitlab_instance_id: claims.gitlab_instance_id.clone(),
            duo_seat_count: claims.duo_seat_count.clone(),
        },
    }
}

fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

/// Read access to request headers by lower-case name. actix-web and the
/// `http` crate have different `HeaderMap` types; both implement this.
pub trait RequestHeaders {
    fn raw(&self, name: &str) -> Option<&[u8]>;
}

impl RequestHeaders for http::HeaderMap {
    fn raw(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(|v| v.as_bytes())
    }
}

impl RequestHeaders for actix_web::http::header::HeaderMap {
    fn raw(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(|v| v.as_bytes())
    }
}

fn header_str<'a, H: RequestHeaders + ?Sized>(headers: &'a H, name: &str) -> Option<&'a str> {
    headers.raw(name).and_then(|v| std::str::from_utf8(v).ok())
}

fn log_bad_seat_count<H: RequestHeaders + ?Sized>(headers: &H) {
    if let Some(value) = headers.raw(HEADER_DUO_SEAT_COUNT) {
        let valid = std::str::from_utf8(value)
            .ok()
            .is_some_and(|v| v.trim().parse::<u64>().is_ok());
        if !valid {
            tracing::debug!("ignoring a malformed X-Gitlab-Duo-Seat-Count header");
        }
    }
}
