//! Duo Workflow sessions of a project in the browser: the list of the user's
//! runs with their status, a form that starts one from a goal, and a run page
//! with the live log (plan, messages, tool calls and their results from the
//! checkpoints' `ui_chat_log`), approve or reject a pending tool call, stop.
//!
//! The run page's script (`workflow.js`) is the run's client on the executor
//! socket (`/api/v4/ai/duo_workflows/ws`, signed in by the session): the
//! monolith answers the service's GitLab API requests itself with the user's
//! permissions, and the page answers every workspace action (files, commands)
//! with an error, since a browser has no checkout. Runs started here therefore
//! get only the GitLab privileges (read, and write when the form allows it;
//! every write asks for approval). The log follows the
//! `workflowEventsUpdated` subscription, so a second tab sees it too.
//!
//! Where a runner is configured, the start form (and "Run with Duo" on an
//! issue page) can instead start a run of the product
//! ([`crate::workflows::steering`]): a software-development run in a sandbox
//! on this instance, as the Duo service account, that ends in a branch and a
//! merge request. Its page shows each leg (state, failure, the executor's
//! output), the place in the queue, Approve / Reject when the run waits for
//! its user, Stop, and the branch and merge request once they exist; the
//! buttons send the events the REST API takes.
//!
//! Every page asks the policy: the project must be readable (404 otherwise),
//! starting needs `can_run_duo_workflow_as` (with the service account for
//! runs of the product), a run is its owner's (or an admin's) only, as on the
//! API; every form carries the session's authenticity token (403 without).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::{Value, json};

use super::PageError;
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::identity::sessions::{self, SessionUser};
use crate::policy::{Ability, Actor, Subject};
use crate::workflows::creation::{self, CreateContext, CreateError};
use crate::workflows::steering::{self, RunView, Steer};
use crate::workflows::store::{self, ListFilter, NewWorkflow, Workflow};
use crate::workflows::{Caller, Status, WorkflowError, checkpoints, runs};

/// Most runs the list shows.
const LIST_LIMIT: i64 = 50;
/// The flow runs started here use: agentic chat, which pauses inline for
/// approvals (GitLab's `chat` definition).
pub const WEB_DEFINITION: &str = "chat";
/// `read_only_gitlab`, always granted and pre-approved.
const READ_GITLAB: i64 = 2;
/// `read_write_gitlab`, granted when the form allows it; never pre-approved.
const WRITE_GITLAB: i64 = 3;
/// Most `ui_chat_log` entries rendered on the server (the newest ones).
const MAX_LOG_ENTRIES: usize = 500;
/// Most branches the start form offers to start from.
const MAX_BRANCHES_OFFERED: usize = 200;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/{project:.+}/-/workflows", web::get().to(list))
        .route("/{project:.+}/-/workflows", web::post().to(start))
        .route(
            "/{project:.+}/-/issues/{iid}/workflows",
            web::post().to(start_from_issue),
        )
        .route("/{project:.+}/-/workflows/{id}", web::get().to(run))
        .route("/{project:.+}/-/workflows/{id}/stop", web::post().to(stop))
        .route(
            "/{project:.+}/-/workflows/{id}/approve",
            web::post().to(approve),
        )
        .route(
            "/{project:.+}/-/workflows/{id}/reject",
            web::post().to(reject),
        );
}

/// A project the user may read.
struct ReadableProject {
    id: i64,
    name: String,
    full_path: String,
}

async fn readable_project(
    state: &AppState,
    session: &SessionUser,
    full_path: &str,
) -> Result<ReadableProject, PageError> {
    let db = state.pool.get().await?;
    let id = super::project_with(state, &*db, session, full_path, &[Ability::ReadProject]).await?;
    let name = crate::namespaces::projects::name(&*db, id).await?;
    Ok(ReadableProject {
        id,
        name,
        full_path: full_path.to_owned(),
    })
}

async fn may_start(
    state: &AppState,
    session: &SessionUser,
    project: &ReadableProject,
) -> Result<bool, PageError> {
    let db = state.pool.get().await?;
    Ok(state
        .policy
        .can_run_duo_workflow_as(
            &*db,
            Actor::from(&session.user),
            None,
            Subject::Project(project.id),
        )
        .await?)
}

