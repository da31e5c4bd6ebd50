//! AI usage: what was asked of Duo, and how it went.
//!
//! Every answered chat question becomes one `request_duo_chat_response`
//! event (GitLab's `ai_usage_events`) with the facts of its answer: the
//! tools the agent ran, the Duo error code of a failed answer, estimated
//! tokens, time to first streamed text and total time. A job on its own queue
//! then asks the AI gateway's `categorize_question` prompt for the question's
//! category and stores it beside the facts; the answer never waits for it.
//!
//! - [`recording`]: what the agent notes while it answers, and the record it
//!   leaves behind;
//! - [`store`]: the tables' SQL for one question;
//! - [`reports`]: the aggregations GraphQL and the admin page show;
//! - [`categorize`]: the categorisation job.
//!
//! Question text is read by the categorisation job only, sent to the gateway
//! only when Duo is on where it was asked, and never logged.

pub mod categorize;
pub mod recording;
pub mod reports;
pub mod store;

pub use categorize::{CATEGORIES, Categorizer, QUEUE};
pub use recording::{Recording, note_resource, note_slash_command, note_tool};
pub use reports::{DateRange, MAX_RANGE_DAYS, UsageScope};
pub use store::UsageRecord;

/// GitLab's event name for a Duo Chat answer.
pub const DUO_CHAT_EVENT: &str = "request_duo_chat_response";

/// Why usage could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error("queue: {0}")]
    Queue(#[from] job_queue::QueueError),
    #[error("{0}")]
    Invalid(String),
}

impl From<tokio_postgres::Error> for UsageError {
    fn from(e: tokio_postgres::Error) -> Self {
        UsageError::Db(crate::db::DbError::Query(e))
    }
}

impl From<deadpool_postgres::PoolError> for UsageError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        UsageError::Db(crate::db::DbError::from(e))
    }
}
