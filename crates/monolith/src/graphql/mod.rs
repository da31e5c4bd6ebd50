//! GitLab's Duo Chat GraphQL API at `/api/graphql` (juniper), with GitLab's type
//! names so GitLab's own clients validate against it.
//!
//! - [`scalars`]: GitLab's ID and JSON scalars;
//! - [`chat_types`]: the chat enums, inputs and objects (`AiMessage`, threads);
//! - [`query`], [`mutation`], [`subscription`]: the roots;
//! - [`limits`]: what a document may cost before it runs;
//! - [`transport`]: HTTP and WebSocket handlers.

pub mod ai_models;
pub mod ai_usage;
pub mod chat_types;
pub mod document_cache;
pub mod limits;
pub mod mutation;
pub mod query;
pub mod scalars;
mod socket;
pub mod subscription;
pub mod transport;
pub mod variables;
pub mod workflows;

use std::sync::Arc;

use juniper::{FieldError, FieldResult, RootNode, graphql_value};

use crate::app_state::AppState;
use crate::chat::live::LiveHub;
use crate::chat::{ChatError, ChatService};
use crate::gid;
use crate::identity::tokens::AuthenticatedUser;
use crate::policy::{Actor, Policy};

pub use chat_types::*;
pub use limits::{MAX_QUERY_BYTES, MAX_QUERY_COMPLEXITY, MAX_QUERY_DEPTH};
pub use mutation::Mutation;
pub use query::Query;
pub use scalars::*;
pub use subscription::Subscription;
pub use transport::{handle, handle_get};

#[derive(Clone)]
pub struct GqlContext {
    pub chat: Arc<ChatService>,
    pub policy: Policy,
    pub pool: deadpool_postgres::Pool,
    pub user: Option<Actor>,
    pub username: Option<String>,
    /// What the caller's token allows here (see [`TokenAccess`]).
    pub access: TokenAccess,
    pub live: Arc<LiveHub>,
    pub models: crate::ai_models::ModelStore,
    pub config: Arc<crate::config::Config>,
    pub repositories: crate::repositories::Repositories,
    /// The service account of a composite token, for the audit trail.
    pub token_service_account: Option<i64>,
}

impl juniper::Context for GqlContext {}

impl GqlContext {
    pub(crate) fn new(state: &AppState, user: Option<AuthenticatedUser>) -> Self {
        GqlContext {
            chat: state.chat.clone(),
            policy: state.policy.clone(),
            pool: state.pool.clone(),
            user: user.as_ref().map(Actor::from),
            access: TokenAccess::of(user.as_ref()),
            token_service_account: user
                .as_ref()
                .and_then(|u| u.service_account.as_ref().map(|s| s.id)),
            username: user.map(|u| u.username),
            live: state.live.clone(),
            models: state.models.clone(),
            config: state.config.clone(),
            repositories: state.repositories.clone(),
        }
    }
}

/// What a token's scopes allow through GraphQL, as GitLab's per-field
/// authorization scopes decide it: `api` everything; `read_api` queries only;
/// `ai_features` only the AI mutations (`aiAction`, chat feedback, deleting
/// one's own threads) and the reads chat needs, never configuration. A
/// browser session counts as `api`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenAccess {
    /// `api` or `read_api`: every query, configuration included.
    pub read: bool,
    /// `api`: every mutation, the admin ones among them.
    pub write: bool,
    /// `api` or `ai_features`: the AI mutations.
    pub ai: bool,
}

/// Why a field refused the caller's token.
const INSUFFICIENT_SCOPE: &str = "INSUFFICIENT_SCOPE";

impl TokenAccess {
    pub fn of(user: Option<&AuthenticatedUser>) -> Self {
        let Some(user) = user else {
            return Self::default();
        };
        TokenAccess {
            read: user.has_any_scope(&["api", "read_api"]),
            write: user.has_any_scope(&["api"]),
            ai: user.has_any_scope(&["api", "ai_features"]),
        }
    }

    /// Reading configuration (models, feature settings) needs `api` or
    /// `read_api`: an `ai_features` token is for using AI, not seeing how it
    /// is set up.
    pub(crate) fn require_read(&self) -> FieldResult<()> {
        if self.read {
            Ok(())
        } else {
            Err(coded(
                "The token needs the api or read_api scope",
                INSUFFICIENT_SCOPE,
            ))
        }
    }

    /// Mutations other than the AI ones (configuration above all) need `api`.
    pub(crate) fn require_write(&self) -> FieldResult<()> {
        if self.write {
            Ok(())
        } else {
            Err(coded("The token needs the api scope", INSUFFICIENT_SCOPE))
        }
    }