/// Whether runs of the product can start in the project: a runner is
/// configured and the policy lets the user (and the service account) run
/// workflows there.
async fn may_run_product(
    state: &AppState,
    session: &SessionUser,
    project_id: i64,
) -> Result<bool, PageError> {
    if runs::configured_runner(&state.config).is_none() {
        return Ok(false);
    }
    let db = state.pool.get().await?;
    steering::may_start_run(&*db, &state.policy, Actor::from(&session.user), project_id)
        .await
        .map_err(workflow_error)
}

/// Starts a run of the product through the path REST and GraphQL share.
/// Refusals the user can act on come back as 422 with why: no runner, an
/// empty repository, a missing branch; 403 when the policy says no.
async fn start_product_run(
    state: &AppState,
    session: &SessionUser,
    request: creation::CreateRequest,
) -> Result<Workflow, PageError> {
    if runs::configured_runner(&state.config).is_none() {
        return Err(PageError::Unprocessable(NO_RUNNER.to_owned()));
    }
    let context = CreateContext {
        pool: &state.pool,
        policy: &state.policy,
        config: &state.config,
        repositories: &state.repositories,
    };
    match creation::create(&context, Actor::from(&session.user), None, request).await {
        Ok(created) => Ok(created.workflow),
        Err(CreateError::Forbidden) => Err(PageError::Forbidden(
            "You cannot run workflows that change code in this project.",
        )),
        Err(CreateError::IssueNotFound) => Err(PageError::NotFound),
        Err(CreateError::BadRequest(why)) => Err(PageError::Unprocessable(why)),
        Err(CreateError::Workflow(e)) => Err(workflow_error(e)),
        Err(CreateError::Policy(e)) => Err(e.into()),
    }
}

/// Whether an issue page offers "Run with Duo" (the caller checked that the
/// user may read the issue).
pub async fn may_run_with_duo(
    state: &AppState,
    session: &SessionUser,
    project_id: i64,
) -> Result<bool, PageError> {
    may_run_product(state, session, project_id).await
}

/// The "Run with Duo" button of an issue page.
pub fn run_with_duo_button(session: &SessionUser, project_path: &str, iid: i32) -> Markup {
    html! {
        form method="post" action={ "/" (project_path) "/-/issues/" (iid) "/workflows" } class="inline run-with-duo" {
            input type="hidden" name="authenticity_token" value=(session.csrf_token);
            button type="submit" class="secondary" id="run-with-duo"
                title="Duo works on this issue in a sandbox, asks before each change, and opens a merge request" {
                "Run with Duo"
            }
        }
    }
}

fn page(
    status: StatusCode,
    session: &SessionUser,
    title: &str,
    scripts: &'static [&'static str],
    data: Value,
    body: Markup,
) -> HttpResponse {
    layout::html_response(
        status,
        layout::render(
            Page {
                title,
                session: Some(session),
                scripts,
                data,
            },
            body,
        ),
    )
}

fn status_badge(status: Status) -> Markup {
    html! { span class={ "badge status " (status.name()) } data-status=(status.name()) { (status.human_name()) } }
}

fn run_url(project: &ReadableProject, id: i64) -> String {
    format!("/{}/-/workflows/{id}", project.full_path)
}

fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max).collect::<String>())
    } else {
        line.to_owned()
    }
}

