//! `POST /v1/search/gitlab-docs`: search the project's documentation.
//!
//! Needs the `documentation_search` unit primitive (403 `{"detail": ...}`
//! otherwise, checked before the body is parsed). The body is
//! [`SearchDocsRequest`]; unknown fields are ignored. A query that is empty,
//! blank or longer than [`MAX_QUERY_CHARS`], or a `page_size` outside 1..=20,
//! is a 422 in FastAPI's shape. The answer holds at most [`MAX_RESULTS`]
//! sections, best first; no match is a 200 with no results.

use super::body::RawBody;
use crate::app_state::AppState;
use crate::auth::GatewayUser;
use crate::docs_search::{DocsHit, MAX_QUERY_CHARS, MAX_RESULTS};
use crate::error::{ApiError, ValidationIssue};
use actix_web::{HttpResponse, web};
use contracts::UnitPrimitive;
use contracts::docs_search::{
    SearchDocsRequest, SearchDocsResponse, SearchResponseMetadata, SearchResult, SearchResults,
};

/// `metadata.provider` of every answer: the search engine behind it.
pub const PROVIDER: &str = "tantivy";
const PAGE_SIZE_RANGE: std::ops::RangeInclusive<u32> = 1..=20;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/search/gitlab-docs", web::post().to(search_docs));
}

pub async fn search_docs(
    user: GatewayUser,
    RawBody(body): RawBody,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if !user.can(UnitPrimitive::DocumentationSearch) {
        return Err(ApiError::Forbidden(format!(
            "Unauthorized to access {}",
            UnitPrimitive::DocumentationSearch
        )));
    }
    let request: SearchDocsRequest =
        serde_json::from_slice(&body).map_err(ApiError::invalid_body)?;
    validate(&request)?;
    let limit = usize::try_from(request.payload.page_size).unwrap_or(MAX_RESULTS);
    // The index is a few hundred sections in memory: a search takes
    // microseconds, so it runs on the worker rather than a blocking thread.
    let hits = state
        .docs
        .search(&request.payload.query, limit)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    tracing::debug!(hits = hits.len(), "documentation search");
    Ok(HttpResponse::Ok().json(response(hits)))
}

fn validate(request: &SearchDocsRequest) -> Result<(), ApiError> {
    let mut issues = Vec::new();
    let query = &request.payload.query;
    if query.trim().is_empty() {
        issues.push(issue(
            "query",
            "String should have at least 1 non-blank character",
            "string_too_short",
        ));
    } else if query.chars().count() > MAX_QUERY_CHARS {
        issues.push(issue(
            "query",
            &format!("String should have at most {MAX_QUERY_CHARS} characters"),
            "string_too_long",
        ));
    }
    let page_size = request.payload.page_size;
    if !PAGE_SIZE_RANGE.contains(&page_size) {
        issues.push(issue(
            "page_size",
            &format!(
                "Input should be between {} and {}",
                PAGE_SIZE_RANGE.start(),
                PAGE_SIZE_RANGE.end()
            ),
            "value_error",
        ));
    }
    if issues.is_empty() {
        Ok(())
    } else {
        Err(ApiError::Validation(issues))
    }
}

fn issue(field: &str, msg: &str, kind: &str) -> ValidationIssue {
    ValidationIssue {
        loc: vec!["body".into(), "payload".into(), field.into()],
        msg: msg.into(),
        kind: kind.into(),
    }
}

fn response(hits: Vec<DocsHit>) -> SearchDocsResponse {
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    SearchDocsResponse {
        response: SearchResults {
            results: hits
                .into_iter()
                .map(|hit| SearchResult {
                    id: hit.id,
                    content: hit.content,
                    metadata: hit.metadata,
                })
                .collect(),
        },
        metadata: SearchResponseMetadata {
            provider: PROVIDER.to_owned(),
            timestamp,
        },
    }
}
