//! `duo-workflow-executor`: carries out a Duo Workflow's actions in a local
//! checkout. It connects to the workflow service over gRPC, runs file and
//! command actions inside one workspace directory only, relays the
//! service's GitLab API calls (`runHTTPRequest`) with the workflow's token,
//! and asks the user (or `--approve` rules) when a tool call or plan needs
//! approval. See `docs/duo-workflow.md`; what it may do and how it is
//! confined is listed in `docs/security.md`. Started by a runner in a sandbox,
//! it reaches out only through relays and works on a clone it checkpoints to
//! the run's hidden ref (`remote`).

pub mod actions;
pub mod cli;
pub mod environment;
pub mod git;
pub mod hardening;
pub mod mcp;
pub mod remote;
pub mod session;
pub mod workspace;

pub use actions::{ActionRunner, GitLabTarget, Limits};
pub use session::{
    Approver, Decision, PendingRequest, Reporter, ServiceTarget, Session, SessionEnd, SessionError,
};
pub use workspace::{PathError, Workspace};
