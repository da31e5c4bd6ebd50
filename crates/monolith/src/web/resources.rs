//! Pages for projects, issues, merge requests and epics, each with an
//! "Ask Duo" button that opens the chat with that resource attached, on an
//! issue "Run with Duo" for who may run workflows there (see
//! [`super::workflow_pages`]), and on a merge request its reviewers with
//! "Request review from GitLab Duo" for who may set them. Items list their
//! discussions (diff notes with their file and line, resolved threads
//! marked). Every page asks the policy first; what a user may not read is
//! "not found", as on the API.

use crate::queries::Queries;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, PreEscaped, html};

use super::PageError;
use super::duo_prompts::{self, PredefinedPrompt};
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::identity::sessions::{self, SessionUser};
use crate::identity::users;
use crate::policy::{Ability, Actor, Subject};
use crate::work_items::discussions::{self, Discussion, Noteable};
use crate::work_items::notes::Note;
use crate::work_items::reviewers::{self, Reviewer};
use crate::work_items::{self, Kind, issues, merge_requests};

/// Most rows a list on a page shows.
const LIST_LIMIT: i64 = 50;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/explore/projects", web::get().to(projects))
        .route("/groups/{path:.+}/-/epics/{iid}", web::get().to(epic))
        .route("/{path:.+}/-/issues/{iid}", web::get().to(issue))
        .route(
            "/{path:.+}/-/merge_requests/{iid}",
            web::get().to(merge_request),
        )
        .route(
            "/{path:.+}/-/merge_requests/{iid}/duo_review",
            web::post().to(request_duo_review),
        );
}

/// The project page is matched last of all routes (its path is any path).
pub fn project_route(cfg: &mut web::ServiceConfig) {
    cfg.route("/{path:.+}", web::get().to(project));
}

fn actor(session: &SessionUser) -> Option<Actor> {
    Some(Actor::from(&session.user))
}

pub(super) fn ask_duo(gid: &str, title: &str) -> Markup {
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

/// Most discussions an item's page shows.
const DISCUSSION_LIMIT: usize = 100;

/// The discussions of one item with the notes people wrote that the user may
/// read (internal notes need the policy's say), oldest first.
async fn readable_discussions(
    state: &AppState,
    db: &impl Queries,
    session: &SessionUser,
    kind: Kind,
    id: i64,
) -> Result<Vec<Discussion>, PageError> {
    let mut out = Vec::new();
    for mut discussion in discussions::list(db, Noteable { kind, id }).await? {
        let mut kept = Vec::new();
        for note in discussion.notes {
            if !note.system
                && readable(
                    state,
                    db,
                    session,
                    Ability::ReadNote,
                    Subject::Note(note.id),
                )
                .await?
            {
                kept.push(note);
            }
        }
        if kept.is_empty() {
            continue;
        }
        discussion.notes = kept;
        out.push(discussion);
        if out.len() >= DISCUSSION_LIMIT {
            break;
        }
    }
    Ok(out)
}

fn note_markup(note: &Note) -> Markup {
    html! {
        strong { "@" (note.author.username) }
        div class="prose" { (PreEscaped(crate::chat::render_markdown(&note.body))) }
    }
}

/// `file:line` of a diff note's thread (the new line, else the old one).
fn diff_place(discussion: &Discussion) -> Option<String> {
    let position = discussion.first()?.position.as_ref()?;
    Some(match (position.new_line, position.old_line) {
        (Some(line), _) => format!("{}:{line}", position.new_path),
        (None, Some(line)) => format!("{}:{line}", position.old_path),
        (None, None) => position.new_path.clone(),
    })
}

fn discussions_markup(threads: &[Discussion]) -> Markup {
    html! {
        section class="card" {
            h2 { "Comments" }
            ul class="rows" {
                @for thread in threads {
                    @if thread.individual_note {
                        @for note in &thread.notes { li { (note_markup(note)) } }
                    } @else {
                        li class={ "thread" @if thread.resolved() { " resolved" } } id={ "discussion-" (thread.id) } {
                            @if let Some(place) = diff_place(thread) {
                                code class="diff-position" { (place) } " "
                            }
                            @if thread.resolved() {
                                span class="badge resolved" { "resolved" }
                            } @else if thread.resolvable() {
                                span class="badge unresolved" { "unresolved" }
                            }
                            ul class="replies" {
                                @for note in &thread.notes { li { (note_markup(note)) } }
                            }
                        }
                    }
                }
                @if threads.is_empty() { li class="muted" { "No comments." } }
            }
        }
    }
}

/// "Summarize comments" for an item with comments the user may read, when
/// they could ask it.
async fn summarize_comments(
    state: &AppState,
    session: &SessionUser,
    threads: &[Discussion],
    item: Subject,
    gid: &str,
    heading: &str,
) -> Result<Markup, PageError> {
    let prompt = PredefinedPrompt::SummarizeComments;
    if threads.is_empty() || !duo_prompts::offered(state, session, prompt, item).await? {
        return Ok(html! {});
    }
    Ok(duo_prompts::link(prompt, gid, heading))
}

/// The page of an issue, merge request or epic; `actions` go beside
/// "Ask Duo" (e.g. "Run with Duo" on an issue), `extra` between the
/// description and the discussions (a merge request's reviewers).
struct ItemPage<'a> {
    heading: String,
    gid: &'a str,
    state: &'a str,
    description: &'a str,
    discussions: &'a [Discussion],
    actions: Markup,
    extra: Markup,
}

