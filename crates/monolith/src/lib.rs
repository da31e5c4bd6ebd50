//! The Duo Chat monolith: users, groups, projects and their resources, permissions,
//! GitLab's chat APIs, and the roles that run them (`web`, `worker`, `migrate`,
//! `seed`).

pub mod add_ons;
pub mod agent;
pub mod api;
pub mod chat;
pub mod completion;
pub mod config;
pub mod db;
pub mod gid;
pub mod graphql;
pub mod instance;
pub mod jwt;
pub mod namespaces;
pub mod policy;
pub mod seed;
pub mod subscriptions;
pub mod tokens;
pub mod web;
pub mod worker;
