//! RS256 tokens the monolith signs for the AI gateway (Cloud Connector style), the
//! signing keys, their rotation, and the published JWKS.
//!
//! Keys live as PKCS#8 PEM files named `<kid>.pem` in the key directory; the kid
//! starts with the creation time, so the newest key signs. Rotation adds a key and
//! keeps older ones published until every token they signed has expired.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, Header};
use rsa::RsaPrivateKey;
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding};
use rsa::traits::PublicKeyParts;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How long a gateway token is valid.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
const KEY_BITS: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    #[error("key storage: {0}")]
    Io(#[from] std::io::Error),
    #[error("key material: {0}")]
    Key(String),
    #[error("signing failed: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
    #[error("signing failed: {0}")]
    Rsa(String),
    #[error("token encoding: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no signing key")]
    NoKey,
    #[error("key ring lock poisoned")]
    Lock,
}

#[derive(Clone)]
struct SigningKey {
    kid: String,
    created_at: u64,
    private: RsaPrivateKey,
    /// Parsed and checked once: `jsonwebtoken::encode` parses the DER key
    /// again for every token, which was a third of a worker's CPU per chat
    /// answer (one token per gateway call).
    signer: std::sync::Arc<aws_lc_rs::signature::RsaKeyPair>,
}

#[derive(Clone)]
pub struct KeyRing {
    dir: PathBuf,
    /// Oldest first; the last one signs.
    keys: Vec<SigningKey>,
}

/// Key ids (file stems) of the `*.pem` files in `dir`, oldest first.
fn key_names(dir: &Path) -> Result<Vec<String>, JwtError> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter_map(|n| n.strip_suffix(".pem").map(str::to_owned))
        .collect();
    names.sort();
    Ok(names)
}

/// A key ring shared by a process's request handlers that follows the key
/// directory: `duo-monolith rotate-keys` (or another replica) adds a key, and
/// the next JWKS request publishes it and the next token is signed with it,
/// without a restart. The directory is listed again only when its
/// modification time says it may have changed (see [`ListedDir`]).
#[derive(Clone)]
pub struct SharedKeyRing {
    ring: std::sync::Arc<std::sync::RwLock<KeyRing>>,
    reused: std::sync::Arc<TokenReuse>,
    listed: std::sync::Arc<std::sync::Mutex<Option<ListedDir>>>,
}

/// When the key directory was last listed, and its modification time then.
/// An unchanged modification time proves nothing was added or removed only
/// once the listing is [`SETTLED`] later than that time (a file system may
/// keep times in whole seconds: a key added in the same second as the
/// listing leaves the time as it was); until then every use lists again.
#[derive(Debug, Clone, Copy)]
struct ListedDir {
    modified: std::time::SystemTime,
    listed_at: std::time::SystemTime,
}

const SETTLED: Duration = Duration::from_secs(2);

impl ListedDir {
    fn still_current(&self, modified: std::time::SystemTime) -> bool {
        modified == self.modified
            && self
                .listed_at
                .duration_since(self.modified)
                .is_ok_and(|after| after >= SETTLED)
    }
}

/// How long a gateway token signed for a subject is handed out again to
/// calls for the same subject ([`SharedKeyRing::token_for`]): an RS256
/// signature costs ~0.2 ms of CPU (more than the rest of a chat answer's
/// worker time), and the token stays valid for [`TOKEN_LIFETIME`].
pub const TOKEN_REUSE: Duration = Duration::from_secs(300);
/// Subjects whose tokens are kept at once (a few kilobytes each); past
/// that, the expired ones go, then all.
const REUSED_TOKENS_MAX: usize = 2_048;

/// What a reused token must match: everything its claims say but the times
/// and the token id, and the key that signed it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ReuseKey {
    kid: String,
    user_id: i64,
    scopes: Vec<String>,
    model_endpoints: Vec<String>,
    realm: String,
    instance_id: String,
    issuer: String,
    audience: String,
}

struct TokenReuse {
    window: Duration,
    tokens: std::sync::Mutex<std::collections::HashMap<ReuseKey, (String, std::time::Instant)>>,
}

