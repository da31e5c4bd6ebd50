//! The workflow status state machine: GitLab's 9 states, 10 events and the
//! answers `UpdateWorkflowStatusService` gives, as plain functions. Applying a
//! decision atomically is [`super::store::apply_status_event`]'s job.

/// A workflow's status, stored as GitLab's small integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
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

impl Status {
    pub const ALL: [Status; 9] = [
        Status::Created,
        Status::Running,
        Status::Paused,
        Status::Finished,
        Status::Failed,
        Status::Stopped,
        Status::InputRequired,
        Status::PlanApprovalRequired,
        Status::ToolCallApprovalRequired,
    ];

    pub fn code(self) -> i16 {
        match self {
            Status::Created => 0,
            Status::Running => 1,
            Status::Paused => 2,
            Status::Finished => 3,
            Status::Failed => 4,
            Status::Stopped => 5,
            Status::InputRequired => 6,
            Status::PlanApprovalRequired => 7,
            Status::ToolCallApprovalRequired => 8,
        }
    }

    pub fn from_code(code: i16) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.code() == code)
    }

    /// The state's name (`tool_call_approval_required`), as the REST API shows it.
    pub fn name(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Finished => "finished",
            Status::Failed => "failed",
            Status::Stopped => "stopped",
            Status::InputRequired => "input_required",
            Status::PlanApprovalRequired => "plan_approval_required",
            Status::ToolCallApprovalRequired => "tool_call_approval_required",
        }
    }

    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The state machine's human name (`tool call approval required`), which
    /// GitLab's refusals quote.
    pub fn human_name(self) -> String {
        self.name().replace('_', " ")
    }

    /// GraphQL's `DuoWorkflowStatus` value and the checkpoint status the
    /// service reports (`TOOL_CALL_APPROVAL_REQUIRED`).
    pub fn upper_name(self) -> String {
        self.name().to_ascii_uppercase()
    }

    /// GitLab's status groups: active, paused, awaiting_input, completed,
    /// failed, canceled.
    pub fn group(self) -> &'static str {
        match self {
            Status::Created | Status::Running => "active",
            Status::Paused => "paused",
            Status::InputRequired
            | Status::PlanApprovalRequired
            | Status::ToolCallApprovalRequired => "awaiting_input",
            Status::Finished => "completed",
            Status::Failed => "failed",
            Status::Stopped => "canceled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Finished | Status::Failed | Status::Stopped)
    }
}

/// A status event (GitLab's `status_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusEvent {
    Start,
    Pause,
    RequireInput,
    RequirePlanApproval,
    RequireToolCallApproval,
    Resume,
    Retry,
    Finish,
    Drop,
    Stop,
}

const AWAITING: [Status; 4] = [
    Status::Paused,
    Status::InputRequired,
    Status::PlanApprovalRequired,
    Status::ToolCallApprovalRequired,
];

const UNFINISHED: [Status; 6] = [
    Status::Created,
    Status::Running,
    Status::Paused,
    Status::InputRequired,
    Status::PlanApprovalRequired,
    Status::ToolCallApprovalRequired,
];

