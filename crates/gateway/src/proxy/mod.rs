//! Authenticated pass-through to Anthropic and Vertex AI
//! (`/v1/proxy/{anthropic,vertex-ai}/{path}`).
//!
//! [`check_purpose`] and [`plan`] are plain functions holding every rule;
//! [`forward`] does the one upstream call and streams the answer back.

mod body_facts;
pub mod rules;

use crate::auth::GatewayUser;
use crate::config::ProvidersConfig;
use crate::error::ApiError;
use crate::observability::{InferenceLabels, InferenceRecorder, ModelWaitClock};
use crate::providers::ProviderKind;
use crate::providers::direct_http::DirectHttp;
use crate::providers::upstream::ProviderHttp;
use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::HeaderMap;
use bytes::Bytes;
use contracts::UnitPrimitive;
use contracts::headers;
use futures::StreamExt;
use reqwest::header::{HeaderMap as UpstreamHeaders, HeaderName, HeaderValue};
use rules::VertexAction;
use secrecy::ExposeSecret;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    Anthropic,
    VertexAi,
}

impl ProxyKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::VertexAi => "vertex-ai",
        }
    }
}

/// The header checks, in GitLab's order: present, known, granted, allowed
/// for this proxy. Returns the unit primitive the call is made for.
pub fn check_purpose(
    kind: ProxyKind,
    request_headers: &HeaderMap,
    user: &GatewayUser,
) -> Result<UnitPrimitive, ApiError> {
    let raw = request_headers
        .get(headers::UNIT_PRIMITIVE)
        .ok_or_else(|| ApiError::BadRequest("Missing x-gitlab-unit-primitive header".into()))?;
    let text = String::from_utf8_lossy(raw.as_bytes());
    let purpose: UnitPrimitive = text
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("Unknown unit primitive header {text}")))?;
    if !user.can(purpose) {
        return Err(ApiError::Forbidden(format!(
            "Unauthorized to access {purpose}"
        )));
    }
    if !rules::allowed_purposes(kind).contains(&purpose) {
        return Err(ApiError::BadRequest(format!(
            "This endpoint cannot be used for {purpose} purpose"
        )));
    }
    Ok(purpose)
}

/// One call to make upstream.
#[derive(Debug)]
pub struct UpstreamCall {
    pub url: String,
    pub headers: UpstreamHeaders,
    pub body: Bytes,
    /// Pass the answer through chunk by chunk instead of reading it whole.
    pub streaming: bool,
    /// For the model metrics: `model_engine` and `model_name`.
    pub engine: &'static str,
    pub model: String,
}

/// The request as the proxy sees it: the part of the path after the proxy
/// prefix (with its leading `/`), the raw request path (still encoded), the
/// query string, the headers and the body.
#[derive(Debug)]
pub struct IncomingCall<'a> {
    pub path: &'a str,
    pub raw_path: &'a str,
    pub query: &'a str,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

/// Checks body, path and model and builds the upstream call.
pub fn plan(
    kind: ProxyKind,
    config: &ProvidersConfig,
    call: IncomingCall<'_>,
) -> Result<UpstreamCall, ApiError> {
    let facts =
        body_facts::read(&call.body).ok_or_else(|| ApiError::BadRequest("Invalid JSON".into()))?;
    if rules::is_traversal(call.raw_path) {
        return Err(ApiError::NotFound("Not found".into()));
    }
    let mut upstream_headers = copy_headers(call.headers, rules::request_headers(kind));
    match kind {
        ProxyKind::Anthropic => {
            if !rules::ANTHROPIC_PATHS.contains(&call.path) {
                return Err(ApiError::NotFound("Not found".into()));
            }
            let model = facts
                .model
                .ok_or_else(|| ApiError::BadRequest("Failed to extract model name".into()))?
                .into_owned();
            let streaming = facts.stream;
            if !rules::ANTHROPIC_MODELS.contains(&model.as_str()) {
                return Err(ApiError::BadRequest("Unsupported model".into()));
            }
            let key = config
                .anthropic_api_key
                .as_ref()
                .ok_or_else(|| ApiError::BadRequest("API key not found".into()))?;
            let mut key = HeaderValue::from_str(key.expose_secret())
                .map_err(|_| ApiError::BadRequest("API key not found".into()))?;
            key.set_sensitive(true);
            upstream_headers.insert(HeaderName::from_static("x-api-key"), key);
            Ok(UpstreamCall {
                url: format!(
                    "{}{}",
                    config.anthropic_base_url.trim_end_matches('/'),
                    call.path
                ),
                headers: upstream_headers,
                body: call.body,
                streaming,
                engine: ProviderKind::Anthropic.engine(),
                model,
            })
        }
        ProxyKind::VertexAi => {
            let (model, action) = rules::parse_vertex_path(call.path)
                .ok_or_else(|| ApiError::NotFound("Not found".into()))?;
            if !rules::vertex_model_allowed(&model, &config.local_embedding_model) {
                return Err(ApiError::BadRequest("Unsupported model".into()));
            }
            if let Some(token) = &config.vertex_access_token {
                let mut bearer =
                    HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
                        .map_err(|_| ApiError::Internal("invalid Vertex AI access token".into()))?;
                bearer.set_sensitive(true);
                upstream_headers.insert(reqwest::header::AUTHORIZATION, bearer);
            }
            let streaming = action == VertexAction::ServerStreamingPredict;
            let query = if streaming && call.query.split('&').any(|p| p == "alt=sse") {
                "?alt=sse"
            } else {
                ""
            };
            Ok(UpstreamCall {
                url: format!(
                    "{}/v1/projects/{}/locations/{}/publishers/google/models/{}:{}{}",
                    vertex_base_url(&config.vertex_endpoint),
                    config.vertex_project,
                    config.vertex_location,
                    model,
                    action.as_str(),
                    query
                ),
                headers: upstream_headers,
                body: call.body,
                streaming,
                engine: ProviderKind::VertexAi.engine(),
                model,
            })
        }
    }
}

