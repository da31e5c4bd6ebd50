//! Everything the gateway's handlers and the Duo Workflow service share,
//! built once at start-up from the configuration.

use crate::auth::Authenticator;
use crate::auth::jwks::KeyStoreError;
use crate::config::Config;
use crate::docs_search::{DocsIndex, DocsIndexError};
use crate::observability::Metrics;
use crate::observability::readiness::Readiness;
use crate::prompts::{PromptLoadError, PromptRegistry};
use crate::providers::direct_http::{DirectHttp, DirectHttpSettings};
use crate::providers::tool_calling::ToolCallingModel;
use crate::providers::{ChatModel, ModelRouter, ProviderClients, ProviderError};
use std::sync::Arc;

/// Everything handlers share (and the workflow service builds on). Cheap to clone: all parts are shared handles.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    /// Every model call goes through this.
    pub model: Arc<dyn ChatModel>,
    pub prompts: Arc<PromptRegistry>,
    /// Turns request headers into a [`crate::auth::GatewayUser`].
    pub authenticator: Arc<Authenticator>,
    pub metrics: Metrics,
    /// One connection pool for proxies and readiness probes.
    pub http: reqwest::Client,
    /// The proxies' client for plain-`http` upstreams (see [`DirectHttp`]).
    pub direct_http: DirectHttp,
    pub readiness: Arc<Readiness>,
    /// The documentation search index, built once at start-up.
    pub docs: Arc<DocsIndex>,
    /// Model calls with native tool calling (chat agent prompts that ask for it).
    pub tool_model: ToolCallingModel,
    /// The model calls' HTTP clients (configured endpoints, and endpoints a
    /// request named, behind the egress policy).
    pub provider_clients: ProviderClients,
    /// The models' context sizes, learnt from their servers.
    pub context_windows: Arc<crate::chat::context_window::ContextWindows>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// Why the shared state could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AppStateError {
    #[error("could not build the HTTP client: {0}")]
    HttpClient(#[from] reqwest::Error),
    #[error(transparent)]
    Prompts(#[from] PromptLoadError),
    #[error("authentication keys: {0}")]
    Keys(#[from] KeyStoreError),
    #[error("model providers: {0}")]
    Providers(#[from] ProviderError),
    #[error(transparent)]
    Docs(#[from] DocsIndexError),
}

impl AppState {
    pub fn build(config: Config) -> Result<Self, AppStateError> {
        let http = proxy_client(&config)?;
        let direct_http = proxy_direct_client(&config);
        let prompts = Arc::new(PromptRegistry::load(&config.prompts.dir)?);
        let authenticator = Arc::new(Authenticator::from_config(&config.auth)?);
        let provider_clients = ProviderClients::new(&config.providers)?;
        let model: Arc<dyn ChatModel> = Arc::new(ModelRouter::with_clients(
            &config.providers,
            provider_clients.clone(),
        ));
        let docs = Arc::new(DocsIndex::build(&config.docs.dir, &config.docs.base_url)?);
        Ok(Self {
            prompts,
            authenticator,
            readiness: Arc::new(Readiness::from_config(&config.providers)),
            model,
            config: Arc::new(config),
            metrics: Metrics::global(),
            http,
            direct_http,
            docs,
            tool_model: ToolCallingModel::with_clients(provider_clients.clone()),
            provider_clients,
            context_windows: Arc::new(crate::chat::context_window::ContextWindows::new()),
        })
    }

    /// The same state with HTTP clients (connection pools) of its own, for
    /// one server worker thread. A pooled connection's task runs on the
    /// thread that opened it: shared between workers, a connection opened on
    /// one hands every read of a streamed answer to the other thread (a
    /// wake-up per read, and the answer's pieces wait for that thread).
    pub fn with_own_clients(&self) -> Result<Self, AppStateError> {
        let provider_clients = ProviderClients::new(&self.config.providers)?;
        Ok(Self {
            http: proxy_client(&self.config)?,
            direct_http: proxy_direct_client(&self.config),
            model: Arc::new(ModelRouter::with_clients(
                &self.config.providers,
                provider_clients.clone(),
            )),
            tool_model: ToolCallingModel::with_clients(provider_clients.clone()),
            provider_clients,
            ..self.clone()
        })
    }
}

/// The proxies' client for plain-`http` upstreams, with the same limits.
fn proxy_direct_client(config: &Config) -> DirectHttp {
    DirectHttp::new(DirectHttpSettings {
        connect_timeout: config.providers.proxy_timeout,
        read_timeout: Some(config.providers.proxy_timeout),
        ..DirectHttpSettings::default()
    })
}

/// The proxies' and readiness probes' client.
fn proxy_client(config: &Config) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(config.providers.proxy_timeout)
        .read_timeout(config.providers.proxy_timeout)
        .pool_max_idle_per_host(256)
        // A redirect goes back to the caller as it is: following it would
        // send the provider credentials the proxy adds to another address.
        .redirect(reqwest::redirect::Policy::none())
        .build()
}
