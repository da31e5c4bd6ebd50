//! Runs of the product as a signed-in person starts and steers them (the web
//! app's "Run with Duo", the workflows page's start form, the run page's
//! Approve, Reject and Stop): who may start one, what it is started with, the
//! events that steer it, and what its page shows of it. The REST API drives
//! the same [`super::runs`] functions with its own parameters.

use super::creation::CreateRequest;
use super::events::{self, Event};
use super::runs::{self, EventReaction};
use super::store::{self, NewWorkflow, Workflow};
use super::{Caller, Status, WorkflowError};
use crate::policy::{Actor, Policy, Subject};
use crate::queries::Queries;

/// The flow a run started from the web app follows: it edits the code and
/// ends in a merge request.
pub const RUN_DEFINITION: &str = "software_development";
/// Files (read and write), GitLab (read) and commands: what the flow needs
/// to change code and check it, in the sandbox.
pub const RUN_PRIVILEGES: &[i64] = &[1, 2, 4];
/// Only reading GitLab goes without asking; every edit and command waits for
/// the user's approval.
pub const RUN_PRE_APPROVED_PRIVILEGES: &[i64] = &[2];
/// Most characters of an issue's description put into a goal.
pub const ISSUE_DESCRIPTION_MAX_CHARS: usize = 4000;
/// Longest message sent with a rejection (what a leg can carry).
pub const REJECT_MESSAGE_MAX_CHARS: usize = 4096;
/// Most characters of a leg's log shown on the run's page (its end).
pub const LOG_TAIL_SHOWN_CHARS: usize = 20_000;

/// Whether `user` may start runs of the product in the project, as the
/// instance's service account where one is configured (what the REST API
/// asks for `start_workflow`; [`super::creation::create`] asks it again).
pub async fn may_start_run(
    db: &impl Queries,
    policy: &Policy,
    user: Actor,
    project_id: i64,
) -> Result<bool, WorkflowError> {
    let service_account = store::instance_service_account(db).await?;
    policy
        .can_run_duo_workflow_as(db, user, service_account, Subject::Project(project_id))
        .await
        .map_err(|crate::policy::PolicyError::Db(e)| WorkflowError::Db(e))
}

/// A run of the product as the web app starts one: a software-development
/// workflow that edits the code and ends in a merge request, started now.
/// It is created by [`super::creation::create`], the path REST and GraphQL
/// take, so the same checks apply (who may run it as which service account,
/// the issue, the runner, the repository and the branch).
pub fn product_run(
    project_id: i64,
    goal: String,
    source_branch: Option<String>,
    issue_iid: Option<i32>,
) -> CreateRequest {
    CreateRequest {
        workflow: NewWorkflow {
            container: Some(Subject::Project(project_id)),
            goal: Some(goal),
            workflow_definition: Some(RUN_DEFINITION.to_owned()),
            agent_privileges: Some(RUN_PRIVILEGES.to_vec()),
            pre_approved_agent_privileges: Some(RUN_PRE_APPROVED_PRIVILEGES.to_vec()),
            allow_agent_to_request_user: Some(true),
            source_branch,
            ..NewWorkflow::default()
        },
        start: true,
        issue_iid,
    }
}

/// The goal of a run on an issue: its number, title and description (cut
/// to [`ISSUE_DESCRIPTION_MAX_CHARS`]), without NUL characters.
pub fn issue_goal(iid: i32, title: &str, description: &str) -> String {
    let description = description.trim();
    let mut kept: String = description
        .chars()
        .take(ISSUE_DESCRIPTION_MAX_CHARS)
        .collect();
    if kept.len() < description.len() {
        kept.push_str("\n[…]");
    }
    let mut goal = format!("Resolve issue #{iid}: {}", title.trim());
    if !kept.is_empty() {
        goal.push_str("\n\n");
        goal.push_str(&kept);
    }
    goal.replace('\0', "")
}

/// What a person can send to a run from its page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steer {
    Stop,
    Approve,
    /// Turn down what the run waits for, with what to do instead.
    Reject(String),
}

/// Sends `steer` to a workflow as its events API would (the event is stored,
/// then the product acts on it). A run of the product that waits for an
/// answer takes it only once its leg has ended (its work is saved); before
/// that, when it waits for nothing, and for a workflow the product does not
/// run (its executor answers its user itself), the answer is refused.
pub async fn steer(
    pool: &deadpool_postgres::Pool,
    config: &crate::config::Config,
    workflow: &Workflow,
    steer: &Steer,
    caller: Caller,
) -> Result<EventReaction, WorkflowError> {
    let (kind, message) = match steer {
        Steer::Stop => ("stop", ""),
        Steer::Approve => ("resume", ""),
        Steer::Reject(message) => ("response", message.as_str()),
    };
    if message.chars().count() > REJECT_MESSAGE_MAX_CHARS {
        return Err(WorkflowError::invalid(
            "message",
            format!("is too long (maximum is {REJECT_MESSAGE_MAX_CHARS} characters)"),
        ));
    }
    let event: Event = {
        let db = pool.get().await?;
        if *steer != Steer::Stop {
            match runs::latest(&*db, workflow.id).await? {
                None => {
                    return Err(WorkflowError::Refused(
                        "This workflow is not run by the product: answer it where it runs".into(),
                    ));
                }
                Some(leg) if leg_is_active(&leg.state) => {
                    return Err(WorkflowError::Conflict(
                        "Duo is still saving the run's work: answer once it waits for you".into(),
                    ));
                }
                Some(_) => {}
            }
        }
        events::create(&*db, workflow, Some(kind), Some(message), None).await?
    };
    runs::react_to_event(pool, config, workflow.id, &event, caller).await
}

