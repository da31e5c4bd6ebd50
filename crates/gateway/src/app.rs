//! Assembles the gateway: routes, app-wide request rules, the HTTP servers
//! and the Duo Workflow service beside them, started and stopped together.
//!
//! Wiring a new part in is two lines: a field on [`AppState`] built in
//! [`AppState::build`] (`app_state.rs`), and its `configure` call in
//! `api::configure`.

use crate::api;
use crate::app_state::AppStateError;
use crate::auth::middleware::authenticate_request;
use crate::config::{Config, ConfigError};
use crate::error::ApiError;
use crate::observability::readiness::Readiness;
use crate::observability::request_telemetry;
use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

/// The gateway's shared state, built here before the servers start (the
/// path callers outside the crate know it by).
pub use crate::app_state::AppState;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The shared parts could not be built.
    #[error(transparent)]
    State(#[from] AppStateError),
    #[error("could not listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Server(#[from] std::io::Error),
    #[error("workflow service: {0}")]
    WorkflowService(#[from] crate::workflow_service::WorkflowServiceError),
    #[error(transparent)]
    WorkflowServe(#[from] crate::workflow_service::ServeError),
}

/// Registers app data, body rules, every route and the JSON 404.
pub fn configure_app(cfg: &mut web::ServiceConfig, state: &AppState) {
    let limit = state.config.max_body_bytes;
    cfg.app_data(web::Data::new(state.clone()))
        .app_data(web::Data::from(state.prompts.clone()))
        .app_data(web::Data::from(state.model.clone()))
        .app_data(web::Data::new(state.tool_model.clone()))
        .app_data(web::Data::from(state.context_windows.clone()))
        .app_data(web::Data::from(state.authenticator.clone()))
        .app_data(web::Data::new((*state.config).clone()))
        .app_data(
            web::JsonConfig::default()
                .limit(limit)
                .error_handler(|err, _req| json_error(err).into()),
        )
        .app_data(web::PayloadConfig::default().limit(limit))
        .configure(api::configure)
        .default_service(web::to(not_found));
}

fn json_error(err: actix_web::error::JsonPayloadError) -> ApiError {
    use actix_web::error::JsonPayloadError as E;
    match err {
        E::Overflow { .. } | E::OverflowKnownLength { .. } => {
            ApiError::PayloadTooLarge(api::body::TOO_LARGE.into())
        }
        other => ApiError::invalid_body(other),
    }
}

async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound("Not Found".into()))
}

/// The HTTP server on an already bound listener (port 0 in tests and the bench).
pub fn build_server(state: AppState, listener: TcpListener) -> Result<Server, AppError> {
    let grace = state_grace(&state);
    let server = HttpServer::new(move || {
        // Runs once per worker thread: its own connection pools (see
        // `AppState::with_own_clients`). The clients were built once already
        // from the same configuration, so this does not fail in practice; if
        // it did, the worker shares the first ones.
        let worker_state = state.with_own_clients().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "a server worker shares the model clients");
            state.clone()
        });
        App::new()
            .wrap(from_fn(authenticate_request))
            .wrap(from_fn(request_telemetry))
            .wrap(from_fn(duo_telemetry::trace_requests))
            .configure(|cfg| configure_app(cfg, &worker_state))
    })
    // Streamed answers are many small writes; with Nagle's algorithm each one
    // after the first waits for the client's delayed ACK (~40 ms on Linux).
    .tcp_nodelay(true)
    // SIGTERM is handled by `serve` (drain first); a stopping server gives
    // requests in flight, streams included, the grace period to end.
    .disable_signals()
    .shutdown_timeout(grace)
    .listen(listener)?
    .run();
    Ok(server)
}

fn state_grace(state: &AppState) -> u64 {
    state.config.shutdown.grace.as_secs()
}

/// `/metrics` alone, for `AIGW_FASTAPI__METRICS_PORT`.
pub fn build_metrics_server(state: AppState, listener: TcpListener) -> Result<Server, AppError> {
    let grace = state_grace(&state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(state.clone()))
            .configure(api::metrics::configure)
            .default_service(web::to(not_found))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(grace)
    .listen(listener)?
    .run();
    Ok(server)
}

fn bind(host: &str, port: u16) -> Result<TcpListener, AppError> {
    TcpListener::bind((host, port)).map_err(|source| AppError::Bind {
        address: format!("{host}:{port}"),
        source,
    })
}

