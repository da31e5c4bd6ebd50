//! `duo-local-llm [serve]` runs the server; `duo-local-llm fetch-models` fetches the weights.

use anyhow::Context as _;
use local_llm::config::Config;
use local_llm::fetch::{fetch_models, missing_weights_hint};
use local_llm::server::{AppState, bind};
use tracing_subscriber::EnvFilter;

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,llama_cpp_2=warn")),
        )
        .init();
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

async fn serve(config: Config) -> anyhow::Result<()> {
    if let Some(hint) = missing_weights_hint(&config) {
        eprintln!("{hint}");
        std::process::exit(2);
    }
    let addr = config.addr;
    let state = AppState::load(config)?;
    let (server, bound) = bind(state, addr)?;
    tracing::info!(%bound, "duo-local-llm listening");
    server.await.context("server stopped")
}
