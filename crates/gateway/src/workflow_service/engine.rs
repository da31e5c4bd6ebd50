//! The graph engine: runs a flow's nodes one step at a time, persisting a
//! checkpoint after every step through the executor, pausing at approval
//! interrupts, and resuming from the newest checkpoint.
//!
//! Flows are data ([`Flow::agents`]): each agent is a model node `<name>`
//! and a tools node `<name>_tools`; `plan_approval` is the one special node.

use super::checkpoint_writer::CheckpointWriter;
use super::guided_edit::{self, Goal, Step};
use super::link::{ExecutorLink, INFRA_STOP_REASONS, LinkError, StreamSignal};
use super::mcp_tools;
use super::model_choice::{AgentModelMetadata, ModelChoice, WORKFLOW_FEATURE_CATEGORY, route_for};
use super::monolith_api::{MonolithApi, MonolithApiError, WorkflowRecord};
use super::state::{
    CheckpointPost, PlanStep, ToolInfo, UiChatLogEntry, WorkflowState, WorkflowStatus,
    new_thread_ts,
};
use super::tools::{self, ToolKind, ToolPolicy, ToolResult, ToolSpec, UnitPrimitives};
use crate::config::{PromptsConfig, ProvidersConfig, WorkflowServiceConfig};
use crate::prompts::{PromptDefinition, PromptRegistry, RenderedMessage, TemplateRole};
use crate::providers::conversation::{Message, ToolCall};
use crate::providers::tool_calling::{ModelTurn, ToolCallingModel, ToolSchema, TurnOptions};
use crate::providers::{ModelParams, ModelRoute};
use contracts::duo_workflow::{NewCheckpoint, StartWorkflowRequest, approval};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use tonic::Status;

/// Shared by every run.
pub struct Services {
    pub providers: ProvidersConfig,
    pub prompts_config: PromptsConfig,
    pub prompts: Arc<PromptRegistry>,
    pub model: ToolCallingModel,
    pub config: WorkflowServiceConfig,
    /// Models' context sizes (the bundled server reports its own).
    pub context_windows: Arc<crate::chat::context_window::ContextWindows>,
    /// Run locks of runs that ended without giving them back (their executor
    /// hung up, so the monolith could no longer be told), by workflow id: the
    /// next run of the workflow on this service takes the lock over at once
    /// instead of waiting for it to lapse. Only this service knows their ids.
    pub orphaned_locks:
        std::sync::Mutex<std::collections::HashMap<String, super::monolith_api::RunLock>>,
}

/// The flows this service runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Chat,
    SoftwareDevelopment,
}

/// One agent of a flow.
#[derive(Debug, Clone, Copy)]
pub struct AgentSpec {
    pub name: &'static str,
    pub prompt_id: &'static str,
    pub tools: &'static [&'static str],
    /// Whether the agent also gets the run's MCP tools (agents that act,
    /// not the ones that only read or plan).
    pub mcp: bool,
    /// Where the graph goes when the agent answers without tool calls.
    pub done: Option<&'static str>,
}

impl AgentSpec {
    /// Whether the agent may call `tool`: one of its own, or an MCP tool of
    /// the run when the agent takes those.
    fn offers(&self, tool: &ToolSpec) -> bool {
        match tool.kind {
            ToolKind::Mcp => self.mcp,
            _ => self.tools.contains(&tool.name.as_ref()),
        }
    }
}

const WORKSPACE_AND_GITLAB_READS: &[&str] = &[
    "read_file",
    "read_files",
    "list_dir",
    "find_files",
    "grep",
    "get_issue",
    "list_issue_notes",
    "get_merge_request",
    "get_pipeline_errors",
    "get_repository_file",
    "semantic_code_search",
];

const ALL_TOOLS: &[&str] = &[
    "read_file",
    "read_files",
    "list_dir",
    "find_files",
    "grep",
    "create_file_with_contents",
    "edit_file",
    "mkdir",
    "run_command",
    "run_git_command",
    "get_issue",
    "list_issue_notes",
    "get_merge_request",
    "get_pipeline_errors",
    "get_repository_file",
    "semantic_code_search",
    "create_issue_note",
    "create_merge_request",
];

const CHAT_AGENTS: &[AgentSpec] = &[AgentSpec {
    name: "chat",
    prompt_id: "workflow/chat",
    tools: ALL_TOOLS,
    mcp: true,
    done: None,
}];

const SOFTWARE_DEVELOPMENT_AGENTS: &[AgentSpec] = &[
    AgentSpec {
        name: "context_builder",
        prompt_id: "workflow/software_development/context_builder",
        tools: WORKSPACE_AND_GITLAB_READS,
        mcp: false,
        done: Some("planner"),
    },
    AgentSpec {
        name: "planner",
        prompt_id: "workflow/software_development/planner",
        tools: &["create_plan"],
        mcp: false,
        done: Some(PLAN_APPROVAL),
    },
    AgentSpec {
        name: "executor",
        prompt_id: "workflow/software_development/executor",
        tools: ALL_TOOLS,
        mcp: true,
        done: None,
    },
];

const PLAN_APPROVAL: &str = "plan_approval";
const TOOLS_SUFFIX: &str = "_tools";

impl Flow {
    /// From the start request: `workflowDefinition`, else `flowConfigId`.
    pub fn from_request(start: &StartWorkflowRequest) -> Result<Self, Status> {
        if start.flow_config.is_some() {
            return Err(Status::invalid_argument(
                "inline flow configurations (flowConfig) are not supported by this service",
            ));
        }
        let name = Some(start.workflow_definition.as_str())
            .filter(|d| !d.is_empty())
            .or(start.flow_config_id.as_deref())
            .unwrap_or("software_development");
        Self::named(name)
            .ok_or_else(|| Status::invalid_argument(format!("Unknown workflow definition: {name}")))
    }

    pub fn named(name: &str) -> Option<Self> {
        // GitLab versions chat and the developer flow; any version is ours.
        match name.split('/').next().unwrap_or(name) {
            "chat" | "chat-partial" => Some(Self::Chat),
            "software_development" | "developer" => Some(Self::SoftwareDevelopment),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::SoftwareDevelopment => "software_development",
        }
    }

    pub fn agents(self) -> &'static [AgentSpec] {
        match self {
            Self::Chat => CHAT_AGENTS,
            Self::SoftwareDevelopment => SOFTWARE_DEVELOPMENT_AGENTS,
        }
    }

    fn entry(self) -> &'static str {
        self.agents()[0].name
    }

    fn agent(self, name: &str) -> Option<&'static AgentSpec> {
        self.agents().iter().find(|a| a.name == name)
    }
}

