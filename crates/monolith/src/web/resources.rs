//! Read-only pages for projects, issues, merge requests and epics, each with an
//! "Ask Duo" button that opens the chat with that resource attached. Every page
//! asks the policy first; what a user may not read is "not found", as on the API.

use crate::queries::Queries;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, PreEscaped, html};

use super::PageError;
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::identity::sessions::SessionUser;
use crate::namespaces::FULL_PATHS;
use crate::policy::{Ability, Actor, Subject};

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
    let rows = db
        .query(
            &format!(
                "{FULL_PATHS} SELECT p.id, p.name, paths.full_path || '/' || p.path, p.description
                 FROM projects p JOIN paths ON paths.id = p.group_id ORDER BY 3 LIMIT 500"
            ),
            &[],
        )
        .await?;
    let mut visible = Vec::new();
    for row in &rows {
        let id: i64 = row.get(0);
        if readable(
            &state,
            &*db,
            &session,
            Ability::ReadProject,
            Subject::Project(id),
        )
        .await?
        {
            visible.push((
                row.get::<_, String>(1),
                row.get::<_, String>(2),
                row.get::<_, String>(3),
            ));
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
    let row = db
        .query_one(
            "SELECT name, description, visibility FROM projects WHERE id = $1",
            &[&id],
        )
        .await?;
    let name: String = row.get(0);
    let issues = db
        .query(
            "SELECT id, iid, title, state FROM issues WHERE project_id = $1 ORDER BY iid DESC LIMIT $2",
            &[&id, &LIST_LIMIT],
        )
        .await?;
    let mut issue_rows = Vec::new();
    for r in &issues {
        if readable(
            &state,
            &*db,
            &session,
            Ability::ReadIssue,
            Subject::Issue(r.get(0)),
        )
        .await?
        {
            issue_rows.push((
                r.get::<_, i32>(1),
                r.get::<_, String>(2),
                r.get::<_, String>(3),
            ));
        }
    }
    let mrs = db
        .query(
            "SELECT iid, title, state FROM merge_requests WHERE project_id = $1 ORDER BY iid DESC LIMIT $2",
            &[&id, &LIST_LIMIT],
        )
        .await?;
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
                p { (row.get::<_, String>(1)) }
                p class="muted" { "Visibility: " (row.get::<_, String>(2)) }
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
                        @for r in &mrs {
                            li { a href={ "/" (path) "/-/merge_requests/" (r.get::<_, i32>(0)) } { "!" (r.get::<_, i32>(0)) " " (r.get::<_, String>(1)) } " " span class="badge" { (r.get::<_, String>(2)) } }
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
async fn notes(
    state: &AppState,
    db: &impl Queries,
    session: &SessionUser,
    kind: &str,
    id: i64,
) -> Result<Vec<(String, String)>, PageError> {
    let rows = db
        .query(
            "SELECT n.id, u.username, n.body FROM notes n JOIN users u ON u.id = n.author_id
             WHERE n.noteable_type = $1 AND n.noteable_id = $2 AND NOT n.system
             ORDER BY n.id LIMIT 100",
            &[&kind, &id],
        )
        .await?;
    let mut out = Vec::new();
    for r in &rows {
        if readable(
            state,
            db,
            session,
            Ability::ReadNote,
            Subject::Note(r.get(0)),
        )
        .await?
        {
            out.push((r.get(1), r.get(2)));
        }
    }
    Ok(out)
}

fn item_page(
    session: &SessionUser,
    heading: String,
    gid: &str,
    state: &str,
    description: &str,
    notes: &[(String, String)],
) -> HttpResponse {
    let description = crate::chat::render_markdown(description);
    page(
        session,
        &heading,
        html! {
            section class="card" {
                div class="title-row" {
                    h1 { (heading) " " span class={ "badge " (state) } { (state) } }
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
    let Some(row) = db
        .query_opt(
            "SELECT id, title, description, state FROM issues WHERE project_id = $1 AND iid = $2",
            &[&project, &iid],
        )
        .await?
    else {
        return Err(PageError::NotFound);
    };
    let id: i64 = row.get(0);
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
    let notes = notes(&state, &*db, &session, "Issue", id).await?;
    Ok(item_page(
        &session,
        format!("{} (#{iid})", row.get::<_, String>(1)),
        &crate::gid::format("Issue", id),
        &row.get::<_, String>(3),
        &row.get::<_, String>(2),
        &notes,
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
    let Some(row) = db
        .query_opt(
            "SELECT id, title, description, state FROM merge_requests WHERE project_id = $1 AND iid = $2",
            &[&project, &iid],
        )
        .await?
    else {
        return Err(PageError::NotFound);
    };
    let id: i64 = row.get(0);
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
    let notes = notes(&state, &*db, &session, "MergeRequest", id).await?;
    Ok(item_page(
        &session,
        format!("{} (!{iid})", row.get::<_, String>(1)),
        &crate::gid::format("MergeRequest", id),
        &row.get::<_, String>(3),
        &row.get::<_, String>(2),
        &notes,
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
    let Some(row) = db
        .query_opt(
            "SELECT id, title, description, state FROM epics WHERE group_id = $1 AND iid = $2",
            &[&group, &iid],
        )
        .await?
    else {
        return Err(PageError::NotFound);
    };
    let id: i64 = row.get(0);
    if !readable(&state, &*db, &session, Ability::ReadEpic, Subject::Epic(id)).await? {
        return Err(PageError::NotFound);
    }
    let notes = notes(&state, &*db, &session, "Epic", id).await?;
    Ok(item_page(
        &session,
        format!("{} (&{iid})", row.get::<_, String>(1)),
        &crate::gid::format("Epic", id),
        &row.get::<_, String>(3),
        &row.get::<_, String>(2),
        &notes,
    ))
}
