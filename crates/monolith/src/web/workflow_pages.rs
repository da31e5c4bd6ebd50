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
//! Every page asks the policy: the project must be readable (404 otherwise),
//! starting needs `can_run_duo_workflow_as`, a run is its owner's (or an
//! admin's) only, as on the API.

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
use crate::workflows::store::{self, ListFilter, NewWorkflow, Workflow};
use crate::workflows::{Caller, Status, WorkflowError, checkpoints};

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

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/{project:.+}/-/workflows", web::get().to(list))
        .route("/{project:.+}/-/workflows", web::post().to(start))
        .route("/{project:.+}/-/workflows/{id}", web::get().to(run))
        .route("/{project:.+}/-/workflows/{id}/stop", web::post().to(stop));
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

fn start_form(
    session: &SessionUser,
    project: &ReadableProject,
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
                label class="check" {
                    input type="checkbox" name="allow_gitlab_writes" value="on" checked;
                    " Allow changes in GitLab (comments, merge requests); each one asks for your approval"
                }
                p class="muted" {
                    "Runs started here use GitLab's API only: the browser has no checkout, so file and command tools are not offered."
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
    let can_start = may_start(state, session, project).await?;
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
        @if can_start {
            (start_form(session, project, error, goal))
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

fn workflow_error(e: WorkflowError) -> PageError {
    match e {
        WorkflowError::NotFound => PageError::NotFound,
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
    let data = json!({
        "workflowId": workflow.id,
        "workflowGid": crate::gid::format(crate::workflows::WORKFLOW_GID_MODEL, workflow.id),
        "definition": workflow.workflow_definition,
        "goal": workflow.goal,
        "status": workflow.status.name(),
        "owner": workflow.user_id == session.user.id,
        "browserClient": browser_can_run(&workflow),
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
            p id="connection" class="muted" aria-live="polite" {}
            // For a run whose client went away mid-step (the page was closed):
            // the service continues from the newest checkpoint.
            button type="button" id="resume" hidden { "Resume" }
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

#[derive(Deserialize)]
struct StopForm {
    #[serde(default)]
    authenticity_token: String,
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
    match store::apply_status_event(&mut db, workflow.id, "stop", caller).await {
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
