//! Workflow records: creation with GitLab's validations, lookups, lists, and
//! status events applied atomically.

use crate::queries::Queries;
use serde_json::{Value, json};

use super::record::{COLUMNS, from_row};
pub use super::record::{ENVIRONMENTS, Workflow, environment_code, environment_name};
use super::status::{self, Decision, Status};
use super::{Caller, WorkflowError, audit, privileges};
use crate::policy::Subject;

/// Longest goal (GitLab's `GOAL_MAX_LENGTH`).
pub const GOAL_MAX_CHARS: usize = 16_384;
/// Longest image name.
pub const IMAGE_MAX_CHARS: usize = 2048;
/// Longest workflow definition name.
pub const DEFINITION_MAX_CHARS: usize = 255;
/// Most additional-context items one workflow takes.
pub const MAX_CONTEXT_ITEMS: usize = 50;
/// Largest additional context, as JSON.
pub const MAX_CONTEXT_BYTES: usize = 64 * 1024;
/// Longest stored model metadata (GitLab's column limit).
pub const MODEL_METADATA_MAX_CHARS: usize = 1024;

/// The agent privileges a workflow gets when none are asked for (GitLab's
/// model default).
pub const DEFAULT_AGENT_PRIVILEGES: &[i16] = &[1, 2, 3, 4, 5, 6];

/// What a caller asks for when creating a workflow (GitLab's parameters).
#[derive(Debug, Clone, Default)]
pub struct NewWorkflow {
    pub container: Option<Subject>,
    pub goal: Option<String>,
    pub workflow_definition: Option<String>,
    pub agent_privileges: Option<Vec<i64>>,
    pub pre_approved_agent_privileges: Option<Vec<i64>>,
    pub allow_agent_to_request_user: Option<bool>,
    pub environment: Option<String>,
    pub image: Option<String>,
    pub additional_context: Option<Value>,
    /// The service account remote flows run as (composite identity).
    pub service_account_id: Option<i64>,
    /// The branch a run of the product starts from (checked by
    /// [`super::runs::check_start`]); `None`: the project's default branch.
    pub source_branch: Option<String>,
    /// The issue the workflow works on (its id, once the caller may read it).
    pub issue_id: Option<i64>,
}

/// A definition name: letters, digits and `_ - . /`, at most 255 characters.
fn valid_definition(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= DEFINITION_MAX_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
}

/// Checks `new` with GitLab's validations; the first failure is the error.
fn validate(new: &NewWorkflow) -> Result<ValidWorkflow, WorkflowError> {
    let goal = new.goal.clone().unwrap_or_default();
    if goal.chars().count() > GOAL_MAX_CHARS {
        return Err(WorkflowError::invalid(
            "goal",
            format!("is too long (maximum is {GOAL_MAX_CHARS} characters)"),
        ));
    }
    let definition = new
        .workflow_definition
        .clone()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "software_development".into());
    if !valid_definition(&definition) {
        return Err(WorkflowError::invalid("workflow_definition", "is invalid"));
    }
    let agent = match &new.agent_privileges {
        Some(ids) => {
            privileges::check(ids).map_err(|m| WorkflowError::invalid("agent_privileges", m))?
        }
        None => DEFAULT_AGENT_PRIVILEGES.to_vec(),
    };
    let pre_approved = match &new.pre_approved_agent_privileges {
        Some(ids) => privileges::check(ids)
            .map_err(|m| WorkflowError::invalid("pre_approved_agent_privileges", m))?,
        None => privileges::DEFAULT
            .iter()
            .copied()
            .filter(|p| agent.contains(p))
            .collect(),
    };
    if let Some(extra) = pre_approved.iter().find(|p| !agent.contains(p)) {
        return Err(WorkflowError::invalid(
            "pre_approved_agent_privileges",
            format!("contains privilege {extra} not present in agent_privileges"),
        ));
    }
    let environment = match new.environment.as_deref() {
        None | Some("") => None,
        Some(name) => Some(environment_code(name).ok_or_else(|| {
            WorkflowError::Param("environment does not have a valid value".into())
        })?),
    };
    if let Some(image) = &new.image
        && image.chars().count() > IMAGE_MAX_CHARS
    {
        return Err(WorkflowError::invalid(
            "image",
            format!("is too long (maximum is {IMAGE_MAX_CHARS} characters)"),
        ));
    }
    let context = new.additional_context.clone().unwrap_or(json!([]));
    match &context {
        Value::Array(items) if items.len() <= MAX_CONTEXT_ITEMS => {
            if items.iter().any(|i| !i.is_object()) {
                return Err(WorkflowError::BadRequest(
                    "additional_context items must be objects".into(),
                ));
            }
        }
        Value::Array(_) => {
            return Err(WorkflowError::BadRequest(format!(
                "additional_context has more than {MAX_CONTEXT_ITEMS} items"
            )));
        }
        _ => {
            return Err(WorkflowError::BadRequest(
                "additional_context is invalid".into(),
            ));
        }
    }
    if context.to_string().len() > MAX_CONTEXT_BYTES {
        return Err(WorkflowError::BadRequest(format!(
            "additional_context is larger than {MAX_CONTEXT_BYTES} bytes"
        )));
    }
    Ok(ValidWorkflow {
        goal,
        definition,
        agent,
        pre_approved,
        environment,
        context,
    })
}