/// What the start form offers besides runs in the page.
enum ProductOffer {
    /// Runs of the product can start here, from one of these branches.
    Available {
        branches: Vec<String>,
        default_branch: String,
    },
    /// Not here, and why (for the user).
    Unavailable(&'static str),
}

const NO_RUNNER: &str = "Runs that change code are off on this instance: no runner is configured \
     (DUO_WORKFLOW_RUNNER). To let Duo change code, run duo-workflow-executor on a checkout of \
     your own (see the Duo Workflow documentation); runs started here use GitLab's API only.";
const NO_SERVICE_ACCOUNT: &str = "Runs that change code act as the Duo service account, which \
     cannot work in this project (it needs Developer access); runs started here use GitLab's API \
     only.";
const EMPTY_REPOSITORY: &str =
    "The repository is empty: runs that change code need a branch to start from.";

async fn product_offer(
    state: &AppState,
    session: &SessionUser,
    project: &ReadableProject,
) -> Result<ProductOffer, PageError> {
    if runs::configured_runner(&state.config).is_none() {
        return Ok(ProductOffer::Unavailable(NO_RUNNER));
    }
    if !may_run_product(state, session, project.id).await? {
        return Ok(ProductOffer::Unavailable(NO_SERVICE_ACCOUNT));
    }
    let branches: Vec<String> =
        match crate::repositories::reader::refs(&state.repositories.path(project.id)) {
            Ok(refs) => refs.branches.into_keys().collect(),
            Err(_) => Vec::new(),
        };
    if branches.is_empty() {
        return Ok(ProductOffer::Unavailable(EMPTY_REPOSITORY));
    }
    let db = state.pool.get().await?;
    let default_branch = crate::namespaces::projects::default_branch(&*db, project.id).await?;
    // The default branch first, then the others by name.
    let mut offered: Vec<String> = branches
        .iter()
        .filter(|b| **b == default_branch)
        .cloned()
        .collect();
    offered.extend(
        branches
            .into_iter()
            .filter(|b| *b != default_branch)
            .take(MAX_BRANCHES_OFFERED),
    );
    Ok(ProductOffer::Available {
        branches: offered,
        default_branch,
    })
}

fn start_form(
    session: &SessionUser,
    project: &ReadableProject,
    offer: &ProductOffer,
    error: Option<&str>,
    goal: &str,
) -> Markup {
    html! {
        section class="card" {
            h2 { "Start a workflow" }
            @if let Some(error) = error { p class="flash error" role="alert" { (error) } }
            form method="post" action={ "/" (project.full_path) "/-/workflows" } class="stack" {
                input type="hidden" name="authenticity_token" value=(session.csrf_token);
                label for="goal" { "Goal" }
                textarea id="goal" name="goal" rows="3" required maxlength=(store::GOAL_MAX_CHARS)
                    placeholder="What should Duo do? For example: summarize issue #1 and leave a comment with the summary." { (goal) }
                @match offer {
                    ProductOffer::Available { branches, default_branch } => {
                        fieldset class="stack" {
                            legend { "Where Duo works" }
                            label class="check" {
                                input type="radio" name="run_in" value="product" id="run-in-product" checked;
                                " On this instance, in a sandbox: Duo changes the code on a new branch and opens a merge request; each edit and command asks for your approval"
                            }
                            label for="source_branch" { "Start from branch" }
                            select id="source_branch" name="source_branch" {
                                @for branch in branches {
                                    option value=(branch) selected[branch == default_branch] { (branch) }
                                }
                            }
                            label class="check" {
                                input type="radio" name="run_in" value="page" id="run-in-page";
                                " In this page: GitLab's API only (the browser has no checkout, so file and command tools are not offered)"
                            }
                            label class="check" {
                                input type="checkbox" name="allow_gitlab_writes" value="on" checked;
                                " In this page, allow changes in GitLab (comments, merge requests); each one asks for your approval"
                            }
                        }
                    }
                    ProductOffer::Unavailable(why) => {
                        label class="check" {
                            input type="checkbox" name="allow_gitlab_writes" value="on" checked;
                            " Allow changes in GitLab (comments, merge requests); each one asks for your approval"
                        }
                        p class="muted" {
                            "Runs started here use GitLab's API only: the browser has no checkout, so file and command tools are not offered."
                        }
                        p class="flash notice" id="no-product-runs" { (why) }
                    }
                }
                div { button type="submit" class="primary" { "Start" } }
            }
        }
    }
}

async fn list(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    let project = readable_project(&state, &session, &path.into_inner()).await?;
    list_page(&state, &session, &project, None, "", StatusCode::OK).await
}

async fn list_page(
    state: &AppState,
    session: &SessionUser,
    project: &ReadableProject,
    error: Option<&str>,
    goal: &str,
    status: StatusCode,
) -> Result<HttpResponse, PageError> {
    let offer = if may_start(state, session, project).await? {
        Some(product_offer(state, session, project).await?)
    } else {
        None
    };
    let db = state.pool.get().await?;
    let runs = store::list_for_user(
        &*db,
        session.user.id,
        &ListFilter {
            project_id: Some(project.id),
            limit: LIST_LIMIT,
            ..ListFilter::default()
        },
    )
    .await
    .map_err(workflow_error)?;
    let body = html! {
        section class="card" {
            div class="title-row" {
                h1 { "Workflows " span class="muted" { (project.full_path) } }
                a class="button" href={ "/" (project.full_path) } { "Project" }
            }
            p class="muted" { "Duo works towards a goal on its own, and asks before it changes anything." }
        }
        @if let Some(offer) = &offer {
            (start_form(session, project, offer, error, goal))
        } @else {
            section class="card" {
                p class="flash notice" {
                    "You cannot start workflows in this project: it needs a GitLab Duo seat that includes the Agent Platform, Developer access, and Duo turned on for the project."
                }
            }
        }
        section class="card" {
            h2 { "Your runs" }
            ul class="rows" id="runs" {
                @for w in &runs {
                    li {
                        a href=(run_url(project, w.id)) { "#" (w.id) " " (first_line(&w.goal, 120)) }
                        " " (status_badge(w.status))
                        " " span class="muted" { (w.created_at.format("%Y-%m-%d %H:%M UTC")) }
                    }
                }
                @if runs.is_empty() { li class="muted" { "No runs yet." } }
            }
        }
    };
    Ok(page(
        status,
        session,
        &format!("Workflows · {}", project.name),
        &[],
        Value::Null,
        body,
    ))
}

#[derive(Deserialize)]
struct StartForm {
    #[serde(default)]
    authenticity_token: String,
    #[serde(default)]
    goal: String,
    allow_gitlab_writes: Option<String>,
    /// `product`: a run of the product; anything else (or nothing, as
    /// before runs of the product existed): this page runs it.
    run_in: Option<String>,
    /// The branch a run of the product starts from (default: the project's).
    source_branch: Option<String>,
}

fn forged(session: &SessionUser, token: &str) -> bool {
    !sessions::csrf_matches(&session.csrf_token, Some(token))
}

async fn start(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    form: web::Form<StartForm>,
) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    let form = form.into_inner();
    if forged(&session, &form.authenticity_token) {
        return Err(PageError::Forbidden(
            "Invalid form token. Reload the page and try again.",
        ));
    }
    let project = readable_project(&state, &session, &path.into_inner()).await?;
    if !may_start(&state, &session, &project).await? {
        return Err(PageError::Forbidden(
            "You cannot start workflows in this project.",
        ));
    }
    let goal = form.goal.trim();
    let problem = if goal.is_empty() {
        Some("Describe the goal first.".to_owned())
    } else if goal.contains('\0') {
        Some("The goal must not contain NUL characters.".to_owned())
    } else if goal.chars().count() > store::GOAL_MAX_CHARS {
        Some(format!(
            "The goal is too long (at most {} characters).",
            store::GOAL_MAX_CHARS
        ))
    } else {
        None
    };
    if let Some(problem) = problem {
        let kept: String = goal.chars().take(store::GOAL_MAX_CHARS).collect();
        return list_page(
            &state,
            &session,
            &project,
            Some(&problem),
            &kept.replace('\0', ""),
            StatusCode::UNPROCESSABLE_ENTITY,
        )
        .await;
    }
    if form.run_in.as_deref() == Some("product") {
        let request = steering::product_run(
            project.id,
            goal.to_owned(),
            form.source_branch.filter(|b| !b.trim().is_empty()),
            None,
        );
        return match start_product_run(&state, &session, request).await {
            Ok(workflow) => Ok(HttpResponse::SeeOther()
                .insert_header(("Location", run_url(&project, workflow.id)))
                .finish()),
            Err(PageError::Unprocessable(why)) => {
                list_page(
                    &state,
                    &session,
                    &project,
                    Some(&why),
                    goal,
                    StatusCode::UNPROCESSABLE_ENTITY,
                )
                .await
            }
            Err(e) => Err(e),
        };
    }
    let mut privileges = vec![READ_GITLAB];
    if form.allow_gitlab_writes.as_deref() == Some("on") {
        privileges.push(WRITE_GITLAB);
    }
    let new = NewWorkflow {
        container: Some(Subject::Project(project.id)),
        goal: Some(goal.to_owned()),
        workflow_definition: Some(WEB_DEFINITION.to_owned()),
        agent_privileges: Some(privileges),
        pre_approved_agent_privileges: Some(vec![READ_GITLAB]),
        allow_agent_to_request_user: Some(true),
        ..NewWorkflow::default()
    };
    let db = state.pool.get().await?;
    let caller = Caller {
        user_id: session.user.id,
        service_account_id: None,
    };
    let workflow = store::create(&*db, caller, &new)
        .await
        .map_err(workflow_error)?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", run_url(&project, workflow.id)))
        .finish())
}

