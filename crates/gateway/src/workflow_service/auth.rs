//! Who is calling the workflow service: RS256 tokens from the monolith's
//! JWKS (shared with the gateway's HTTP side) or minted by this service's
//! `GenerateToken`, the `x-gitlab-*` metadata checked against the claims, and
//! the unit primitives each flow needs.

use crate::auth::Authenticator;
use crate::auth::jwt::TokenClaims;
use crate::config::{AuthConfig, WorkflowServiceConfig};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::ExposeSecret;
use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::Status;
use tonic::metadata::MetadataMap;

/// Unit primitives a token minted by `GenerateToken` may carry: the caller's
/// scopes are narrowed to these (the flows' own, and those of the tools that
/// need one: `codebase_search` for `semantic_code_search`).
pub const SERVICE_UNIT_PRIMITIVES: [&str; 4] = [
    "duo_agent_platform",
    "duo_workflow_execute_workflow",
    "duo_chat",
    "codebase_search",
];

/// The authenticated caller of one RPC.
#[derive(Debug, Clone, Default)]
pub struct WorkflowCaller {
    /// Authentication is off (development): everything is allowed.
    pub is_debug: bool,
    /// The token was minted by this service.
    pub self_signed: bool,
    pub scopes: BTreeSet<String>,
    pub global_user_id: Option<String>,
    pub realm: Option<String>,
    pub instance_id: Option<String>,
    /// The token's `model_endpoints`, normalized: the self-hosted model
    /// endpoints the monolith vouches for (minted tokens keep them).
    pub model_endpoints: Vec<String>,
}

impl WorkflowCaller {
    pub fn can(&self, unit_primitive: &str) -> bool {
        self.is_debug || self.scopes.contains(unit_primitive)
    }

    /// What this caller's model header may name as an endpoint.
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

    /// Who holds the per-workflow lock: the same workflow id from another
    /// user or instance is a different key, so nobody can lock others out.
    pub fn lock_owner(&self) -> String {
        format!(
            "{}/{}",
            self.instance_id.as_deref().unwrap_or(""),
            self.global_user_id.as_deref().unwrap_or("")
        )
    }
}

/// Signs the tokens `GenerateToken` hands out.
struct TokenSigner {
    kid: String,
    encoding: EncodingKey,
    decoding: Arc<DecodingKey>,
}

#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("AIGW_SELF_SIGNED_JWT__SIGNING_KEY is not a PEM RSA private key: {0}")]
    BadKey(String),
    #[error("could not generate a signing key: {0}")]
    Generate(String),
}

impl TokenSigner {
    fn new(service_name: &str, pem: Option<&str>) -> Result<Self, SignerError> {
        let pem = match pem {
            Some(pem) => pem.to_owned(),
            None => {
                use rsa::pkcs8::{EncodePrivateKey, LineEnding};
                tracing::warn!(
                    "AIGW_SELF_SIGNED_JWT__SIGNING_KEY is not set: workflow service tokens are signed with a key generated at start-up and stop working when the gateway restarts"
                );
                let mut rng = rsa::rand_core::OsRng;
                let key = rsa::RsaPrivateKey::new(&mut rng, 2048)
                    .map_err(|e| SignerError::Generate(e.to_string()))?;
                key.to_pkcs8_pem(LineEnding::LF)
                    .map_err(|e| SignerError::Generate(e.to_string()))?
                    .to_string()
            }
        };
        let encoding = EncodingKey::from_rsa_pem(pem.as_bytes())
            .map_err(|e| SignerError::BadKey(e.to_string()))?;
        let jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&encoding, Algorithm::RS256)
            .map_err(|e| SignerError::BadKey(e.to_string()))?;
        let decoding =
            DecodingKey::from_jwk(&jwk).map_err(|e| SignerError::BadKey(e.to_string()))?;
        Ok(Self {
            kid: format!("{service_name}_signing_key"),
            encoding,
            decoding: Arc::new(decoding),
        })
    }
}

/// Checks tokens and metadata; mints tokens. One per process.
pub struct WorkflowAuth {
    enabled: bool,
    authenticator: Arc<Authenticator>,
    audiences: [String; 2],
    service_name: String,
    leeway: Duration,
    token_lifetime: Duration,
    signer: TokenSigner,
}