struct ValidWorkflow {
    goal: String,
    definition: String,
    agent: Vec<i16>,
    pre_approved: Vec<i16>,
    environment: Option<i16>,
    context: Value,
}

/// Creates a workflow for `caller` (status `created`) and audits it.
pub async fn create(
    db: &impl Queries,
    caller: Caller,
    new: &NewWorkflow,
) -> Result<Workflow, WorkflowError> {
    let valid = validate(new)?;
    let (project_id, namespace_id) = match new.container {
        Some(Subject::Project(id)) => (Some(id), None),
        Some(Subject::Group(id)) => (None, Some(id)),
        _ => {
            return Err(WorkflowError::BadRequest(
                "project_id or namespace_id must be provided".into(),
            ));
        }
    };
    let row = db
        .query_one(
            &format!(
                "INSERT INTO duo_workflows_workflows
                   (user_id, project_id, namespace_id, service_account_id, goal, workflow_definition,
                    agent_privileges, pre_approved_agent_privileges, allow_agent_to_request_user,
                    image, environment, additional_context, source_branch, issue_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                 RETURNING {COLUMNS}"
            ),
            &[
                &caller.user_id,
                &project_id,
                &namespace_id,
                &new.service_account_id,
                &valid.goal,
                &valid.definition,
                &valid.agent,
                &valid.pre_approved,
                &new.allow_agent_to_request_user.unwrap_or(true),
                &new.image,
                &valid.environment,
                &valid.context,
                &new.source_branch,
                &new.issue_id,
            ],
        )
        .await?;
    let workflow = from_row(&row);
    audit(
        db,
        Some(workflow.id),
        "duo_session_created",
        caller,
        json!({ "workflow_definition": workflow.workflow_definition }),
    )
    .await?;
    Ok(workflow)
}

pub async fn find(db: &impl Queries, id: i64) -> Result<Option<Workflow>, WorkflowError> {
    let row = db
        .query_opt(
            &format!("SELECT {COLUMNS} FROM duo_workflows_workflows WHERE id = $1"),
            &[&id],
        )
        .await?;
    Ok(row.as_ref().map(from_row))
}

/// Filters of a workflow list.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub project_id: Option<i64>,
    pub workflow_definition: Option<String>,
    pub status_group: Option<String>,
    pub environment: Option<i16>,
    /// At most this many, newest first.
    pub limit: i64,
}

/// The user's own workflows, newest first.
pub async fn list_for_user(
    db: &impl Queries,
    user_id: i64,
    filter: &ListFilter,
) -> Result<Vec<Workflow>, WorkflowError> {
    let statuses: Option<Vec<i16>> = filter.status_group.as_deref().map(|group| {
        Status::ALL
            .into_iter()
            .filter(|s| s.group() == group)
            .map(Status::code)
            .collect()
    });
    let rows = db
        .query(
            &format!(
                "SELECT {COLUMNS} FROM duo_workflows_workflows
                 WHERE user_id = $1
                   AND ($2::bigint IS NULL OR project_id = $2)
                   AND ($3::text IS NULL OR workflow_definition = $3)
                   AND ($4::smallint[] IS NULL OR status = ANY($4))
                   AND ($5::smallint IS NULL OR environment = $5)
                 ORDER BY id DESC LIMIT $6"
            ),
            &[
                &user_id,
                &filter.project_id,
                &filter.workflow_definition,
                &statuses,
                &filter.environment,
                &filter.limit.max(0),
            ],
        )
        .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// What a status event did.
#[derive(Debug, Clone)]
pub struct StatusChange {
    pub workflow: Workflow,
    /// `Some(from)` when the status moved; `None` when it was already there.
    pub moved_from: Option<Status>,
    pub message: String,
}

/// Applies `event_name` to the workflow under a row lock, so two racing
/// updates see each other's result: only one moves the workflow, the other is
/// answered from the new status. On a move the owner's live subscribers get
/// the change at commit, and the audit trail records the caller.
///
/// `run_token` is the token of a product run's leg when the event comes from
/// that run's executor (through the workflow service): such an event may move
/// the workflow back to running only while its leg still runs. An executor's
/// request that passed authentication just before its leg was cancelled must
/// not undo the stop that ended the leg; the check is made under the row lock
/// the leg's own ending takes too.
pub async fn apply_status_event(
    client: &mut deadpool_postgres::Client,
    workflow_id: i64,
    event_name: &str,
    caller: Caller,
    run_token: Option<i64>,
) -> Result<StatusChange, WorkflowError> {
    let tx = client.transaction().await?;
    let row = tx
        .query_opt(
            &format!("SELECT {COLUMNS} FROM duo_workflows_workflows WHERE id = $1 FOR UPDATE"),
            &[&workflow_id],
        )
        .await?
        .ok_or(WorkflowError::NotFound)?;
    let current = from_row(&row);
    let decision = status::decide(current.status, event_name);
    if let (
        Decision::Fire {
            to: Status::Running,
            ..
        },
        Some(token_id),
    ) = (&decision, run_token)
    {
        let leg_runs: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM duo_workflow_workloads
                                WHERE workflow_id = $1 AND token_id = $2 AND state = 'running')",
                &[&workflow_id, &token_id],
            )
            .await?
            .get(0);
        if !leg_runs {
            return Err(WorkflowError::Refused(format!(
                "Can not {event_name} workflow: the run this token was issued for has ended"
            )));
        }
    }
    match decision {
        Decision::Refused { message } => Err(WorkflowError::Refused(message)),
        Decision::Already { message } => Ok(StatusChange {
            workflow: current,
            moved_from: None,
            message,
        }),
        Decision::Fire { from, to } => {
            let row = tx
                .query_one(
                    &format!(
                        "UPDATE duo_workflows_workflows SET status = $2, updated_at = now()
                         WHERE id = $1 RETURNING {COLUMNS}"
                    ),
                    &[&workflow_id, &to.code()],
                )
                .await?;
            let workflow = from_row(&row);
            audit(
                &tx,
                Some(workflow_id),
                "duo_session_status_changed",
                caller,
                json!({ "event": event_name, "from": from.name(), "to": to.name() }),
            )
            .await?;
            super::live::publish_status(&tx, &workflow).await?;
            tx.commit().await?;
            Ok(StatusChange {
                workflow,
                moved_from: Some(from),
                message: "Workflow status updated".into(),
            })
        }
    }
}

