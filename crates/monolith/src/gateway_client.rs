//! The monolith's client of the AI gateway: `POST /v2/chat/agent` (one ReAct
//! step as NDJSON events), `POST /v1/prompts/chat/<name>` (a named prompt,
//! streamed or not) and `POST /v1/search/gitlab-docs`.
//!
//! Every request carries GitLab's Cloud Connector headers and a short-lived
//! RS256 token for the user, signed with the instance's key ring; the
//! gateway verifies it against the instance's JWKS.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use contracts::docs_search::{
    SearchDocsRequest, SearchDocsResponse, SearchMetadata, SearchPayload,
};
use contracts::events::parse_event_line;
use contracts::{AgentEvent, AgentRequest, DuoErrorCode, PromptRequest, headers};
use futures::{Stream, StreamExt};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::identity::jwt::{KeyRing, SharedKeyRing, TokenSubject};

/// The GitLab version this monolith speaks to the gateway as. The gateway
/// offers the build and merge request readers only from 17.5 on.
pub const GITLAB_VERSION: &str = "17.6.0";

/// The answer text the gateway and the providers use when the conversation
/// does not fit the model's context window.
const PROMPT_TOO_LONG: &str = "prompt is too long";

/// Why a gateway call failed, and the Duo error code the user sees for it.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the AI gateway is unreachable: {0}")]
    Connect(String),
    #[error("the AI gateway did not answer in time")]
    Timeout,
    #[error("the AI gateway sent no events")]
    NoEvents,
    #[error("the AI gateway refused the request (403)")]
    Forbidden,
    #[error("the AI gateway answered HTTP {status}")]
    Status { status: u16 },
    /// The gateway's words say which model, its context and the prompt's
    /// size (when the gateway knew them).
    #[error("the conversation is too long for the model: {0}")]
    PromptTooLong(String),
    #[error("the AI gateway does not offer the tool")]
    ToolNotAvailable,
    #[error("the AI gateway reported an error: {0}")]
    Event(String),
    #[error("the answer broke off: {0}")]
    Interrupted(String),
    /// The connection broke while the answer was streaming (the gateway
    /// died or was restarted): worth asking again, maybe of another replica.
    #[error("the connection to the AI gateway broke before the answer was complete: {0}")]
    StreamCut(String),
    #[error("the AI gateway answer could not be read: {0}")]
    Body(String),
    #[error("signing the gateway token failed: {0}")]
    Token(String),
}

impl GatewayError {
    pub fn code(&self) -> DuoErrorCode {
        match self {
            Self::Connect(_) => DuoErrorCode::A1001,
            Self::Timeout => DuoErrorCode::A1000,
            Self::NoEvents => DuoErrorCode::A1002,
            Self::Forbidden => DuoErrorCode::M3006,
            Self::PromptTooLong(_) => DuoErrorCode::A1005,
            Self::ToolNotAvailable => DuoErrorCode::G3001,
            Self::Event(_) => DuoErrorCode::A1004,
            Self::Interrupted(_) | Self::StreamCut(_) => DuoErrorCode::A1003,
            // What a proxy in front of a gateway that is down or restarting
            // answers: as good as not connecting.
            Self::Status { status: 502..=504 } => DuoErrorCode::A1001,
            Self::Status { .. } | Self::Body(_) | Self::Token(_) => DuoErrorCode::A9999,
        }
    }

    /// A failure of the hop itself (the gateway down, restarting, or cut off
    /// mid-answer), after which the same request may well succeed: on a new
    /// connection, possibly to another replica.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Connect(_)
                | Self::StreamCut(_)
                | Self::NoEvents
                | Self::Status { status: 502..=504 }
        )
    }

    /// A request that failed before an answer began: never "unexpected".
    fn from_reqwest(err: &reqwest::Error) -> Self {
        if err.is_timeout() {
            Self::Timeout
        } else {
            Self::Connect(err.to_string())
        }
    }

    /// Reading an answer that had begun failed.
    fn from_body_error(err: &reqwest::Error) -> Self {
        if err.is_timeout() {
            Self::Timeout
        } else {
            Self::StreamCut(err.to_string())
        }
    }
}

