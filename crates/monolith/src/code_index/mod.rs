//! Codebase search: the code index of each project's default branch (and
//! of a few other branches asked about) and the searches chat runs over it.
//! See `docs/code-search.md`.
//!
//! - [`indexer`]: the `code_index` job (on push, on first use, by command)
//!   walks what changed since the indexed commit, chunks files
//!   ([`chunker`]), skips what must never be sent to AI ([`filters`]), has
//!   the gateway embed the chunks and stores them ([`store`]).
//! - [`branches`]: indexes of other branches, made on demand, bounded per
//!   project, sharing embedded blobs with the default branch.
//! - [`search`]: vector kNN and full-text search fused by reciprocal rank.
//! - [`chat_context`]: the `REPOSITORY` / `DIRECTORY` additional context of a
//!   chat question, authorized, searched and rendered as GitLab does.
//! - [`switches`]: turning Duo off for a project, a group or the instance
//!   drops what is indexed of it; turning it back on indexes it again.

pub mod batching;
pub mod branches;
pub mod chat_context;
pub mod chunker;
pub mod filters;
pub mod indexer;
pub mod search;
pub mod store;
pub mod switches;

use crate::queries::Queries;
use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::config::CodeIndexConfig;
use crate::gateway_client::{GatewayAuth, GatewayClient, GatewayError};
use crate::repositories::Repositories;

pub use indexer::{CodeIndexBranchJob, CodeIndexJob, enqueue_branch_index, enqueue_index};
pub use store::{IndexState, IndexStatus};

/// What indexing and searching need.
#[derive(Clone)]
pub struct CodeIndex {
    pub pool: Pool,
    pub repositories: Repositories,
    pub gateway: GatewayClient,
    pub settings: CodeIndexConfig,
    /// The admin's model choice for code embeddings.
    pub models: crate::ai_models::ModelStore,
    /// Decides whether a project's code may be embedded at all (Duo on)
    /// and which of its files (the exclusion rules).
    pub policy: crate::policy::Policy,
}

impl CodeIndex {
    /// The model code embeddings use: `None` for the gateway's configured
    /// one, a self-hosted model's metadata, or [`CodeIndexError::SwitchedOff`].
    pub async fn embedding_model(
        &self,
        db: &impl crate::queries::Queries,
    ) -> Result<Option<contracts::ModelMetadata>, CodeIndexError> {
        match self
            .models
            .choice(db, crate::ai_models::Feature::CodeEmbeddings)
            .await?
        {
            crate::ai_models::Choice::Disabled => Err(CodeIndexError::SwitchedOff),
            choice => Ok(choice.metadata().cloned()),
        }
    }
}

impl std::fmt::Debug for CodeIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeIndex")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Why indexing or a search failed.
#[derive(Debug, thiserror::Error)]
pub enum CodeIndexError {
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("repository: {0}")]
    Repository(#[from] crate::repositories::RepositoryError),
    #[error("embedding: {0}")]
    Embedding(#[from] GatewayError),
    #[error("policy: {0}")]
    Policy(#[from] crate::policy::PolicyError),
    #[error("job queue: {0}")]
    Queue(#[from] job_queue::QueueError),
    #[error("the project's exclusion rules: {0}")]
    Exclusions(#[from] filters::BadGlob),
    /// The gateway answered with another model than the stored vectors'
    /// (handled inside a run: it starts over with the whole tree).
    #[error("the embedding model changed")]
    ModelChanged,
    #[error("indexing took longer than {0} seconds")]
    Timeout(u64),
    /// Code embeddings are switched off in the AI model settings.
    #[error("code embeddings are switched off in the AI model settings")]
    SwitchedOff,
    #[error("the AI model settings: {0}")]
    Models(#[from] crate::ai_models::ModelsError),
    /// Duo was turned off for the project while it was being indexed
    /// (handled inside a run: it stops and drops the index).
    #[error("GitLab Duo was turned off for the project")]
    DuoSwitchedOff,
    /// The branch's index was evicted or dropped under its run (handled
    /// inside a run: it stops).
    #[error("the branch's index was dropped")]
    BranchDropped,
}

impl CodeIndexError {
    /// The code stored with a failed index and shown in chat: GitLab's codes
    /// for the AI service (A1xxx) when the embedder failed, A9999 otherwise.
    pub fn code(&self) -> contracts::DuoErrorCode {
        match self {
            Self::Embedding(GatewayError::Status { .. }) => contracts::DuoErrorCode::A1004,
            Self::Embedding(e) => e.code(),
            Self::Timeout(_) => contracts::DuoErrorCode::A1000,
            Self::SwitchedOff => contracts::DuoErrorCode::M3004,
            Self::DuoSwitchedOff => contracts::DuoErrorCode::M3002,
            _ => contracts::DuoErrorCode::A9999,
        }
    }
}

/// Gateway credentials for embedding on behalf of `user_id` (0: the
/// instance itself, for indexing). Embedding needs only
/// `generate_embeddings_codebase`: the user's own access was checked before.
pub async fn embedding_auth(
    db: &impl Queries,
    user_id: i64,
    request_id: Uuid,
) -> Result<GatewayAuth, tokio_postgres::Error> {
    let (realm, gateway_url) = crate::gateway_client::instance_route(db).await?;
    Ok(GatewayAuth {
        user_id,
        scopes: vec![
            contracts::UnitPrimitive::GenerateEmbeddingsCodebase
                .as_str()
                .to_owned(),
        ],
        realm,
        request_id,
        gateway_url,
    })
}