impl TokenReuse {
    fn get(&self, key: &ReuseKey) -> Option<String> {
        let tokens = self.tokens.lock().ok()?;
        let (token, signed) = tokens.get(key)?;
        (signed.elapsed() < self.window).then(|| token.clone())
    }

    fn put(&self, key: ReuseKey, token: String) {
        if self.window.is_zero() {
            return;
        }
        let Ok(mut tokens) = self.tokens.lock() else {
            return;
        };
        if tokens.len() >= REUSED_TOKENS_MAX {
            tokens.retain(|_, (_, signed)| signed.elapsed() < self.window);
            if tokens.len() >= REUSED_TOKENS_MAX {
                tokens.clear();
            }
        }
        tokens.insert(key, (token, std::time::Instant::now()));
    }
}

impl SharedKeyRing {
    pub fn new(ring: KeyRing) -> Self {
        Self::with_reuse(ring, TOKEN_REUSE)
    }

    /// A ring whose [`SharedKeyRing::token_for`] hands a token out again for
    /// `window` after signing it (`Duration::ZERO`: never).
    pub fn with_reuse(ring: KeyRing, window: Duration) -> Self {
        Self {
            ring: std::sync::Arc::new(std::sync::RwLock::new(ring)),
            reused: std::sync::Arc::new(TokenReuse {
                window,
                tokens: std::sync::Mutex::new(std::collections::HashMap::new()),
            }),
            listed: std::sync::Arc::new(std::sync::Mutex::new(None)),
        }
    }

    fn refresh(&self) -> Result<(), JwtError> {
        // Held throughout: what it says is true of the ring once this returns.
        let mut listed = self.listed.lock().map_err(|_| JwtError::Lock)?;
        let (dir, current, seen) = {
            let ring = self.ring.read().map_err(|_| JwtError::Lock)?;
            let modified = std::fs::metadata(&ring.dir)?.modified()?;
            if listed.is_some_and(|seen| seen.still_current(modified)) {
                return Ok(());
            }
            let seen = ListedDir {
                modified,
                // Before the listing: a key added after it changes the time.
                listed_at: std::time::SystemTime::now(),
            };
            (
                ring.dir.clone(),
                ring.kids().map(str::to_owned).collect::<Vec<_>>(),
                seen,
            )
        };
        let names = key_names(&dir)?;
        if names != current {
            self.ring
                .write()
                .map_err(|_| JwtError::Lock)?
                .reload(&names)?;
        }
        *listed = Some(seen);
        Ok(())
    }

    /// Signs with the newest key in the directory.
    pub fn sign(&self, claims: &GatewayClaims) -> Result<String, JwtError> {
        self.refresh()?;
        self.ring.read().map_err(|_| JwtError::Lock)?.sign(claims)
    }

    /// A gateway token for `subject`: one signed for the same subject with
    /// the newest key less than [`TOKEN_REUSE`] ago, else a new one. A
    /// rotated key is used at once (the key is part of what must match), and
    /// a reused token has at least `TOKEN_LIFETIME - TOKEN_REUSE` to live.
    pub fn token_for(&self, subject: TokenSubject<'_>) -> Result<String, JwtError> {
        self.refresh()?;
        let ring = self.ring.read().map_err(|_| JwtError::Lock)?;
        let kid = ring.active_kid().ok_or(JwtError::NoKey)?;
        let key = ReuseKey {
            kid: kid.to_owned(),
            user_id: subject.user_id,
            scopes: subject.scopes.clone(),
            model_endpoints: subject.model_endpoints.clone(),
            realm: subject.realm.to_owned(),
            instance_id: subject.instance_id.to_owned(),
            issuer: subject.issuer.to_owned(),
            audience: subject.audience.to_owned(),
        };
        if let Some(token) = self.reused.get(&key) {
            return Ok(token);
        }
        let token = ring.sign(&claims_for(subject))?;
        self.reused.put(key, token.clone());
        Ok(token)
    }

    /// Every key in the directory, as a JWKS.
    pub fn jwks(&self) -> Result<Value, JwtError> {
        self.refresh()?;
        Ok(self.ring.read().map_err(|_| JwtError::Lock)?.jwks())
    }
}