/// Who a gateway call is made for: the token's subject and scopes.
#[derive(Debug, Clone)]
pub struct GatewayAuth {
    pub user_id: i64,
    /// Unit primitives of the user's seats.
    pub scopes: Vec<String>,
    /// `saas` or `self-managed`, as stored in the instance settings.
    pub realm: String,
    /// Sent as `X-Request-ID` so gateway logs join the monolith's.
    pub request_id: Uuid,
    /// The instance setting `ai_gateway_url`, which wins over `AI_GATEWAY_URL`
    /// (as GitLab's `Ai::Setting` does), so an admin can move the gateway
    /// without restarting workers.
    pub gateway_url: Option<url::Url>,
}

/// The instance's realm and its `ai_gateway_url` setting (unset or blank:
/// `None`, the configured `AI_GATEWAY_URL` applies): what every
/// [`GatewayAuth`] is built from.
pub async fn instance_route(
    db: &impl crate::queries::Queries,
) -> Result<(String, Option<url::Url>), tokio_postgres::Error> {
    let settings = db
        .query_one("SELECT realm, ai_gateway_url FROM instance_settings", &[])
        .await?;
    Ok((settings.get(0), gateway_url_setting(settings.get(1))))
}

/// The `ai_gateway_url` setting as a URL; unset, blank or unparsable: `None`.
pub fn gateway_url_setting(setting: Option<&str>) -> Option<url::Url> {
    setting
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .and_then(|u| url::Url::parse(u).ok())
}

/// The prompt a model check runs: small, needs only the `explain_code` unit
/// primitive, and every model family can answer it.
pub const CHECK_PROMPT: &str = "chat/explain_code";
/// Longest answer or explanation a model check keeps.
const CHECK_TEXT_CHARS: usize = 500;

/// What a model check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelCheck {
    /// The model answered (the start of its answer).
    Answered(String),
    /// The gateway or the model refused, with the gateway's explanation.
    Refused { status: u16, detail: String },
}

fn clip(text: &str, chars: usize) -> String {
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().count() > chars {
        out.push('…');
    }
    out
}

/// Which code-embedding endpoint a call uses: bulk indexing or a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddingPurpose {
    Index,
    Search,
}

/// Vectors from the gateway and the model that made them.
#[derive(Debug, Clone, PartialEq)]
pub struct CodeEmbeddings {
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
}

/// Settings of [`GatewayClient`].
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub base_url: url::Url,
    pub instance_id: String,
    /// The JWT issuer: this instance's external URL.
    pub issuer: String,
    pub audience: String,
    pub timeout: Duration,
    /// Sent as `x-gitlab-enabled-feature-flags`.
    pub enabled_feature_flags: Vec<String>,
}

impl GatewaySettings {
    /// The settings the configuration gives every caller of the gateway
    /// (no feature flags; callers that send some add them).
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self {
            base_url: config.ai_gateway_url.clone(),
            instance_id: config.instance_id.clone(),
            issuer: config.external_url.to_string(),
            audience: config.gateway_audience.clone(),
            timeout: config.ai_gateway_timeout,
            enabled_feature_flags: Vec::new(),
        }
    }
}

#[derive(Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    keys: SharedKeyRing,
    settings: GatewaySettings,
    /// The issuer's host (`X-Gitlab-Host-Name`), read from it once.
    host_name: String,
}

impl std::fmt::Debug for GatewayClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayClient")
            .field("base_url", &self.settings.base_url.as_str())
            .finish_non_exhaustive()
    }
}

/// The events of one agent step, decoded as they arrive.
pub type EventStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<AgentEvent, GatewayError>> + Send>>;

/// Text deltas of a streamed prompt answer.
pub type TextStream = std::pin::Pin<Box<dyn Stream<Item = Result<String, GatewayError>> + Send>>;

impl GatewayClient {
    pub fn new(keys: KeyRing, settings: GatewaySettings) -> Result<Self, reqwest::Error> {
        Self::with_shared_keys(SharedKeyRing::new(keys), settings)
    }

