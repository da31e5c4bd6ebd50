//! Integration tests, one binary for the crate: linked once, each test still
//! its own process under nextest.

// Tests fail loudly by design; the shared support modules do too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chat_e2e;
mod chat_live_e2e;
mod code_review_e2e;
mod deploy_manifests;
mod dev_run_e2e;
mod fixtures;
mod gateway_crash_e2e;
mod mcp_client_e2e;
mod mcp_e2e;
mod migrations_e2e;
mod model_selection_e2e;
mod pipeline_fix_e2e;
mod python_gitlab_e2e;
mod readme_e2e;
mod release_profile;
mod shutdown_e2e;
mod traces_e2e;
mod web_admin_e2e;
mod web_code_e2e;
mod web_duo_prompts_e2e;
mod web_e2e;
mod web_graphql_explorer_e2e;
mod web_support;
mod workflow_e2e;
mod workflow_runs_e2e;
mod workflow_runs_web_e2e;
