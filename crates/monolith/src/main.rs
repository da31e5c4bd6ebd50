//! `duo-monolith web | worker | migrate | seed [--json] | rotate-keys`

use std::sync::Arc;

use anyhow::Context;
use monolith::chat::completion::ChatResponder;
use monolith::config::Config;
use monolith::policy::add_ons::AddOnCatalogue;
use monolith::probes::{ProbeState, Role};
use monolith::{app_state::AppState, db, server};

// jemalloc with background threads hands the pages a burst of large requests
// used back to the system within seconds, even when the process goes idle
// right after; glibc's allocator kept most of a flood's peak for good
// (measured with `./dev bench hostile`; settings in docs/configuration.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "usage: duo-monolith <web|worker|migrate|seed [--json]|rotate-keys|reindex <group/project>|--all|render-run-job>";

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let role = args.first().map(String::as_str).unwrap_or("");
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "info".to_owned());
    // One JSON object per line for log collectors, on stdout for the roles an
    // orchestrator runs; `seed` and `rotate-keys` print their results on
    // stdout, so their logs stay on stderr. Text (for people) on stderr.
    let json = std::env::var("DUO_LOG_FORMAT").is_ok_and(|f| f.trim().eq_ignore_ascii_case("json"));
    let prints_results = matches!(role, "seed" | "rotate-keys" | "reindex" | "render-run-job");
    let target = if json && !prints_results {
        duo_telemetry::LogTarget::Stdout
    } else {
        duo_telemetry::LogTarget::Stderr
    };
    let service = match role {
        "worker" => "duo-monolith-worker",
        "web" => "duo-monolith-web",
        _ => "duo-monolith",
    };
    let _telemetry =
        duo_telemetry::init(duo_telemetry::LogOptions::new(service, filter).json(json, target));
    let config = Config::from_env().context("reading configuration")?;
    match role {
        "migrate" => {
            let pool = db::pool(&config)?;
            let applied = monolith::db::migrate_exclusively(&pool).await?;
            monolith::instance::apply_config(&pool, &config).await?;
            tracing::info!(applied, "migrations applied");
            Ok(())
        }
        "web" => {
            let pool = db::pool(&config)?;
            monolith::db::migrate_exclusively(&pool)
                .await
                .context("migrating the database")?;
            monolith::instance::apply_config(&pool, &config).await?;
            ensure_signing_key(&pool, &config).await?;
            let catalogue = AddOnCatalogue::load(&config.add_ons_file)?;
            let listener = std::net::TcpListener::bind(config.web_addr)
                .with_context(|| format!("binding {}", config.web_addr))?;
            tracing::info!(addr = %listener.local_addr()?, "web role listening");
            let state = AppState::new(pool.clone(), config.clone(), catalogue)?;
            let server = server::serve(state.clone(), listener)?;
            let handle = server.handle();
            let stopper = tokio::spawn({
                let state = state.clone();
                async move {
                    stop_requested().await;
                    server::stop_gracefully(&state, &handle).await;
                }
            });
            if !config.web_runs_jobs {
                server.await?;
                stopper.abort();
                tracing::info!("web role stopped");
                return Ok(());
            }
            // Jobs in this process too: the worker loop stops with the server.
            tracing::info!("DUO_WEB_RUNS_JOBS: this web process also runs queued jobs");
            let (responder, parts) = chat_responder(&config, &pool).await?;
            let lifecycle = state.lifecycle.clone();
            let worker = tokio::spawn(async move {
                monolith::worker::run(&config, pool, responder, parts, lifecycle.stopped()).await
            });
            let served = server.await;
            state.lifecycle.begin_stopping();
            stopper.abort();
            worker.await.context("the in-process worker panicked")??;
            served?;
            tracing::info!("web role stopped");
            Ok(())
        }
        "seed" => {
            let json = args.iter().any(|a| a == "--json");
            let pool = db::pool(&config)?;
            monolith::db::migrate_exclusively(&pool).await?;
            monolith::instance::apply_config(&pool, &config).await?;
            let repositories = monolith::repositories::Repositories::new(
                config.repositories_dir.clone(),
                config.git_max_concurrent,
            );
            let report = monolith::seed::run(&pool, &repositories).await?;
            let out = if json {
                report.to_json()?
            } else {
                report.to_text()
            };
            // The seed's whole purpose is to print tokens for the operator.
            #[expect(clippy::print_stdout, reason = "the seed prints its report on stdout")]
            {
                println!("{out}");
            }
            Ok(())
        }
        "worker" => {
            let pool = db::pool(&config)?;
            ensure_signing_key(&pool, &config).await?;
            let (responder, parts) = chat_responder(&config, &pool).await?;
            let lifecycle = monolith::lifecycle::Lifecycle::new();
            let probes = match config.worker_probe_addr {
                Some(addr) => {
                    let state = ProbeState::new(
                        pool.clone(),
                        std::sync::Arc::new(config.clone()),
                        lifecycle.clone(),
                        Role::Worker,
                    );
                    let server = monolith::probes::serve_probes(state, addr)
                        .with_context(|| format!("binding the probe server to {addr}"))?;
                    tracing::info!(%addr, "worker probes listening");
                    let handle = server.handle();
                    tokio::spawn(server);
                    Some(handle)
                }
                None => None,
            };
            tokio::spawn({
                let lifecycle = lifecycle.clone();
                async move {
                    stop_requested().await;
                    lifecycle.begin_stopping();
                }
            });
            monolith::worker::run(&config, pool, responder, parts, lifecycle.stopped())
                .await
                .context("running the worker role")?;
            if let Some(handle) = probes {
                handle.stop(true).await;
            }
            tracing::info!("worker role stopped");
            Ok(())
        }
        "render-run-job" => {
            let job = monolith::workflows::runners::kubernetes::example_job(&config);
            #[expect(clippy::print_stdout, reason = "the Job is the command's output")]
            {
                println!("{}", serde_json::to_string_pretty(&job)?);
            }
            Ok(())
        }
        "rotate-keys" => {
            let pool = db::pool(&config)?;
            let kid = rotate_signing_key(&pool, &config).await?;
            #[expect(
                clippy::print_stdout,
                reason = "the new key id is the command's output"
            )]
            {
                println!("{kid}");
            }
            Ok(())
        }
        "reindex" => {
            let target = args.get(1).map(String::as_str).unwrap_or("");
            if target.is_empty() {
                anyhow::bail!("{USAGE}");
            }
            let pool = db::pool(&config)?;
            monolith::db::migrate_exclusively(&pool).await?;
            let queued = monolith::code_index::indexer::request_reindex(
                &pool,
                (target != "--all").then_some(target),
                config.code_index.max_attempts,
            )
            .await?;
            #[expect(
                clippy::print_stdout,
                reason = "the queued projects are the command's output"
            )]
            {
                for path in &queued {
                    println!("re-index queued: {path}");
                }
            }
            if queued.is_empty() {
                anyhow::bail!("no project {target}");
            }
            Ok(())
        }
        _ => anyhow::bail!("{USAGE}"),
    }
}

