//! Duo Workflow in GitLab's GraphQL shapes, for the web page: the caller's
//! workflows (`duoWorkflowWorkflows`), a workflow's history as events
//! (`duoWorkflowEvents`, one per checkpoint, newest first), and live updates
//! (`workflowEventsUpdated`) pushed at each status change and checkpoint.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use juniper::{FieldError, FieldResult, GraphQLEnum, GraphQLObject};

use super::*;
use crate::workflows::checkpoints::{self, Checkpoint};
use crate::workflows::live::{self, WorkflowEventMessage};
use crate::workflows::store::{self, ListFilter, Workflow};
use crate::workflows::{Status, privileges};
use serde_json::value::RawValue;

pub use crate::workflows::WORKFLOW_GID_MODEL;

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "DuoWorkflowStatus")]
pub enum DuoWorkflowStatusEnum {
    Created,
    Running,
    Paused,
    Finished,
    Failed,
    Stopped,
    InputRequired,
    PlanApprovalRequired,
    ToolCallApprovalRequired,
}

impl From<Status> for DuoWorkflowStatusEnum {
    fn from(s: Status) -> Self {
        match s {
            Status::Created => Self::Created,
            Status::Running => Self::Running,
            Status::Paused => Self::Paused,
            Status::Finished => Self::Finished,
            Status::Failed => Self::Failed,
            Status::Stopped => Self::Stopped,
            Status::InputRequired => Self::InputRequired,
            Status::PlanApprovalRequired => Self::PlanApprovalRequired,
            Status::ToolCallApprovalRequired => Self::ToolCallApprovalRequired,
        }
    }
}

