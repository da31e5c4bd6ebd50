//! A failed job, when the project turned the `pipeline_failed` trigger on:
//! a software-development workflow run in the product (the remote runner)
//! reads the job's log, fixes the code on a new branch and opens a merge
//! request. The run is the reporter's (their rights, their approvals), its
//! goal says what started it, and it is refused like any run they start.

use super::reviewer::{ReviewError, ReviewServices};
use super::triggers::PipelineFailed;
use crate::policy::Actor;
use crate::workflows::creation::{CreateContext, CreateError, CreateRequest, create};
use crate::workflows::store::NewWorkflow;

/// Most of the log's end the goal carries (the rest is in the job).
const LOG_TAIL_CHARS: usize = 4000;

/// The goal of the fix flow: what failed, where, and what to do. A run in
/// the product cannot commit, push or name its branch (its git has no
/// identity and no credentials; the runner checkpoints the workspace and
/// publishes it as `duo/workflow-<id>` with a merge request when the run
/// finishes), so the goal asks for the fix only.
pub fn goal(job_name: &str, pipeline_id: i64, git_ref: &str, sha: &str, log: &str) -> String {
    let tail: String = {
        let chars: Vec<char> = log.chars().collect();
        chars[chars.len().saturating_sub(LOG_TAIL_CHARS)..]
            .iter()
            .collect()
    };
    format!(
        "Started by a failed pipeline: job `{job_name}` of pipeline #{pipeline_id} failed on `{git_ref}` ({short}).\n\
         Find the cause in the log below and fix the code in the workspace. Do not commit, push or open a \
         merge request yourself: when the run finishes, its changes are put on a new branch and a merge \
         request into `{git_ref}` is opened with them.\n\n\
         The end of the job's log:\n```\n{tail}\n```",
        short = &sha[..sha.len().min(8)],
    )
}

/// Starts the fix run for `job`.
pub async fn run(services: &ReviewServices, job: &PipelineFailed) -> Result<(), ReviewError> {
    let agent = services.agent.services();
    let db = agent.pool.get().await?;
    let Some(failed) = crate::work_items::builds::job(&*db, job.project_id, job.job_id).await?
    else {
        return Ok(());
    };
    let Some(user) = crate::identity::users::active(&*db, job.user_id).await? else {
        return Ok(());
    };
    drop(db);
    let context = CreateContext {
        pool: &agent.pool,
        policy: &agent.policy,
        config: &services.config,
        repositories: &agent.repositories,
    };
    let request = CreateRequest {
        workflow: NewWorkflow {
            container: Some(crate::policy::Subject::Project(job.project_id)),
            goal: Some(goal(
                &failed.name,
                failed.pipeline_id,
                &failed.git_ref,
                &failed.sha,
                &failed.log,
            )),
            workflow_definition: Some("software_development".to_owned()),
            // Files, GitLab reads and writes, commands and git: what a fix
            // needs; the user still approves each step on the run's page.
            agent_privileges: Some(vec![1, 2, 3, 4, 5]),
            pre_approved_agent_privileges: Some(vec![2]),
            environment: Some("ambient".to_owned()),
            source_branch: Some(failed.git_ref.clone()),
            ..NewWorkflow::default()
        },
        start: true,
        issue_iid: None,
    };
    match create(&context, Actor::user(user.id, user.admin), None, request).await {
        Ok(created) => {
            tracing::info!(
                project_id = job.project_id,
                pipeline_id = job.pipeline_id,
                workflow_id = created.workflow.id,
                "a fix run started for a failed pipeline"
            );
            Ok(())
        }
        // Not allowed or not possible (no runner, no seat): nothing to retry.
        Err(CreateError::Forbidden | CreateError::BadRequest(_) | CreateError::IssueNotFound) => {
            tracing::info!(
                project_id = job.project_id,
                pipeline_id = job.pipeline_id,
                "no fix run for the failed pipeline: the user may not start one"
            );
            Ok(())
        }
        Err(CreateError::Workflow(e)) => {
            tracing::warn!(pipeline_id = job.pipeline_id, error = %e, "the fix run could not start");
            Ok(())
        }
        Err(CreateError::Policy(e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_goal_names_what_failed_and_keeps_the_log_tail() {
        let log = format!(
            "{}\nerror[E0425]: cannot find value `conf`",
            "x".repeat(10_000)
        );
        let text = goal("test", 42, "main", "0123456789abcdef", &log);
        assert!(text.starts_with(
            "Started by a failed pipeline: job `test` of pipeline #42 failed on `main` (01234567)."
        ));
        assert!(text.contains("a merge request into `main` is opened"));
        assert!(text.contains("cannot find value `conf`"));
        assert!(text.len() < LOG_TAIL_CHARS + 600);
    }
}