    /// A client signing with keys shared with others (the web role's ring).
    pub fn with_shared_keys(
        keys: SharedKeyRing,
        settings: GatewaySettings,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10).min(settings.timeout))
            .read_timeout(settings.timeout)
            .pool_max_idle_per_host(32)
            .build()?;
        let host_name = settings
            .issuer
            .parse::<url::Url>()
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        Ok(Self {
            http,
            keys,
            settings,
            host_name,
        })
    }

    /// The same client with another silence limit (tests use short ones).
    pub fn with_timeout(self, timeout: Duration) -> Result<Self, reqwest::Error> {
        let mut settings = self.settings;
        settings.timeout = timeout;
        Self::with_shared_keys(self.keys, settings)
    }

    /// Sends these names as `x-gitlab-enabled-feature-flags` on every call.
    pub fn with_enabled_feature_flags(mut self, flags: Vec<String>) -> Self {
        self.settings.enabled_feature_flags = flags;
        self
    }

    pub fn settings(&self) -> &GatewaySettings {
        &self.settings
    }

    /// The signing keys this client mints gateway tokens with.
    pub fn keys(&self) -> &SharedKeyRing {
        &self.keys
    }

    /// GitLab's headers for a call made on behalf of `auth`. The token
    /// vouches for `model`'s endpoint, the one self-hosted model the call
    /// may name (the gateway refuses any other).
    pub fn headers(
        &self,
        auth: &GatewayAuth,
        model: Option<&contracts::ModelMetadata>,
    ) -> Result<Vec<(&'static str, String)>, GatewayError> {
        let global_user_id =
            crate::identity::jwt::global_user_id(&self.settings.instance_id, auth.user_id);
        let token = self
            .keys
            .token_for(TokenSubject {
                user_id: auth.user_id,
                scopes: auth.scopes.clone(),
                model_endpoints: model.map(|m| m.endpoint.clone()).into_iter().collect(),
                realm: &auth.realm,
                instance_id: &self.settings.instance_id,
                issuer: &self.settings.issuer,
                audience: &self.settings.audience,
            })
            .map_err(|e| GatewayError::Token(e.to_string()))?;
        Ok(vec![
            (headers::AUTHORIZATION, format!("Bearer {token}")),
            (
                headers::AUTHENTICATION_TYPE,
                headers::AUTHENTICATION_TYPE_OIDC.to_owned(),
            ),
            (headers::REALM, auth.realm.clone()),
            (headers::INSTANCE_ID, self.settings.instance_id.clone()),
            (headers::GLOBAL_USER_ID, global_user_id),
            (headers::HOST_NAME, self.host_name.clone()),
            (headers::VERSION, GITLAB_VERSION.to_owned()),
            (headers::REQUEST_ID, auth.request_id.to_string()),
            (
                headers::RAILS_SEND_START,
                format!(
                    "{:.3}",
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs_f64())
                        .unwrap_or(0.0)
                ),
            ),
            (
                headers::ENABLED_FEATURE_FLAGS,
                self.settings.enabled_feature_flags.join(","),
            ),
        ])
    }

    fn url(&self, auth: &GatewayAuth, path: &str) -> Result<url::Url, GatewayError> {
        let base = auth.gateway_url.as_ref().unwrap_or(&self.settings.base_url);
        // `join` would drop the last segment of a base without a trailing slash.
        let mut base = base.clone();
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        base.join(path.trim_start_matches('/'))
            .map_err(|e| GatewayError::Body(e.to_string()))
    }

    /// Sends a request and returns whatever the gateway answered.
    async fn send(
        &self,
        auth: &GatewayAuth,
        path: &str,
        body: &impl serde::Serialize,
        model: Option<&contracts::ModelMetadata>,
    ) -> Result<reqwest::Response, GatewayError> {
        let mut request = self
            .http
            .post(self.url(auth, path)?)
            .headers(duo_telemetry::outgoing_headers())
            .json(body);
        for (name, value) in self.headers(auth, model)? {
            request = request.header(name, value);
        }
        request
            .send()
            .await
            .map_err(|e| GatewayError::from_reqwest(&e))
    }

    async fn post(
        &self,
        auth: &GatewayAuth,
        path: &str,
        body: &impl serde::Serialize,
        model: Option<&contracts::ModelMetadata>,
    ) -> Result<reqwest::Response, GatewayError> {
        let response = self.send(auth, path, body, model).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status.as_u16() == 403 {
            return Err(GatewayError::Forbidden);
        }
        let text = response.text().await.unwrap_or_default();
        tracing::debug!(status = status.as_u16(), body = %text, "gateway refused a request");
        if text.contains(PROMPT_TOO_LONG) {
            let detail = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_owned))
                .unwrap_or(text);
            tracing::warn!(detail = %detail, "the prompt does not fit the model's context");
            return Err(GatewayError::PromptTooLong(detail));
        }
        Err(GatewayError::Status {
            status: status.as_u16(),
        })
    }

    /// Runs one ReAct step; the stream ends after the gateway's last event.
    pub async fn agent_step(
        &self,
        auth: &GatewayAuth,
        body: &AgentRequest,
    ) -> Result<EventStream, GatewayError> {
        let response = self
            .post(auth, "/v2/chat/agent", body, body.model_metadata.as_ref())
            .await?;
        let mut bytes = response.bytes_stream();
        let stream = async_stream::stream! {
            let mut decoder = NdjsonDecoder::default();
            while let Some(chunk) = bytes.next().await {
                match chunk {
                    Ok(chunk) => {
                        for event in decoder.push(&chunk) {
                            yield Ok(event);
                        }
                    }
                    Err(err) => {
                        yield Err(GatewayError::from_body_error(&err));
                        return;
                    }
                }
            }
            for event in decoder.finish() {
                yield Ok(event);
            }
        };
        Ok(Box::pin(stream))
    }

    /// Runs `/v1/prompts/<prompt_id>` and returns the whole answer text;
    /// a failed hop is asked again ([`with_transport_retries`]).
    pub async fn prompt(
        &self,
        auth: &GatewayAuth,
        prompt_id: &str,
        inputs: Map<String, Value>,
        model_metadata: Option<&contracts::ModelMetadata>,
    ) -> Result<String, GatewayError> {
        with_transport_retries("prompt", || {
            self.prompt_once(auth, prompt_id, inputs.clone(), model_metadata)
        })
        .await
    }

    async fn prompt_once(
        &self,
        auth: &GatewayAuth,
        prompt_id: &str,
        inputs: Map<String, Value>,
        model_metadata: Option<&contracts::ModelMetadata>,
    ) -> Result<String, GatewayError> {
        let body = PromptRequest {
            inputs,
            prompt_version: None,
            stream: false,
            model_metadata: model_metadata.cloned(),
        };
        let response = self
            .post(
                auth,
                &format!("/v1/prompts/{prompt_id}"),
                &body,
                model_metadata,
            )
            .await?;
        let text = response
            .text()
            .await
            .map_err(|e| GatewayError::from_body_error(&e))?;
        // The gateway answers a JSON string; accept plain text too.
        Ok(serde_json::from_str::<String>(&text).unwrap_or(text))
    }

    /// Checks a self-hosted model: asks it a tiny question through the
    /// gateway (`/v1/prompts/`[`CHECK_PROMPT`] with its `model_metadata`), so
    /// the check goes the same way as a feature's call: gateway settings,
    /// prompt family, endpoint, identifier and key. A refusal by the gateway
    /// or the model comes back with the gateway's own explanation; only a
    /// gateway that cannot be reached is an error.
    pub async fn check_model(
        &self,
        auth: &GatewayAuth,
        model_metadata: &contracts::ModelMetadata,
    ) -> Result<ModelCheck, GatewayError> {
        let mut inputs = Map::new();
        for (name, value) in [
            ("selected_text", "fn ok() -> bool { true }"),
            ("language_info", "The code is written in Rust."),
            ("file_content", ""),
            (
                "input",
                "This is a connection test: answer in one short sentence.",
            ),
        ] {
            inputs.insert(name.to_owned(), Value::String(value.to_owned()));
        }
        let body = PromptRequest {
            inputs,
            prompt_version: None,
            stream: false,
            model_metadata: Some(model_metadata.clone()),
        };
        let response = self
            .send(
                auth,
                &format!("/v1/prompts/{CHECK_PROMPT}"),
                &body,
                Some(model_metadata),
            )
            .await?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| GatewayError::from_body_error(&e))?;
        if status.is_success() {
            let answer = serde_json::from_str::<String>(&text).unwrap_or(text);
            return Ok(ModelCheck::Answered(clip(&answer, CHECK_TEXT_CHARS)));
        }
        // The gateway explains itself in `detail` (FastAPI's error shape).
        let detail = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| match &v["detail"] {
                Value::String(s) => Some(s.clone()),
                Value::Null => None,
                other => Some(other.to_string()),
            })
            .unwrap_or(text);
        Ok(ModelCheck::Refused {
            status: status.as_u16(),
            detail: clip(&detail, CHECK_TEXT_CHARS),
        })
    }

    /// `/v1/embeddings/code_embeddings/{index,search}`: one vector per text, in
    /// order, and the model that made them (recorded with the vectors, so a
    /// change of model re-indexes instead of mixing vectors).
    /// A failed hop is asked again ([`with_transport_retries`]).
    pub async fn code_embeddings(
        &self,
        auth: &GatewayAuth,
        purpose: EmbeddingPurpose,
        texts: &[String],
        model_metadata: Option<&contracts::ModelMetadata>,
    ) -> Result<CodeEmbeddings, GatewayError> {
        with_transport_retries("code embeddings", || {
            self.code_embeddings_once(auth, purpose, texts, model_metadata)
        })
        .await
    }

    async fn code_embeddings_once(
        &self,
        auth: &GatewayAuth,
        purpose: EmbeddingPurpose,
        texts: &[String],
        model_metadata: Option<&contracts::ModelMetadata>,
    ) -> Result<CodeEmbeddings, GatewayError> {
        let path = match purpose {
            EmbeddingPurpose::Index => "/v1/embeddings/code_embeddings/index",
            EmbeddingPurpose::Search => "/v1/embeddings/code_embeddings/search",
        };
        let mut body = serde_json::json!({ "contents": texts });
        if let Some(model) = model_metadata {
            body["model_metadata"] =
                serde_json::to_value(model).map_err(|e| GatewayError::Body(e.to_string()))?;
        }
        let response = self.post(auth, path, &body, model_metadata).await?;
        let value: Value = read_json(response).await?;
        let model = value["model"]["identifier"]
            .as_str()
            .or_else(|| value["model"]["name"].as_str())
            .unwrap_or_default()
            .to_owned();
        let mut indexed: Vec<(u64, Vec<f32>)> = value["predictions"]
            .as_array()
            .ok_or_else(|| GatewayError::Body("no predictions".into()))?
            .iter()
            .map(|p| {
                let vector = p["embedding"]
                    .as_array()?
                    .iter()
                    .map(|v| v.as_f64().map(|f| f as f32))
                    .collect::<Option<Vec<f32>>>()?;
                Some((p["index"].as_u64()?, vector))
            })
            .collect::<Option<_>>()
            .ok_or_else(|| GatewayError::Body("malformed predictions".into()))?;
        indexed.sort_by_key(|(i, _)| *i);
        if indexed.len() != texts.len() {
            return Err(GatewayError::Body(format!(
                "{} vectors for {} texts",
                indexed.len(),
                texts.len()
            )));
        }
        Ok(CodeEmbeddings {
            model,
            vectors: indexed.into_iter().map(|(_, v)| v).collect(),
        })
    }

    /// Runs `/v1/prompts/<prompt_id>` with `stream: true`: plain text deltas.
    pub async fn prompt_stream(
        &self,
        auth: &GatewayAuth,
        prompt_id: &str,
        inputs: Map<String, Value>,
        model_metadata: Option<&contracts::ModelMetadata>,
    ) -> Result<TextStream, GatewayError> {
        let body = PromptRequest {
            inputs,
            prompt_version: None,
            stream: true,
            model_metadata: model_metadata.cloned(),
        };
        let response = self
            .post(
                auth,
                &format!("/v1/prompts/{prompt_id}"),
                &body,
                model_metadata,
            )
            .await?;
        let mut bytes = response.bytes_stream();
        let stream = async_stream::stream! {
            let mut text = Utf8Decoder::default();
            while let Some(chunk) = bytes.next().await {
                match chunk {
                    Ok(chunk) => {
                        let piece = text.push(&chunk);
                        if !piece.is_empty() {
                            yield Ok(piece);
                        }
                    }
                    Err(err) => {
                        yield Err(GatewayError::from_body_error(&err));
                        return;
                    }
                }
            }
        };
        Ok(Box::pin(stream))
    }

    /// Searches the GitLab documentation through the gateway; a failed hop
    /// is asked again ([`with_transport_retries`]).
    pub async fn search_docs(
        &self,
        auth: &GatewayAuth,
        query: &str,
    ) -> Result<SearchDocsResponse, GatewayError> {
        with_transport_retries("documentation search", || {
            self.search_docs_once(auth, query)
        })
        .await
    }

    async fn search_docs_once(
        &self,
        auth: &GatewayAuth,
        query: &str,
    ) -> Result<SearchDocsResponse, GatewayError> {
        let body = SearchDocsRequest {
            request_type: "search-docs".to_owned(),
            metadata: SearchMetadata {
                source: "GitLab EE".to_owned(),
                version: GITLAB_VERSION.to_owned(),
            },
            payload: SearchPayload {
                query: query.to_owned(),
                page_size: contracts::docs_search::default_page_size(),
            },
        };
        let response = self
            .post(auth, "/v1/search/gitlab-docs", &body, None)
            .await?;
        read_json(response).await
    }
}

