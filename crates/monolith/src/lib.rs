//! The Duo Chat monolith: users, groups, projects and their resources, permissions,
//! GitLab's chat APIs, and the roles that run them (`web`, `worker`, `migrate`,
//! `seed`).
//!
//! Modules are layered; a module uses only modules of its own layer or below
//! (`tests/it/architecture.rs` checks it):
//!
//! 1. foundations: [`config`], [`db`], [`gid`], [`instance`],
//!    [`lifecycle`], [`percent`], [`queries`] (what SQL runs on, with statements prepared
//!    once per pooled connection), [`rate_limit`] (per-user request budgets),
//!    [`features`] (feature flags and their gates)
//! 2. who is calling: [`identity`] (personal access tokens, the signing keys of
//!    gateway tokens)
//! 3. who may do what: [`policy`] (abilities, Duo access, seats and add-ons)
//! 4. domains: [`namespaces`] (groups, projects and their members, found by
//!    id or full path), [`work_items`] (issues, merge requests, epics, notes,
//!    CI pipelines and jobs: their SQL, and what of them is sent to AI, once
//!    the policy allows it), [`ai_models`] (which model serves each feature),
//!    [`gateway_client`] (calls to the AI gateway), [`chat`]
//!    (threads, messages, the completion seam, live delivery), [`ai_usage`]
//!    (usage records of AI features and the questions' categories),
//!    [`agent`] (the agent loop, slash commands and tools; above
//!    [`code_index`], the code index and codebase search, which builds on
//!    [`repositories`] and [`gateway_client`]), [`repositories`]
//!    (git repositories on disk: serving, reading, writing, pushes), [`workflows`]
//!    (Duo Workflow: workflows, checkpoints, events, run leases), and above
//!    the code index [`duo_settings`] (instance Duo settings, seats, group and
//!    project switches, which the code index follows)
//! 5. the state the interfaces share: [`app_state`]; beside it [`review`]
//!    (code review of merge requests and answers to mentions, run as jobs)
//! 6. interfaces: [`rest`] (`/api/v4`), [`graphql`] (`/api/graphql`), [`git_http`]
//!    (clone and push over smart HTTP), [`probes`]
//!    (liveness, readiness, metrics), [`web`] (pages for people), [`worker`] (the
//!    job-running role)
//! 7. wiring: [`server`] (the `web` role's routes), [`seed`]

pub mod audit;
pub mod config;
pub mod db;
pub mod features;
pub mod gid;
pub mod instance;
pub mod lifecycle;
pub mod percent;
pub mod queries;
pub mod rate_limit;

pub mod identity;

pub mod policy;

pub mod agent;
pub mod ai_models;
pub mod ai_usage;
pub mod chat;
pub mod code_index;
pub mod duo_settings;
pub mod gateway_client;
pub mod namespaces;
pub mod repositories;
pub mod work_items;
pub mod workflows;

pub mod app_state;
pub mod review;

pub mod git_http;
pub mod graphql;
pub mod probes;
pub mod rest;
pub mod web;
pub mod worker;

pub mod seed;
pub mod server;