/// The `message_sub_type` of the `workflow_end` entry of a software
/// development run that changed nothing.
pub const NO_CHANGES: &str = "no_changes";

/// What such a run's last chat log entry says.
pub const NO_CHANGES_MESSAGE: &str = "Workflow completed without changing anything: the model \
    made no file edit and no GitLab change. Try a smaller, more specific goal (name the file and \
    the change), or configure a larger model.";

/// How a stream ended without an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    Finished,
    /// Waiting for the user (approval or input).
    Paused(WorkflowStatus),
    Stopped,
}

impl RunOutcome {
    pub fn message(&self) -> &'static str {
        match self {
            Self::Stopped => "workflow execution stopped",
            _ => "workflow execution success",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("the executor disconnected")]
    HungUp,
    #[error("{0}")]
    TooLarge(String),
    #[error("workflow execution failure: {kind}: {message}")]
    Failure { kind: &'static str, message: String },
}

impl RunError {
    pub fn status(&self) -> Status {
        let message = self.to_string();
        match self {
            Self::InvalidArgument(_) => Status::invalid_argument(message),
            Self::PermissionDenied(_) => Status::permission_denied(message),
            Self::FailedPrecondition(_) => Status::failed_precondition(message),
            Self::HungUp => Status::cancelled(message),
            Self::TooLarge(_) => Status::resource_exhausted(message),
            Self::Failure { .. } => Status::internal(message),
        }
    }

    fn failure(kind: &'static str, message: impl std::fmt::Display) -> Self {
        Self::Failure {
            kind,
            message: message.to_string(),
        }
    }
}

impl From<LinkError> for RunError {
    fn from(err: LinkError) -> Self {
        match err {
            LinkError::HungUp => Self::HungUp,
            LinkError::TooLarge(_) => Self::TooLarge(err.to_string()),
            LinkError::Timeout(_) => Self::failure("ExecutorTimeout", err),
        }
    }
}

impl From<MonolithApiError> for RunError {
    fn from(err: MonolithApiError) -> Self {
        match err {
            MonolithApiError::Link(link) => link.into(),
            // GitLab's name for this failure, as callers see it.
            other => Self::failure("GitLabError", other),
        }
    }
}

/// One stream's run of one workflow.
pub struct Run {
    services: Arc<Services>,
    link: ExecutorLink,
    monolith: MonolithApi,
    workflow_id: String,
    flow: Flow,
    record: WorkflowRecord,
    policy: ToolPolicy,
    state: WorkflowState,
    writer: CheckpointWriter,
    model: ModelChoice,
    command_timeout: bool,
    additional_context: String,
    model_calls: u32,
    /// The service takes this run's steps for a model too small to choose
    /// tools ([`guided_edit`]).
    guided: bool,
}

enum NodeEnd {
    Ran(Result<(), RunError>),
    Interrupted(StreamSignal),
}

/// Is `id` a plausible workflow id (digits only, bounded)?
fn valid_workflow_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit())
}

/// The first status event of a run, from the monolith's status.
fn initial_event(status: &str) -> Result<&'static str, String> {
    Ok(match status {
        "created" => "start",
        "paused" | "input_required" | "plan_approval_required" | "tool_call_approval_required" => {
            "resume"
        }
        "running" | "stopped" | "failed" => "retry",
        "finished" => return Err("the workflow has finished".to_owned()),
        other => return Err(format!("the workflow has an unknown status {other:?}")),
    })
}

/// Renews a run lock in the background until dropped. A lost lock is not
/// fought over: the monolith then refuses this run's writes, which ends it.
struct LockRenewal(tokio::task::JoinHandle<()>);

impl LockRenewal {
    fn start(api: MonolithApi, workflow_id: String, lock: super::monolith_api::RunLock) -> Self {
        let every = std::time::Duration::from_secs(lock.ttl_seconds.max(3) / 3);
        Self(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match api.renew_run_lock(&workflow_id, &lock).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(workflow_id, "the run lost its lock to another run");
                        return;
                    }
                    Err(err) => {
                        tracing::debug!(workflow_id, error = %err, "renewing the run lock failed")
                    }
                }
            }
        }))
    }
}

impl Drop for LockRenewal {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Run {
    /// Loads the workflow, sends the first status event and runs it;
    /// `unit_primitives` are the caller's (they decide some tools).
    pub async fn execute(
        services: Arc<Services>,
        link: ExecutorLink,
        start: StartWorkflowRequest,
        flow: Flow,
        model: ModelChoice,
        unit_primitives: UnitPrimitives,
    ) -> Result<RunOutcome, RunError> {
        let workflow_id = start.workflow_id.trim().to_owned();
        if !valid_workflow_id(&workflow_id) {
            return Err(RunError::InvalidArgument(format!(
                "bad workflow ID {:?}",
                start.workflow_id.chars().take(40).collect::<String>()
            )));
        }
        let monolith = MonolithApi::new(link.clone(), services.config.http_retry_base);
        let record = match monolith.workflow(&workflow_id).await {
            Ok(record) => record,
            Err(err) if err.status() == Some(404) => {
                return Err(RunError::InvalidArgument(format!(
                    "workflow {workflow_id} not found"
                )));
            }
            Err(err) if err.status() == Some(403) || err.status() == Some(401) => {
                return Err(RunError::PermissionDenied(err.message()));
            }
            Err(err) => return Err(err.into()),
        };
        let event = initial_event(&record.status).map_err(RunError::FailedPrecondition)?;
        // One running copy per workflow: the monolith's run lock, renewed
        // while the run lasts and given up at its end.
        let orphaned = services
            .orphaned_locks
            .lock()
            .ok()
            .and_then(|mut locks| locks.remove(&workflow_id));
        let lock = match monolith
            .take_run_lock(&workflow_id, orphaned.as_ref())
            .await
        {
            Ok(lock) => lock,
            Err(err) if err.status() == Some(409) => {
                return Err(RunError::FailedPrecondition(err.message()));
            }
            Err(err) if err.status() == Some(403) || err.status() == Some(401) => {
                return Err(RunError::PermissionDenied(err.message()));
            }
            Err(err) => return Err(err.into()),
        };
        let renewal = lock
            .clone()
            .map(|lock| LockRenewal::start(monolith.clone(), workflow_id.clone(), lock));
        let locked_api = monolith.clone();
        let locked_id = workflow_id.clone();
        let orphans = services.clone();
        let outcome = Self::execute_locked(
            services,
            link,
            start,
            flow,
            model,
            unit_primitives,
            monolith,
            workflow_id,
            record,
            event,
        )
        .await;
        drop(renewal);
        if let Some(lock) = lock {
            // Through the executor, which may be gone: the lock is then kept
            // for the workflow's next run here (or lapses).
            if locked_api
                .release_run_lock(&locked_id, &lock)
                .await
                .is_err()
                && let Ok(mut locks) = orphans.orphaned_locks.lock()
            {
                locks.insert(locked_id, lock);
            }
        }
        outcome
    }

