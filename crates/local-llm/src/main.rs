//! `duo-local-llm [serve]` runs the server; `duo-local-llm fetch-models` fetches the weights.

use anyhow::Context as _;
use local_llm::config::Config;
use local_llm::fetch::{fetch_models, missing_weights_hint};
use local_llm::server::{AppState, bind};

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "info,llama_cpp_2=warn".to_owned());
    // DUO_LOG_FORMAT=json: one JSON object per line on stdout, for log
    // collectors; text on stderr otherwise.
    let json = std::env::var("DUO_LOG_FORMAT").is_ok_and(|f| f.trim().eq_ignore_ascii_case("json"));
    let target = if json {
        duo_telemetry::LogTarget::Stdout
    } else {
        duo_telemetry::LogTarget::Stderr
    };
    let _telemetry = duo_telemetry::init(
        duo_telemetry::LogOptions::new("duo-local-llm", filter).json(json, target),
    );
    let config = Config::from_env()?;
    match std::env::args().nth(1).as_deref() {
        None | Some("serve") => serve(config).await,
        Some("fetch-models") => {
            let fetched = fetch_models(&config.models_dir).context("fetching model weights")?;
            if fetched.is_empty() {
                println!(
                    "model weights already present in {}",
                    config.models_dir.display()
                );
            } else {
                for path in fetched {
                    println!("fetched {}", path.display());
                }
            }
            Ok(())
        }
        Some(other) => anyhow::bail!("unknown command {other:?}; use `serve` or `fetch-models`"),
    }
}

/// How long the generator thread gets to end once the server has stopped.
const GENERATOR_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

async fn serve(config: Config) -> anyhow::Result<()> {
    if let Some(hint) = missing_weights_hint(&config) {
        eprintln!("{hint}");
        std::process::exit(2);
    }
    // Before any model loads: a forced CPU variant this machine cannot run,
    // or no variant installed, stops here with the reason.
    match local_llm::engine::cpu_variant() {
        Ok(loaded) => tracing::info!(variant = loaded.name, "llama.cpp CPU code loaded"),
        Err(e) => {
            eprintln!("duo-local-llm: {e}");
            std::process::exit(2);
        }
    }
    let addr = config.addr;
    let drain = config.shutdown_drain;
    let state = AppState::load(config)?;
    let (server, bound) = bind(state.clone(), addr)?;
    tracing::info!(%bound, "duo-local-llm listening");
    let handle = server.handle();
    let chat = state.chat.clone();
    let stopper = tokio::spawn(async move {
        stop_requested().await;
        // Not ready, still serving while load balancers take it out; then no
        // new connections, and requests in flight get the grace period
        // (generations past it are cancelled when their connections drop).
        state.begin_stopping();
        tracing::info!(
            drain_seconds = drain.as_secs(),
            "stop requested: not ready, draining"
        );
        tokio::time::sleep(drain).await;
        tracing::info!("no longer accepting connections; finishing requests in flight");
        handle.stop(true).await;
    });
    let served = server.await;
    stopper.abort();
    // The connections are closed, so a generation still running ends at its
    // next token. Exiting before its thread has freed the model would tear
    // the inference library down under it (a crash at exit).
    let ended = tokio::task::spawn_blocking(move || chat.stop_and_wait(GENERATOR_EXIT_WAIT))
        .await
        .unwrap_or(false);
    if !ended {
        tracing::warn!("the generator thread was still running at exit");
    }
    served.context("server stopped")?;
    tracing::info!("duo-local-llm stopped");
    Ok(())
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