#[derive(Deserialize)]
struct TokenForm {
    #[serde(default)]
    authenticity_token: String,
}

/// "Run with Duo" on an issue: a run of the product on the issue (its title
/// and description are the goal), from the default branch.
async fn start_from_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, PageError> {
    let (full_path, iid) = path.into_inner();
    let session = super::signed_in(&state, &req).await?;
    if forged(&session, &form.authenticity_token) {
        return Err(PageError::Forbidden(
            "Invalid form token. Reload the page and try again.",
        ));
    }
    let iid: i32 = iid
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or(PageError::NotFound)?;
    let project = readable_project(&state, &session, &full_path).await?;
    let issue = {
        let db = state.pool.get().await?;
        let issue =
            crate::work_items::view_by_iid(&*db, crate::work_items::Kind::Issue, project.id, iid)
                .await?
                .ok_or(PageError::NotFound)?;
        if !state
            .policy
            .can(
                &*db,
                Some(Actor::from(&session.user)),
                Ability::ReadIssue,
                Subject::Issue(issue.id),
            )
            .await?
        {
            return Err(PageError::NotFound);
        }
        issue
    };
    let request = steering::product_run(
        project.id,
        steering::issue_goal(iid, &issue.title, &issue.description),
        None,
        Some(iid),
    );
    let workflow = start_product_run(&state, &session, request).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", run_url(&project, workflow.id)))
        .finish())
}

