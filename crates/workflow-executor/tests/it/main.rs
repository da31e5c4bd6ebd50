//! Integration tests, one binary for the crate.

mod service;
mod support;

mod actions;
mod confinement;
mod workspace;