fn time(t: chrono::DateTime<chrono::Utc>) -> Time {
    Time(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// A workflow's history entry: one checkpoint with the workflow's status.
#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "DuoWorkflowEvent")]
pub struct DuoWorkflowEvent {
    pub checkpoint: Option<Json>,
    pub compressed_checkpoint: Option<String>,
    pub metadata: Option<Json>,
    pub workflow_status: Option<DuoWorkflowStatusEnum>,
    /// Granular status: the graph's own (`Planning`, `Execution`, ...) when
    /// the checkpoint says, else the workflow's.
    pub execution_status: String,
    pub timestamp: Option<Time>,
    pub parent_timestamp: Option<Time>,
    pub errors: Option<Vec<String>>,
    pub workflow_goal: Option<String>,
    pub workflow_definition: Option<String>,
    /// The conversation of the checkpoint. In `workflowEventsUpdated` only
    /// the messages that are new since the subscriber's last event.
    pub duo_messages: Option<Vec<DuoMessage>>,
    pub last_duo_message: Option<DuoMessage>,
}

/// One message of a workflow's conversation, as GitLab shapes it.
#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "DuoMessage")]
pub struct DuoMessage {
    pub content: String,
    /// `user`, `agent`, `tool`, `request` or `workflow_end`.
    pub message_type: String,
    pub status: Option<String>,
    /// The tool's name and arguments, as JSON text.
    pub tool_info: Option<String>,
    pub timestamp: Option<Time>,
    pub correlation_id: Option<String>,
    /// Who speaks: `user` for the user's messages, `tool` for tools',
    /// `assistant` for the agent's.
    pub role: Option<String>,
}

fn duo_message(entry: live::ChatLogEntry) -> DuoMessage {
    let role = match entry.message_type.as_str() {
        "user" => "user",
        "tool" => "tool",
        _ => "assistant",
    };
    DuoMessage {
        role: Some(role.to_owned()),
        tool_info: entry.tool_info.map(|v| v.to_string()),
        timestamp: entry
            .timestamp
            .as_deref()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| time(t.with_timezone(&chrono::Utc))),
        content: entry.content,
        message_type: entry.message_type,
        status: entry.status,
        correlation_id: entry.correlation_id,
    }
}

/// The messages of a checkpoint, oldest first.
fn duo_messages(checkpoint: Option<&RawValue>) -> Vec<DuoMessage> {
    checkpoint
        .map(live::chat_log_of)
        .unwrap_or_default()
        .into_iter()
        .map(duo_message)
        .collect()
}

fn summary(checkpoint: Option<&RawValue>) -> live::CheckpointSummary {
    checkpoint.map(live::summary_of).unwrap_or_default()
}

fn event_of(workflow: &Workflow, checkpoint: Option<&Checkpoint>) -> DuoWorkflowEvent {
    let summary = summary(checkpoint.map(|c| &*c.checkpoint));
    DuoWorkflowEvent {
        checkpoint: checkpoint.map(|c| Json(c.checkpoint.get().to_owned())),
        compressed_checkpoint: checkpoint.map(|c| checkpoints::compress(c.checkpoint.get())),
        metadata: checkpoint.map(|c| Json(c.metadata.to_string())),
        workflow_status: Some(workflow.status.into()),
        execution_status: summary
            .status
            .unwrap_or_else(|| workflow.status.human_name()),
        timestamp: checkpoint.map(|c| time(summary.timestamp.unwrap_or(c.created_at))),
        parent_timestamp: None,
        errors: Some(Vec::new()),
        workflow_goal: Some(workflow.goal.clone()),
        workflow_definition: Some(workflow.workflow_definition.clone()),
        duo_messages: None,
        last_duo_message: None,
    }
    .with_messages(checkpoint.map(|c| &*c.checkpoint), 0)
}

impl DuoWorkflowEvent {
    /// Fills the conversation fields from the checkpoint, skipping the
    /// first `skip` messages (those a subscriber already has).
    fn with_messages(mut self, checkpoint: Option<&RawValue>, skip: usize) -> Self {
        let all = duo_messages(checkpoint);
        self.last_duo_message = all.last().cloned();
        self.duo_messages = Some(all.into_iter().skip(skip).collect());
        self
    }
}

fn event_of_message(m: WorkflowEventMessage) -> DuoWorkflowEvent {
    let status = Status::from_name(&m.status).unwrap_or(Status::Failed);
    let summary = summary(m.checkpoint.as_deref());
    DuoWorkflowEvent {
        compressed_checkpoint: m
            .checkpoint
            .as_ref()
            .map(|c| checkpoints::compress(c.get())),
        execution_status: summary.status.unwrap_or_else(|| status.human_name()),
        checkpoint: m.checkpoint.map(|c| Json(c.get().to_owned())),
        metadata: m.metadata.map(|c| Json(c.to_string())),
        workflow_status: Some(status.into()),
        timestamp: m.timestamp.or(summary.timestamp).map(time),
        parent_timestamp: m.parent_timestamp.map(time),
        errors: Some(Vec::new()),
        workflow_goal: Some(m.goal),
        workflow_definition: Some(m.workflow_definition),
        duo_messages: None,
        last_duo_message: None,
    }
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "DuoWorkflow")]
pub struct DuoWorkflow {
    pub id: AiDuoWorkflowsWorkflowId,
    pub user_id: UserId,
    pub project_id: Option<ProjectId>,
    pub namespace_id: Option<NamespaceId>,
    pub goal: Option<String>,
    pub human_status: String,
    pub status: Option<DuoWorkflowStatusEnum>,
    pub status_name: Option<String>,
    pub status_group: Option<String>,
    pub workflow_definition: Option<String>,
    pub environment: Option<String>,
    pub agent_privileges: Vec<i32>,
    pub agent_privileges_names: Vec<String>,
    pub pre_approved_agent_privileges: Vec<i32>,
    pub pre_approved_agent_privileges_names: Vec<String>,
    pub allow_agent_to_request_user: bool,
    pub mcp_enabled: bool,
    pub created_at: Time,
    pub updated_at: Time,
    pub latest_checkpoint: Option<DuoWorkflowEvent>,
}