fn workflow_error(e: WorkflowError) -> PageError {
    match e {
        WorkflowError::NotFound => PageError::NotFound,
        WorkflowError::CannotRun(why) | WorkflowError::Refused(why) => {
            PageError::Unprocessable(why)
        }
        invalid @ WorkflowError::Invalid { .. } => PageError::Unprocessable(invalid.to_string()),
        WorkflowError::Conflict(why) => PageError::Conflict(why),
        other => PageError::Internal(other.to_string()),
    }
}

/// The run `id` of this project, when the user may see it (its owner or an
/// admin who may still run workflows there); "not found" otherwise.
async fn visible_run(
    state: &AppState,
    session: &SessionUser,
    project: &ReadableProject,
    id: &str,
) -> Result<Workflow, PageError> {
    let id: i64 = id.parse().map_err(|_| PageError::NotFound)?;
    let db = state.pool.get().await?;
    let actor = Actor::from(&session.user);
    let workflow = store::find(&*db, id)
        .await
        .map_err(workflow_error)?
        .filter(|w| w.project_id == Some(project.id))
        .filter(|w| w.user_id == actor.id || actor.admin)
        .ok_or(PageError::NotFound)?;
    if !state
        .policy
        .can_access_workflow(&*db, actor, None, workflow.facts())
        .await?
    {
        return Err(PageError::NotFound);
    }
    Ok(workflow)
}

/// Whether this page can be the run's client: only when the workflow has no
/// workspace privileges (files, commands, git, MCP tools), since a browser has
/// no checkout. Other runs continue in their executor (IDE, CLI).
fn browser_can_run(workflow: &Workflow) -> bool {
    workflow
        .agent_privileges
        .iter()
        .all(|p| i64::from(*p) == READ_GITLAB || i64::from(*p) == WRITE_GITLAB)
}