/// Binds, logs what the gateway will use, and serves until SIGINT/SIGTERM
/// (see [`stop_on_signal`]).
pub async fn serve(config: Config) -> Result<(), AppError> {
    log_startup(&config);
    let listener = bind(&config.api_host, config.api_port)?;
    let metrics_listener = match config.metrics_port {
        Some(port) => Some(bind(&config.api_host, port)?),
        None => None,
    };
    let state = AppState::build(config)?;
    let workflow_service = start_workflow_service(&state)?;
    tracing::info!(address = %listener.local_addr()?, "gateway listening");
    let main = build_server(state.clone(), listener)?;
    let metrics = match metrics_listener {
        Some(metrics_listener) => {
            tracing::info!(address = %metrics_listener.local_addr()?, "metrics listening");
            Some(build_metrics_server(state.clone(), metrics_listener)?)
        }
        None => None,
    };
    let handles = std::iter::once(main.handle())
        .chain(metrics.as_ref().map(Server::handle))
        .collect();
    let stopper = tokio::spawn(stop_on_signal(
        state.readiness.clone(),
        state.config.shutdown.drain,
        handles,
    ));
    let served = match metrics {
        Some(metrics) => tokio::try_join!(main, metrics).map(|_| ()),
        None => main.await,
    };
    stopper.abort();
    if let Some(workflow_service) = workflow_service {
        // Its own runtime gets its grace period too; joining it blocks.
        if let Err(err) = tokio::task::spawn_blocking(move || workflow_service.stop()).await {
            tracing::warn!(error = %err, "the Duo Workflow service did not stop cleanly");
        }
    }
    served?;
    tracing::info!("gateway stopped");
    Ok(())
}

/// The Duo Workflow gRPC service on its own port, unless turned off.
fn start_workflow_service(
    state: &AppState,
) -> Result<Option<crate::workflow_service::RunningWorkflowService>, AppError> {
    let config = &state.config.workflow;
    let Some(address) = config.listen.as_deref() else {
        tracing::info!("the Duo Workflow service is off (AIGW_WORKFLOW_SERVICE__LISTEN is empty)");
        return Ok(None);
    };
    let tls = config
        .tls_cert_file
        .clone()
        .zip(config.tls_key_file.clone());
    let service = crate::workflow_service::WorkflowService::build(state)?;
    let running = crate::workflow_service::RunningWorkflowService::start(
        service,
        address,
        tls.clone(),
        config.shutdown_grace,
        // NOT_SERVING together with readiness, at SIGTERM.
        state.readiness.stopping(),
    )?;
    tracing::info!(address = %running.address, tls = tls.is_some(), "Duo Workflow service listening");
    Ok(Some(running))
}

/// On SIGTERM (or Ctrl-C): readiness fails at once, the servers keep serving
/// for `drain` while load balancers take the gateway out, then they stop
/// accepting and let requests in flight (streams included) finish within the
/// grace period (`AIGW_SHUTDOWN__GRACE_SECONDS`); whatever is still running
/// then is cut off.
async fn stop_on_signal(readiness: Arc<Readiness>, drain: Duration, servers: Vec<ServerHandle>) {
    stop_requested().await;
    readiness.begin_stopping();
    tracing::info!(
        drain_seconds = drain.as_secs(),
        "stop requested: not ready, draining"
    );
    tokio::time::sleep(drain).await;
    tracing::info!("no longer accepting connections; finishing requests in flight");
    futures::future::join_all(servers.iter().map(|server| server.stop(true))).await;
}

/// Ctrl-C, or SIGTERM from systemd, Kubernetes or `docker stop`.
async fn stop_requested() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %err, "cannot wait for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot wait for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

fn log_startup(config: &Config) {
    let providers = &config.providers;
    if providers.mock_model_responses {
        tracing::warn!(
            "AIGW_MOCK_MODEL_RESPONSES is on: models are not called, answers are canned"
        );
    } else if providers.uses_local_default() {
        tracing::info!(
            url = %providers.local_llm_url,
            "no model provider configured: using the bundled local model server at {}",
            providers.local_llm_url
        );
    } else {
        if providers.anthropic_api_key.is_some() {
            tracing::info!(base_url = %providers.anthropic_base_url, "using Anthropic");
        }
        if let Some(base) = &providers.openai_base_url {
            tracing::info!(base_url = %base, "using an OpenAI-compatible server");
        }
    }
    tracing::info!(endpoint = %providers.vertex_endpoint, "Vertex AI proxy upstream");
    if config.auth.bypass_external {
        tracing::warn!(
            "AUTHENTICATION IS DISABLED (AIGW_AUTH__BYPASS_EXTERNAL=true): every caller may use everything. Never run this in production."
        );
    } else if config.auth.bypass_external_with_header {
        tracing::warn!(
            "AUTHENTICATION CAN BE SKIPPED with the header `Bypass-Auth: true` (AIGW_AUTH__BYPASS_EXTERNAL_WITH_HEADER=true). Never run this in production."
        );
    }
    if config.auth.bypass_jwt_signature {
        tracing::warn!(
            "JWT SIGNATURES ARE NOT CHECKED (AIGW_AUTH__BYPASS_JWT_SIGNATURE=true). Never run this in production."
        );
    }
}