    /// The run once it holds the workflow.
    #[allow(clippy::too_many_arguments)]
    async fn execute_locked(
        services: Arc<Services>,
        link: ExecutorLink,
        start: StartWorkflowRequest,
        flow: Flow,
        model: ModelChoice,
        unit_primitives: UnitPrimitives,
        monolith: MonolithApi,
        workflow_id: String,
        record: super::monolith_api::WorkflowRecord,
        event: &'static str,
    ) -> Result<RunOutcome, RunError> {
        let latest = if event == "start" {
            None
        } else {
            monolith.latest_checkpoint(&workflow_id).await?
        };
        let writer = CheckpointWriter::start(
            monolith.clone(),
            workflow_id.clone(),
            latest.as_ref().map(|c| c.thread_ts.clone()),
            services.config.checkpoint_interval,
        );
        let mut run = Self {
            policy: ToolPolicy {
                privileges: record.agent_privileges.iter().copied().collect(),
                pre_approved: record
                    .pre_approved_agent_privileges
                    .iter()
                    .copied()
                    .collect(),
                session_approved: session_approved_tools(&start),
                mcp_tools: run_mcp_tools(&workflow_id, &record, &start),
                unit_primitives,
            },
            command_timeout: start
                .client_capabilities
                .iter()
                .any(|c| c == "command_timeout"),
            additional_context: additional_context_text(&start),
            services,
            link,
            monolith,
            workflow_id,
            flow,
            record,
            state: WorkflowState::default(),
            writer,
            model,
            model_calls: 0,
            guided: false,
        };
        match &latest {
            Some(stored) => {
                run.state = WorkflowState::from_checkpoint(&stored.checkpoint).map_err(|e| {
                    RunError::failure("CheckpointError", format!("unreadable checkpoint: {e}"))
                })?;
            }
            None if event == "resume" => {
                return Err(RunError::FailedPrecondition(format!(
                    "workflow {} awaits input but has no checkpoint to resume from",
                    run.workflow_id
                )));
            }
            None => run.state = run.fresh_state(&start),
        }
        let answers = start.approval.is_some()
            || (run.state.status == WorkflowStatus::InputRequired && !start.goal.trim().is_empty());
        if run.state.status.awaits_approval() && !answers {
            // An executor attaching to a paused workflow: show it what waits
            // for the user, change nothing, and end the stream.
            run.notify().await?;
            return Ok(RunOutcome::Paused(run.state.status));
        }
        run.apply_user_decision(&start)?;
        match run.monolith.status_event(&run.workflow_id, event).await {
            Ok(()) => {}
            Err(err) if err.status() == Some(403) => {
                return Err(RunError::PermissionDenied(err.message()));
            }
            Err(err) if err.status() == Some(400) => {
                return Err(RunError::FailedPrecondition(err.message()));
            }
            Err(err) => return Err(err.into()),
        }
        if event == "start" {
            run.persist("input").await?;
        }
        run.drive().await
    }

    fn fresh_state(&self, start: &StartWorkflowRequest) -> WorkflowState {
        let goal = Some(start.goal.clone())
            .filter(|g| !g.trim().is_empty())
            .or_else(|| self.record.goal.clone())
            .unwrap_or_default();
        let mut state = WorkflowState {
            status: WorkflowStatus::Planning,
            goal: goal.clone(),
            next_node: Some(self.flow.entry().to_owned()),
            step: -1,
            ..WorkflowState::default()
        };
        if !goal.is_empty() {
            state.ui_chat_log.push(UiChatLogEntry::new("user", goal));
        }
        state
    }

    /// Applies the approval or rejection the start request carries to a
    /// paused workflow.
    fn apply_user_decision(&mut self, start: &StartWorkflowRequest) -> Result<(), RunError> {
        let status = self.state.status;
        if !status.awaits_approval() {
            if self.state.next_node.is_some() {
                self.state.status = WorkflowStatus::Execution;
            }
            return Ok(());
        }
        let decision = start
            .approval
            .as_ref()
            .and_then(|a| a.user_decision.as_ref());
        match decision {
            Some(approval::UserDecision::Approval(_)) => {
                self.state.status = WorkflowStatus::Execution;
            }
            Some(approval::UserDecision::Rejection(rejection)) => {
                let message = rejection.message.clone().unwrap_or_default();
                let agent = self
                    .state
                    .pending_agent
                    .clone()
                    .unwrap_or_else(|| self.flow.entry().to_owned());
                let pending = std::mem::take(&mut self.state.pending_tool_calls);
                let conversation = self.state.conversation(&agent);
                for call in &pending {
                    conversation.push(Message::tool(
                        call,
                        "The user rejected this tool call; it was not run.",
                        true,
                    ));
                }
                let turn = if message.trim().is_empty() {
                    if status == WorkflowStatus::PlanApprovalRequired {
                        "The user rejected the plan. Make a different one.".to_owned()
                    } else {
                        "The user rejected the tool call.".to_owned()
                    }
                } else {
                    message.clone()
                };
                conversation.push(Message::human(turn));
                if !message.trim().is_empty() {
                    self.state
                        .ui_chat_log
                        .push(UiChatLogEntry::new("user", message));
                }
                self.state.status = WorkflowStatus::Execution;
                self.state.next_node = Some(agent);
            }
            None if !start.goal.trim().is_empty() && status == WorkflowStatus::InputRequired => {
                let agent = self
                    .state
                    .pending_agent
                    .clone()
                    .unwrap_or_else(|| self.flow.entry().to_owned());
                self.state
                    .conversation(&agent)
                    .push(Message::human(start.goal.clone()));
                self.state.status = WorkflowStatus::Execution;
                self.state.next_node = Some(agent);
            }
            None => {
                return Err(RunError::InvalidArgument(format!(
                    "workflow {} is waiting for the user: the start request must carry an approval or a rejection",
                    self.workflow_id
                )));
            }
        }
        self.state.pending_agent = None;
        Ok(())
    }

