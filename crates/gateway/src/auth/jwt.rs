//! Token validation: RS256 only, audience, expiry and not-before with leeway.

use super::jwks::KeyStore;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// What a token must satisfy besides its signature.
#[derive(Debug, Clone)]
pub struct TokenRules {
    /// The required `aud` (the service name).
    pub audience: String,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
    /// False only under `AIGW_AUTH__BYPASS_JWT_SIGNATURE` (development).
    pub verify_signature: bool,
}

/// The claims the gateway reads from a token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TokenClaims {
    #[serde(default)]
    pub sub: Option<String>,
    #[serde(default)]
    pub iss: Option<String>,
    /// Required and checked by [`validate`]; kept to know how long a checked
    /// token may be reused ([`super::verified_tokens`]).
    #[serde(default)]
    pub exp: Option<u64>,
    #[serde(default)]
    pub gitlab_realm: Option<String>,
    #[serde(default)]
    pub gitlab_instance_id: Option<String>,
    /// Our monolith's per-user claim (not in GitLab's tokens): when present it
    /// must equal `X-Gitlab-Global-User-Id`, so a token minted for one user
    /// cannot be replayed with another user's header.
    #[serde(default)]
    pub gitlab_global_user_id: Option<String>,
    /// Sent as a string by GitLab; numbers are accepted too.
    #[serde(default, deserialize_with = "string_or_number")]
    pub duo_seat_count: Option<String>,
    /// Unit primitive names.
    #[serde(default)]
    pub scopes: Option<Vec<String>>,
    /// Our monolith's claim (not in GitLab's tokens): the self-hosted model
    /// endpoints its admin configured, the only ones a request carrying this
    /// token may name (`providers::egress`).
    #[serde(default)]
    pub model_endpoints: Option<Vec<String>>,
}

/// Why a token was refused. Callers answer every variant except
/// [`JwtError::NoKeys`] with the same 401, so details only reach the logs.
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("algorithm {0:?} is not accepted, only RS256")]
    Algorithm(Algorithm),
    #[error("no known key has id {0:?}")]
    UnknownKey(String),
    /// Neither local keys nor any issuer's keys are available: a server fault.
    #[error("no signing keys are configured or could be fetched")]
    NoKeys,
    #[error("token rejected: {0}")]
    Rejected(String),
}

impl From<jsonwebtoken::errors::Error> for JwtError {
    fn from(err: jsonwebtoken::errors::Error) -> Self {
        match err.kind() {
            ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Json(_) => {
                Self::Malformed(err.to_string())
            }
            _ => Self::Rejected(err.to_string()),
        }
    }
}

/// The key a token named by id and was verified with.
#[derive(Debug)]
pub struct VerifyingKey {
    pub kid: String,
    pub key: Arc<DecodingKey>,
}

/// Checks `token` and returns its claims, with the key that verified it when
/// the token named it by id (`None` without a key id or without signature
/// checks).
pub async fn validate(
    token: &str,
    keys: &KeyStore,
    rules: &TokenRules,
) -> Result<(TokenClaims, Option<VerifyingKey>), JwtError> {
    // `alg: none` and unknown algorithm names fail right here: the header
    // does not parse into a known algorithm.
    let header = jsonwebtoken::decode_header(token)?;
    if header.alg != Algorithm::RS256 {
        return Err(JwtError::Algorithm(header.alg));
    }
    if !rules.verify_signature {
        return validate_unsigned(token, rules).map(|claims| (claims, None));
    }

    let validation = validation_for(rules);
    match header.kid {
        Some(kid) => {
            let key = match keys.key(&kid).await {
                Some(key) => key,
                None if keys.keys().await.is_empty() => return Err(JwtError::NoKeys),
                None => return Err(JwtError::UnknownKey(kid)),
            };
            let claims = decode_with(token, &key, &validation)?;
            Ok((claims, Some(VerifyingKey { kid, key })))
        }
        None => {
            // Without a kid, any known key may have signed it.
            let all = keys.keys().await;
            if all.is_empty() {
                return Err(JwtError::NoKeys);
            }
            let mut last = JwtError::Rejected("no key verified the signature".into());
            for key in all.values() {
                match decode_with(token, key, &validation) {
                    Ok(claims) => return Ok((claims, None)),
                    Err(err) => last = err,
                }
            }
            Err(last)
        }
    }
}

fn validation_for(rules: &TokenRules) -> Validation {
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_audience(&[&rules.audience]);
    validation.set_required_spec_claims(&["exp", "aud"]);
    validation.validate_nbf = true;
    validation.leeway = rules.leeway.as_secs();
    validation
}

fn decode_with(
    token: &str,
    key: &DecodingKey,
    validation: &Validation,
) -> Result<TokenClaims, JwtError> {
    Ok(jsonwebtoken::decode::<TokenClaims>(token, key, validation)?.claims)
}

/// The signature is not checked, but audience and times still are, so a
/// development setup behaves like production apart from key management.
fn validate_unsigned(token: &str, rules: &TokenRules) -> Result<TokenClaims, JwtError> {
    let raw = jsonwebtoken::dangerous::insecure_decode::<serde_json::Value>(token)?.claims;
    let now = jsonwebtoken::get_current_timestamp();
    let leeway = rules.leeway.as_secs();

    let exp = raw
        .get("exp")
        .ok_or_else(|| JwtError::Rejected("missing exp".into()))?
        .as_u64()
        .ok_or_else(|| JwtError::Rejected("exp is not a timestamp".into()))?;
    if exp.saturating_add(leeway) < now {
        return Err(JwtError::Rejected("expired".into()));
    }
    if let Some(nbf) = raw.get("nbf") {
        let nbf = nbf
            .as_u64()
            .ok_or_else(|| JwtError::Rejected("nbf is not a timestamp".into()))?;
        if nbf > now.saturating_add(leeway) {
            return Err(JwtError::Rejected("not yet valid".into()));
        }
    }
    let audience_ok = match raw.get("aud") {
        Some(serde_json::Value::String(aud)) => *aud == rules.audience,
        Some(serde_json::Value::Array(auds)) => auds
            .iter()
            .any(|aud| aud.as_str() == Some(rules.audience.as_str())),
        _ => false,
    };
    if !audience_ok {
        return Err(JwtError::Rejected("wrong audience".into()));
    }
    serde_json::from_value(raw).map_err(|e| JwtError::Malformed(e.to_string()))
}

fn string_or_number<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(
        match Option::<serde_json::Value>::deserialize(deserializer)? {
            Some(serde_json::Value::String(s)) => Some(s),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        },
    )
}
