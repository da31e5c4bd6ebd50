//! Events a human (or the executor) sends to a running workflow: pause,
//! resume, stop, a message, a response, or a request for input. The service
//! reads the queued ones and marks each delivered.

use crate::queries::Queries;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::WorkflowError;
use super::store::Workflow;

/// GitLab's event types, by stored number.
pub const EVENT_TYPES: &[(i16, &str)] = &[
    (0, "pause"),
    (1, "resume"),
    (2, "stop"),
    (3, "message"),
    (4, "response"),
    (5, "require_input"),
];

/// GitLab's event statuses, by stored number.
pub const EVENT_STATUSES: &[(i16, &str)] = &[(0, "queued"), (1, "delivered")];

/// Longest message of an event.
pub const MAX_MESSAGE_CHARS: usize = 16_384;

fn code_of(table: &[(i16, &str)], name: &str) -> Option<i16> {
    table.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
}

fn name_of(table: &[(i16, &'static str)], code: i16) -> &'static str {
    table
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| *n)
        .unwrap_or("unknown")
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: i64,
    pub workflow_id: i64,
    pub event_type: &'static str,
    pub event_status: &'static str,
    pub message: String,
    pub correlation_id: Option<uuid::Uuid>,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "id, workflow_id, event_type, event_status, message, correlation_id_value, created_at";

fn from_row(row: &tokio_postgres::Row) -> Event {
    Event {
        id: row.get(0),
        workflow_id: row.get(1),
        event_type: name_of(EVENT_TYPES, row.get(2)),
        event_status: name_of(EVENT_STATUSES, row.get(3)),
        message: row.get(4),
        correlation_id: row.get(5),
        created_at: row.get(6),
    }
}

/// GitLab's event entity.
pub fn to_json(e: &Event) -> Value {
    json!({
        "id": e.id,
        "workflow_id": e.workflow_id,
        "event_type": e.event_type,
        "event_status": e.event_status,
        "message": e.message,
        "correlation_id": e.correlation_id.map(|u| u.to_string()),
    })
}

/// Queues an event. `event_type` must be one of GitLab's; `message` is
/// required; `correlation_id`, when given, is a UUID no other event has.
pub async fn create(
    db: &impl Queries,
    workflow: &Workflow,
    event_type: Option<&str>,
    message: Option<&str>,
    correlation_id: Option<&str>,
) -> Result<Event, WorkflowError> {
    let Some(event_type) = event_type else {
        return Err(WorkflowError::Param("event_type is missing".into()));
    };
    let code = code_of(EVENT_TYPES, event_type)
        .ok_or_else(|| WorkflowError::Param("event_type does not have a valid value".into()))?;
    let Some(message) = message else {
        return Err(WorkflowError::Param("message is missing".into()));
    };
    if message.chars().count() > MAX_MESSAGE_CHARS || message.contains('\0') {
        return Err(WorkflowError::invalid(
            "message",
            format!("is too long (maximum is {MAX_MESSAGE_CHARS} characters)"),
        ));
    }
    let correlation = match correlation_id {
        None => None,
        Some(text) => Some(
            uuid::Uuid::parse_str(text)
                .map_err(|_| WorkflowError::Param("correlation_id is invalid".into()))?,
        ),
    };
    let row = db
        .query_opt(
            &format!(
                "INSERT INTO duo_workflows_events (workflow_id, project_id, namespace_id, event_type, message, correlation_id_value)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (correlation_id_value) DO NOTHING
                 RETURNING {COLUMNS}"
            ),
            &[
                &workflow.id,
                &workflow.project_id,
                &workflow.namespace_id,
                &code,
                &message,
                &correlation,
            ],
        )
        .await?;
    match row {
        Some(row) => Ok(from_row(&row)),
        None => Err(WorkflowError::invalid(
            "correlation_id_value",
            "has already been taken",
        )),
    }
}

/// The workflow's queued events, oldest first.
pub async fn queued(
    db: &impl Queries,
    workflow_id: i64,
    offset: i64,
    limit: i64,
) -> Result<(Vec<Event>, i64), WorkflowError> {
    let total: i64 = db
        .query_one(
            "SELECT count(*) FROM duo_workflows_events WHERE workflow_id = $1 AND event_status = 0",
            &[&workflow_id],
        )
        .await?
        .get(0);
    let rows = db
        .query(
            &format!(
                "SELECT {COLUMNS} FROM duo_workflows_events WHERE workflow_id = $1 AND event_status = 0
                 ORDER BY id OFFSET $2 LIMIT $3"
            ),
            &[&workflow_id, &offset.max(0), &limit.max(0)],
        )
        .await?;
    Ok((rows.iter().map(from_row).collect(), total))
}

/// Every event of the workflow, newest first (GraphQL).
pub async fn all(db: &impl Queries, workflow_id: i64) -> Result<Vec<Event>, WorkflowError> {
    let rows = db
        .query(
            &format!(
                "SELECT {COLUMNS} FROM duo_workflows_events WHERE workflow_id = $1 ORDER BY id DESC LIMIT 100"
            ),
            &[&workflow_id],
        )
        .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// Sets an event's status (`queued` or `delivered`); 404 for an event of
/// another workflow.
pub async fn set_status(
    db: &impl Queries,
    workflow_id: i64,
    event_id: i64,
    event_status: Option<&str>,
) -> Result<Event, WorkflowError> {
    let Some(event_status) = event_status else {
        return Err(WorkflowError::Param("event_status is missing".into()));
    };
    let code = code_of(EVENT_STATUSES, event_status)
        .ok_or_else(|| WorkflowError::Param("event_status does not have a valid value".into()))?;
    let row = db
        .query_opt(
            &format!(
                "UPDATE duo_workflows_events SET event_status = $3, updated_at = now()
                 WHERE workflow_id = $1 AND id = $2 RETURNING {COLUMNS}"
            ),
            &[&workflow_id, &event_id, &code],
        )
        .await?
        .ok_or(WorkflowError::NotFound)?;
    Ok(from_row(&row))
}