    /// Runs nodes until the graph ends, pauses or is stopped.
    async fn drive(mut self) -> Result<RunOutcome, RunError> {
        while let Some(node) = self.state.next_node.clone() {
            if let StreamSignal::Stop(reason) = self.link.signal() {
                return self.stop(&reason).await;
            }
            // Around tools with side effects the state is made durable: what
            // led to them before they run, their results after.
            let effects = self.next_tools_have_effects(&node);
            if effects && let Err(err) = self.writer.flush().await {
                return self.fail(err.into()).await;
            }
            let link = self.link.clone();
            let step = tokio::select! {
                result = self.run_node(&node) => NodeEnd::Ran(result),
                signal = link.interrupted() => NodeEnd::Interrupted(signal),
            };
            match step {
                NodeEnd::Ran(Ok(())) => {}
                NodeEnd::Ran(Err(err)) => return self.fail(err).await,
                NodeEnd::Interrupted(StreamSignal::Stop(reason)) => {
                    return self.stop(&reason).await;
                }
                NodeEnd::Interrupted(_) => return Err(RunError::HungUp),
            }
            self.state.step += 1;
            if self.state.status.awaits_approval() {
                let event = match self.state.status {
                    WorkflowStatus::PlanApprovalRequired => "require_plan_approval",
                    WorkflowStatus::InputRequired => "require_input",
                    _ => "require_tool_call_approval",
                };
                if let Err(err) = self.monolith.status_event(&self.workflow_id, event).await {
                    return self.fail(err.into()).await;
                }
                self.persist("loop").await?;
                return Ok(RunOutcome::Paused(self.state.status));
            }
            if self.state.next_node.is_none() {
                self.state.status = WorkflowStatus::Completed;
                let end = self.end_entry();
                self.state.ui_chat_log.push(end);
            }
            // A model's calls to read-only tools are stored with their
            // results a moment later: writing a long run's state costs more
            // than such a step, and the writer would mostly replace it with
            // the next one before sending it. Calls with side effects, or
            // waiting for approval, are stored before they run.
            let next_reads_only = self.state.next_node.as_deref().is_some_and(|next| {
                next.ends_with(TOOLS_SUFFIX) && !self.next_tools_have_effects(next)
            });
            if !next_reads_only && let Err(err) = self.save().await {
                return self.fail(err).await;
            }
            if (effects || self.state.status == WorkflowStatus::Completed)
                && let Err(err) = self.writer.flush().await
            {
                return self.fail(err.into()).await;
            }
            if self.state.status == WorkflowStatus::Completed
                && let Err(err) = self
                    .monolith
                    .status_event(&self.workflow_id, "finish")
                    .await
            {
                return self.fail(err.into()).await;
            }
            self.notify().await?;
        }
        Ok(RunOutcome::Finished)
    }

    async fn stop(mut self, reason: &str) -> Result<RunOutcome, RunError> {
        if INFRA_STOP_REASONS.contains(&reason) {
            // The session is resumed later from the newest checkpoint: store
            // what is still on its way, if the executor is still there.
            let _ = self.writer.flush().await;
            return Ok(RunOutcome::Stopped);
        }
        self.state.status = WorkflowStatus::Cancelled;
        self.state.next_node = None;
        self.persist("loop").await?;
        self.monolith
            .status_event(&self.workflow_id, "stop")
            .await?;
        Ok(RunOutcome::Stopped)
    }

    /// Records the failure in the monolith (when the executor is still
    /// there) and ends the stream with it.
    async fn fail(mut self, err: RunError) -> Result<RunOutcome, RunError> {
        if matches!(err, RunError::HungUp) {
            return Err(err);
        }
        tracing::warn!(workflow_id = %self.workflow_id, error = %err, "workflow failed");
        self.state.status = WorkflowStatus::Error;
        let _ = self.persist("loop").await;
        let _ = self.monolith.status_event(&self.workflow_id, "drop").await;
        Err(err)
    }

    /// Saves a checkpoint, waits until it (and every one before it) is
    /// stored, and tells the client.
    async fn persist(&mut self, source: &str) -> Result<(), RunError> {
        self.save_as(source).await?;
        self.writer.flush().await?;
        self.notify().await
    }

    /// The last chat log entry of a completed run. A software development
    /// run that changed nothing says so (sub type [`NO_CHANGES`]), so that
    /// nobody takes a run that only talked for a successful edit.
    fn end_entry(&self) -> UiChatLogEntry {
        let asked_for_change = self.flow == Flow::SoftwareDevelopment
            || (self.guided && guided_edit::asks_for_change(&self.state.goal));
        if !asked_for_change || self.changed_something() {
            return UiChatLogEntry::new("workflow_end", "Workflow completed.");
        }
        let mut entry = UiChatLogEntry::new("workflow_end", NO_CHANGES_MESSAGE);
        entry.message_sub_type = Some(NO_CHANGES.to_owned());
        entry.status = Some("failure".to_owned());
        entry
    }

    /// Whether a tool that changes files or GitLab (anything with side
    /// effects but `mkdir`) ran successfully in this run.
    fn changed_something(&self) -> bool {
        self.state.ui_chat_log.iter().any(|entry| {
            entry.message_type == "tool"
                && entry.status.as_deref() == Some("success")
                && entry.tool_info.as_ref().is_some_and(|info| {
                    info.name != "mkdir"
                        && self
                            .policy
                            .find(&info.name)
                            .is_none_or(|tool| tool.has_side_effects())
                })
        })
    }

    /// Whether `node` runs tools with side effects (anything but reading
    /// the workspace, reading GitLab and planning).
    fn next_tools_have_effects(&self, node: &str) -> bool {
        node.ends_with(TOOLS_SUFFIX)
            && self.state.pending_tool_calls.iter().any(|call| {
                self.policy
                    .find(&call.name)
                    .is_none_or(|tool| tool.has_side_effects())
            })
    }

    async fn save(&mut self) -> Result<(), RunError> {
        self.save_as("loop").await
    }

    async fn save_as(&mut self, source: &str) -> Result<(), RunError> {
        let thread_ts = new_thread_ts();
        let stored_metadata = self.model.metadata.as_ref().map(AgentModelMetadata::stored);
        // The writer fills in the parent: the checkpoint it stored last.
        let post = CheckpointPost::new(&self.state, &thread_ts, source, stored_metadata.as_ref());
        self.writer.submit(thread_ts, post)?;
        Ok(())
    }

