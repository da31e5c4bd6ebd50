//! prompts
