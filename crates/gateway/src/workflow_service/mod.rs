//! The Duo Workflow service: GitLab's `DuoWorkflow` gRPC API
//! (`proto/duo_workflow.proto`), served by `duo-gateway` on its own port
//! (`AIGW_WORKFLOW_SERVICE__LISTEN`, GitLab's 50052 by default).
//!
//! An executor opens `ExecuteWorkflow`, sends a start request, and then
//! carries out the actions the service sends: file and command actions in
//! its workspace, and `runHTTPRequest` calls to the monolith, which is how
//! the service reads the workflow and stores its status and checkpoints: the
//! service itself keeps no state. The agent is a small graph engine
//! ([`engine`]) running the `chat` and `software_development` flows with
//! native tool calling ([`crate::providers::tool_calling`]), tools mapped to actions ([`tools`]) and
//! approval interrupts. See `docs/duo-workflow.md`.

pub mod auth;
pub mod checkpoint_writer;
pub mod engine;
pub mod guided_edit;
pub mod link;
pub mod mcp_tools;
pub mod model_choice;
pub mod monolith_api;
pub mod server;
pub mod state;
pub mod tools;

pub use server::{ServeError, WorkflowService};

use crate::app_state::AppState;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum WorkflowServiceError {
    #[error(transparent)]
    Signer(#[from] auth::SignerError),
    #[error("model client: {0}")]
    Model(#[from] crate::providers::ProviderError),
}

impl WorkflowService {
    /// The service over the gateway's shared parts (prompts, keys, config).
    pub fn build(state: &AppState) -> Result<Self, WorkflowServiceError> {
        let config = &state.config;
        let auth =
            auth::WorkflowAuth::new(&config.auth, &config.workflow, state.authenticator.clone())?;
        Ok(Self {
            services: Arc::new(engine::Services {
                providers: config.providers.clone(),
                prompts_config: config.prompts.clone(),
                prompts: state.prompts.clone(),
                model: state.tool_model.clone(),
                config: config.workflow.clone(),
                context_windows: state.context_windows.clone(),
                orphaned_locks: std::sync::Mutex::default(),
            }),
            auth: Arc::new(auth),
            running: Arc::new(server::RunningWorkflows::default()),
        })
    }
}

/// The service running on its own thread and runtime (actix's runtime is
/// single-threaded per worker); [`RunningWorkflowService::stop`] shuts it
/// down gracefully.
pub struct RunningWorkflowService {
    pub address: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningWorkflowService {
    /// Binds `address` and serves from a new thread with its own runtime
    /// (built there: a runtime may not be started or dropped inside another).
    /// Health turns NOT_SERVING when `draining` resolves (the process began
    /// stopping); calls are served until [`RunningWorkflowService::stop`].
    pub fn start(
        service: WorkflowService,
        address: &str,
        tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
        grace: std::time::Duration,
        draining: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<Self, ServeError> {
        let bind_error = |source| ServeError::Bind {
            address: address.to_owned(),
            source,
        };
        let listener = std::net::TcpListener::bind(address).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let bound = listener.local_addr().map_err(bind_error)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("workflow-service".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("workflow-service")
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        tracing::error!(error = %err, "could not start the workflow service runtime");
                        return;
                    }
                };
                runtime.block_on(run_until_stopped(
                    service, listener, tls, draining, stopped, grace,
                ));
            })
            .map_err(bind_error)?;
        Ok(Self {
            address: bound,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Health turns NOT_SERVING, running streams get the grace period.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningWorkflowService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn run_until_stopped(
    service: WorkflowService,
    listener: std::net::TcpListener,
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    draining: impl std::future::Future<Output = ()> + Send + 'static,
    stopped: tokio::sync::oneshot::Receiver<()>,
    grace: std::time::Duration,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(error = %err, "workflow service listener");
            return;
        }
    };
    let (signal_tx, mut signal_rx) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        let _ = signal_rx.wait_for(|s| *s).await;
    };
    let serving = server::serve_draining(service, listener, tls, draining, shutdown, grace);
    tokio::pin!(serving);
    tokio::select! {
        result = &mut serving => {
            if let Err(err) = result {
                tracing::error!(error = %err, "workflow service stopped");
            }
        }
        _ = stopped => {
            let _ = signal_tx.send(true);
            // Streams still open after the grace period are cut.
            let _ = tokio::time::timeout(grace + std::time::Duration::from_secs(1), serving).await;
        }
    }
}
