//! The workflow record as stored: the `Workflow` row, its columns and their
//! mapping, and the environment codes. Below the store, the checkpoints and
//! the live updates, which all read workflows and must not import each other
//! to do it.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::status::Status;
use crate::policy::{Subject, WorkflowFacts};

/// Where a workflow runs: GitLab's `environment` enum.
pub const ENVIRONMENTS: &[(i16, &str)] = &[
    (1, "ide"),
    (2, "web"),
    (3, "chat_partial"),
    (4, "chat"),
    (5, "ambient"),
];

pub fn environment_name(code: i16) -> Option<&'static str> {
    ENVIRONMENTS
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| *n)
}

pub fn environment_code(name: &str) -> Option<i16> {
    ENVIRONMENTS
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(c, _)| *c)
}

/// One workflow as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    pub id: i64,
    pub user_id: i64,
    pub project_id: Option<i64>,
    pub namespace_id: Option<i64>,
    pub service_account_id: Option<i64>,
    pub goal: String,
    pub workflow_definition: String,
    pub status: Status,
    pub agent_privileges: Vec<i16>,
    pub pre_approved_agent_privileges: Vec<i16>,
    pub allow_agent_to_request_user: bool,
    pub image: Option<String>,
    pub environment: Option<i16>,
    pub summary: Option<String>,
    pub tool_call_approvals: Value,
    pub model_metadata_json: Option<String>,
    pub additional_context: Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Workflow {
    /// The project or group the workflow runs in.
    pub fn container(&self) -> Subject {
        match (self.project_id, self.namespace_id) {
            (Some(p), _) => Subject::Project(p),
            (None, Some(g)) => Subject::Group(g),
            (None, None) => Subject::Global,
        }
    }

    pub fn facts(&self) -> WorkflowFacts {
        WorkflowFacts {
            owner_id: self.user_id,
            container: self.container(),
        }
    }

    pub fn environment_name(&self) -> Option<&'static str> {
        self.environment.and_then(environment_name)
    }

    pub fn is_chat(&self) -> bool {
        self.workflow_definition == "chat"
    }
}

pub(crate) const COLUMNS: &str = "id, user_id, project_id, namespace_id, service_account_id, goal, workflow_definition, status,
     agent_privileges, pre_approved_agent_privileges, allow_agent_to_request_user, image, environment, summary,
     tool_call_approvals, model_metadata_json, additional_context, created_at, updated_at";

pub(crate) fn from_row(row: &tokio_postgres::Row) -> Workflow {
    Workflow {
        id: row.get("id"),
        user_id: row.get("user_id"),
        project_id: row.get("project_id"),
        namespace_id: row.get("namespace_id"),
        service_account_id: row.get("service_account_id"),
        goal: row.get("goal"),
        workflow_definition: row.get("workflow_definition"),
        status: Status::from_code(row.get("status")).unwrap_or(Status::Failed),
        agent_privileges: row.get("agent_privileges"),
        pre_approved_agent_privileges: row.get("pre_approved_agent_privileges"),
        allow_agent_to_request_user: row.get("allow_agent_to_request_user"),
        image: row.get("image"),
        environment: row.get("environment"),
        summary: row.get("summary"),
        tool_call_approvals: row.get("tool_call_approvals"),
        model_metadata_json: row.get("model_metadata_json"),
        additional_context: row.get("additional_context"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }
}
