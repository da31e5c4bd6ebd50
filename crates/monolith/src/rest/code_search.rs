//! `GET /api/v4/projects/:id/semantic_code_search`: the project's code index
//! searched by meaning, for Duo Workflow's `semantic_code_search` tool (the
//! "API for Workflow" of the codebase search design) and any other caller.
//!
//! The same gate as chat's codebase search, in order: a signed-in caller who
//! may read the project (404 otherwise, as if it did not exist), its code
//! may go to AI (`Policy::code_for_ai`: code access, Duo on; 403 when only
//! Duo is off), and the project's Duo context exclusion rules drop excluded
//! files from the results. A project not indexed yet is queued for indexing
//! and answers an empty list with `status: "indexing"`.
//!
//! `ref` searches a branch other than the default, through the same path as
//! chat's `metadata.branch` (`code_index::chat_context::branch_index`): for
//! a caller who may read the project, a name git would refuse is 400 before
//! the branch is looked up; after the checks above, a branch that does not
//! exist is 404 and one not indexed yet is queued and answers
//! `status: "indexing"`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::ApiError;
use super::containers::readable_project;
use super::workflow_tools::DUO_OFF;
use crate::app_state::AppState;
use crate::code_index::chat_context::{self, BranchLookup, Outcome};
use crate::code_index::search::{self, QueryVector, Retrieval, Scope};
use crate::code_index::{CodeIndex, branches, store};
use crate::gateway_client::EmbeddingPurpose;
use crate::policy::{Ability, AiReader, Subject};
use crate::repositories::reader;

/// Longest query accepted (as the MCP tool's).
const MAX_QUERY_CHARS: usize = 2_000;
/// Results per call: GitLab's semantic search default and our ceiling.
const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: usize = 20;
/// Longest chunk content returned, and all of them together.
const MAX_CHUNK_CHARS: usize = 4_000;
const MAX_TOTAL_CHARS: usize = 32_000;

#[derive(Debug, Deserialize)]
pub(super) struct SearchParams {
    semantic_query: Option<String>,
    directory_path: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "ref")]
    branch: Option<String>,
}

/// The checked parameters.
struct Query {
    text: String,
    directory: Option<String>,
    limit: usize,
    /// A branch other than the default, its name checked as git checks it.
    branch: Option<String>,
}

fn checked(params: SearchParams) -> Result<Query, ApiError> {
    let text = params.semantic_query.unwrap_or_default();
    if text.trim().is_empty() {
        return Err(ApiError::BadRequest("semantic_query is missing".into()));
    }
    if text.chars().count() > MAX_QUERY_CHARS || text.contains('\0') {
        return Err(ApiError::BadRequest(format!(
            "semantic_query must be at most {MAX_QUERY_CHARS} characters long"
        )));
    }
    let directory = match params.directory_path.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(dir) => {
            let clean = reader::clean_path(dir)
                .map_err(|_| ApiError::BadRequest("directory_path is invalid".into()))?;
            (!clean.is_empty()).then_some(clean)
        }
    };
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    let branch = match params.branch.as_deref() {
        None => None,
        Some(name) => Some(
            branches::validate_name(name)
                .map_err(|e| ApiError::BadRequest(format!("ref is invalid: {e}")))?
                .to_owned(),
        ),
    };
    Ok(Query {
        text,
        directory,
        limit,
        branch,
    })
}

/// Which index a search reads, or what to answer instead.
enum Target {
    /// The default branch's (`None`) or a branch's index (its id).
    Index(Option<i64>),
    Indexing,
}