/// The parts of a checkpoint the page shows: the log (newest entries at most
/// [`MAX_LOG_ENTRIES`]) and the plan.
fn client_view(checkpoint: Option<&Value>) -> Value {
    let values = checkpoint.and_then(|c| c.get("channel_values"));
    let mut log = values
        .and_then(|v| v.get("ui_chat_log"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if log.len() > MAX_LOG_ENTRIES {
        log.drain(..log.len() - MAX_LOG_ENTRIES);
    }
    json!({
        "ui_chat_log": log,
        "plan": values.and_then(|v| v.get("plan")).cloned().unwrap_or(Value::Null),
    })
}

async fn run(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, PageError> {
    let (full_path, id) = path.into_inner();
    let session = super::signed_in(&state, &req).await?;
    let project = readable_project(&state, &session, &full_path).await?;
    let workflow = visible_run(&state, &session, &project, &id).await?;
    let db = state.pool.get().await?;
    let latest = checkpoints::latest(&*db, workflow.id)
        .await
        .map_err(workflow_error)?;
    let body = latest
        .as_ref()
        .and_then(|c| serde_json::from_str::<Value>(c.checkpoint.get()).ok());
    let view = client_view(body.as_ref());
    let product = steering::run_view(&*db, workflow.id)
        .await
        .map_err(workflow_error)?;
    let data = json!({
        "workflowId": workflow.id,
        "workflowGid": crate::gid::format(crate::workflows::WORKFLOW_GID_MODEL, workflow.id),
        "definition": workflow.workflow_definition,
        "goal": workflow.goal,
        "status": workflow.status.name(),
        "owner": workflow.user_id == session.user.id,
        // A run of the product has its runner: the page only follows it.
        "browserClient": !product.is_product_run() && browser_can_run(&workflow),
        "productRun": product.is_product_run(),
        // The page refreshes its run card while a leg waits or runs.
        "following": product.is_active(),
        "log": view["ui_chat_log"],
        "plan": view["plan"],
    });
    let body = html! {
        section class="card" {
            div class="title-row" {
                div {
                    h1 { "Workflow #" (workflow.id) " " span id="status" { (status_badge(workflow.status)) } }
                    p class="muted" {
                        a href={ "/" (project.full_path) "/-/workflows" } { "All runs of " (project.full_path) }
                    }
                }
                @if !workflow.status.is_terminal() {
                    form method="post" action={ (run_url(&project, workflow.id)) "/stop" } class="inline" id="stop-form" {
                        input type="hidden" name="authenticity_token" value=(session.csrf_token);
                        button type="submit" class="secondary" id="stop" { "Stop" }
                    }
                }
            }
            h2 { "Goal" }
            p class="goal" { (workflow.goal) }
            // Always there (empty until the run says how it ended), so the
            // page's script can swap in a newer one.
            p class="summary" id="summary" hidden[workflow.summary.is_none()] {
                (workflow.summary.as_deref().unwrap_or_default())
            }
            p id="connection" class="muted" aria-live="polite" {}
            // For a run whose client went away mid-step (the page was closed):
            // the service continues from the newest checkpoint.
            button type="button" id="resume" hidden { "Resume" }
        }
        @if product.is_product_run() {
            (run_card(&project, &product))
            div id="answer-slot" {
                @if product.awaits_answer(workflow.status) {
                    (answer_card(&session, &project, &workflow, &view))
                }
            }
        }
        section class="card approval" id="approval" hidden aria-labelledby="approval-title" {
            h2 id="approval-title" { "Approval needed" }
            p { "Duo wants to run this tool:" }
            pre id="pending-call" class="code" {}
            label for="reject-message" { "Message to Duo (optional, sent when you reject)" }
            textarea id="reject-message" rows="2" maxlength="2000" {}
            div class="actions" {
                button type="button" class="primary" id="approve" { "Approve" }
                button type="button" id="reject" { "Reject" }
            }
        }
        section class="card" id="plan-card" hidden {
            h2 { "Plan" }
            ol id="plan" {}
        }
        section class="card" {
            h2 { "Log" }
            ol id="log" class="workflow-log" aria-live="polite" {
                // Rendered by the script from the page data; this is what a
                // browser without scripts shows.
                @for entry in view["ui_chat_log"].as_array().into_iter().flatten() {
                    li class={ "entry " (entry["message_type"].as_str().unwrap_or("agent")) } {
                        (entry["content"].as_str().unwrap_or_default())
                    }
                }
            }
        }
    };
    Ok(page(
        StatusCode::OK,
        &session,
        &format!("Workflow #{} · {}", workflow.id, project.name),
        &["workflow.js"],
        data,
        body,
    ))
}

/// A run of the product: where it starts from, its legs (state, failure,
/// the end of the executor's output), its place in the queue, and the branch
/// and merge request it produced.
fn run_card(project: &ReadableProject, run: &RunView) -> Markup {
    let base = format!("/{}", project.full_path);
    html! {
        section class="card" id="run" data-legs=(run.legs.len()) data-active=(run.is_active()) {
            h2 { "Run" }
            @if let Some(place) = run.queue_position {
                p class="flash notice" id="queue-position" {
                    "Waiting for a free runner: number " (place) " in line."
                }
            } @else if run.is_active() {
                p class="muted" { "Duo is working in a sandbox on this instance; this page follows it." }
            }
            p class="muted" {
                "Starts from "
                @match &run.source_branch {
                    Some(branch) => { code { (branch) } }
                    None => { "the default branch" }
                }
                @if let Some(iid) = run.issue_iid {
                    ", works on " a href={ (base) "/-/issues/" (iid) } { "issue #" (iid) }
                }
                "."
            }
            @if run.result_branch.is_some() || run.merge_request_iid.is_some() {
                p class="actions" id="result" {
                    @if let Some(iid) = run.merge_request_iid {
                        a class="button primary" id="merge-request" href={ (base) "/-/merge_requests/" (iid) } {
                            "Merge request !" (iid)
                        }
                        " "
                    }
                    @if let Some(branch) = &run.result_branch {
                        a class="button" id="result-branch" href={ (base) "/-/tree/" (branch) } { "Branch " (branch) }
                    }
                }
            }
            ol class="rows legs" id="legs" {
                @for leg in &run.legs {
                    li class={ "leg " (leg.state) } data-state=(leg.state) {
                        strong { "Leg " (leg.leg) } " " span class={ "badge " (leg.state) } { (leg.state) }
                        @if let Some(reason) = &leg.failure_reason {
                            p class="flash error" { (reason) }
                        }
                        @if let Some(log) = &leg.log_tail {
                            details {
                                summary { "Executor output" }
                                pre class="code log-tail" { (log) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What the run waits for: the newest request of its log (a tool call with
/// its arguments, or a question), or the plan.
fn pending_request(status: Status, view: &Value) -> Option<String> {
    if status == Status::PlanApprovalRequired {
        let steps: Vec<String> = view["plan"]["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["description"].as_str())
            .enumerate()
            .map(|(i, d)| format!("{}. {d}", i + 1))
            .collect();
        if !steps.is_empty() {
            return Some(steps.join("\n"));
        }
    }
    let request = view["ui_chat_log"]
        .as_array()?
        .iter()
        .rev()
        .find(|e| e["message_type"] == "request")?;
    let mut text = request["content"].as_str().unwrap_or_default().to_owned();
    if let Some(name) = request["tool_info"]["name"].as_str() {
        let args = serde_json::to_string_pretty(&request["tool_info"]["args"]).unwrap_or_default();
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("{name}({args})"));
    }
    Some(text).filter(|t| !t.is_empty())
}

/// Approve / Reject for a run of the product that waits for its user.
fn answer_card(
    session: &SessionUser,
    project: &ReadableProject,
    workflow: &Workflow,
    view: &Value,
) -> Markup {
    let url = run_url(project, workflow.id);
    let (title, question) = match workflow.status {
        Status::PlanApprovalRequired => ("Approve the plan", "Duo plans to do this:"),
        Status::InputRequired => ("Duo asks you", "Duo needs an answer to go on:"),
        _ => ("Approval needed", "Duo wants to run this tool:"),
    };
    html! {
        section class="card approval" id="answer" aria-labelledby="answer-title" {
            h2 id="answer-title" { (title) }
            @if let Some(request) = pending_request(workflow.status, view) {
                p { (question) }
                pre class="code" id="pending-request" { (request) }
            }
            div class="actions" {
                form method="post" action={ (url) "/approve" } class="inline" {
                    input type="hidden" name="authenticity_token" value=(session.csrf_token);
                    button type="submit" class="primary" id="approve-run" { "Approve" }
                }
            }
            form method="post" action={ (url) "/reject" } class="stack" {
                input type="hidden" name="authenticity_token" value=(session.csrf_token);
                label for="reject-run-message" { "Message to Duo (what to do instead)" }
                textarea id="reject-run-message" name="message" rows="2"
                    maxlength=(steering::REJECT_MESSAGE_MAX_CHARS) {}
                div { button type="submit" id="reject-run" { "Reject" } }
            }
        }
    }
}

type StopForm = TokenForm;

#[derive(Deserialize)]
struct RejectForm {
    #[serde(default)]
    authenticity_token: String,
    #[serde(default)]
    message: String,
}

/// Sends an answer to a run of the product, as its page's buttons do.
async fn answer(
    state: &AppState,
    req: &HttpRequest,
    path: (String, String),
    token: &str,
    steer: Steer,
) -> Result<HttpResponse, PageError> {
    let (full_path, id) = path;
    let session = super::signed_in(state, req).await?;
    if forged(&session, token) {
        return Err(PageError::Forbidden(
            "Invalid form token. Reload the page and try again.",
        ));
    }
    let project = readable_project(state, &session, &full_path).await?;
    let workflow = visible_run(state, &session, &project, &id).await?;
    let caller = Caller {
        user_id: session.user.id,
        service_account_id: None,
    };
    steering::steer(&state.pool, &state.config, &workflow, &steer, caller)
        .await
        .map_err(workflow_error)?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", run_url(&project, workflow.id)))
        .finish())
}

async fn approve(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, PageError> {
    answer(
        &state,
        &req,
        path.into_inner(),
        &form.authenticity_token,
        Steer::Approve,
    )
    .await
}

async fn reject(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<RejectForm>,
) -> Result<HttpResponse, PageError> {
    let form = form.into_inner();
    answer(
        &state,
        &req,
        path.into_inner(),
        &form.authenticity_token,
        Steer::Reject(form.message.trim().to_owned()),
    )
    .await
}

async fn stop(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<StopForm>,
) -> Result<HttpResponse, PageError> {
    let (full_path, id) = path.into_inner();
    let session = super::signed_in(&state, &req).await?;
    if forged(&session, &form.authenticity_token) {
        return Err(PageError::Forbidden(
            "Invalid form token. Reload the page and try again.",
        ));
    }
    let project = readable_project(&state, &session, &full_path).await?;
    let workflow = visible_run(&state, &session, &project, &id).await?;
    let mut db = state.pool.get().await?;
    let caller = Caller {
        user_id: session.user.id,
        service_account_id: None,
    };
    let product_run = runs::latest(&*db, workflow.id)
        .await
        .map_err(workflow_error)?
        .is_some();
    let stopped = if product_run {
        // As the events API: the event is kept, the leg cancelled.
        drop(db);
        steering::steer(&state.pool, &state.config, &workflow, &Steer::Stop, caller)
            .await
            .map(|_| ())
    } else {
        store::apply_status_event(&mut db, workflow.id, "stop", caller, None)
            .await
            .map(|_| ())
    };
    match stopped {
        // Already over: nothing to stop, the page shows how it ended.
        Ok(_) | Err(WorkflowError::Refused(_)) => {}
        Err(e) => return Err(workflow_error(e)),
    }
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", run_url(&project, workflow.id)))
        .finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_view_keeps_the_newest_log_entries_and_the_plan() {
        let entries: Vec<Value> = (0..MAX_LOG_ENTRIES + 3)
            .map(|i| json!({"message_type": "agent", "content": i.to_string()}))
            .collect();
        let checkpoint = json!({"channel_values": {"ui_chat_log": entries, "plan": {"steps": []},
                                 "conversation_history": {"chat": ["secret"]}}});
        let view = client_view(Some(&checkpoint));
        let log = view["ui_chat_log"].as_array().unwrap();
        assert_eq!(log.len(), MAX_LOG_ENTRIES);
        assert_eq!(log[0]["content"], "3");
        assert_eq!(view["plan"], json!({"steps": []}));
        assert!(view.get("conversation_history").is_none());
        assert_eq!(client_view(None)["ui_chat_log"], json!([]));
    }

    #[test]
    fn long_goals_are_cut_for_the_list() {
        assert_eq!(first_line("one\ntwo", 10), "one");
        assert_eq!(first_line("abcdef", 3), "abc…");
    }
}
