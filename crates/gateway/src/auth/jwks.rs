//! The set of public keys tokens may be signed with.
//!
//! Two sources are merged: local keys (the public halves of the gateway's own
//! self-signing keys) and the JWKS published by each OIDC issuer (the GitLab
//! instance, the customer portal). Issuer keys are fetched lazily, cached for
//! `jwks_cache_ttl`, and refetched early when a token names a key id we have
//! not seen: that is how an issuer rotates keys without breaking tokens that
//! are already in flight. Early refetches are rate-limited so a stream of
//! made-up key ids cannot turn the gateway into a load generator.

use crate::config::AuthConfig;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use secrecy::ExposeSecret;
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// How often an unknown key id may trigger an early refetch.
pub const DEFAULT_MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// Public keys by key id.
pub type KeyMap = HashMap<String, Arc<DecodingKey>>;

#[derive(Debug, thiserror::Error)]
pub enum KeyStoreError {
    /// A configured self-signing key is not a usable RSA private key.
    #[error("{variable} is not a PEM-encoded RSA private key: {reason}")]
    InvalidLocalKey {
        variable: &'static str,
        reason: String,
    },
    #[error("could not build the HTTP client for JWKS discovery: {0}")]
    HttpClient(String),
}

/// Why one issuer's keys could not be fetched (logged, never sent).
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("request to {url} failed: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered {status}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
    },
    #[error("{url} returned an unreadable document: {reason}")]
    Body { url: String, reason: String },
}

#[derive(Default)]
struct IssuerCache {
    /// Keys per issuer URL; an issuer that fails keeps its last good keys.
    by_issuer: HashMap<String, KeyMap>,
    /// When the cached keys must be fetched again.
    fresh_until: Option<Instant>,
    /// The last refetch caused by an unknown key id.
    last_forced_refresh: Option<Instant>,
}

/// Local keys plus cached issuer keys; cheap to share behind an `Arc`.
pub struct KeyStore {
    local: KeyMap,
    issuers: Vec<String>,
    http: reqwest::Client,
    fetch_timeout: Duration,
    cache_ttl: Duration,
    min_refresh_interval: Duration,
    cache: RwLock<IssuerCache>,
    /// Serialises fetches so concurrent requests do not stampede the issuers.
    fetch_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyStore")
            .field("local_kids", &self.local.keys().collect::<Vec<_>>())
            .field("issuers", &self.issuers)
            .finish_non_exhaustive()
    }
}

