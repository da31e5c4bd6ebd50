//! Integration tests, one binary for the crate: linked once, each test still
//! its own process under nextest.

// Tests fail loudly by design; the shared support modules do too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod app_support;
mod key_support;
mod scripted_support;
mod stream_support;
mod workflow_support;

mod agent_api;
mod agent_budget;
mod agent_native;
mod agent_prompt;
mod agent_stream;
mod app_health;
mod architecture;
mod auth_flows;
mod body_limits;
mod code_embeddings;
mod docs_search;
mod fuzz_requests;
mod hostile_requests;
mod model_endpoints;
mod model_metrics;
mod prompts_api;
mod prompts_feature_flags;
mod prompts_registry;
mod providers;
mod proxy_contract;
mod vertex_provider;
mod workflow_mcp;
mod workflow_prompts;
mod workflow_service;
mod workflow_small_model;
