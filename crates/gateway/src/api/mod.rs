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
    // The router tries routes in this order, and a route with a pattern
    // runs a regex: the fixed paths (the chat agent's above all) come first,
    // so a chat request matches before the proxy's and prompts' patterns.
    // No pattern matches a fixed path, so the order decides no request.
    cfg.configure(health::configure)
        .configure(metrics::configure)
        .configure(agent::configure)
        .configure(docs_search::configure)
        .configure(embeddings::configure)
        .configure(proxy::configure)
        .configure(prompts::configure);
}
