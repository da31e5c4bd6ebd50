//! Duo Workflow, the monolith's side: workflow records and their status state
//! machine, LangGraph checkpoints, checkpoint writes and events (what the
//! workflow service stores here through the REST API), the one-run lease per
//! workflow, live updates to the owner's subscription, the periodic jobs
//! (stuck workflows, checkpoint retention), and the client of the workflow
//! service (token minting, tools, the executor stream).
//!
//! Authorization is the policy's ([`crate::policy::Policy::can_access_workflow`]);
//! these functions take the already-authorized caller.

/// GitLab's global-id model name of a workflow.
pub const WORKFLOW_GID_MODEL: &str = "Ai::DuoWorkflows::Workflow";

pub mod access;
pub mod checkpoint_record;
pub mod checkpoints;
pub mod creation;
pub mod events;
pub mod jobs;
pub mod lease;
pub mod live;
pub mod maintenance;
pub mod privileges;
pub mod protojson;
pub mod record;
pub mod runners;
pub mod runs;
pub mod service;
pub mod status;
pub mod steering;
pub mod store;

pub use record::Workflow;
pub use status::{Decision, Status, StatusEvent};
pub use store::NewWorkflow;

/// Who acts on a workflow: the human and, under composite identity, the
/// service account acting for them (both go to the audit trail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub user_id: i64,
    pub service_account_id: Option<i64>,
}

/// Every failure of the workflow domain; the REST and GraphQL layers map it to
/// their wire answers.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// The workflow (or checkpoint, event) does not exist for this caller.
    #[error("not found")]
    NotFound,
    /// A parameter missing or out of its values, in Grape's words
    /// (`{"error": "message is missing"}`).
    #[error("{0}")]
    Param(String),
    /// Refused with GitLab's `bad_request!` ("400 Bad request - <reason>").
    #[error("{0}")]
    BadRequest(String),
    /// Refused with the bare message (GitLab's `render_api_error!`), as the
    /// status state machine answers.
    #[error("{0}")]
    Refused(String),
    /// A model validation of one field (`{"message": {field: [error]}}`).
    #[error("{field} {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// Another run holds the workflow.
    #[error("{0}")]
    Conflict(String),
    /// The workflow cannot be run by the product as asked (no runner, no
    /// project, a source branch that does not exist): GitLab's 422.
    #[error("{0}")]
    CannotRun(String),
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error(transparent)]
    Queue(#[from] job_queue::QueueError),
    /// Something stored cannot be read back (a checkpoint that is not JSON).
    #[error("stored data is unreadable: {0}")]
    Stored(String),
}

impl From<tokio_postgres::Error> for WorkflowError {
    fn from(e: tokio_postgres::Error) -> Self {
        WorkflowError::Db(crate::db::DbError::Query(e))
    }
}

impl From<deadpool_postgres::PoolError> for WorkflowError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        WorkflowError::Db(crate::db::DbError::Checkout(e))
    }
}

impl WorkflowError {
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        WorkflowError::Invalid {
            field,
            message: message.into(),
        }
    }
}

/// Records an action on a workflow with both identities of the caller.
pub async fn audit(
    db: &impl crate::queries::Queries,
    workflow_id: Option<i64>,
    action: &str,
    caller: Caller,
    details: serde_json::Value,
) -> Result<(), WorkflowError> {
    db.execute(
        "INSERT INTO duo_workflows_audit_events (workflow_id, action, user_id, service_account_id, details)
         VALUES ($1, $2, $3, $4, $5)",
        &[
            &workflow_id,
            &action,
            &caller.user_id,
            &caller.service_account_id,
            &details,
        ],
    )
    .await?;
    Ok(())
}
