//! Duo where people work: code review of merge requests by the review bot
//! (`GitLabDuo`) and answers to mentions in comments.
//!
//! - [`triggers`]: the events (the bot assigned as a reviewer, a mention in
//!   a comment) that enqueue work, per project's trigger settings;
//! - [`instructions`]: review instructions as GitLab reads them
//!   (`.gitlab/duo/mr-review-instructions.yaml` on the target branch, plus
//!   instance and group defaults), matched to files by glob;
//! - [`response`]: the model's `<review><comment …>` answer, parsed;
//! - [`reviewer`]: one review: authorize, read the diff, ask the model per
//!   file within a budget, post diff notes and a summary, follow up on its
//!   own threads;
//! - [`related`]: the code around a change, from the project's code index;
//! - [`feedback`]: developers' replies that dismiss a review comment, kept
//!   per project and shown to later reviews;
//! - [`mentions`]: a reply in the thread for `@GitLabDuo <question>` (and
//!   for a reply in one of the bot's threads, which may teach it);
//! - [`pipeline_fix`]: a failed job starts a run that proposes a fix as a
//!   merge request (when the project turned that trigger on).

pub mod diff_lines;
pub mod feedback;
pub mod instructions;
pub mod jobs;
pub mod mentions;
pub mod pipeline_fix;
pub mod posting;
pub mod related;
pub mod response;
pub mod reviewer;
pub mod store;
pub mod triggers;

pub use reviewer::{ReviewBudget, ReviewServices};