    async fn notify(&self) -> Result<(), RunError> {
        self.link
            .notify(NewCheckpoint {
                status: self.state.status.checkpoint_status().to_owned(),
                checkpoint: self.state.client_view(),
                goal: self.state.goal.clone(),
                errors: Vec::new(),
                agent_context_usage: Default::default(),
            })
            .await
            .map_err(RunError::from)
    }

    async fn run_node(&mut self, node: &str) -> Result<(), RunError> {
        if node == PLAN_APPROVAL {
            self.state.status = WorkflowStatus::PlanApprovalRequired;
            self.state.pending_agent = Some("planner".to_owned());
            self.state.next_node = Some("executor".to_owned());
            let steps: Vec<String> = self
                .state
                .plan
                .steps
                .iter()
                .map(|s| format!("- {}", s.description))
                .collect();
            let mut entry = UiChatLogEntry::new(
                "request",
                format!("Approve this plan?\n{}", steps.join("\n")),
            );
            entry.status = Some("pending".to_owned());
            self.state.ui_chat_log.push(entry);
            return Ok(());
        }
        if let Some(agent) = node.strip_suffix(TOOLS_SUFFIX) {
            let spec = self
                .flow
                .agent(agent)
                .ok_or_else(|| RunError::failure("GraphError", format!("unknown node {node}")))?;
            return self.run_tools(spec).await;
        }
        let spec = self
            .flow
            .agent(node)
            .ok_or_else(|| RunError::failure("GraphError", format!("unknown node {node}")))?;
        self.run_agent(spec).await
    }

    fn prompt(&self, spec: &AgentSpec) -> Result<Arc<PromptDefinition>, RunError> {
        let registry = &self.services.prompts;
        let configured = self
            .services
            .prompts_config
            .default_families
            .get(spec.prompt_id)
            .map(String::as_str)
            .unwrap_or(&self.services.prompts_config.default_family);
        let family = self
            .model
            .metadata
            .as_ref()
            .and_then(AgentModelMetadata::family)
            .unwrap_or(configured);
        registry
            .resolve(spec.prompt_id, family, None)
            .or_else(|_| registry.resolve(spec.prompt_id, "base", None))
            .map_err(|e| RunError::failure("PromptError", e))
    }

    fn prompt_inputs(&self, spec: &AgentSpec, tool_names: &[&str]) -> Value {
        let plan: Vec<&str> = self
            .state
            .plan
            .steps
            .iter()
            .map(|s| s.description.as_str())
            .collect();
        json!({
            "goal": self.state.goal,
            "agent": spec.name,
            "project_id": self.record.project_id,
            "tool_names": tool_names,
            "additional_context": self.additional_context,
            "context": self.state.agent_results.get("context_builder").cloned().unwrap_or_default(),
            "plan": plan,
        })
    }

    async fn run_agent(&mut self, spec: &AgentSpec) -> Result<(), RunError> {
        let started = std::time::Instant::now();
        let tools = self.policy.tools(spec.tools, spec.mcp);
        let schemas: Vec<_> = tools.iter().map(|t| t.schema()).collect();
        let tool_names: Vec<&str> = schemas.iter().map(|t| t.name.as_str()).collect();
        let definition = self.prompt(spec)?;
        let inputs = self.prompt_inputs(spec, &tool_names);
        let rendered = definition
            .render(&self.services.prompts, &inputs)
            .map_err(|e| RunError::failure("PromptError", e))?;
        let system = role_text(&rendered, TemplateRole::System);
        if self.state.conversation(spec.name).is_empty() {
            let first = role_text(&rendered, TemplateRole::User);
            self.state
                .conversation(spec.name)
                .push(Message::human(first));
        }
        let route = route_for(&self.services.providers, &definition, &self.model)
            .map_err(|e| RunError::failure("ModelChoiceError", e))?;
        if self.small_model(&route) {
            self.guided = true;
            return self.run_guided(spec, &route).await;
        }
        self.count_model_call()?;
        let params = definition.model_params();
        self.fit_conversation(spec, &route, &system, params.max_tokens)
            .await?;
        let prepared = started.elapsed();
        let messages = self
            .state
            .conversation_history
            .get(spec.name)
            .cloned()
            .unwrap_or_default();
        let turn = self
            .call_model(spec.name, &route, &system, &messages, &schemas, &params)
            .await?;
        tracing::debug!(
            agent = spec.name,
            prepare_ms = prepared.as_secs_f64() * 1000.0,
            model_ms = (started.elapsed() - prepared).as_secs_f64() * 1000.0,
            "agent step timed"
        );
        self.take_turn(spec, turn, &route);
        Ok(())
    }

    /// One model call; a call whose connection failed or broke is made
    /// again (the node is retried, the run goes on): what the model is asked
    /// is the same, and no tool has run for this turn yet.
    async fn call_model(
        &self,
        agent: &str,
        route: &ModelRoute,
        system: &str,
        messages: &[Message],
        schemas: &[ToolSchema],
        params: &ModelParams,
    ) -> Result<ModelTurn, RunError> {
        let mut retry = 0;
        loop {
            let attempt = self
                .services
                .model
                .complete(
                    route,
                    system,
                    messages,
                    schemas,
                    params,
                    TurnOptions {
                        require_call: false,
                        feature_category: WORKFLOW_FEATURE_CATEGORY,
                        wait_clock: None,
                    },
                )
                .await;
            match attempt {
                Err(err) if err.is_transient() && retry < MODEL_NODE_RETRIES => {
                    retry += 1;
                    let pause = model_retry_pause(retry);
                    tracing::info!(
                        agent,
                        attempt = retry,
                        error = %err,
                        "a model call of the run failed; retrying the node"
                    );
                    tokio::time::sleep(pause).await;
                }
                other => return other.map_err(|e| RunError::failure("ModelError", e)),
            }
        }
    }

    /// Counts a model call against the stream's limit.
    fn count_model_call(&mut self) -> Result<(), RunError> {
        if self.model_calls >= self.services.config.max_model_calls {
            return Err(RunError::failure(
                "StepLimit",
                format!(
                    "the run made {} model calls, the most one stream may make",
                    self.model_calls
                ),
            ));
        }
        self.model_calls += 1;
        Ok(())
    }

    /// The model's context size when known (configured, or reported by
    /// the bundled server).
    async fn context_of(&self, route: &ModelRoute) -> Option<(String, u32)> {
        self.services
            .context_windows
            .for_route(&self.services.providers, route)
            .await
    }