pub(super) async fn semantic_code_search(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    params: web::Query<SearchParams>,
) -> Result<HttpResponse, ApiError> {
    let project_id = path.into_inner();
    let actor = readable_project(&state, &req, project_id)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    let query = checked(params.into_inner())?;
    let mut db = state.pool.get().await?;
    let Some(code) = state
        .policy
        .code_for_ai(&*db, AiReader::User(actor), project_id)
        .await?
    else {
        // A reader of the project who may not read its code: as if absent;
        // one who may, with Duo off here: refused saying so.
        let reads_code = state
            .policy
            .can(
                &*db,
                Some(actor),
                Ability::ReadCode,
                Subject::Project(project_id),
            )
            .await?;
        return Err(if reads_code {
            ApiError::ForbiddenBecause(DUO_OFF)
        } else {
            ApiError::NotFound("Project")
        });
    };
    let index = state.code_index().map_err(|e| unavailable(&e))?;
    let branch_id = match which_index(&index, &*db, project_id, query.branch.as_deref()).await? {
        Target::Index(branch_id) => branch_id,
        Target::Indexing => {
            return Ok(HttpResponse::Ok().json(json!({"status": "indexing", "results": []})));
        }
    };
    let auth = crate::code_index::embedding_auth(&*db, actor.id, Uuid::new_v4()).await?;
    let model = index
        .embedding_model(&*db)
        .await
        .map_err(|e| unavailable(&e))?;
    let embedded = index
        .gateway
        .code_embeddings(
            &auth,
            EmbeddingPurpose::Search,
            std::slice::from_ref(&query.text),
            model.as_ref(),
        )
        .await
        .map_err(|e| unavailable(&e))?;
    let vector = embedded
        .vectors
        .into_iter()
        .next()
        .map(|vector| QueryVector {
            model: embedded.model,
            vector,
        });
    let scope = Scope {
        project_id,
        directory: query.directory,
    };
    let hits = search::search_on(
        &mut db,
        &scope,
        branch_id,
        &query.text,
        vector.as_ref(),
        Retrieval::Fused,
        query.limit,
        code.exclusions(),
    )
    .await?;
    let mut total = 0;
    let mut results = Vec::new();
    for hit in hits {
        // Checked again here: nothing excluded leaves, whatever the search did.
        if !code.allows(&hit.path) {
            continue;
        }
        let content = crate::work_items::ai_serialization::bounded(&hit.content, MAX_CHUNK_CHARS);
        total += content.chars().count();
        if total > MAX_TOTAL_CHARS {
            break;
        }
        results.push(json!({
            "path": hit.path,
            "start_line": hit.start_line,
            "end_line": hit.end_line,
            "content": content,
            "score": hit.score,
        }));
    }
    Ok(HttpResponse::Ok().json(json!({"status": "ready", "results": results})))
}

/// The index to search, for a caller already authorized for the project's
/// code: the branch's when one is named (queued when missing), else the
/// default branch's (queued when not indexed yet).
async fn which_index(
    index: &CodeIndex,
    db: &impl crate::queries::Queries,
    project_id: i64,
    branch: Option<&str>,
) -> Result<Target, ApiError> {
    if let Some(name) = branch {
        let found = chat_context::branch_index(index, db, project_id, name)
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        match found {
            BranchLookup::Default => {}
            BranchLookup::Indexed(id) => return Ok(Target::Index(Some(id))),
            BranchLookup::Missing => return Err(ApiError::NotFound("Branch")),
            BranchLookup::Other(Outcome::Answer(_)) => return Ok(Target::Indexing),
            BranchLookup::Other(Outcome::Refused(code, detail)) => {
                return Err(ApiError::Internal(format!("{detail} ({code})")));
            }
            BranchLookup::Other(Outcome::Ready(_)) => {
                return Err(ApiError::Internal("unexpected branch lookup".into()));
            }
        }
    }
    let searchable = store::status(db, project_id)
        .await?
        .is_some_and(|s| s.searchable());
    if !searchable {
        store::ensure_status(db, project_id).await?;
        crate::code_index::enqueue_index(db, project_id, index.settings.max_attempts)
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        return Ok(Target::Indexing);
    }
    Ok(Target::Index(None))
}

fn unavailable(e: &dyn std::fmt::Display) -> ApiError {
    tracing::warn!(error = %e, "semantic code search could not embed the query");
    ApiError::Internal(format!("the code search is unavailable: {e}"))
}