/// The instance's Duo Workflow service account, when one is configured (and
/// still a service account).
pub async fn instance_service_account(
    db: &impl Queries,
) -> Result<Option<crate::policy::Actor>, WorkflowError> {
    let row = db
        .query_opt(
            "SELECT u.id, u.admin FROM instance_settings s JOIN users u ON u.id = s.duo_workflow_service_account_id
             WHERE u.service_account AND u.state = 'active'",
            &[],
        )
        .await?;
    Ok(row.map(|r| crate::policy::Actor::user(r.get(0), r.get(1))))
}

/// Stores the session's model (without any API key) so a resume keeps it.
pub async fn remember_model_metadata(
    db: &impl Queries,
    workflow_id: i64,
    model_metadata_json: &str,
) -> Result<(), WorkflowError> {
    db.execute(
        "UPDATE duo_workflows_workflows SET model_metadata_json = $2 WHERE id = $1",
        &[&workflow_id, &model_metadata_json],
    )
    .await?;
    Ok(())
}

/// The model metadata as stored: parsed, with any `api_key` removed, and no
/// longer than the column allows; `None` when it is not a JSON object.
pub fn sanitize_model_metadata(raw: &str) -> Option<String> {
    let mut value: Value = serde_json::from_str(raw).ok()?;
    let obj = value.as_object_mut()?;
    obj.remove("api_key");
    let text = value.to_string();
    (text.chars().count() <= MODEL_METADATA_MAX_CHARS).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new() -> NewWorkflow {
        NewWorkflow {
            container: Some(Subject::Project(1)),
            ..NewWorkflow::default()
        }
    }

    #[test]
    fn defaults_and_subsets() {
        let v = validate(&new()).unwrap();
        assert_eq!(v.agent, DEFAULT_AGENT_PRIVILEGES);
        assert_eq!(v.pre_approved, vec![1, 2]);
        assert_eq!(v.definition, "software_development");

        let mut bad = new();
        bad.agent_privileges = Some(vec![1]);
        bad.pre_approved_agent_privileges = Some(vec![1, 3]);
        let err = validate(&bad).err().unwrap();
        assert_eq!(
            err.to_string(),
            "pre_approved_agent_privileges contains privilege 3 not present in agent_privileges"
        );

        let mut unknown = new();
        unknown.agent_privileges = Some(vec![9]);
        assert_eq!(
            validate(&unknown).err().unwrap().to_string(),
            "agent_privileges contains an invalid value 9"
        );

        let mut long = new();
        long.goal = Some("x".repeat(GOAL_MAX_CHARS + 1));
        assert!(validate(&long).is_err());
    }

    #[test]
    fn model_metadata_loses_its_key() {
        let s = sanitize_model_metadata(r#"{"provider":"openai","api_key":"sk-1","name":"m"}"#)
            .unwrap();
        assert!(!s.contains("sk-1"));
        assert!(s.contains("openai"));
        assert!(sanitize_model_metadata("[1]").is_none());
    }
}