    /// The AI mutations need `api` or `ai_features`.
    pub(crate) fn require_ai(&self) -> FieldResult<()> {
        if self.ai {
            Ok(())
        } else {
            Err(coded(
                "The token needs the api or ai_features scope",
                INSUFFICIENT_SCOPE,
            ))
        }
    }
}

pub(crate) fn coded(message: impl std::fmt::Display, code: &str) -> FieldError {
    FieldError::new(message, graphql_value!({ "code": code }))
}

pub(crate) fn internal<E: std::fmt::Display>(e: E) -> FieldError {
    tracing::error!(error = %e, "graphql resolver failed");
    coded("Internal server error", "INTERNAL_SERVER_ERROR")
}

pub(crate) fn parse_thread_id(id: &AiConversationThreadId) -> FieldResult<i64> {
    match gid::parse(&id.0) {
        Some(("Ai::Conversation::Thread", n)) => Ok(n),
        _ => Err(coded(
            format!("{} is not a valid AiConversationThreadID", id.0),
            "ARGUMENT_ERROR",
        )),
    }
}

/// Errors that stop the whole field (as opposed to `errors` in the payload).
pub(crate) fn chat_field_error(e: ChatError) -> FieldError {
    match e {
        ChatError::Unauthenticated => coded(
            "The resource that you are attempting to access does not exist or you don't have permission to perform this action",
            "UNAUTHENTICATED",
        ),
        ChatError::RateLimited => coded(e.to_string(), "RATE_LIMITED"),
        ChatError::Invalid(msg) => coded(msg, "ARGUMENT_ERROR"),
        ChatError::ThreadNotFound => coded(e.to_string(), "THREAD_NOT_FOUND"),
        ChatError::ResourceNotFound => coded(e.to_string(), "RESOURCE_NOT_AVAILABLE"),
        ChatError::ResourceNotPermitted => coded(e.to_string(), "AI_NOT_PERMITTED"),
        ChatError::Denied(code) => coded(code.user_message(), &code.to_string()),
        ChatError::Internal(detail) => internal(detail),
    }
}

pub type Schema = RootNode<Query, Mutation, Subscription>;

pub fn schema() -> Schema {
    // juniper's parser limits back up `limits::check_document` for every path a
    // document can take to the executor.
    Schema::new(Query, Mutation, Subscription)
        .limit_depth(limits::PARSER_MAX_DEPTH)
        .limit_tokens(limits::PARSER_MAX_TOKENS)
        .limit_fields(limits::PARSER_MAX_FIELDS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat;

    #[tokio::test]
    async fn schema_uses_gitlab_type_names() {
        let schema = schema();
        for name in [
            "AiActionInput",
            "AiChatInput",
            "AiModelID",
            "AiConversationThreadID",
            "AiCurrentFileInput",
            "AiAdditionalContextInput",
            "AiConversationsThreadsConversationType",
            "AiMessageRole",
            "ProjectID",
            "UserID",
            "AiAction",
            "AiAgentVersionID",
        ] {
            let query = format!("{{ __type(name: \"{name}\") {{ name }} }}");
            let vars = juniper::Variables::new();
            let ctx = test_context();
            let (value, errors) = juniper::execute(&query, None, &schema, &vars, &ctx)
                .await
                .unwrap();
            assert!(errors.is_empty());
            assert!(
                value.to_string().contains(name),
                "{name} missing from schema"
            );
        }
    }

    fn test_context() -> GqlContext {
        let pool = crate::db::pool_for_url("postgres://nobody@127.0.0.1:1/none", 1).unwrap();
        let policy = Policy::new(Arc::new(
            crate::policy::add_ons::AddOnCatalogue::built_in().unwrap(),
        ));
        GqlContext {
            chat: Arc::new(ChatService {
                pool: pool.clone(),
                policy: policy.clone(),
                queue: Arc::new(chat::PgCompletionQueue { max_attempts: 1 }),
                rate_limit: 1,
                rate_window: std::time::Duration::from_secs(1),
                docs_base_url: String::new(),
            }),
            policy,
            pool,
            user: None,
            username: None,
            access: TokenAccess::default(),
            live: LiveHub::new("postgres://nobody@127.0.0.1:1/none"),
            models: crate::ai_models::ModelStore::new(Arc::new(
                crate::identity::secret_box::SecretBox::from_key(&[0; 32]).unwrap(),
            )),
            config: Arc::new(
                crate::config::Config::from_lookup(|name| {
                    (name == "DATABASE_URL")
                        .then(|| "postgres://nobody@127.0.0.1:1/none".to_owned())
                })
                .unwrap(),
            ),
            repositories: crate::repositories::Repositories::new("/nonexistent", 1),
            token_service_account: None,
        }
    }
}