impl StatusEvent {
    pub const ALL: [StatusEvent; 10] = [
        StatusEvent::Start,
        StatusEvent::Pause,
        StatusEvent::RequireInput,
        StatusEvent::RequirePlanApproval,
        StatusEvent::RequireToolCallApproval,
        StatusEvent::Resume,
        StatusEvent::Retry,
        StatusEvent::Finish,
        StatusEvent::Drop,
        StatusEvent::Stop,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StatusEvent::Start => "start",
            StatusEvent::Pause => "pause",
            StatusEvent::RequireInput => "require_input",
            StatusEvent::RequirePlanApproval => "require_plan_approval",
            StatusEvent::RequireToolCallApproval => "require_tool_call_approval",
            StatusEvent::Resume => "resume",
            StatusEvent::Retry => "retry",
            StatusEvent::Finish => "finish",
            StatusEvent::Drop => "drop",
            StatusEvent::Stop => "stop",
        }
    }

    pub fn parse(name: &str) -> Option<StatusEvent> {
        StatusEvent::ALL.into_iter().find(|e| e.name() == name)
    }

    /// The status the event leads to.
    pub fn target(self) -> Status {
        match self {
            StatusEvent::Start | StatusEvent::Resume | StatusEvent::Retry => Status::Running,
            StatusEvent::Pause => Status::Paused,
            StatusEvent::RequireInput => Status::InputRequired,
            StatusEvent::RequirePlanApproval => Status::PlanApprovalRequired,
            StatusEvent::RequireToolCallApproval => Status::ToolCallApprovalRequired,
            StatusEvent::Finish => Status::Finished,
            StatusEvent::Drop => Status::Failed,
            StatusEvent::Stop => Status::Stopped,
        }
    }

    /// The statuses the event may fire from.
    pub fn sources(self) -> &'static [Status] {
        match self {
            StatusEvent::Start => &[Status::Created],
            StatusEvent::Pause
            | StatusEvent::RequireInput
            | StatusEvent::RequirePlanApproval
            | StatusEvent::RequireToolCallApproval
            | StatusEvent::Finish => &[Status::Running],
            StatusEvent::Resume => &AWAITING,
            StatusEvent::Retry => &[Status::Running, Status::Stopped, Status::Failed],
            StatusEvent::Drop | StatusEvent::Stop => &UNFINISHED,
        }
    }
}

/// What a status event does to a workflow in a given status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The workflow moves from one status to the other.
    Fire { from: Status, to: Status },
    /// It is already where the event leads: success, nothing changes
    /// ("Workflow already in status running").
    Already { message: String },
    /// Refused with 400 and this message.
    Refused { message: String },
}

/// GitLab's decision for `event_name` on a workflow in `current`, in its
/// order: an unknown event, then "already there", then "not from here".
pub fn decide(current: Status, event_name: &str) -> Decision {
    let Some(event) = StatusEvent::parse(event_name) else {
        return Decision::Refused {
            message: format!("Can not update workflow status, unsupported event: {event_name}"),
        };
    };
    let target = event.target();
    if target == current {
        return Decision::Already {
            message: format!("Workflow already in status {}", current.human_name()),
        };
    }
    if !event.sources().contains(&current) {
        return Decision::Refused {
            message: format!(
                "Can not {} workflow that has status {}",
                event.name(),
                current.human_name()
            ),
        };
    }
    Decision::Fire {
        from: current,
        to: target,
    }
}

/// The event that moves a workflow into `status` from a running one, as the
/// service reports it in a checkpoint (`FINISHED` → `finish`); `None` when
/// no event leads there from `running`.
pub fn event_into(status: Status) -> Option<StatusEvent> {
    StatusEvent::ALL
        .into_iter()
        .find(|e| e.target() == status && e.sources().contains(&Status::Running))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
            assert_eq!(Status::from_name(s.name()), Some(s));
        }
        for e in StatusEvent::ALL {
            assert_eq!(StatusEvent::parse(e.name()), Some(e));
        }
        assert_eq!(
            Status::ToolCallApprovalRequired.human_name(),
            "tool call approval required"
        );
    }

    #[test]
    fn gitlabs_refusals() {
        assert_eq!(
            decide(Status::Created, "finish"),
            Decision::Refused {
                message: "Can not finish workflow that has status created".into()
            }
        );
        assert_eq!(
            decide(Status::Running, "jump"),
            Decision::Refused {
                message: "Can not update workflow status, unsupported event: jump".into()
            }
        );
        assert_eq!(
            decide(Status::Running, "retry"),
            Decision::Already {
                message: "Workflow already in status running".into()
            }
        );
        assert_eq!(
            decide(Status::Paused, "resume"),
            Decision::Fire {
                from: Status::Paused,
                to: Status::Running
            }
        );
    }
}