/// Claims of a gateway token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatewayClaims {
    pub iss: String,
    pub sub: String,
    pub aud: String,
    pub iat: u64,
    pub nbf: u64,
    pub exp: u64,
    pub jti: String,
    pub gitlab_realm: String,
    pub gitlab_instance_id: String,
    /// The user the token was minted for ([`global_user_id`]); the gateway
    /// can match it against `X-Gitlab-Global-User-Id`.
    pub gitlab_global_user_id: String,
    pub scopes: Vec<String>,
    /// The self-hosted model endpoints a request with this token may name
    /// (the gateway refuses any other): the admin's configured models only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_endpoints: Vec<String>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl KeyRing {
    /// Loads every key of `dir`, creating the directory and a first key if empty.
    pub fn load_or_create(dir: &Path) -> Result<Self, JwtError> {
        std::fs::create_dir_all(dir)?;
        let mut ring = KeyRing {
            dir: dir.to_path_buf(),
            keys: Self::read_keys(dir, &key_names(dir)?)?,
        };
        if ring.keys.is_empty() {
            ring.rotate()?;
        }
        Ok(ring)
    }

    fn read_keys(dir: &Path, names: &[String]) -> Result<Vec<SigningKey>, JwtError> {
        names
            .iter()
            .map(|kid| {
                let pem = std::fs::read_to_string(dir.join(format!("{kid}.pem")))?;
                Self::key_from_pem(kid, &pem)
            })
            .collect()
    }

    fn kids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.kid.as_str())
    }

    /// Re-reads the directory when another process added or retired a key.
    /// An emptied directory keeps the keys in memory: signing must not stop.
    fn reload(&mut self, names: &[String]) -> Result<(), JwtError> {
        let keys = Self::read_keys(&self.dir, names)?;
        if !keys.is_empty() {
            self.keys = keys;
        }
        Ok(())
    }

    fn key_from_pem(kid: &str, pem: &str) -> Result<SigningKey, JwtError> {
        let private =
            RsaPrivateKey::from_pkcs8_pem(pem).map_err(|e| JwtError::Key(format!("{kid}: {e}")))?;
        let der = private
            .to_pkcs8_der()
            .map_err(|e| JwtError::Key(format!("{kid}: {e}")))?;
        let signer = aws_lc_rs::signature::RsaKeyPair::from_pkcs8(der.as_bytes())
            .map_err(|e| JwtError::Key(format!("{kid}: {e}")))?;
        let created_at = kid
            .split('-')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Ok(SigningKey {
            kid: kid.to_owned(),
            created_at,
            private,
            signer: std::sync::Arc::new(signer),
        })
    }

    /// Adds a new signing key and drops keys no live token can refer to any more.
    pub fn rotate(&mut self) -> Result<String, JwtError> {
        let mut rng = rsa::rand_core::OsRng;
        let private =
            RsaPrivateKey::new(&mut rng, KEY_BITS).map_err(|e| JwtError::Key(e.to_string()))?;
        let pem = private
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|e| JwtError::Key(e.to_string()))?;
        // Strictly after the newest key, even within one second, so that the
        // name order (zero-padded) is the signing order.
        let newest = self.keys.last().map(|k| k.created_at + 1).unwrap_or(0);
        let created_at = now_secs().max(newest);
        let kid = format!(
            "{created_at:012}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let path = self.dir.join(format!("{kid}.pem"));
        write_private(&path, pem.as_bytes())?;
        let key = Self::key_from_pem(&kid, &pem)?;
        self.keys.push(key);
        self.prune()?;
        Ok(kid)
    }

    /// A retired key stays published for one token lifetime after its successor
    /// started signing.
    fn prune(&mut self) -> Result<(), JwtError> {
        let now = now_secs();
        let mut keep = Vec::new();
        for (i, key) in self.keys.iter().enumerate() {
            let successor_since = self.keys.get(i + 1).map(|k| k.created_at);
            let expired = successor_since.is_some_and(|t| t + TOKEN_LIFETIME.as_secs() < now);
            if expired {
                let _ = std::fs::remove_file(self.dir.join(format!("{}.pem", key.kid)));
            } else {
                keep.push(key.clone());
            }
        }
        self.keys = keep;
        Ok(())
    }

    pub fn active_kid(&self) -> Option<&str> {
        self.keys.last().map(|k| k.kid.as_str())
    }

    pub fn sign(&self, claims: &GatewayClaims) -> Result<String, JwtError> {
        let key = self.keys.last().ok_or(JwtError::NoKey)?;
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(key.kid.clone());
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header)?),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims)?)
        );
        let mut signature = vec![0; key.signer.public_modulus_len()];
        key.signer
            .sign(
                &aws_lc_rs::signature::RSA_PKCS1_SHA256,
                &aws_lc_rs::rand::SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .map_err(|e| JwtError::Rsa(e.to_string()))?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }

    /// The JSON Web Key Set of every published key.
    pub fn jwks(&self) -> Value {
        let keys: Vec<Value> = self
            .keys
            .iter()
            .map(|k| {
                let public = k.private.to_public_key();
                json!({
                    "kty": "RSA",
                    "kid": k.kid,
                    "use": "sig",
                    "alg": "RS256",
                    "n": URL_SAFE_NO_PAD.encode(public.n().to_bytes_be()),
                    "e": URL_SAFE_NO_PAD.encode(public.e().to_bytes_be()),
                })
            })
            .collect();
        json!({ "keys": keys })
    }
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