fn item_page(session: &SessionUser, item: ItemPage<'_>) -> HttpResponse {
    let description = crate::chat::render_markdown(item.description);
    page(
        session,
        &item.heading,
        html! {
            section class="card" {
                div class="title-row" {
                    h1 { (item.heading) " " span class={ "badge " (item.state) } { (item.state) } }
                    div class="actions" {
                        (item.actions)
                        (ask_duo(item.gid, &item.heading))
                    }
                }
                div class="prose" { (PreEscaped(description)) }
            }
            (item.extra)
            (discussions_markup(item.discussions))
        },
    )
}

/// A merge request's reviewers (the review bot as "GitLab Duo") and, for
/// who may set them, the form asking the bot for a review.
fn reviewers_markup(
    session: &SessionUser,
    reviewers: &[Reviewer],
    bot: Option<i64>,
    request_form: Option<&str>,
) -> Markup {
    html! {
        section class="card reviewers" {
            h2 { "Reviewers" }
            ul class="rows" {
                @for r in reviewers {
                    li {
                        @if Some(r.user.id) == bot { strong { "GitLab Duo" } } @else { strong { (r.user.name) } }
                        " " span class="muted" { "@" (r.user.username) }
                        " " span class={ "badge " (r.state) } { (r.state.replace('_', " ")) }
                    }
                }
                @if reviewers.is_empty() { li class="muted" { "No reviewers." } }
            }
            @if let Some(action) = request_form {
                form method="post" action=(action) class="inline duo-review" {
                    input type="hidden" name="authenticity_token" value=(session.csrf_token);
                    button type="submit" class="secondary" id="request-duo-review"
                        title="GitLab Duo reviews the changes and comments on the lines it has something to say about" {
                        "Request review from GitLab Duo"
                    }
                }
            }
        }
    }
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
    let threads = readable_discussions(&state, &*db, &session, Kind::Issue, id).await?;
    drop(db);
    let run_with_duo = if super::workflow_pages::may_run_with_duo(&state, &session, project).await?
    {
        super::workflow_pages::run_with_duo_button(&session, &project_path, iid)
    } else {
        html! {}
    };
    let heading = format!("{} (#{iid})", item.title);
    let gid = crate::gid::format("Issue", id);
    let summarize = summarize_comments(
        &state,
        &session,
        &threads,
        Subject::Issue(id),
        &gid,
        &heading,
    )
    .await?;
    Ok(item_page(
        &session,
        ItemPage {
            heading,
            gid: &gid,
            state: &item.state,
            description: &item.description,
            discussions: &threads,
            actions: html! { (summarize) (run_with_duo) },
            extra: html! {},
        },
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
    let threads = readable_discussions(&state, &*db, &session, Kind::MergeRequest, id).await?;
    let reviewers = reviewers::list(&*db, id).await?;
    let bot = users::review_bot(&*db).await?.map(|b| b.id);
    let may_request = bot.is_some()
        && state
            .policy
            .may_set_reviewers(&*db, actor(&session), project)
            .await?;
    let action = format!("/{project_path}/-/merge_requests/{iid}/duo_review");
    let extra = reviewers_markup(
        &session,
        &reviewers,
        bot,
        may_request.then_some(action.as_str()),
    );
    drop(db);
    let heading = format!("{} (!{iid})", item.title);
    let gid = crate::gid::format("MergeRequest", id);
    let summarize = summarize_comments(
        &state,
        &session,
        &threads,
        Subject::MergeRequest(id),
        &gid,
        &heading,
    )
    .await?;
    Ok(item_page(
        &session,
        ItemPage {
            heading,
            gid: &gid,
            state: &item.state,
            description: &item.description,
            discussions: &threads,
            actions: summarize,
            extra,
        },
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
    let threads = readable_discussions(&state, &*db, &session, Kind::Epic, id).await?;
    drop(db);
    let heading = format!("{} (&{iid})", item.title);
    let gid = crate::gid::format("Epic", id);
    let summarize = summarize_comments(
        &state,
        &session,
        &threads,
        Subject::Epic(id),
        &gid,
        &heading,
    )
    .await?;
    Ok(item_page(
        &session,
        ItemPage {
            heading,
            gid: &gid,
            state: &item.state,
            description: &item.description,
            discussions: &threads,
            actions: summarize,
            extra: html! {},
        },
    ))
}

#[derive(serde::Deserialize)]
struct DuoReviewForm {
    #[serde(default)]
    authenticity_token: String,
}

/// "Request review from GitLab Duo": the review bot added as a reviewer
/// (or asked again), as `reviewer_ids` does through the API, then back to
/// the merge request.
async fn request_duo_review(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<DuoReviewForm>,
) -> Result<HttpResponse, PageError> {
    let (project_path, iid) = path.into_inner();
    let iid = parse_iid(&iid)?;
    let session = super::signed_in(&state, &req).await?;
    if !sessions::csrf_matches(&session.csrf_token, Some(&form.authenticity_token)) {
        return Err(PageError::Forbidden(
            "Invalid form token. Reload the page and try again.",
        ));
    }
    let db = state.pool.get().await?;
    let Some(project) = project_id(&*db, &project_path).await? else {
        return Err(PageError::NotFound);
    };
    let Some(item) = work_items::view_by_iid(&*db, Kind::MergeRequest, project, iid).await? else {
        return Err(PageError::NotFound);
    };
    if !readable(
        &state,
        &*db,
        &session,
        Ability::ReadMergeRequest,
        Subject::MergeRequest(item.id),
    )
    .await?
    {
        return Err(PageError::NotFound);
    }
    if !state
        .policy
        .may_set_reviewers(&*db, actor(&session), project)
        .await?
    {
        return Err(PageError::Forbidden(
            "You cannot set the reviewers of this merge request.",
        ));
    }
    let Some(bot) = users::review_bot(&*db).await? else {
        return Err(PageError::Unprocessable(
            "This instance has no GitLab Duo review bot.".into(),
        ));
    };
    reviewers::request(&*db, item.id, bot.id)
        .await
        .map_err(|e| PageError::Internal(e.to_string()))?;
    if let Err(e) =
        crate::review::triggers::reviewers_added(&*db, project, iid, session.user.id, &[bot.id])
            .await
    {
        tracing::warn!(error = %e, project, iid, "could not enqueue the Duo review");
    }
    Ok(HttpResponse::SeeOther()
        .insert_header((
            "Location",
            format!("/{project_path}/-/merge_requests/{iid}"),
        ))
        .finish())
}