/// The workflow as GraphQL shows it; `mcp_enabled` is
/// [`crate::policy::Policy::mcp_for_workflows`]'s answer for it.
fn workflow_of(w: &Workflow, latest: Option<&Checkpoint>, mcp_enabled: bool) -> DuoWorkflow {
    DuoWorkflow {
        id: AiDuoWorkflowsWorkflowId(gid::format(WORKFLOW_GID_MODEL, w.id)),
        user_id: UserId(gid::format("User", w.user_id)),
        project_id: w.project_id.map(|p| ProjectId(gid::format("Project", p))),
        namespace_id: w
            .namespace_id
            .map(|n| NamespaceId(gid::format("Namespace", n))),
        goal: Some(w.goal.clone()),
        human_status: w.status.human_name(),
        status: Some(w.status.into()),
        status_name: Some(w.status.name().to_owned()),
        status_group: Some(w.status.group().to_owned()),
        workflow_definition: Some(w.workflow_definition.clone()),
        environment: w.environment_name().map(str::to_owned),
        agent_privileges: w.agent_privileges.iter().map(|p| i32::from(*p)).collect(),
        agent_privileges_names: privileges::names(&w.agent_privileges)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        pre_approved_agent_privileges: w
            .pre_approved_agent_privileges
            .iter()
            .map(|p| i32::from(*p))
            .collect(),
        pre_approved_agent_privileges_names: privileges::names(&w.pre_approved_agent_privileges)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        allow_agent_to_request_user: w.allow_agent_to_request_user,
        mcp_enabled,
        created_at: time(w.created_at),
        updated_at: time(w.updated_at),
        latest_checkpoint: latest.map(|c| event_of(w, Some(c))),
    }
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "DuoWorkflowConnection")]
pub struct DuoWorkflowConnection {
    pub nodes: Vec<DuoWorkflow>,
    pub page_info: PageInfo,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "DuoWorkflowEventConnection")]
pub struct DuoWorkflowEventConnection {
    pub nodes: Vec<DuoWorkflowEvent>,
    pub page_info: PageInfo,
}

fn not_available() -> FieldError {
    coded(
        "The resource that you are attempting to access does not exist or you don't have permission to perform this action",
        "RESOURCE_NOT_AVAILABLE",
    )
}

fn parse_workflow_id(id: &AiDuoWorkflowsWorkflowId) -> FieldResult<i64> {
    match gid::parse(&id.0) {
        Some((WORKFLOW_GID_MODEL, n)) => Ok(n),
        _ => Err(coded(
            format!("{} is not a valid AiDuoWorkflowsWorkflowID", id.0),
            "ARGUMENT_ERROR",
        )),
    }
}

/// The workflow when the caller may read it (its owner, or an admin, who may
/// still use Duo Workflow where it runs); otherwise "not available".
async fn readable_workflow(ctx: &GqlContext, id: i64) -> FieldResult<Workflow> {
    let Some(user) = ctx.user else {
        return Err(not_available());
    };
    let db = ctx.pool.get().await.map_err(internal)?;
    let workflow = store::find(&*db, id)
        .await
        .map_err(internal)?
        .filter(|w| w.user_id == user.id || user.admin)
        .ok_or_else(not_available)?;
    if !ctx
        .policy
        .can_access_workflow(&*db, user, None, workflow.facts())
        .await
        .map_err(internal)?
    {
        return Err(not_available());
    }
    Ok(workflow)
}

/// `duoWorkflowWorkflows`: one workflow by id, or the caller's own, newest first.
pub async fn workflows(
    ctx: &GqlContext,
    workflow_id: Option<AiDuoWorkflowsWorkflowId>,
    project_path: Option<juniper::ID>,
    workflow_type: Option<String>,
    first: Option<i32>,
) -> FieldResult<DuoWorkflowConnection> {
    let Some(user) = ctx.user else {
        return Ok(DuoWorkflowConnection {
            nodes: Vec::new(),
            page_info: PageInfo::single_page(),
        });
    };
    let list = match &workflow_id {
        Some(id) => vec![readable_workflow(ctx, parse_workflow_id(id)?).await?],
        None => {
            let db = ctx.pool.get().await.map_err(internal)?;
            let project_id = match project_path {
                Some(path) => Some(
                    crate::namespaces::project_id_by_full_path(&*db, &path)
                        .await
                        .map_err(internal)?
                        .unwrap_or(-1),
                ),
                None => None,
            };
            store::list_for_user(
                &*db,
                user.id,
                &ListFilter {
                    project_id,
                    workflow_definition: workflow_type,
                    limit: i64::from(first.unwrap_or(100).clamp(1, 100)),
                    ..ListFilter::default()
                },
            )
            .await
            .map_err(internal)?
        }
    };
    let db = ctx.pool.get().await.map_err(internal)?;
    let containers: Vec<_> = list.iter().map(Workflow::container).collect();
    let mcp = crate::policy::Policy::mcp_for_workflows(&*db, &containers)
        .await
        .map_err(internal)?;
    let mut nodes = Vec::with_capacity(list.len());
    for (i, w) in list.iter().enumerate() {
        let latest = checkpoints::latest(&*db, w.id).await.map_err(internal)?;
        let mcp_enabled = mcp.get(i).is_some_and(|m| m.enabled);
        nodes.push(workflow_of(w, latest.as_ref(), mcp_enabled));
    }
    Ok(DuoWorkflowConnection {
        nodes,
        page_info: PageInfo::single_page(),
    })
}

