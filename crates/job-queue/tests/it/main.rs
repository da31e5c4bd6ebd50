//! Integration tests, one binary for the crate: linked once, each test still
//! its own process under nextest.

mod pubsub;
mod queue;
