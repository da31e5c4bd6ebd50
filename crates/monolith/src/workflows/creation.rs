//! Creating a workflow for a user, and starting its run in the product when
//! asked: the one path the REST API, GraphQL and the web pages share, so the
//! policy checks (who may run workflows where, as which service account,
//! which issue they may link) are made once.

use super::runs::{self, StartedRun};
use super::store::{self, NewWorkflow, Workflow};
use super::{Caller, WorkflowError};
use crate::policy::{Ability, Actor, Policy, PolicyError, Subject};

/// What a caller asks for (GitLab's creation parameters), once the
/// container was resolved and found readable by the caller.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub workflow: NewWorkflow,
    /// Start a run in the product now (`start_workflow`).
    pub start: bool,
    /// The IID of an issue of the workflow's project.
    pub issue_iid: Option<i32>,
}

/// A created workflow, with its run and the page to follow it on.
#[derive(Debug, Clone)]
pub struct Created {
    pub workflow: Workflow,
    pub run: Option<(StartedRun, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The user (or the service account it would run as) may not run
    /// workflows in the container.
    #[error("You cannot run workflows here")]
    Forbidden,
    #[error("Issue not found")]
    IssueNotFound,
    /// A parameter that does not fit the others.
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

impl From<tokio_postgres::Error> for CreateError {
    fn from(e: tokio_postgres::Error) -> Self {
        CreateError::Workflow(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for CreateError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        CreateError::Workflow(e.into())
    }
}

/// What creating needs besides the request.
pub struct CreateContext<'a> {
    pub pool: &'a deadpool_postgres::Pool,
    pub policy: &'a Policy,
    pub config: &'a crate::config::Config,
    pub repositories: &'a crate::repositories::Repositories,
}

/// Creates the workflow for `actor` (whose own token may already carry a
/// service account, `token_service_account`) and starts its run when asked.
/// Runs and remote flows (`ambient`, formerly `web`) are carried out as the
/// instance's Duo service account on behalf of the user, when one is set.
pub async fn create(
    context: &CreateContext<'_>,
    actor: Actor,
    token_service_account: Option<i64>,
    request: CreateRequest,
) -> Result<Created, CreateError> {
    let CreateRequest {
        workflow: mut new,
        start,
        issue_iid,
    } = request;
    let container = new.container.ok_or_else(|| {
        CreateError::Workflow(WorkflowError::BadRequest(
            "project_id or namespace_id must be provided".into(),
        ))
    })?;
    let db = context.pool.get().await?;
    let remote = start || matches!(new.environment.as_deref(), Some("ambient" | "web"));
    let service_account = if remote {
        store::instance_service_account(&*db).await?
    } else {
        None
    };
    if !context
        .policy
        .can_run_duo_workflow_as(&*db, actor, service_account, container)
        .await?
    {
        return Err(CreateError::Forbidden);
    }
    let project_id = match container {
        Subject::Project(id) => Some(id),
        _ => None,
    };
    if start {
        let repository = project_id.map(|id| context.repositories.path(id));
        runs::check_start(
            context.config,
            repository.as_deref().unwrap_or(std::path::Path::new("")),
            project_id,
            new.source_branch.as_deref(),
        )?;
    } else if new.source_branch.is_some() {
        return Err(CreateError::BadRequest(
            "source_branch is only used with start_workflow".into(),
        ));
    }
    new.issue_id = match (issue_iid, project_id) {
        (None, _) => None,
        (Some(iid), Some(project)) => {
            let issue = crate::work_items::issues::by_iid(&*db, project, iid)
                .await?
                .ok_or(CreateError::IssueNotFound)?;
            if !context
                .policy
                .can(
                    &*db,
                    Some(actor),
                    Ability::ReadIssue,
                    Subject::Issue(issue.id),
                )
                .await?
            {
                return Err(CreateError::IssueNotFound);
            }
            Some(issue.id)
        }
        (Some(_), None) => {
            return Err(CreateError::BadRequest(
                "issue_id needs a project_id".into(),
            ));
        }
    };
    new.service_account_id = service_account.map(|s| s.id);
    // The audit trail names the service account the workflow will run as.
    let caller = Caller {
        user_id: actor.id,
        service_account_id: service_account.map(|s| s.id).or(token_service_account),
    };
    let workflow = store::create(&*db, caller, &new).await?;
    let run = match (start, project_id) {
        (true, Some(project)) => {
            let page = format!(
                "{}/{}/-/workflows/{}",
                context.config.external_url.as_str().trim_end_matches('/'),
                crate::namespaces::projects::full_path(&*db, project).await?,
                workflow.id
            );
            drop(db);
            let started = runs::start(context.pool, context.config, workflow.id, None).await?;
            Some((started, page))
        }
        _ => None,
    };
    Ok(Created { workflow, run })
}