/// Reads a JSON answer: a body cut off is a broken hop, JSON that does not
/// parse is an unexpected answer.
async fn read_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
) -> Result<T, GatewayError> {
    let bytes = response
        .bytes()
        .await
        .map_err(|e| GatewayError::from_body_error(&e))?;
    serde_json::from_slice(&bytes).map_err(|e| GatewayError::Body(e.to_string()))
}

/// How long one model step, or one gateway call, keeps retrying a failed
/// hop, its pauses included.
pub const RETRY_BUDGET: Duration = Duration::from_secs(12);
/// At most this many retries after failed hops.
pub const MAX_TRANSPORT_RETRIES: u32 = 6;

/// The pause before transport retry `retry` (from 0), or `None` when the
/// budget or the retries are spent: 250 ms doubling to 2 s, plus up to half
/// of it again as jitter, so the calls one dead gateway cut off together do
/// not all come back at the same instant. Each retry opens its request anew,
/// so a Service in front of several replicas can route it to a live one.
pub fn transport_backoff(retry: u32, elapsed: Duration) -> Option<Duration> {
    if retry >= MAX_TRANSPORT_RETRIES {
        return None;
    }
    let base_ms = 250u64.saturating_mul(1 << retry.min(3)).min(2_000);
    let jitter_ms = rand::random_range(0..=base_ms / 2);
    let pause = Duration::from_millis(base_ms + jitter_ms);
    (elapsed + pause < RETRY_BUDGET).then_some(pause)
}