    /// Whether `route` goes to the bundled model, which cannot choose tools
    /// (the chat agent makes the same call, `chat::agent`).
    fn small_model(&self, route: &ModelRoute) -> bool {
        matches!(route, ModelRoute::OpenAi { base_url, .. }
            if *base_url == self.services.providers.local_llm_url)
    }

    /// Drops the oldest exchanges of `spec`'s conversation until the prompt
    /// fits the service's limit and the model's context (its answer's
    /// `max_tokens` kept free); a prompt that cannot fit fails the run with
    /// the sizes and what to change.
    async fn fit_conversation(
        &mut self,
        spec: &AgentSpec,
        route: &ModelRoute,
        system: &str,
        max_tokens: u32,
    ) -> Result<(), RunError> {
        let window = self.context_of(route).await;
        let mut limit = self.services.config.max_context_tokens;
        if let Some((_, context)) = &window {
            let reserve = max_tokens.min(context / 4);
            limit = limit.min(context.saturating_sub(reserve) as usize);
        }
        let system_tokens = crate::chat::budget::estimate_tokens(system.len());
        let budget = limit.saturating_sub(system_tokens);
        let conversation = self.state.conversation(spec.name);
        trim_context(conversation, budget);
        let needed = system_tokens
            + conversation
                .iter()
                .map(Message::estimated_tokens)
                .sum::<usize>();
        match window {
            Some((model, context)) if needed > limit => Err(RunError::failure(
                "ContextTooSmall",
                format!(
                    "the {} agent's prompt needs about {needed} tokens, and the model {model} \
                     holds {context} (with room for its answer) even after dropping earlier \
                     steps: choose a model with a larger context (the bundled model server: \
                     DUO_LOCAL_LLM_CONTEXT), or give a shorter goal and less attached context",
                    spec.name
                ),
            )),
            _ => Ok(()),
        }
    }

    /// A step of a run on a model too small to choose tools: the service
    /// takes it ([`guided_edit`]); the model writes only text.
    async fn run_guided(&mut self, spec: &AgentSpec, route: &ModelRoute) -> Result<(), RunError> {
        let turn = match guided_edit::read_goal(&self.state.goal) {
            Goal::Question if self.flow == Flow::Chat => self.plain_answer(spec, route).await?,
            Goal::Question => {
                self.decline(spec, "The goal asks for no change to a file.");
                return Ok(());
            }
            Goal::Beyond(reason) => {
                self.decline(spec, &reason);
                return Ok(());
            }
            Goal::Edit(goal) => {
                let conversation = self.state.conversation(spec.name).clone();
                match guided_edit::next_step(spec.name, &goal, &conversation) {
                    Step::Call { text, call } => ModelTurn {
                        text,
                        tool_calls: vec![call],
                        invalid_calls: Vec::new(),
                    },
                    Step::Finish(text) => ModelTurn {
                        text,
                        tool_calls: Vec::new(),
                        invalid_calls: Vec::new(),
                    },
                    Step::Write { contents } => {
                        let existing = contents.as_deref().unwrap_or_default();
                        let mut text = None;
                        // A reply that only talks about the task is asked
                        // for once more, more plainly.
                        for retry in [false, true] {
                            let reply = self
                                .write_text(&goal, contents.as_deref(), route, retry)
                                .await?;
                            text =
                                guided_edit::clean_text(&reply, existing, &goal, &self.state.goal);
                            if text.is_some() {
                                break;
                            }
                        }
                        let edit = text
                            .ok_or_else(|| {
                                format!(
                                    "The model's reply held no text to add to {} (it talked about \
                                 the task instead), so nothing was changed.",
                                    goal.path
                                )
                            })
                            .and_then(|text| {
                                guided_edit::edit_call(
                                    &conversation,
                                    &goal,
                                    contents.as_deref(),
                                    &text,
                                )
                            });
                        match edit {
                            Ok(call) => ModelTurn {
                                text: format!("Proposing an edit of {}.", goal.path),
                                tool_calls: vec![call],
                                invalid_calls: Vec::new(),
                            },
                            Err(reason) => {
                                self.decline(spec, &reason);
                                return Ok(());
                            }
                        }
                    }
                }
            }
        };
        self.take_turn(spec, turn, route);
        Ok(())
    }

    /// Ends the run with what the service could not do and what to do
    /// instead; nothing was changed, and the run's last entry says so.
    fn decline(&mut self, spec: &AgentSpec, reason: &str) {
        let text = guided_edit::decline_message(reason);
        self.state.conversation(spec.name).push(Message::AiMessage {
            content: text.clone(),
            tool_calls: Vec::new(),
        });
        self.state
            .ui_chat_log
            .push(UiChatLogEntry::new("agent", text.clone()));
        self.state.agent_results.insert(spec.name.to_owned(), text);
        self.state.next_node = None;
    }

    /// The small model's text for a guided edit.
    async fn write_text(
        &mut self,
        goal: &guided_edit::EditGoal,
        contents: Option<&str>,
        route: &ModelRoute,
        retry: bool,
    ) -> Result<String, RunError> {
        let registry = &self.services.prompts;
        let definition = registry
            .resolve(guided_edit::WRITE_TEXT_PROMPT, "openai", None)
            .map_err(|e| RunError::failure("PromptError", e))?;
        let mut params = definition.model_params();
        if goal.one_line {
            params.max_tokens = params.max_tokens.min(64);
        }
        // The file as far as it fits the model's context beside the
        // instructions and the answer.
        let mut shown = guided_edit::MAX_SHOWN_CHARS;
        if let Some((_, context)) = self.context_of(route).await {
            let free = (context as usize).saturating_sub(params.max_tokens as usize + 300);
            shown = shown.min(free * crate::chat::budget::CHARS_PER_TOKEN);
        }
        let inputs = json!({
            "goal": self.state.goal,
            "file_path": goal.path,
            "file_content": guided_edit::shown_contents(contents.unwrap_or_default().trim_end(), shown),
            "new_file": contents.is_none(),
            "one_line": goal.one_line,
            "what": goal.what,
            "retry": retry,
        });
        let rendered = definition
            .render(registry, &inputs)
            .map_err(|e| RunError::failure("PromptError", e))?;
        let (system, user) = (
            role_text(&rendered, TemplateRole::System),
            role_text(&rendered, TemplateRole::User),
        );
        self.count_model_call()?;
        let turn = self
            .call_model(
                "write_text",
                route,
                &system,
                &[Message::human(user)],
                &[],
                &params,
            )
            .await?;
        Ok(turn.text)
    }

