//! `POST /v1/embeddings/code_embeddings` (also `/index`) and `/search`: GitLab's
//! code-embedding endpoints, which the monolith's code index calls to embed
//! chunks (index) and questions (search). Two paths so that search traffic
//! can be told apart (and scaled) from bulk indexing.
//!
//! Needs `generate_embeddings_codebase` (403 otherwise, before the body is
//! read). Body: `{contents: [str], model_metadata?: {provider, identifier?,
//! name?, endpoint?, api_key?}, dimensions?}`; answer: `{model: {engine, name,
//! identifier}, predictions: [{embedding, index}]}`. Errors: 422 for a bad
//! body, 400 for a text too long for the model, 401 when the model refuses our
//! credentials, 429 when it rate-limits us, 504 when it times out.

use actix_web::{HttpResponse, web};
use contracts::UnitPrimitive;
use serde::Deserialize;
use serde_json::json;

use super::body::RawBody;
use crate::app_state::AppState;
use crate::auth::GatewayUser;
use crate::config::EmbeddingProvider;
use crate::embeddings::{self, EmbedError, EmbeddingTarget};
use crate::error::{ApiError, ValidationIssue};
use crate::providers::Egress;

/// Most texts one request may carry.
pub const MAX_CONTENTS: usize = 1000;
/// Most characters of one text.
pub const MAX_CONTENT_CHARS: usize = 32 * 1024;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/embeddings/code_embeddings", web::post().to(index))
        .route(
            "/v1/embeddings/code_embeddings/index",
            web::post().to(index),
        )
        .route(
            "/v1/embeddings/code_embeddings/search",
            web::post().to(search),
        );
}

#[derive(Debug, Deserialize)]
struct ModelMetadata {
    provider: Option<String>,
    identifier: Option<String>,
    name: Option<String>,
    endpoint: Option<String>,
    api_key: Option<String>,
}

#[derive(Debug, Deserialize)]
struct EmbeddingsRequest {
    contents: Vec<String>,
    model_metadata: Option<ModelMetadata>,
}

async fn index(
    user: GatewayUser,
    body: RawBody,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    handle(user, body, state).await
}

async fn search(
    user: GatewayUser,
    body: RawBody,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    handle(user, body, state).await
}

fn issue(field: &str, msg: String, kind: &str) -> ValidationIssue {
    ValidationIssue {
        loc: vec!["body".into(), field.into()],
        msg,
        kind: kind.into(),
    }
}

async fn handle(
    user: GatewayUser,
    RawBody(body): RawBody,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if !user.can(UnitPrimitive::GenerateEmbeddingsCodebase) {
        return Err(ApiError::Forbidden(format!(
            "Unauthorized to access {}",
            UnitPrimitive::GenerateEmbeddingsCodebase
        )));
    }
    let request: EmbeddingsRequest =
        serde_json::from_slice(&body).map_err(ApiError::invalid_body)?;
    drop(body);
    if request.contents.is_empty() || request.contents.len() > MAX_CONTENTS {
        return Err(ApiError::Validation(vec![issue(
            "contents",
            format!("List should have 1 to {MAX_CONTENTS} items"),
            "too_long",
        )]));
    }
    if let Some(i) = request
        .contents
        .iter()
        .position(|c| c.chars().count() > MAX_CONTENT_CHARS || c.trim().is_empty())
    {
        return Err(ApiError::Validation(vec![issue(
            "contents",
            format!(
                "Item {i} should be a non-blank string of at most {MAX_CONTENT_CHARS} characters"
            ),
            "string_too_long",
        )]));
    }
    let config = &state.config;
    let target = match request.model_metadata {
        // A self-hosted OpenAI-compatible embedding model, when the instance
        // allows custom models and the caller's token vouches for it.
        Some(ModelMetadata {
            provider: Some(provider),
            endpoint: Some(endpoint),
            identifier,
            name,
            api_key,
        }) if provider != "gitlab" => {
            if !config.providers.custom_models_enabled {
                return Err(ApiError::BadRequest(
                    "Custom models are not enabled on this gateway".into(),
                ));
            }
            let admitted = user
                .endpoint_guard(&config.providers.egress)
                .admit(&endpoint, api_key.as_deref())
                .map_err(|e| ApiError::Forbidden(e.to_string()))?;
            EmbeddingTarget {
                provider: EmbeddingProvider::OpenAi,
                base_url: admitted.base_url().to_owned(),
                model: identifier.or(name).unwrap_or_default(),
                api_key: admitted.api_key().map(str::to_owned),
                vertex_project: String::new(),
                vertex_location: String::new(),
                egress: Egress::CallerNamed,
            }
        }
        _ => EmbeddingTarget::configured(&config.code_embeddings, &config.providers),
    };
    let vectors = embeddings::embed(
        state.provider_clients.get(target.egress).pooled(),
        &target,
        &request.contents,
        config.code_embeddings.batch_size,
        config.code_embeddings.timeout,
    )
    .await
    .map_err(|e| match e {
        EmbedError::InputTooLong => ApiError::BadRequest(e.to_string()),
        EmbedError::RateLimited => ApiError::TooManyRequests(e.to_string()),
        EmbedError::Unauthorized => ApiError::Unauthorized(e.to_string()),
        EmbedError::Timeout => ApiError::GatewayTimeout(e.to_string()),
        EmbedError::Upstream(_) => ApiError::Upstream(e.to_string()),
    })?;
    tracing::debug!(texts = vectors.len(), model = %target.model, "code embeddings");
    Ok(HttpResponse::Ok().json(json!({
        "model": {
            "engine": target.engine(),
            "name": target.model,
            "identifier": target.model,
        },
        "predictions": vectors
            .into_iter()
            .enumerate()
            .map(|(index, embedding)| json!({ "embedding": embedding, "index": index }))
            .collect::<Vec<_>>(),
    })))
}