/// Runs `call` again while it fails with a transient hop failure
/// ([`GatewayError::is_transient`]), within [`RETRY_BUDGET`].
pub async fn with_transport_retries<T, F, Fut>(what: &str, mut call: F) -> Result<T, GatewayError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, GatewayError>>,
{
    let started = tokio::time::Instant::now();
    let mut retry = 0;
    loop {
        match call().await {
            Err(err) if err.is_transient() => {
                let Some(pause) = transport_backoff(retry, started.elapsed()) else {
                    return Err(err);
                };
                retry += 1;
                tracing::info!(what, attempt = retry, error = %err, "the AI gateway hop failed; retrying");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

/// Longest event line the decoder keeps; a longer one (no newline for this
/// long) is dropped whole. The gateway's events are far smaller (text deltas and
/// one action), so this only bounds what a broken or hostile peer can make the
/// worker hold.
pub const MAX_EVENT_LINE_BYTES: usize = 4 * 1024 * 1024;

/// Cuts NDJSON events out of a byte stream. Reads may end anywhere, even
/// inside a UTF-8 character; lines are only decoded once complete. Lines that
/// are not an event we know are logged at DEBUG and skipped. Each byte is
/// scanned once, and memory is bounded by [`MAX_EVENT_LINE_BYTES`].
#[derive(Debug, Default)]
pub struct NdjsonDecoder {
    buffer: BytesMut,
    /// How much of `buffer` is known to hold no newline.
    scanned: usize,
    /// Inside an over-long line: skip bytes up to its newline.
    discarding: bool,
}

impl NdjsonDecoder {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<AgentEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        loop {
            let Some(offset) = self.buffer[self.scanned..].iter().position(|b| *b == b'\n') else {
                self.scanned = self.buffer.len();
                if self.scanned > MAX_EVENT_LINE_BYTES {
                    tracing::warn!(
                        bytes = self.scanned,
                        "dropping an over-long agent event line"
                    );
                    self.buffer.clear();
                    self.scanned = 0;
                    self.discarding = true;
                }
                break;
            };
            let end = self.scanned + offset;
            let line = self.buffer.split_to(end);
            self.buffer.advance(1);
            self.scanned = 0;
            if std::mem::take(&mut self.discarding) {
                continue;
            }
            decode_line(&line, &mut events);
        }
        events
    }

    /// The last line, when the stream ended without a newline.
    pub fn finish(&mut self) -> Vec<AgentEvent> {
        let rest = self.buffer.split();
        self.scanned = 0;
        let mut events = Vec::new();
        if !std::mem::take(&mut self.discarding) {
            decode_line(&rest, &mut events);
        }
        events
    }
}

fn decode_line(line: &[u8], events: &mut Vec<AgentEvent>) {
    let text = String::from_utf8_lossy(line);
    match parse_event_line(&text) {
        None => {}
        Some(Ok(event)) => events.push(event),
        Some(Err(err)) => {
            tracing::debug!(error = %err, line = %text, "skipping an agent event we do not know");
        }
    }
}

/// Turns byte chunks into text without breaking characters split across reads.
#[derive(Debug, Default)]
struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Invalid bytes (not just an unfinished character): replace them.
            Err(_) => self.pending.len(),
        };
        let done: Vec<u8> = self.pending.drain(..valid).collect();
        String::from_utf8_lossy(&done).into_owned()
    }
}