/// What a gateway token says about a user.
pub struct TokenSubject<'a> {
    pub user_id: i64,
    pub scopes: Vec<String>,
    /// See [`GatewayClaims::model_endpoints`].
    pub model_endpoints: Vec<String>,
    pub realm: &'a str,
    pub instance_id: &'a str,
    pub issuer: &'a str,
    pub audience: &'a str,
}

/// The global user id sent to the gateway: stable per instance and user,
/// and reveals nothing else about the user.
pub fn global_user_id(instance_id: &str, user_id: i64) -> String {
    crate::gid::stable_uuid(&format!("{instance_id}:{user_id}")).to_string()
}

pub fn claims_for(subject: TokenSubject<'_>) -> GatewayClaims {
    let now = now_secs();
    GatewayClaims {
        iss: subject.issuer.trim_end_matches('/').to_owned(),
        // Instance-issued Cloud Connector tokens name the instance as subject;
        // the user travels in `X-Gitlab-Global-User-Id` (see `global_user_id`).
        sub: subject.instance_id.to_owned(),
        aud: subject.audience.to_owned(),
        iat: now,
        nbf: now.saturating_sub(5),
        exp: now + TOKEN_LIFETIME.as_secs(),
        jti: uuid::Uuid::new_v4().to_string(),
        gitlab_realm: subject.realm.to_owned(),
        gitlab_instance_id: subject.instance_id.to_owned(),
        gitlab_global_user_id: global_user_id(subject.instance_id, subject.user_id),
        scopes: subject.scopes,
        model_endpoints: subject.model_endpoints,
    }
}

/// `/.well-known/openid-configuration` for this instance.
pub fn openid_configuration(issuer: &str) -> Value {
    let issuer = issuer.trim_end_matches('/');
    json!({
        "issuer": issuer,
        "jwks_uri": format!("{issuer}/oauth/discovery/keys"),
        "id_token_signing_alg_values_supported": ["RS256"],
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_trusted_only_once_settled_after_the_directorys_time() {
        let modified = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let settled = ListedDir {
            modified,
            listed_at: modified + SETTLED,
        };
        assert!(settled.still_current(modified));
        // The directory changed since: list again.
        assert!(!settled.still_current(modified + Duration::from_nanos(1)));
        // Listed in the same second as the change: a key added later in
        // that second may have left the time as it was.
        let fresh = ListedDir {
            modified,
            listed_at: modified + Duration::from_millis(500),
        };
        assert!(!fresh.still_current(modified));
        // A clock that went back: never trusted.
        let earlier = ListedDir {
            modified,
            listed_at: modified - Duration::from_secs(5),
        };
        assert!(!earlier.still_current(modified));
    }
}
