//! HTTP handlers. Each submodule has a `configure` that registers its routes;
//! handlers stay thin and call into the plain modules.

pub mod agent;
pub mod body;
pub mod docs_search;
pub mod embeddings;
pub mod health;
pub mod metrics;
pub mod prompts;
pub mod proxy;
pub mod stream_body;

use actix_web::web;

/// Every route of the gateway.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.configure(health::configure)
        .configure(metrics::configure)
        .configure(proxy::configure)
        .configure(prompts::configure)
        .configure(agent::configure)
        .configure(docs_search::configure)
        .configure(embeddings::configure);
}