    /// A question to the chat flow on the small model: answered in plain
    /// text from the agent's own prompt, offered no tools.
    async fn plain_answer(
        &mut self,
        spec: &AgentSpec,
        route: &ModelRoute,
    ) -> Result<ModelTurn, RunError> {
        let definition = self.prompt(spec)?;
        let inputs = self.prompt_inputs(spec, &[]);
        let rendered = definition
            .render(&self.services.prompts, &inputs)
            .map_err(|e| RunError::failure("PromptError", e))?;
        let system = role_text(&rendered, TemplateRole::System);
        let mut params = definition.model_params();
        params.max_tokens = params
            .max_tokens
            .min(crate::chat::native::BUNDLED_ANSWER_TOKENS);
        params.dry_multiplier = Some(crate::chat::native::BUNDLED_DRY_MULTIPLIER);
        self.count_model_call()?;
        self.fit_conversation(spec, route, &system, params.max_tokens)
            .await?;
        let messages = self.state.conversation(spec.name).clone();
        let mut turn = self
            .call_model(spec.name, route, &system, &messages, &[], &params)
            .await?;
        // Offered no tools, it has none to call.
        turn.tool_calls.clear();
        turn.invalid_calls.clear();
        Ok(turn)
    }

    /// Records the model's turn and decides where the graph goes.
    fn take_turn(&mut self, spec: &AgentSpec, turn: ModelTurn, _route: &ModelRoute) {
        let ModelTurn {
            text,
            tool_calls,
            invalid_calls,
        } = turn;
        // PostgreSQL's jsonb refuses NUL characters, and checkpoints carry this.
        let text = text.replace('\0', "\u{fffd}");
        let mut tool_calls = tool_calls;
        for call in &mut tool_calls {
            scrub_nul(&mut call.args);
        }
        let mut all_calls = tool_calls.clone();
        all_calls.extend(invalid_calls.iter().map(|(id, name, _)| ToolCall {
            id: id.clone(),
            name: name.clone(),
            args: json!({}),
        }));
        self.state.conversation(spec.name).push(Message::AiMessage {
            content: text.clone(),
            tool_calls: all_calls,
        });
        if !text.trim().is_empty() {
            self.state
                .ui_chat_log
                .push(UiChatLogEntry::new("agent", text.clone()));
        }
        // Invalid calls are answered right away so the model can correct
        // itself; the valid ones go on.
        let mut valid = Vec::new();
        let mut answered_invalid = false;
        for (id, name, reason) in invalid_calls {
            let call = ToolCall {
                id,
                name,
                args: json!({}),
            };
            self.state.conversation(spec.name).push(Message::tool(
                &call,
                format!("Invalid tool call: {reason}. Fix the call and try again."),
                true,
            ));
            answered_invalid = true;
        }
        for call in tool_calls {
            let problem = match self.policy.find(&call.name) {
                Some(tool) if !spec.offers(tool) => Some(format!(
                    "the tool {} is not available to this workflow",
                    call.name
                )),
                Some(tool) => match self.policy.refusal(tool) {
                    Some(refusal) => Some(refusal.message(&call.name)),
                    None => tools::validate_args(tool, &call.args).err(),
                },
                None => Some(format!("there is no tool named {}", call.name)),
            };
            match problem {
                Some(reason) => {
                    self.state.conversation(spec.name).push(Message::tool(
                        &call,
                        format!("Invalid tool call: {reason}. Fix the call and try again."),
                        true,
                    ));
                    answered_invalid = true;
                }
                None => valid.push(call),
            }
        }
        if valid.is_empty() {
            if answered_invalid {
                self.state.next_node = Some(spec.name.to_owned());
            } else {
                self.state.agent_results.insert(spec.name.to_owned(), text);
                self.state.next_node = spec.done.map(str::to_owned);
                if spec.name == "planner" && self.state.plan.steps.is_empty() {
                    self.plan_from_text();
                }
            }
            return;
        }
        let needs_approval: Vec<&ToolCall> = valid
            .iter()
            .filter(|c| {
                self.policy
                    .find(&c.name)
                    .is_some_and(|t| self.policy.needs_approval(t))
            })
            .collect();
        for call in &needs_approval {
            let mut entry = UiChatLogEntry::new(
                "request",
                format!(
                    "Tool {} requires approval. Please confirm if you want to proceed.",
                    call.name
                ),
            );
            entry.status = Some("pending".to_owned());
            entry.correlation_id = Some(call.id.clone());
            entry.tool_info = Some(ToolInfo {
                name: call.name.clone(),
                args: call.args.clone(),
                tool_response: None,
            });
            self.state.ui_chat_log.push(entry);
        }
        if !needs_approval.is_empty() {
            self.state.status = WorkflowStatus::ToolCallApprovalRequired;
            self.state.pending_agent = Some(spec.name.to_owned());
        } else {
            self.state.status = WorkflowStatus::Execution;
        }
        self.state.pending_tool_calls = valid;
        self.state.next_node = Some(format!("{}{TOOLS_SUFFIX}", spec.name));
    }

    fn plan_from_text(&mut self) {
        let text = self
            .state
            .agent_results
            .get("planner")
            .cloned()
            .unwrap_or_default();
        let steps = text
            .lines()
            .map(|l| l.trim().trim_start_matches(['-', '*', ' ']).trim())
            .map(|l| {
                l.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                    .trim()
            })
            .filter(|l| !l.is_empty());
        self.set_plan(steps.map(str::to_owned).collect());
    }

    fn set_plan(&mut self, steps: Vec<String>) {
        self.state.plan.steps = steps
            .into_iter()
            .take(50)
            .enumerate()
            .map(|(n, description)| PlanStep {
                id: format!("task-{n}"),
                description,
                status: "Not Started".to_owned(),
            })
            .collect();
    }

    async fn run_tools(&mut self, spec: &AgentSpec) -> Result<(), RunError> {
        let pending = std::mem::take(&mut self.state.pending_tool_calls);
        let mut next = Some(spec.name.to_owned());
        for call in pending {
            let kind = self.policy.find(&call.name).map(|tool| tool.kind);
            let result = match kind {
                // An MCP tool approved in an earlier stream whose executor
                // no longer offers it: the model hears so and goes on.
                None => ToolResult::error(format!(
                    "The tool {} is unavailable: this executor does not offer it.",
                    call.name
                )),
                Some(kind) => self.run_tool(kind, &call, spec, &mut next).await?,
            };
            let mut entry = UiChatLogEntry::new("tool", format!("Used tool {}", call.name));
            entry.status = Some(
                if result.is_error {
                    "failure"
                } else {
                    "success"
                }
                .to_owned(),
            );
            entry.correlation_id = Some(call.id.clone());
            entry.tool_info = Some(ToolInfo {
                name: call.name.clone(),
                args: call.args.clone(),
                tool_response: Some(result.content.chars().take(2000).collect()),
            });
            self.state.ui_chat_log.push(entry);
            self.state.conversation(spec.name).push(Message::tool(
                &call,
                result.content,
                result.is_error,
            ));
        }
        self.state.status = WorkflowStatus::Execution;
        self.state.next_node = next;
        Ok(())
    }

