//! Integration tests, one binary for the crate.

mod support;

mod actions;
mod workspace;