/// The responder the worker answers questions with: the agent loop.
/// (`monolith::chat::jobs::NotYetAvailableResponder` is the stand-in when no agent is wanted.)
async fn chat_responder(
    config: &Config,
    pool: &deadpool_postgres::Pool,
) -> anyhow::Result<(Arc<dyn ChatResponder>, monolith::worker::WorkerParts)> {
    let agent = monolith::agent::AgentResponder::from_config(config, pool.clone())
        .context("setting up the chat agent")?;
    let services = agent.services();
    let code_index = services.code_index.clone();
    let runs = monolith::workflows::runs::RunContext::from_config(
        config,
        services.policy.clone(),
        services.gateway.keys().clone(),
        services.models.clone(),
        services.repositories.clone(),
    )
    .await
    .context("setting up workflow runs")?
    .map(Arc::new);
    let review = Arc::new(monolith::review::ReviewServices::new(agent.clone(), config));
    Ok((
        Arc::new(agent),
        monolith::worker::WorkerParts {
            code_index: Some(code_index),
            workflow_runs: runs,
            review: Some(review),
        },
    ))
}

/// Ctrl-C, or SIGTERM from systemd, Kubernetes or `docker stop`.
async fn stop_requested() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot wait for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot wait for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("stop requested");
}

/// Creates the first signing key under a database-wide lock: `web` and `worker`
/// starting together on an empty key directory would otherwise each create their
/// own key, and the worker would sign with a key the web role's JWKS lacks.
async fn ensure_signing_key(pool: &deadpool_postgres::Pool, config: &Config) -> anyhow::Result<()> {
    with_signing_key_lock(pool, || {
        monolith::identity::jwt::KeyRing::load_or_create(&config.signing_key_dir).map(|_| ())
    })
    .await
    .with_context(|| {
        format!(
            "loading signing keys from {}",
            config.signing_key_dir.display()
        )
    })
}

/// Adds a signing key. Running `web` and `worker` processes pick it up from the
/// key directory on their next token or JWKS request; the retired key stays
/// published for one token lifetime, so tokens in flight keep verifying.
async fn rotate_signing_key(
    pool: &deadpool_postgres::Pool,
    config: &Config,
) -> anyhow::Result<String> {
    with_signing_key_lock(pool, || {
        monolith::identity::jwt::KeyRing::load_or_create(&config.signing_key_dir)?.rotate()
    })
    .await
    .with_context(|| {
        format!(
            "rotating the signing key in {}",
            config.signing_key_dir.display()
        )
    })
}

async fn with_signing_key_lock<T>(
    pool: &deadpool_postgres::Pool,
    change: impl FnOnce() -> Result<T, monolith::identity::jwt::JwtError>,
) -> anyhow::Result<T> {
    const LOCK: &str = "SELECT pg_advisory_lock(hashtextextended('duo_signing_keys', 0))";
    const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended('duo_signing_keys', 0))";
    let client = pool.get().await.context("connecting to the database")?;
    client
        .execute(LOCK, &[])
        .await
        .context("locking the key directory")?;
    let outcome = change();
    client
        .execute(UNLOCK, &[])
        .await
        .context("unlocking the key directory")?;
    Ok(outcome?)
}
