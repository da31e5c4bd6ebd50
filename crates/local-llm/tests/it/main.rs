//! Integration tests, one binary for the crate: linked once, each test still
//! its own process under nextest.

// Tests fail loudly by design; the shared support modules do too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

mod chat_templates;
mod cpu_variants;
mod engines;
mod http_api;
mod prompt_cache;
mod queueing;
mod speculation;
mod tools;