    async fn run_tool(
        &mut self,
        kind: ToolKind,
        call: &ToolCall,
        spec: &AgentSpec,
        next: &mut Option<String>,
    ) -> Result<ToolResult, RunError> {
        Ok(match kind {
            ToolKind::WorkspaceRead | ToolKind::Executor => {
                tools::run_executor_tool(&self.link, call, self.command_timeout).await?
            }
            ToolKind::GitLab => {
                tools::run_gitlab_tool(&self.monolith, call, self.record.project_id).await?
            }
            ToolKind::Mcp => mcp_tools::run(&self.link, call).await?,
            ToolKind::Internal => {
                let steps: Vec<String> = call.args["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect();
                self.set_plan(steps);
                // The plan is the planner's last word.
                *next = spec.done.map(str::to_owned);
                ToolResult {
                    content: "The plan is recorded.".to_owned(),
                    is_error: false,
                }
            }
        })
    }
}

/// The rendered templates of one role, one paragraph each.
fn role_text(rendered: &[RenderedMessage], role: TemplateRole) -> String {
    rendered
        .iter()
        .filter(|m| m.role == role)
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The executor's MCP tools this run offers: none unless the monolith says
/// the workflow may use MCP (instance, group and allow-list switches) and
/// the workflow holds the `run_mcp_tools` privilege.
fn run_mcp_tools(
    workflow_id: &str,
    record: &WorkflowRecord,
    start: &StartWorkflowRequest,
) -> Vec<ToolSpec> {
    if start.mcp_tools.is_empty() {
        return Vec::new();
    }
    let privileged = record
        .agent_privileges
        .contains(&(tools::Privilege::RunMcpTools as i64));
    if !record.mcp_enabled || !privileged {
        tracing::info!(
            workflow_id,
            offered = start.mcp_tools.len(),
            mcp_enabled = record.mcp_enabled,
            privileged,
            "the executor's MCP tools are not used by this workflow"
        );
        return Vec::new();
    }
    let offered = mcp_tools::offered(&start.mcp_tools);
    for reason in &offered.refused {
        tracing::info!(workflow_id, reason, "an MCP tool was left out");
    }
    offered.tools
}

/// Tool names the client pre-approved for the session; honoured only when
/// the workflow metadata enables session approvals (as GitLab does).
fn session_approved_tools(start: &StartWorkflowRequest) -> BTreeSet<String> {
    let enabled = serde_json::from_str::<Value>(&start.workflow_metadata)
        .ok()
        .and_then(|m| m["tool_approval_for_session_enabled"].as_bool())
        .unwrap_or(false);
    if !enabled {
        return BTreeSet::new();
    }
    start.preapproved_tools.iter().cloned().collect()
}

/// The start request's additional context as text for the first prompt.
fn additional_context_text(start: &StartWorkflowRequest) -> String {
    start
        .additional_context
        .iter()
        .take(20)
        .map(|item| {
            let content: String = item
                .content
                .as_deref()
                .unwrap_or_default()
                .chars()
                .take(20_000)
                .collect();
            format!(
                "<{category} id={id:?}>\n{content}\n</{category}>",
                category = item
                    .category
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>(),
                id = item.id.as_deref().unwrap_or_default(),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Replaces NUL characters in every string of `value`.
fn scrub_nul(value: &mut Value) {
    match value {
        Value::String(text) if text.contains('\0') => *text = text.replace('\0', "\u{fffd}"),
        Value::Array(items) => items.iter_mut().for_each(scrub_nul),
        Value::Object(map) => map.values_mut().for_each(scrub_nul),
        _ => {}
    }
}

/// Drops the oldest exchanges (an AI turn with its tool results) after the
/// first message until the estimate fits `budget` tokens.
pub fn trim_context(conversation: &mut Vec<Message>, budget: usize) {
    let total = |c: &[Message]| c.iter().map(Message::estimated_tokens).sum::<usize>();
    while conversation.len() > 2 && total(conversation) > budget {
        conversation.remove(1);
        // Tool results without their call would be refused by providers.
        while conversation.len() > 1 && matches!(conversation[1], Message::ToolMessage { .. }) {
            conversation.remove(1);
        }
    }
}

/// Retries of one model node after a failed connection, before the run fails.
const MODEL_NODE_RETRIES: u32 = 3;

/// 500 ms doubling per retry, plus up to half of it again as jitter.
fn model_retry_pause(retry: u32) -> std::time::Duration {
    let base_ms = 500u64 << retry.saturating_sub(1).min(3);
    std::time::Duration::from_millis(base_ms + rand::random_range(0..=base_ms / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_events_follow_the_monolith_status() {
        assert_eq!(initial_event("created"), Ok("start"));
        assert_eq!(initial_event("tool_call_approval_required"), Ok("resume"));
        assert_eq!(initial_event("running"), Ok("retry"));
        assert_eq!(initial_event("stopped"), Ok("retry"));
        assert!(initial_event("finished").is_err());
    }

    #[test]
    fn flows_by_name() {
        assert_eq!(Flow::named("chat"), Some(Flow::Chat));
        assert_eq!(
            Flow::named("software_development"),
            Some(Flow::SoftwareDevelopment)
        );
        assert_eq!(Flow::named("nope"), None);
        assert!(!valid_workflow_id("1/../2"));
        assert!(valid_workflow_id("42"));
    }

    #[test]
    fn trimming_keeps_the_goal_and_whole_exchanges() {
        let call = ToolCall {
            id: "1".into(),
            name: "read_file".into(),
            args: json!({}),
        };
        let mut conversation = vec![
            Message::human("goal"),
            Message::AiMessage {
                content: "x".repeat(400),
                tool_calls: vec![call.clone()],
            },
            Message::tool(&call, "y".repeat(4000), false),
            Message::human("latest"),
        ];
        trim_context(&mut conversation, 50);
        assert_eq!(conversation.len(), 2);
        assert_eq!(conversation[0], Message::human("goal"));
        assert_eq!(conversation[1], Message::human("latest"));
    }
}