impl KeyStore {
    pub fn from_config(config: &AuthConfig) -> Result<Self, KeyStoreError> {
        let mut local = KeyMap::new();
        let service = &config.service_name;
        for (variable, suffix, pem) in [
            (
                "AIGW_SELF_SIGNED_JWT__SIGNING_KEY",
                "signing_key",
                &config.signing_key,
            ),
            (
                "AIGW_SELF_SIGNED_JWT__VALIDATION_KEY",
                "validation_key",
                &config.validation_key,
            ),
        ] {
            if let Some(pem) = pem {
                let key = public_key_from_private_pem(pem.expose_secret())
                    .map_err(|reason| KeyStoreError::InvalidLocalKey { variable, reason })?;
                local.insert(format!("{service}_{suffix}"), Arc::new(key));
            }
        }
        let issuers = [&config.gitlab_url, &config.customer_portal_url]
            .into_iter()
            .flatten()
            .map(|url| url.trim_end_matches('/').to_owned())
            .filter(|url| !url.is_empty())
            .collect();
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| KeyStoreError::HttpClient(e.to_string()))?;
        Ok(Self {
            local,
            issuers,
            http,
            fetch_timeout: config.jwks_timeout,
            cache_ttl: config.jwks_cache_ttl,
            min_refresh_interval: DEFAULT_MIN_REFRESH_INTERVAL,
            cache: RwLock::new(IssuerCache::default()),
            fetch_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Changes how often an unknown key id may force a refetch (tests use a
    /// short interval; production keeps the default).
    pub fn with_min_refresh_interval(mut self, interval: Duration) -> Self {
        self.min_refresh_interval = interval;
        self
    }

    /// Every known key, fetching issuer keys first if the cache is stale.
    pub async fn keys(&self) -> KeyMap {
        if self.is_stale() {
            self.refresh(false).await;
        }
        self.snapshot()
    }

    /// The key named `kid`. An unknown id triggers one rate-limited refetch
    /// before giving up.
    pub async fn key(&self, kid: &str) -> Option<Arc<DecodingKey>> {
        if self.is_stale() {
            self.refresh(false).await;
        }
        if let Some(key) = self.lookup(kid) {
            return Some(key);
        }
        // Even when rate-limited, another request may just have fetched it.
        self.refresh(true).await;
        self.lookup(kid)
    }

    /// Looks one key up without copying the whole set (the hot path).
    fn lookup(&self, kid: &str) -> Option<Arc<DecodingKey>> {
        if let Some(key) = self.local.get(kid) {
            return Some(Arc::clone(key));
        }
        let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
        cache
            .by_issuer
            .values()
            .find_map(|keys| keys.get(kid))
            .cloned()
    }

    fn is_stale(&self) -> bool {
        if self.issuers.is_empty() {
            return false;
        }
        let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
        cache.fresh_until.is_none_or(|t| Instant::now() >= t)
    }

    fn snapshot(&self) -> KeyMap {
        let cache = self.cache.read().unwrap_or_else(PoisonError::into_inner);
        let mut keys = self.local.clone();
        for issuer_keys in cache.by_issuer.values() {
            for (kid, key) in issuer_keys {
                // Local keys win: an issuer must not shadow the gateway's own kid.
                keys.entry(kid.clone()).or_insert_with(|| Arc::clone(key));
            }
        }
        keys
    }

    /// Fetches every issuer's keys. `forced` marks a refetch caused by an
    /// unknown key id, which is rate-limited.
    async fn refresh(&self, forced: bool) {
        if self.issuers.is_empty() {
            return;
        }
        let _guard = self.fetch_lock.lock().await;
        {
            let mut cache = self.cache.write().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if forced {
                let too_soon = cache
                    .last_forced_refresh
                    .is_some_and(|t| now.duration_since(t) < self.min_refresh_interval);
                if too_soon {
                    return;
                }
                cache.last_forced_refresh = Some(now);
            } else if cache.fresh_until.is_some_and(|t| now < t) {
                // Another request refreshed while we waited for the lock.
                return;
            }
        }

        let mut fetched = Vec::with_capacity(self.issuers.len());
        let mut all_ok = true;
        for issuer in &self.issuers {
            match self.fetch_issuer_keys(issuer).await {
                Ok(keys) => {
                    tracing::debug!(issuer = %issuer, count = keys.len(), "fetched JWKS");
                    fetched.push((issuer.clone(), keys));
                }
                Err(error) => {
                    all_ok = false;
                    tracing::warn!(issuer = %issuer, %error, "could not fetch the issuer's signing keys; keeping the others");
                }
            }
        }

        let mut cache = self.cache.write().unwrap_or_else(PoisonError::into_inner);
        for (issuer, keys) in fetched {
            cache.by_issuer.insert(issuer, keys);
        }
        // After a failure, try again soon rather than serving a hole for a day.
        let ttl = if all_ok {
            self.cache_ttl
        } else {
            self.cache_ttl.min(self.min_refresh_interval)
        };
        cache.fresh_until = Some(Instant::now() + ttl);
    }

    async fn fetch_issuer_keys(&self, issuer: &str) -> Result<KeyMap, FetchError> {
        #[derive(serde::Deserialize)]
        struct Discovery {
            jwks_uri: String,
        }
        #[derive(serde::Deserialize)]
        struct RawJwks {
            keys: Vec<serde_json::Value>,
        }

        let discovery_url = format!("{issuer}/.well-known/openid-configuration");
        let discovery: Discovery = self.get_json(&discovery_url).await?;
        let jwks: RawJwks = self.get_json(&discovery.jwks_uri).await?;
        let mut keys = KeyMap::new();
        for raw in jwks.keys {
            // One odd key (another type, no kid) must not hide the rest.
            let Ok(jwk) = serde_json::from_value::<Jwk>(raw) else {
                continue;
            };
            if let Some((kid, key)) = usable_rs256_key(&jwk) {
                keys.insert(kid, Arc::new(key));
            }
        }
        Ok(keys)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, FetchError> {
        let response = self
            .http
            .get(url)
            .timeout(self.fetch_timeout)
            .send()
            .await
            .map_err(|source| FetchError::Http {
                url: url.to_owned(),
                source,
            })?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Status {
                url: url.to_owned(),
                status,
            });
        }
        let bytes = response.bytes().await.map_err(|source| FetchError::Http {
            url: url.to_owned(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| FetchError::Body {
            url: url.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// Do both keys check the same signatures? (A refetched key set holds new
/// copies of unchanged keys.)
pub fn same_key(a: &DecodingKey, b: &DecodingKey) -> bool {
    use jsonwebtoken::DecodingKeyKind as Kind;
    std::ptr::eq(a, b)
        || a.family() == b.family()
            && match (a.kind(), b.kind()) {
                (Kind::SecretOrDer(a), Kind::SecretOrDer(b)) => a == b,
                (Kind::RsaModulusExponent { n, e }, Kind::RsaModulusExponent { n: n2, e: e2 }) => {
                    n == n2 && e == e2
                }
                _ => false,
            }
}

/// An RSA signature key with a kid whose declared algorithm (if any) is RS256.
fn usable_rs256_key(jwk: &Jwk) -> Option<(String, DecodingKey)> {
    let kid = jwk.common.key_id.clone()?;
    if !matches!(jwk.algorithm, AlgorithmParameters::RSA(_)) {
        return None;
    }
    if jwk
        .common
        .key_algorithm
        .is_some_and(|alg| alg != KeyAlgorithm::RS256)
    {
        return None;
    }
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    DecodingKey::from_jwk(jwk).ok().map(|key| (kid, key))
}

/// The public half of a PEM RSA private key (PKCS#1 or PKCS#8).
fn public_key_from_private_pem(pem: &str) -> Result<DecodingKey, String> {
    let private = EncodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| e.to_string())?;
    let jwk = Jwk::from_encoding_key(&private, Algorithm::RS256).map_err(|e| e.to_string())?;
    DecodingKey::from_jwk(&jwk).map_err(|e| e.to_string())
}
