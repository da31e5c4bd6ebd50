//! Integration tests, one binary for the crate: linked once, each test still
//! its own process under nextest.

mod common;

mod engines;
mod http_api;
mod queueing;
