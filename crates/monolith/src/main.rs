//! `duo-monolith web | worker | migrate | seed [--json]`

use anyhow::Context;
use monolith::add_ons::AddOnCatalogue;
use monolith::config::Config;
use monolith::{db, web};

const USAGE: &str = "usage: duo-monolith <web|worker|migrate|seed [--json]>";

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let role = args.first().map(String::as_str).unwrap_or("");
    let config = Config::from_env().context("reading configuration")?;
    match role {
        "migrate" => {
            let pool = db::pool(&config)?;
            let applied = db::migrate(&pool).await?;
            monolith::instance::apply_config(&pool, &config).await?;
            tracing::info!(applied, "migrations applied");
            Ok(())
        }
        "web" => {
            let pool = db::pool(&config)?;
            db::migrate(&pool).await.context("migrating the database")?;
            monolith::instance::apply_config(&pool, &config).await?;
            let catalogue = AddOnCatalogue::load(&config.add_ons_file)?;
            let listener = std::net::TcpListener::bind(config.web_addr)
                .with_context(|| format!("binding {}", config.web_addr))?;
            tracing::info!(addr = %listener.local_addr()?, "web role listening");
            web::serve(web::AppState::new(pool, config, catalogue)?, listener)?.await?;
            Ok(())
        }
        "seed" => {
            let json = args.iter().any(|a| a == "--json");
            let pool = db::pool(&config)?;
            db::migrate(&pool).await?;
            monolith::instance::apply_config(&pool, &config).await?;
            let report = monolith::seed::run(&pool).await?;
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
            // Completions are answered inline by the web role until the queue-backed
            // agent loop lands; the worker runs the periodic thread retention.
            let pool = db::pool(&config)?;
            db::migrate(&pool).await.context("migrating the database")?;
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
            loop {
                tokio::select! {
                    _ = tick.tick() => match monolith::chat::apply_retention(&pool).await {
                        Ok(deleted) => tracing::info!(deleted, "idle conversation threads removed"),
                        Err(e) => tracing::warn!(error = %e, "thread retention failed"),
                    },
                    _ = tokio::signal::ctrl_c() => {
                        tracing::info!("worker stopping");
                        return Ok(());
                    }
                }
            }
        }
        _ => anyhow::bail!("{USAGE}"),
    }
}