/// Maps an `error` event of the agent stream to the failure it stands for.
pub fn error_event_failure(message: &str) -> GatewayError {
    if message.contains(TOOL_NOT_AVAILABLE) {
        GatewayError::ToolNotAvailable
    } else if message.contains(PROMPT_TOO_LONG) {
        GatewayError::PromptTooLong(message.to_owned())
    } else {
        GatewayError::Event(message.to_owned())
    }
}

/// The gateway's message for an action naming a tool it did not offer.
const TOOL_NOT_AVAILABLE: &str = "tool not available";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_inside_a_character_is_kept_whole() {
        let mut d = Utf8Decoder::default();
        let bytes = "héllo".as_bytes();
        let a = d.push(&bytes[..2]);
        let b = d.push(&bytes[2..]);
        assert_eq!(format!("{a}{b}"), "héllo");
        assert_eq!(a, "h");
    }

    #[test]
    fn error_events_map_to_codes() {
        assert_eq!(
            error_event_failure("tool not available").code(),
            DuoErrorCode::G3001
        );
        assert_eq!(
            error_event_failure("prompt is too long: 300000 tokens").code(),
            DuoErrorCode::A1005
        );
        assert_eq!(
            error_event_failure("overloaded_error").code(),
            DuoErrorCode::A1004
        );
    }
}
