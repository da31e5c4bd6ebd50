//! Read-only pages for projects, issues, merge requests and epics, each with an
//! "Ask Duo" button that opens the chat with that resource attached, and on an
//! issue "Run with Duo" for who may run workflows there (see
//! [`super::workflow_pages`]). Every page asks the policy first; what a user
//! may not read is "not found", as on the API.

use crate::queries::Queries;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, PreEscaped, html};

use super::PageError;
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::identity::sessions::SessionUser;
use crate::policy::{Ability, Actor, Subject};
use crate::work_items::{self, Kind, issues, merge_requests, notes};

/// Most rows a list on a page shows.
const LIST_LIMIT: i64 = 50;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/explore/projects", web::get().to(projects))
        .route("/groups/{path:.+}/-/epics/{iid}", web::get().to(epic))
        .route("/{path:.+}/-/issues/{iid}", web::get().to(issue))
        .route(
            "/{path:.+}/-/merge_requests/{iid}",
            web::get().to(merge_request),
        );
}

/// The project page is matched last of all routes (its path is any path).
pub fn project_route(cfg: &mut web::ServiceConfig) {
    cfg.route("/{path:.+}", web::get().to(project));
}

fn actor(session: &SessionUser) -> Option<Actor> {
    Some(Actor::from(&session.user))
}

fn ask_duo(gid: &str, title: &str) -> Markup {
    let href = format!(
        "/-/chat?resource={}&resource_title={}",
        url::form_urlencoded::byte_serialize(gid.as_bytes()).collect::<String>(),
        url::form_urlencoded::byte_serialize(title.as_bytes()).collect::<String>(),
    );
    html! { a class="button primary ask-duo" href=(href) data-resource=(gid) { "Ask Duo" } }
}

fn page(session: &SessionUser, title: &str, body: Markup) -> HttpResponse {
    layout::html_response(
        StatusCode::OK,
        layout::render(
            Page {
                title,
                session: Some(session),
                scripts: &[],
                data: serde_json::Value::Null,
            },
            body,
        ),
    )
}

async fn project_id(db: &impl Queries, path: &str) -> Result<Option<i64>, PageError> {
    Ok(crate::namespaces::project_id_by_full_path(db, path).await?)
}

async fn readable(
    state: &AppState,
    db: &impl Queries,
    session: &SessionUser,
    ability: Ability,
    subject: Subject,
) -> Result<bool, PageError> {
    Ok(state
        .policy
        .can(db, actor(session), ability, subject)
        .await?)
}

async fn projects(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    let db = state.pool.get().await?;
    let projects = crate::namespaces::projects_by_full_path(&*db).await?;
    let mut visible = Vec::new();
    for project in projects {
        if readable(
            &state,
            &*db,
            &session,
            Ability::ReadProject,
            Subject::Project(project.id),
        )
        .await?
        {
            visible.push((project.name, project.full_path, project.description));
        }
        if visible.len() as i64 >= LIST_LIMIT {
            break;
        }
    }
    Ok(page(
        &session,
        "Projects",
        html! {
            section class="card" {
                h1 { "Projects" }
                ul class="rows" {
                    @for (name, path, description) in &visible {
                        li { a href={ "/" (path) } { strong { (name) } " " span class="muted" { (path) } }
                             @if !description.is_empty() { p class="muted" { (description) } } }
                    }
                    @if visible.is_empty() { li class="muted" { "No projects you can see yet." } }
                }
            }
        },
    ))
}