/// `duoWorkflowEvents`: the workflow's checkpoints as events, newest first.
pub async fn events(
    ctx: &GqlContext,
    workflow_id: AiDuoWorkflowsWorkflowId,
) -> FieldResult<DuoWorkflowEventConnection> {
    let workflow = readable_workflow(ctx, parse_workflow_id(&workflow_id)?).await?;
    let db = ctx.pool.get().await.map_err(internal)?;
    let (list, _) = checkpoints::list(&*db, workflow.id, None, 0, 100)
        .await
        .map_err(internal)?;
    Ok(DuoWorkflowEventConnection {
        nodes: list.iter().map(|c| event_of(&workflow, Some(c))).collect(),
        page_info: PageInfo::single_page(),
    })
}

pub type DuoWorkflowEventStream =
    Pin<Box<dyn Stream<Item = Result<DuoWorkflowEvent, FieldError>> + Send>>;

/// `workflowEventsUpdated`: the workflow's status changes and new checkpoints
/// as they happen, to its owner (or an admin).
pub async fn events_updated(
    ctx: &GqlContext,
    workflow_id: AiDuoWorkflowsWorkflowId,
) -> FieldResult<DuoWorkflowEventStream> {
    let workflow = readable_workflow(ctx, parse_workflow_id(&workflow_id)?).await?;
    let wanted = workflow.id;
    let receiver = ctx
        .live
        .subscribe(&live::user_topic(workflow.user_id))
        .await
        .map_err(internal)?;
    // The subscriber has the conversation up to now (from the query); each
    // event carries only the messages that are new since the last one.
    let already = {
        let db = ctx.pool.get().await.map_err(internal)?;
        checkpoints::latest(&*db, wanted)
            .await
            .map_err(internal)?
            .map_or(0, |c| live::chat_log_of(&c.checkpoint).len())
    };
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(already));
    let pool = ctx.pool.clone();
    let stream = tokio_stream::wrappers::BroadcastStream::new(receiver).filter_map(move |item| {
        let pool = pool.clone();
        let sent = sent.clone();
        async move {
            let value = item.ok()?;
            let message: WorkflowEventMessage = serde_json::from_value(value).ok()?;
            if message.workflow_id != wanted {
                return None;
            }
            let message = match message.resolve(&pool).await {
                Ok(message) => message,
                Err(e) => return Some(Err(internal(e))),
            };
            let log_length = message
                .checkpoint
                .as_deref()
                .map_or(0, |c| live::chat_log_of(c).len());
            let previous = sent.swap(log_length, std::sync::atomic::Ordering::Relaxed);
            // A shorter log is another thread's: send it whole.
            let skip = if log_length >= previous { previous } else { 0 };
            let checkpoint = message.checkpoint.clone();
            Some(Ok(
                event_of_message(message).with_messages(checkpoint.as_deref(), skip)
            ))
        }
    });
    Ok(Box::pin(stream))
}

/// `aiDuoWorkflowCreate`'s input: GitLab's creation parameters.
#[derive(Debug, Clone, juniper::GraphQLInputObject)]
#[graphql(name = "AiDuoWorkflowCreateInput")]
pub struct AiDuoWorkflowCreateInput {
    pub client_mutation_id: Option<String>,
    /// The project's full path (or numeric id).
    pub project_path: Option<juniper::ID>,
    pub goal: Option<String>,
    pub workflow_definition: Option<String>,
    pub agent_privileges: Option<Vec<i32>>,
    pub pre_approved_agent_privileges: Option<Vec<i32>>,
    pub allow_agent_to_request_user: Option<bool>,
    pub environment: Option<String>,
    /// Start a run in the product now.
    pub start_workflow: Option<bool>,
    pub source_branch: Option<String>,
    /// The IID of an issue of the project the workflow works on.
    pub issue_iid: Option<i32>,
}