/// `AIGW_VERTEX_TEXT_MODEL__ENDPOINT` is a URL, or a bare host meaning https.
pub fn vertex_base_url(endpoint: &str) -> String {
    let endpoint = endpoint.trim_end_matches('/');
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("https://{endpoint}")
    }
}

fn copy_headers(from: &HeaderMap, allowed: &[&str]) -> UpstreamHeaders {
    let mut out = UpstreamHeaders::new();
    for name in allowed {
        if let Some(value) = from.get(*name)
            && let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value.as_bytes()),
            )
        {
            out.insert(name, value);
        }
    }
    out
}

/// Makes the upstream call and relays status, allowed headers and body.
/// Time spent waiting on the upstream (for its head, then for each chunk of
/// the body) counts as waiting on the model; the call is counted in the
/// model metrics under `feature_category`. Plain-`http` upstreams go through
/// `direct` (see [`DirectHttp`]), the others through `client`.
pub async fn forward(
    client: &reqwest::Client,
    direct: &DirectHttp,
    call: UpstreamCall,
    clock: &ModelWaitClock,
    feature_category: &'static str,
) -> Result<HttpResponse, ApiError> {
    let mut recorder = InferenceRecorder::start(
        InferenceLabels {
            engine: call.engine,
            model: call.model,
            feature_category,
            streaming: call.streaming,
        },
        None,
    );
    recorder.prompt(|| String::from_utf8_lossy(&call.body).into_owned());
    let trace_headers = recorder.span().in_scope(duo_telemetry::outgoing_headers);
    let upstream = clock
        .time(
            ProviderHttp::new(client, Some(direct))
                .post(call.url)
                .headers(call.headers)
                .headers(trace_headers)
                .body(call.body)
                .send(),
        )
        .await
        .map_err(|err| {
            recorder.fail();
            tracing::warn!(error = %err, "proxy upstream unreachable");
            ApiError::BadGateway
        })?;
    let status =
        StatusCode::from_u16(upstream.status.as_u16()).map_err(|_| ApiError::BadGateway)?;
    if !status.is_success() {
        recorder.fail();
    }
    let mut response = HttpResponse::build(status);
    for name in rules::RESPONSE_HEADERS {
        if let Some(value) = upstream.headers.get(*name)
            && let Ok(value) = actix_web::http::header::HeaderValue::from_bytes(value.as_bytes())
        {
            response.insert_header((*name, value));
        }
    }
    if call.streaming {
        let clock = clock.clone();
        let pacing = upstream.body.pacing();
        let body = async_stream::stream! {
            let mut chunks = upstream.body.into_stream();
            while let Some(chunk) = clock.time(chunks.next()).await {
                if let Err(err) = &chunk {
                    recorder.fail();
                    tracing::warn!(error = %err, "proxy upstream stream broke");
                }
                yield chunk;
            }
            drop(recorder);
        };
        // A provider's read often holds several events: relayed one by one,
        // each cost a write and a wake-up of the client (21 writes for one
        // streamed Anthropic answer read in one go).
        Ok(response.streaming(crate::api::stream_body::first_chunk_ready(body, pacing).await))
    } else {
        let body = clock.time(upstream.body.bytes()).await.map_err(|err| {
            recorder.fail();
            tracing::warn!(error = %err, "proxy upstream body failed");
            ApiError::BadGateway
        })?;
        Ok(response.body(body))
    }
}
