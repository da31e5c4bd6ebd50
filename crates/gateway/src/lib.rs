//! The AI gateway: prompts, the tool catalogue, and every call to a model.
//!
//! How the modules stand on each other (`tests/it/architecture.rs` checks
//! that no source files import each other in a loop, and that `providers`
//! imports none of the modules built on it):
//! - `providers`: the model layer: the one route decision (`route`), the
//!   streaming chat clients, and the tool-calling client (`tool_calling`)
//!   with its conversation types (`conversation`).
//! - `chat` (the Duo Chat agent step), `prompts`, `docs_search`,
//!   `embeddings`, `proxy`: what the HTTP API offers, on top of it.
//! - `workflow_service`: the Duo Workflow gRPC service, on top of it too.
//! - `app_state`: the parts the handlers and the workflow service share,
//!   built once; `api`: the HTTP handlers; `app`: the server wiring, which
//!   starts and stops the HTTP servers and the workflow service together.

pub mod api;
pub mod app;
pub mod app_state;
pub mod auth;
pub mod chat;
pub mod config;
pub mod docs_search;
pub mod embeddings;
pub mod error;
pub mod observability;
pub mod prompts;
pub mod providers;
pub mod proxy;
pub(crate) mod recent_values;
pub mod workflow_service;

pub use config::Config;
pub use error::ApiError;
