//! Runners: where a workflow started in the product runs its executor, the
//! role GitLab gives CI runners. A run is carried out in *legs*: a leg clones
//! the project (or continues from the run's hidden checkpoint ref), runs the
//! executor until the flow finishes, pauses for an approval or fails, and
//! checkpoints the code; an approval starts the next leg.
//!
//! Two backends, chosen by `DUO_WORKFLOW_RUNNER` (`docs/duo-workflow-runs.md`):
//! - [`local::LocalRunner`] (default): the worker starts the executor in a
//!   bubblewrap sandbox of its own, reaching only the monolith and the
//!   workflow service through relays;
//! - [`kubernetes::KubernetesRunner`]: a Kubernetes Job per leg, its tokens
//!   in a Secret owned by the Job.

pub mod kubernetes;
pub mod local;
pub mod relay;

use std::time::Duration;

use async_trait::async_trait;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

/// Limits of one leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// Wall-clock time, after which the leg is killed.
    pub max_duration: Duration,
    /// Address space of each process.
    pub memory_bytes: u64,
    /// CPU time of each process.
    pub cpu_seconds: u64,
    /// Size of the workspace file system.
    pub disk_bytes: u64,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            max_duration: Duration::from_secs(3600),
            memory_bytes: 2 * 1024 * 1024 * 1024,
            cpu_seconds: 1800,
            disk_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// Everything one leg needs. The secrets reach the executor only through
/// its environment (never its command line), which it moves off at start.
#[derive(Debug, Clone)]
pub struct LegSpec {
    pub workflow_id: i64,
    pub workload_id: i64,
    /// `group/project`.
    pub project_path: String,
    pub source_ref: String,
    pub checkpoint_ref: String,
    pub definition: String,
    pub goal: String,
    /// The run's `ai_workflows` token (this project, this run).
    pub gitlab_token: SecretString,
    /// The workflow service's token for the run.
    pub service_token: SecretString,
    /// Request metadata for the service (cloud-connector headers and the
    /// model header, which may carry a self-hosted model's key).
    pub service_headers: SecretString,
    /// The user's answer to the request the run paused on (the leg after
    /// an approval or a rejection); `None` for a first leg.
    pub answer: Option<Answer>,
    /// Who commits the checkpoints: the Duo service account.
    pub git_author: (String, String),
    pub limits: RunLimits,
}

impl LegSpec {
    /// The executor's arguments inside any runner; `gitlab` and `service`
    /// name how it reaches them (sockets in a sandbox, URLs in a pod).
    pub fn executor_args(&self, reach: &Reach, workspace: &str) -> Vec<String> {
        let mut args = vec![
            "--workflow-id".to_owned(),
            self.workflow_id.to_string(),
            "--definition".to_owned(),
            self.definition.clone(),
            "--workspace".to_owned(),
            workspace.to_owned(),
            "--clone-project".to_owned(),
            self.project_path.clone(),
            "--source-ref".to_owned(),
            self.source_ref.clone(),
            "--checkpoint-ref".to_owned(),
            self.checkpoint_ref.clone(),
            "--git-author".to_owned(),
            format!("{} <{}>", self.git_author.0, self.git_author.1),
            "--quiet".to_owned(),
        ];
        if !self.goal.is_empty() {
            args.extend(["--goal".to_owned(), self.goal.clone()]);
        }
        match reach {
            Reach::Sockets { gitlab, service } => args.extend([
                "--gitlab-socket".to_owned(),
                gitlab.clone(),
                "--service-socket".to_owned(),
                service.clone(),
            ]),
            Reach::Urls { gitlab, service } => args.extend([
                "--gitlab-url".to_owned(),
                gitlab.clone(),
                "--service-url".to_owned(),
                service.clone(),
            ]),
        }
        match &self.answer {
            Some(Answer::Approve) => {
                args.extend(["--decide-first".to_owned(), "approve".to_owned()]);
            }
            Some(Answer::Reject(message)) => {
                args.extend(["--decide-first".to_owned(), "reject".to_owned()]);
                if let Some(message) = message {
                    args.extend(["--reject-message".to_owned(), message.clone()]);
                }
            }
            None => {}
        }
        args
    }
}

/// A user's answer to the request a run paused on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Approve,
    /// With what to do instead, if the user said.
    Reject(Option<String>),
}

/// How the executor reaches the monolith and the workflow service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Unix sockets relayed by the runner (a sandbox without a network).
    Sockets { gitlab: String, service: String },
    /// Addresses on the network (a pod).
    Urls { gitlab: String, service: String },
}

/// How a leg ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegEnd {
    /// The flow finished (exit 0).
    Finished,
    /// The flow waits for an approval (exit 3).
    Paused,
    /// The executor failed; the reason is its last words.
    Failed(String),
    /// The leg ran past its limit and was killed.
    TimedOut,
    /// A stop event (or the worker's shutdown) ended it.
    Cancelled,
}

/// What a leg left behind, for the workflow's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegOutcome {
    pub end: LegEnd,
    /// The end of what the executor printed (bounded).
    pub log_tail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The runner could not start the leg at all.
    #[error("the runner could not start the run: {0}")]
    Start(String),
    #[error("the runner failed: {0}")]
    Backend(String),
}

/// A place legs run.
#[async_trait]
pub trait Runner: Send + Sync {
    /// `local` or `kubernetes`, as configured and recorded with each leg.
    fn name(&self) -> &'static str;

    /// Runs one leg to its end; `cancel` ends it early. Whatever happens,
    /// nothing of the leg is left running or on disk when this returns.
    async fn run_leg(
        &self,
        spec: &LegSpec,
        cancel: CancellationToken,
    ) -> Result<LegOutcome, RunnerError>;
}

/// The last `limit` bytes of `text`, cut at a character boundary.
pub fn tail(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

/// The reason a failed executor gives: its last non-empty line.
pub fn last_words(log: &str) -> String {
    log.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.trim_start_matches("duo-workflow-executor: ").to_owned())
        .unwrap_or_else(|| "the executor ended without saying why".to_owned())
}

/// What an exit status means.
pub fn end_of(status: Option<i32>, log: &str) -> LegEnd {
    match status {
        Some(0) => LegEnd::Finished,
        Some(3) => LegEnd::Paused,
        // The sandbox (bwrap, a shell) reports a child killed by signal N
        // as exit 128 + N.
        Some(code @ 129..=159) => LegEnd::Failed(format!(
            "{} (killed by signal {}, exit {code})",
            last_words(log),
            code - 128
        )),
        Some(code) => LegEnd::Failed(format!("{} (exit {code})", last_words(log))),
        None => LegEnd::Failed(format!("{} (killed by a signal)", last_words(log))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_map_to_leg_ends() {
        assert_eq!(end_of(Some(0), ""), LegEnd::Finished);
        assert_eq!(end_of(Some(3), ""), LegEnd::Paused);
        assert_eq!(
            end_of(Some(1), "cloned\nduo-workflow-executor: boom\n\n"),
            LegEnd::Failed("boom (exit 1)".into())
        );
        assert_eq!(
            end_of(None, ""),
            LegEnd::Failed("the executor ended without saying why (killed by a signal)".into())
        );
        assert_eq!(
            end_of(Some(137), ""),
            LegEnd::Failed(
                "the executor ended without saying why (killed by signal 9, exit 137)".into()
            )
        );
        assert_eq!(tail("ééé", 3), "é");
    }
}