async fn project(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, PageError> {
    let path = path.into_inner();
    let session = super::signed_in(&state, &req).await?;
    let db = state.pool.get().await?;
    let id = super::project_with(&state, &*db, &session, &path, &[Ability::ReadProject]).await?;
    let summary = crate::namespaces::project_summary(&*db, id).await?;
    let name = summary.name;
    let mut issue_rows = Vec::new();
    for issue in issues::newest_lines(&*db, id, LIST_LIMIT).await? {
        if readable(
            &state,
            &*db,
            &session,
            Ability::ReadIssue,
            Subject::Issue(issue.id),
        )
        .await?
        {
            issue_rows.push((issue.iid, issue.title, issue.state));
        }
    }
    let mrs = merge_requests::newest_lines(&*db, id, LIST_LIMIT).await?;
    let can_read_mrs = readable(
        &state,
        &*db,
        &session,
        Ability::ReadProject,
        Subject::Project(id),
    )
    .await?;
    let gid = crate::gid::format("Project", id);
    Ok(page(
        &session,
        &name,
        html! {
            section class="card" {
                div class="title-row" {
                    h1 { (name) " " span class="muted" { (path) } }
                    (ask_duo(&gid, &name))
                }
                p { (summary.description) }
                p class="muted" { "Visibility: " (summary.visibility) }
                p class="actions" {
                    a class="button" href={ "/" (path) "/-/tree" } { "Files" }
                    " "
                    a class="button" href={ "/" (path) "/-/workflows" } { "Workflows" }
                }
            }
            section class="card" {
                h2 { "Issues" }
                ul class="rows" {
                    @for (iid, title, state) in &issue_rows {
                        li { a href={ "/" (path) "/-/issues/" (iid) } { "#" (iid) " " (title) } " " span class={ "badge " (state) } { (state) } }
                    }
                    @if issue_rows.is_empty() { li class="muted" { "No issues." } }
                }
            }
            @if can_read_mrs {
                section class="card" {
                    h2 { "Merge requests" }
                    ul class="rows" {
                        @for mr in &mrs {
                            li { a href={ "/" (path) "/-/merge_requests/" (mr.iid) } { "!" (mr.iid) " " (mr.title) } " " span class="badge" { (mr.state) } }
                        }
                        @if mrs.is_empty() { li class="muted" { "No merge requests." } }
                    }
                }
            }
        },
    ))
}

/// Notes of one noteable the user may read (internal notes need the policy's
/// say), oldest first.
async fn readable_notes(
    state: &AppState,
    db: &impl Queries,
    session: &SessionUser,
    kind: Kind,
    id: i64,
) -> Result<Vec<(String, String)>, PageError> {
    let mut out = Vec::new();
    for comment in notes::comments(db, kind, id, Some(100)).await? {
        if readable(
            state,
            db,
            session,
            Ability::ReadNote,
            Subject::Note(comment.id),
        )
        .await?
        {
            out.push((comment.author_username, comment.body));
        }
    }
    Ok(out)
}

/// The page of an issue, merge request or epic; `actions` go beside
/// "Ask Duo" (e.g. "Run with Duo" on an issue).
fn item_page(
    session: &SessionUser,
    heading: String,
    gid: &str,
    state: &str,
    description: &str,
    notes: &[(String, String)],
    actions: Markup,
) -> HttpResponse {
    let description = crate::chat::render_markdown(description);
    page(
        session,
        &heading,
        html! {
            section class="card" {
                div class="title-row" {
                    h1 { (heading) " " span class={ "badge " (state) } { (state) } }
                    (actions)
                    (ask_duo(gid, &heading))
                }
                div class="prose" { (PreEscaped(description)) }
            }
            section class="card" {
                h2 { "Comments" }
                ul class="rows" {
                    @for (author, body) in notes {
                        li { strong { "@" (author) } div class="prose" { (PreEscaped(crate::chat::render_markdown(body))) } }
                    }
                    @if notes.is_empty() { li class="muted" { "No comments." } }
                }
            }
        },
    )
}

fn parse_iid(text: &str) -> Result<i32, PageError> {
    text.parse::<i32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or(PageError::NotFound)
}

async fn issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, PageError> {
    let (project_path, iid) = path.into_inner();
    let iid = parse_iid(&iid)?;
    let session = super::signed_in(&state, &req).await?;
    let db = state.pool.get().await?;
    let Some(project) = project_id(&*db, &project_path).await? else {
        return Err(PageError::NotFound);
    };
    let Some(item) = work_items::view_by_iid(&*db, Kind::Issue, project, iid).await? else {
        return Err(PageError::NotFound);
    };
    let id = item.id;
    if !readable(
        &state,
        &*db,
        &session,
        Ability::ReadIssue,
        Subject::Issue(id),
    )
    .await?
    {
        return Err(PageError::NotFound);
    }
    let notes = readable_notes(&state, &*db, &session, Kind::Issue, id).await?;
    drop(db);
    let actions = if super::workflow_pages::may_run_with_duo(&state, &session, project).await? {
        super::workflow_pages::run_with_duo_button(&session, &project_path, iid)
    } else {
        html! {}
    };
    Ok(item_page(
        &session,
        format!("{} (#{iid})", item.title),
        &crate::gid::format("Issue", id),
        &item.state,
        &item.description,
        &notes,
        actions,
    ))
}

async fn merge_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, PageError> {
    let (project_path, iid) = path.into_inner();
    let iid = parse_iid(&iid)?;
    let session = super::signed_in(&state, &req).await?;
    let db = state.pool.get().await?;
    let Some(project) = project_id(&*db, &project_path).await? else {
        return Err(PageError::NotFound);
    };
    let Some(item) = work_items::view_by_iid(&*db, Kind::MergeRequest, project, iid).await? else {
        return Err(PageError::NotFound);
    };
    let id = item.id;
    if !readable(
        &state,
        &*db,
        &session,
        Ability::ReadMergeRequest,
        Subject::MergeRequest(id),
    )
    .await?
    {
        return Err(PageError::NotFound);
    }
    let notes = readable_notes(&state, &*db, &session, Kind::MergeRequest, id).await?;
    Ok(item_page(
        &session,
        format!("{} (!{iid})", item.title),
        &crate::gid::format("MergeRequest", id),
        &item.state,
        &item.description,
        &notes,
        html! {},
    ))
}

async fn epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, PageError> {
    let (group_path, iid) = path.into_inner();
    let iid = parse_iid(&iid)?;
    let session = super::signed_in(&state, &req).await?;
    let db = state.pool.get().await?;
    let Some(group) = crate::namespaces::group_id_by_full_path(&*db, &group_path).await? else {
        return Err(PageError::NotFound);
    };
    let Some(item) = work_items::view_by_iid(&*db, Kind::Epic, group, iid).await? else {
        return Err(PageError::NotFound);
    };
    let id = item.id;
    if !readable(&state, &*db, &session, Ability::ReadEpic, Subject::Epic(id)).await? {
        return Err(PageError::NotFound);
    }
    let notes = readable_notes(&state, &*db, &session, Kind::Epic, id).await?;
    Ok(item_page(
        &session,
        format!("{} (&{iid})", item.title),
        &crate::gid::format("Epic", id),
        &item.state,
        &item.description,
        &notes,
        html! {},
    ))
}