/// The started run: its id and where to follow it.
#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "DuoWorkflowWorkload")]
pub struct DuoWorkflowWorkload {
    pub id: juniper::ID,
    pub message: String,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiDuoWorkflowCreatePayload")]
pub struct AiDuoWorkflowCreatePayload {
    pub client_mutation_id: Option<String>,
    pub workflow: Option<DuoWorkflow>,
    pub workload: Option<DuoWorkflowWorkload>,
    pub errors: Vec<String>,
}

/// `aiDuoWorkflowCreate`: the REST API's creation through the same domain
/// function. A project the caller cannot see and one they may not run
/// workflows in are both "not available"; invalid parameters come back in
/// `errors`.
pub async fn create(
    ctx: &GqlContext,
    input: AiDuoWorkflowCreateInput,
) -> FieldResult<AiDuoWorkflowCreatePayload> {
    use crate::workflows::creation::{self, CreateContext, CreateError, CreateRequest};
    let Some(user) = ctx.user else {
        return Err(coded("Unauthorized", "UNAUTHENTICATED"));
    };
    ctx.access.require_write()?;
    let unavailable = || {
        coded(
            "The resource that you are attempting to access does not exist or you don't have permission to perform this action",
            "RESOURCE_NOT_AVAILABLE",
        )
    };
    let project = {
        let Some(path) = input.project_path.as_deref() else {
            return Ok(payload_with_error(
                input.client_mutation_id,
                "projectPath must be provided",
            ));
        };
        let db = ctx.pool.get().await.map_err(internal)?;
        let id = match path.parse::<i64>() {
            Ok(id) => Some(id),
            Err(_) => crate::namespaces::project_id_by_full_path(&*db, path)
                .await
                .map_err(internal)?,
        };
        let Some(id) = id else {
            return Err(unavailable());
        };
        let readable = ctx
            .policy
            .can(
                &*db,
                Some(user),
                crate::policy::Ability::ReadProject,
                crate::policy::Subject::Project(id),
            )
            .await
            .map_err(internal)?;
        if !readable {
            return Err(unavailable());
        }
        id
    };
    let widen = |ids: Option<Vec<i32>>| ids.map(|v| v.into_iter().map(i64::from).collect());
    let request = CreateRequest {
        workflow: crate::workflows::store::NewWorkflow {
            container: Some(crate::policy::Subject::Project(project)),
            goal: input.goal,
            workflow_definition: input.workflow_definition,
            agent_privileges: widen(input.agent_privileges),
            pre_approved_agent_privileges: widen(input.pre_approved_agent_privileges),
            allow_agent_to_request_user: input.allow_agent_to_request_user,
            environment: input.environment,
            source_branch: input.source_branch,
            ..Default::default()
        },
        start: input.start_workflow.unwrap_or(false),
        issue_iid: input.issue_iid,
    };
    let context = CreateContext {
        pool: &ctx.pool,
        policy: &ctx.policy,
        config: &ctx.config,
        repositories: &ctx.repositories,
    };
    match creation::create(&context, user, ctx.token_service_account, request).await {
        Ok(created) => {
            let db = ctx.pool.get().await.map_err(internal)?;
            let latest = checkpoints::latest(&*db, created.workflow.id)
                .await
                .map_err(internal)?;
            let mcp = crate::policy::Policy::mcp_for_workflow(&*db, created.workflow.container())
                .await
                .map_err(internal)?;
            Ok(AiDuoWorkflowCreatePayload {
                client_mutation_id: input.client_mutation_id,
                workflow: Some(workflow_of(&created.workflow, latest.as_ref(), mcp.enabled)),
                workload: created.run.map(|(started, page)| {
                    let json = started.workload_json(&page);
                    DuoWorkflowWorkload {
                        id: juniper::ID::new(started.workload.id.to_string()),
                        message: json["message"].as_str().unwrap_or_default().to_owned(),
                    }
                }),
                errors: Vec::new(),
            })
        }
        Err(CreateError::Forbidden | CreateError::IssueNotFound) => Err(unavailable()),
        Err(CreateError::Policy(e)) => Err(internal(e)),
        Err(CreateError::Workflow(crate::workflows::WorkflowError::Db(e))) => Err(internal(e)),
        Err(e) => Ok(payload_with_error(input.client_mutation_id, &e.to_string())),
    }
}

fn payload_with_error(
    client_mutation_id: Option<String>,
    error: &str,
) -> AiDuoWorkflowCreatePayload {
    AiDuoWorkflowCreatePayload {
        client_mutation_id,
        workflow: None,
        workload: None,
        errors: vec![error.to_owned()],
    }
}
