//! api

pub mod prompts;
