//! api

pub mod agent;
pub mod prompts;