impl std::fmt::Debug for WorkflowAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowAuth")
            .field("enabled", &self.enabled)
            .field("service_name", &self.service_name)
            .finish_non_exhaustive()
    }
}

/// A minted token.
#[derive(Debug, Clone)]
pub struct MintedToken {
    pub token: String,
    pub expires_at: i64,
}

#[derive(Serialize)]
struct MintedClaims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    gitlab_realm: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gitlab_instance_id: Option<&'a str>,
    gitlab_global_user_id: &'a str,
    scopes: Vec<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    model_endpoints: &'a [String],
    jti: String,
    iat: i64,
    nbf: i64,
    exp: i64,
}

pub const HEADER_AUTHORIZATION: &str = "authorization";
pub const HEADER_AUTHENTICATION_TYPE: &str = "x-gitlab-authentication-type";
pub const HEADER_REALM: &str = "x-gitlab-realm";
pub const HEADER_INSTANCE_ID: &str = "x-gitlab-instance-id";
pub const HEADER_GLOBAL_USER_ID: &str = "x-gitlab-global-user-id";
pub const HEADER_MODEL_METADATA: &str = "x-gitlab-agent-platform-model-metadata";
pub const HEADER_VERSION: &str = "x-gitlab-version";

fn metadata_str<'a>(metadata: &'a MetadataMap, name: &str) -> Option<&'a str> {
    metadata
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn unauthenticated(message: &str) -> Status {
    Status::unauthenticated(message.to_owned())
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl WorkflowAuth {
    pub fn new(
        auth: &AuthConfig,
        workflow: &WorkflowServiceConfig,
        authenticator: Arc<Authenticator>,
    ) -> Result<Self, SignerError> {
        let signer = TokenSigner::new(
            &workflow.service_name,
            auth.signing_key.as_ref().map(|k| k.expose_secret()),
        )?;
        Ok(Self {
            enabled: !auth.bypass_external,
            authenticator,
            audiences: [auth.service_name.clone(), workflow.service_name.clone()],
            service_name: workflow.service_name.clone(),
            leeway: auth.leeway,
            token_lifetime: workflow.token_lifetime,
            signer,
        })
    }

    /// Authenticates one call from its metadata.
    pub async fn authenticate(&self, metadata: &MetadataMap) -> Result<WorkflowCaller, Status> {
        if !self.enabled {
            return Ok(WorkflowCaller {
                is_debug: true,
                global_user_id: metadata_str(metadata, HEADER_GLOBAL_USER_ID).map(str::to_owned),
                instance_id: metadata_str(metadata, HEADER_INSTANCE_ID).map(str::to_owned),
                realm: metadata_str(metadata, HEADER_REALM).map(str::to_owned),
                ..WorkflowCaller::default()
            });
        }
        let authorization = metadata_str(metadata, HEADER_AUTHORIZATION)
            .ok_or_else(|| unauthenticated("No authorization header presented"))?;
        let (scheme, token) = authorization.split_once(' ').unwrap_or((authorization, ""));
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(unauthenticated("Invalid authorization header"));
        }
        if metadata_str(metadata, HEADER_AUTHENTICATION_TYPE) != Some("oidc") {
            return Err(unauthenticated(
                "Invalid authentication token type - only OIDC is supported",
            ));
        }
        let claims = self.validate(token.trim()).await.map_err(|reason| {
            tracing::debug!(%reason, "workflow service token refused");
            unauthenticated("Forbidden by auth provider")
        })?;
        let self_signed = claims.iss.as_deref() == Some(self.service_name.as_str());
        check_metadata_matches(&claims, metadata, self_signed)?;
        Ok(WorkflowCaller {
            is_debug: false,
            self_signed,
            model_endpoints: crate::auth::vouched_endpoints(claims.model_endpoints),
            scopes: claims.scopes.unwrap_or_default().into_iter().collect(),
            global_user_id: metadata_str(metadata, HEADER_GLOBAL_USER_ID)
                .map(str::to_owned)
                .or(claims.gitlab_global_user_id),
            realm: claims.gitlab_realm,
            instance_id: claims.gitlab_instance_id,
        })
    }

    async fn validate(&self, token: &str) -> Result<TokenClaims, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| e.to_string())?;
        if header.alg != Algorithm::RS256 {
            return Err(format!("algorithm {:?} is not accepted", header.alg));
        }
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_audience(&self.audiences);
        validation.set_required_spec_claims(&["exp", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = self.leeway.as_secs();
        let decode = |key: &DecodingKey| {
            jsonwebtoken::decode::<TokenClaims>(token, key, &validation)
                .map(|data| data.claims)
                .map_err(|e| e.to_string())
        };
        let keys = self.authenticator.key_store();
        match header.kid.as_deref() {
            Some(kid) if kid == self.signer.kid => decode(&self.signer.decoding),
            Some(kid) => match keys.key(kid).await {
                Some(key) => decode(&key),
                None => Err(format!("no known key has id {kid:?}")),
            },
            None => {
                if let Ok(claims) = decode(&self.signer.decoding) {
                    return Ok(claims);
                }
                let mut last = "no key verified the signature".to_owned();
                for key in keys.keys().await.values() {
                    match decode(key) {
                        Ok(claims) => return Ok(claims),
                        Err(err) => last = err,
                    }
                }
                Err(last)
            }
        }
    }

    /// `GenerateToken`: a token for `caller`, signed by this service. Tokens
    /// this service minted cannot be exchanged for new ones.
    pub fn mint(&self, caller: &WorkflowCaller) -> Result<MintedToken, Status> {
        if caller.self_signed {
            return Err(Status::permission_denied(
                "tokens issued by the workflow service cannot generate tokens",
            ));
        }
        let Some(user_id) = caller.global_user_id.as_deref() else {
            return Err(Status::invalid_argument(
                "x-gitlab-global-user-id is required to generate a token",
            ));
        };
        let now = now_secs();
        let exp = now + self.token_lifetime.as_secs() as i64;
        let scopes = SERVICE_UNIT_PRIMITIVES
            .into_iter()
            .filter(|up| caller.can(up))
            .collect();
        let claims = MintedClaims {
            iss: &self.service_name,
            aud: &self.service_name,
            sub: user_id,
            gitlab_realm: caller.realm.as_deref(),
            gitlab_instance_id: caller.instance_id.as_deref(),
            gitlab_global_user_id: user_id,
            scopes,
            model_endpoints: &caller.model_endpoints,
            jti: uuid::Uuid::new_v4().to_string(),
            iat: now,
            nbf: now,
            exp,
        };
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(self.signer.kid.clone());
        let token = jsonwebtoken::encode(&header, &claims, &self.signer.encoding)
            .map_err(|e| Status::internal(format!("could not sign the token: {e}")))?;
        Ok(MintedToken {
            token,
            expires_at: exp,
        })
    }
}

