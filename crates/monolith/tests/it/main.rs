//! Integration tests, one binary for the crate: linked once, each test still
//! its own process under nextest.

// Tests fail loudly by design; the shared support modules do too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod agent_support;
mod git_support;
mod rest_support;
mod support;
mod workflows_support;

mod agent_chat;
mod agent_commands;
mod agent_commit_reader;
mod agent_documentation;
mod agent_file_context;
mod agent_gateway_client;
mod agent_named_resources;
mod agent_ndjson;
mod agent_serialize;
mod agent_tool_catalogue;
mod agent_tools;
mod ai_usage;
mod architecture;
mod code_index;
mod code_index_branches;
mod db_outage;
mod duo_context_exclusion;
mod duo_off_index;
mod features_api;
mod fuzz_edges;
mod git_push_limits;
mod graphql_chat;
mod graphql_clients;
mod graphql_token_scopes;
mod hostile_input;
mod jwt_jwks;
mod mcp_client_settings;
mod mcp_server;
mod policy_duo_chat;
mod policy_read;
mod policy_write;
mod probes;
mod repositories_git;
mod repositories_rest;
mod rest_code_search;
mod rest_discussions;
mod rest_members;
mod rest_merge_requests;
mod rest_resources;
mod rest_reviewers;
mod rest_token_scopes;
mod rest_tokens;
mod rest_writes;
mod review_bot_user;
mod review_jobs;
mod subscriptions_live;
mod web_admin;
mod web_code_pages;
mod web_duo_prompts;
mod web_graphql_explorer;
mod web_merge_request_review;
mod web_sign_in;
mod web_sign_in_redirect;
mod web_workflow_runs;
mod work_item_discussions;
mod work_item_shapes;
mod worker_completion;
mod workflow_runner_kubernetes;
mod workflows_duo_off;
mod workflows_graphql;
mod workflows_jobs;
mod workflows_rest;
mod workflows_run_lock;
mod workflows_socket;
mod workflows_state_machine;
mod workflows_tokens;