/// Whether a leg in `state` is waiting to run or running.
pub fn leg_is_active(state: &str) -> bool {
    matches!(state, "queued" | "running")
}

/// One leg as a run's page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegView {
    pub leg: i32,
    pub state: String,
    pub failure_reason: Option<String>,
    /// The end of the executor's output ([`LOG_TAIL_SHOWN_CHARS`] at most).
    pub log_tail: Option<String>,
}

/// What a run's page shows besides the workflow itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunView {
    /// Oldest first; empty for a workflow the product does not run.
    pub legs: Vec<LegView>,
    /// The newest leg's place in the queue while it waits.
    pub queue_position: Option<i64>,
    pub source_branch: Option<String>,
    pub result_branch: Option<String>,
    /// The IID of the merge request the run opened.
    pub merge_request_iid: Option<i32>,
    /// The IID of the issue the run works on.
    pub issue_iid: Option<i32>,
}

impl RunView {
    /// Whether the product runs this workflow.
    pub fn is_product_run(&self) -> bool {
        !self.legs.is_empty()
    }

    /// Whether a leg is waiting or running (the page follows it).
    pub fn is_active(&self) -> bool {
        self.legs.last().is_some_and(|l| leg_is_active(&l.state))
    }

    /// Whether the run waits for its user's answer, its leg ended.
    pub fn awaits_answer(&self, status: Status) -> bool {
        self.is_product_run()
            && !self.is_active()
            && matches!(
                status,
                Status::PlanApprovalRequired
                    | Status::ToolCallApprovalRequired
                    | Status::InputRequired
            )
    }
}

/// The legs, queue place and results of a workflow.
pub async fn run_view(db: &impl Queries, workflow_id: i64) -> Result<RunView, WorkflowError> {
    let legs: Vec<LegView> = db
        .query(
            "SELECT leg, state, failure_reason, log_tail FROM duo_workflow_workloads
             WHERE workflow_id = $1 ORDER BY leg",
            &[&workflow_id],
        )
        .await?
        .iter()
        .map(|row| LegView {
            leg: row.get(0),
            state: row.get(1),
            failure_reason: row.get(2),
            log_tail: row
                .get::<_, Option<String>>(3)
                .filter(|t| !t.trim().is_empty())
                .map(|t| super::runners::tail(&t, LOG_TAIL_SHOWN_CHARS)),
        })
        .collect();
    let queue_position = match runs::latest(db, workflow_id).await? {
        Some(leg) if leg.state == "queued" => runs::queue_position(db, leg.id).await?,
        _ => None,
    };
    let row = db
        .query_one(
            "SELECT w.source_branch, w.result_branch, m.iid, i.iid
             FROM duo_workflows_workflows w
             LEFT JOIN merge_requests m ON m.id = w.merge_request_id
             LEFT JOIN issues i ON i.id = w.issue_id
             WHERE w.id = $1",
            &[&workflow_id],
        )
        .await?;
    Ok(RunView {
        legs,
        queue_position,
        source_branch: row.get(0),
        result_branch: row.get(1),
        merge_request_iid: row.get(2),
        issue_iid: row.get(3),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issue_goal_is_bounded_and_clean() {
        assert_eq!(
            issue_goal(3, " Fix login ", "Steps:\n1. Sign in\0"),
            "Resolve issue #3: Fix login\n\nSteps:\n1. Sign in"
        );
        assert_eq!(issue_goal(1, "Title", "  "), "Resolve issue #1: Title");
        let long = issue_goal(1, "T", &"é".repeat(ISSUE_DESCRIPTION_MAX_CHARS + 10));
        assert!(long.ends_with("\n[…]"));
        assert_eq!(
            long.chars().filter(|c| *c == 'é').count(),
            ISSUE_DESCRIPTION_MAX_CHARS
        );
        assert!(long.chars().count() < store::GOAL_MAX_CHARS);
    }

    #[test]
    fn a_run_waits_for_an_answer_only_once_its_leg_ended() {
        let leg = |state: &str| LegView {
            leg: 1,
            state: state.into(),
            failure_reason: None,
            log_tail: None,
        };
        let view = |state: &str| RunView {
            legs: vec![leg(state)],
            ..RunView::default()
        };
        assert!(view("paused").awaits_answer(Status::PlanApprovalRequired));
        assert!(!view("running").awaits_answer(Status::PlanApprovalRequired));
        assert!(!view("paused").awaits_answer(Status::Running));
        assert!(!RunView::default().awaits_answer(Status::ToolCallApprovalRequired));
        assert!(view("queued").is_active());
    }
}