/// Claims that are present must agree with the matching metadata, as on the
/// gateway's HTTP side.
fn check_metadata_matches(
    claims: &TokenClaims,
    metadata: &MetadataMap,
    self_signed: bool,
) -> Result<(), Status> {
    let mismatch = |claim: &Option<String>, header: &str| match claim.as_deref() {
        Some(value) if !value.is_empty() => metadata_str(metadata, header) != Some(value),
        _ => false,
    };
    let refuse = |name: &str| Err(unauthenticated(&format!("Header mismatch '{name}'")));
    if mismatch(&claims.gitlab_realm, HEADER_REALM) {
        return refuse("X-Gitlab-Realm");
    }
    if mismatch(&claims.gitlab_instance_id, HEADER_INSTANCE_ID) {
        return refuse("X-Gitlab-Instance-Id");
    }
    if self_signed {
        if mismatch(&claims.sub, HEADER_GLOBAL_USER_ID) {
            return refuse("X-Gitlab-Global-User-Id");
        }
    } else if mismatch(&claims.sub, HEADER_INSTANCE_ID) {
        return refuse("X-Gitlab-Instance-Id");
    }
    if mismatch(&claims.gitlab_global_user_id, HEADER_GLOBAL_USER_ID) {
        return refuse("X-Gitlab-Global-User-Id");
    }
    Ok(())
}

/// The unit primitive a flow needs (`chat`: `duo_chat`; every other flow
/// `duo_agent_platform`, or the legacy `duo_workflow_execute_workflow`).
pub fn may_run_flow(caller: &WorkflowCaller, flow_name: &str) -> bool {
    if flow_name == "chat" {
        caller.can("duo_chat")
    } else {
        caller.can("duo_agent_platform") || caller.can("duo_workflow_execute_workflow")
    }
}
