//! The AI gateway: prompts, the tool catalogue, and every call to a model.

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
pub mod workflow_service;

pub use config::Config;
pub use error::ApiError;
