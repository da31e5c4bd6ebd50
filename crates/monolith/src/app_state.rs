//! What every request handler shares: the pool, the policy, the configuration,
//! the chat service, the signing keys and the live-message hub.

use std::sync::Arc;

use deadpool_postgres::Pool;
use secrecy::ExposeSecret;

use crate::ai_models::ModelStore;
use crate::chat::live::LiveHub;
use crate::chat::{ChatService, CompletionQueue, PgCompletionQueue};
use crate::config::Config;
use crate::identity::jwt::{JwtError, KeyRing, SharedKeyRing};
use crate::identity::secret_box::SecretBox;
use crate::lifecycle::Lifecycle;
use crate::policy::Policy;
use crate::policy::add_ons::AddOnCatalogue;
use crate::repositories::Repositories;

/// Why the shared state could not be built (the keys on disk).
#[derive(Debug, thiserror::Error)]
pub enum AppStateError {
    #[error("signing keys: {0}")]
    Jwt(#[from] JwtError),
    #[error("secrets key: {0}")]
    Secrets(#[from] crate::identity::secret_box::SecretBoxError),
}

#[derive(Clone)]
pub struct AppState {
    pub pool: Pool,
    pub policy: Policy,
    pub config: Arc<Config>,
    pub chat: Arc<ChatService>,
    pub keys: SharedKeyRing,
    /// Live messages for `aiCompletionResponse` subscribers on this process.
    pub live: Arc<LiveHub>,
    /// Serving or stopping (readiness, socket hand-off at shutdown).
    pub lifecycle: Lifecycle,
    /// Which model serves each AI feature.
    pub models: ModelStore,
    /// The projects' git repositories on disk.
    pub repositories: Repositories,
}

impl AppState {
    /// State whose completions go to the PostgreSQL queue (run by `worker`).
    pub fn new(
        pool: Pool,
        config: Config,
        catalogue: AddOnCatalogue,
    ) -> Result<Self, AppStateError> {
        let queue = Arc::new(PgCompletionQueue {
            max_attempts: config.completion_max_attempts,
        });
        Self::with_queue(pool, config, catalogue, queue)
    }

    pub fn with_queue(
        pool: Pool,
        config: Config,
        catalogue: AddOnCatalogue,
        queue: Arc<dyn CompletionQueue>,
    ) -> Result<Self, AppStateError> {
        let keys = SharedKeyRing::new(KeyRing::load_or_create(&config.signing_key_dir)?);
        let secrets = SecretBox::load_or_create(&config.signing_key_dir)?;
        let policy = Policy::new(Arc::new(catalogue));
        let chat = Arc::new(ChatService {
            pool: pool.clone(),
            policy: policy.clone(),
            queue,
            rate_limit: config.ai_action_rate_limit,
            rate_window: config.ai_action_rate_window,
            docs_base_url: config.docs_base_url.to_string(),
        });
        let live = LiveHub::new(config.database_url.expose_secret());
        let (config_repositories_dir, config_git_max_concurrent) =
            (config.repositories_dir.clone(), config.git_max_concurrent);
        Ok(Self {
            pool,
            policy,
            config: Arc::new(config),
            chat,
            keys,
            live,
            lifecycle: Lifecycle::new(),
            models: ModelStore::new(Arc::new(secrets)),
            repositories: Repositories::new(config_repositories_dir, config_git_max_concurrent),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayTokenError {
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    #[error(transparent)]
    Db(#[from] deadpool_postgres::PoolError),
    #[error(transparent)]
    Jwt(#[from] JwtError),
}

impl AppState {
    /// The code index as a request reaches it (codebase search over REST and
    /// MCP): this instance's gateway settings and signing keys.
    pub fn code_index(&self) -> Result<crate::code_index::CodeIndex, reqwest::Error> {
        let settings = crate::gateway_client::GatewaySettings::from_config(&self.config);
        let gateway =
            crate::gateway_client::GatewayClient::with_shared_keys(self.keys.clone(), settings)?;
        Ok(crate::code_index::CodeIndex {
            pool: self.pool.clone(),
            repositories: self.repositories.clone(),
            gateway,
            settings: self.config.code_index.clone(),
            models: self.models.clone(),
            policy: self.policy.clone(),
        })
    }

    /// A gateway JWT for the user, scoped to the unit primitives their seats grant.
    pub async fn gateway_token(&self, user_id: i64) -> Result<String, GatewayTokenError> {
        let db = self.pool.get().await?;
        let scopes = self.policy.seat_unit_primitives(&*db, user_id).await?;
        let realm: String = db
            .query_one("SELECT realm FROM instance_settings", &[])
            .await
            .map_err(crate::policy::PolicyError::from)?
            .get(0);
        let claims = crate::identity::jwt::claims_for(crate::identity::jwt::TokenSubject {
            user_id,
            scopes: scopes.iter().map(|s| s.as_str().to_owned()).collect(),
            model_endpoints: Vec::new(),
            realm: &realm,
            instance_id: &self.config.instance_id,
            issuer: self.config.external_url.as_str(),
            audience: &self.config.gateway_audience,
        });
        Ok(self.keys.sign(&claims)?)
    }
}
