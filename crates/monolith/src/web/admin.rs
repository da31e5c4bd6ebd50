//! The admin area: instance Duo settings, Duo seats, and the Duo switches of
//! groups and projects ([`super::admin_models`] has the self-hosted models and
//! per-feature model selection, `admin_frame` what every admin page
//! shares). Only instance admins see it; for anyone else every admin page and
//! form is "not found", as GitLab hides its admin area.
//!
//! Pages are plain forms (no script): each carries the session's
//! `authenticity_token`; a changed setting redirects back with a notice, a
//! refused one shows the page again with the reason and what was entered.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Deserialize;

use super::PageError;
use super::admin_frame::{
    Flash, NoticeQuery, admin_page, admin_session, back_to, check_form_token, hidden_token,
};
use crate::app_state::AppState;
use crate::duo_settings::{self, DuoSettingsError, InstanceDuoSettings};
use crate::identity::sessions::SessionUser;
use crate::policy::add_ons::AddOn;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/admin", web::get().to(index))
        .service(
            web::resource("/admin/gitlab_duo")
                // A full MCP allow-list, URL-encoded, is larger than the
                // default 16 KiB form.
                .app_data(web::FormConfig::default().limit(SETTINGS_FORM_LIMIT))
                .route(web::get().to(settings_page))
                .route(web::post().to(update_settings)),
        )
        .route(
            "/admin/gitlab_duo/seat_utilization",
            web::get().to(seats_page),
        )
        .route(
            "/admin/gitlab_duo/seat_utilization",
            web::post().to(change_seat),
        )
        .route("/admin/gitlab_duo/switches", web::get().to(switches_page))
        .route("/admin/gitlab_duo/switches", web::post().to(change_switch));
}

impl From<DuoSettingsError> for PageError {
    fn from(e: DuoSettingsError) -> Self {
        match e {
            DuoSettingsError::NotFound(_) => PageError::NotFound,
            other => PageError::Internal(other.to_string()),
        }
    }
}

async fn index(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, PageError> {
    admin_session(&state, &req).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", "/admin/gitlab_duo"))
        .finish())
}

// ---- instance Duo settings -------------------------------------------------------

/// Largest settings form: [`crate::instance::MAX_MCP_ALLOWED_SERVERS`] entries
/// of [`crate::instance::MAX_MCP_SERVER_CHARS`], each character up to three
/// once URL-encoded, and room for the rest.
const SETTINGS_FORM_LIMIT: usize =
    crate::instance::MAX_MCP_ALLOWED_SERVERS * (crate::instance::MAX_MCP_SERVER_CHARS + 2) * 3
        + 16 * 1024;

/// The allow-list as the textarea shows it: one entry a line.
fn servers_text(servers: &[String]) -> String {
    servers.join("\n")
}

/// The textarea's entries: one a line (blank lines dropped when checked).
fn servers_of_text(text: &str) -> Vec<String> {
    text.lines().map(str::to_owned).collect()
}

fn settings_body(
    state: &AppState,
    session: &SessionUser,
    settings: &InstanceDuoSettings,
    entered_url: &str,
    entered_servers: &str,
    realm: &str,
    tier: &str,
) -> Markup {
    html! {
        form method="post" action="/admin/gitlab_duo" class="stack admin-form" id="duo-settings" {
            (hidden_token(session))
            label class="check" {
                input type="checkbox" name="duo_features_enabled" value="1" checked[settings.duo_features_enabled];
                " GitLab Duo features are on for this instance"
            }
            p class="hint" { "Off: nobody can use Duo Chat or any other Duo feature, whatever their seat." }
            label for="ai_gateway_url" { "AI gateway URL" }
            input id="ai_gateway_url" name="ai_gateway_url" type="url" maxlength="255" value=(entered_url)
                placeholder=(state.config.ai_gateway_url.as_str()) aria-describedby="ai_gateway_url_hint";
            p class="hint" id="ai_gateway_url_hint" {
                "Leave empty to use the configured AI_GATEWAY_URL (" code { (state.config.ai_gateway_url.as_str()) } ")."
            }
            label class="check" {
                input type="checkbox" name="experiment_features_enabled" value="1" checked[settings.experiment_features_enabled];
                " Experiment and beta AI features"
            }
            p class="hint" { "Features still in development; they may change or go away." }
            label class="check" {
                input type="checkbox" name="duo_workflow_mcp_enabled" value="1" checked[settings.duo_workflow_mcp_enabled];
                " Allow Duo Workflow to use MCP servers"
            }
            p class="hint" {
                "Flows may then call tools of the MCP servers their users configure, in top-level groups "
                "that allow it too, and only servers on the list below."
            }
            label for="duo_workflow_mcp_allowed_servers" { "Allowed MCP servers" }
            textarea id="duo_workflow_mcp_allowed_servers" name="duo_workflow_mcp_allowed_servers" rows="4"
                aria-describedby="duo_workflow_mcp_allowed_servers_hint" { (entered_servers) }
            p class="hint" id="duo_workflow_mcp_allowed_servers_hint" {
                "One a line: a URL prefix such as " code { "https://mcp.example.com/" } ", or " code { "*" }
                " for any server. Empty: no server is allowed. At most "
                (crate::instance::MAX_MCP_ALLOWED_SERVERS) " entries of "
                (crate::instance::MAX_MCP_SERVER_CHARS) " characters."
            }
            div { button type="submit" class="primary" { "Save changes" } }
        }
        dl class="facts" {
            dt { "Realm" } dd { (realm) }
            dt { "Subscription tier" } dd { (tier) }
        }
    }
}

async fn realm_and_tier(state: &AppState) -> Result<(String, String), PageError> {
    let db = state.pool.get().await?;
    let settings = crate::instance::settings(&*db).await?;
    Ok((settings.realm, settings.instance_tier))
}

async fn settings_page(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<NoticeQuery>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    let db = state.pool.get().await?;
    let settings = duo_settings::instance_settings(&*db).await?;
    let (realm, tier) = realm_and_tier(&state).await?;
    let url = settings.ai_gateway_url.clone().unwrap_or_default();
    let servers = servers_text(&settings.duo_workflow_mcp_allowed_servers);
    Ok(admin_page(
        &session,
        StatusCode::OK,
        "/admin/gitlab_duo",
        "GitLab Duo",
        &query.flash(),
        settings_body(&state, &session, &settings, &url, &servers, &realm, &tier),
    ))
}

#[derive(Deserialize)]
struct SettingsForm {
    #[serde(default)]
    authenticity_token: String,
    duo_features_enabled: Option<String>,
    #[serde(default)]
    ai_gateway_url: String,
    experiment_features_enabled: Option<String>,
    duo_workflow_mcp_enabled: Option<String>,
    /// Absent (a form without the field): the list stays as it is.
    duo_workflow_mcp_allowed_servers: Option<String>,
}

async fn update_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<SettingsForm>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let db = state.pool.get().await?;
    let servers = match &form.duo_workflow_mcp_allowed_servers {
        Some(text) => servers_of_text(text),
        None => {
            duo_settings::instance_settings(&*db)
                .await?
                .duo_workflow_mcp_allowed_servers
        }
    };
    let entered_servers = form
        .duo_workflow_mcp_allowed_servers
        .clone()
        .unwrap_or_else(|| servers_text(&servers));
    let settings = InstanceDuoSettings {
        duo_features_enabled: form.duo_features_enabled.is_some(),
        ai_gateway_url: Some(form.ai_gateway_url.clone()),
        experiment_features_enabled: form.experiment_features_enabled.is_some(),
        duo_workflow_mcp_enabled: form.duo_workflow_mcp_enabled.is_some(),
        duo_workflow_mcp_allowed_servers: servers,
    };
    let attempts = state.config.code_index.max_attempts;
    match duo_settings::update_instance_settings(&*db, &settings, attempts).await {
        Ok(()) => Ok(back_to("/admin/gitlab_duo", "saved")),
        Err(DuoSettingsError::Invalid(why)) => {
            let (realm, tier) = realm_and_tier(&state).await?;
            Ok(admin_page(
                &session,
                StatusCode::UNPROCESSABLE_ENTITY,
                "/admin/gitlab_duo",
                "GitLab Duo",
                &Flash::error(why),
                settings_body(
                    &state,
                    &session,
                    &settings,
                    &form.ai_gateway_url,
                    &entered_servers,
                    &realm,
                    &tier,
                ),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

// ---- seats -----------------------------------------------------------------------

const ADD_ONS: [(AddOn, &str); 2] = [
    (AddOn::DuoPro, "Duo Pro"),
    (AddOn::DuoEnterprise, "Duo Enterprise"),
];

async fn seats_response(
    state: &AppState,
    session: &SessionUser,
    status: StatusCode,
    flash: &Flash,
    search: &str,
) -> Result<HttpResponse, PageError> {
    let db = state.pool.get().await?;
    let counts = duo_settings::seat_counts(&*db).await?;
    let (holders, more) = duo_settings::seat_holders(&*db, search).await?;
    let body = html! {
        p class="hint" {
            "A user needs a Duo seat to use Duo Chat. Duo Pro gives chat and the slash commands; "
            "Duo Enterprise adds questions about issues, epics, merge requests and jobs."
        }
        table class="admin-table" id="seat-counts" {
            thead { tr { th { "Add-on" } th { "Assigned" } th { "Purchased" } } }
            tbody {
                @for count in &counts {
                    tr {
                        td { (ADD_ONS.iter().find(|(a, _)| *a == count.add_on).map(|(_, l)| *l).unwrap_or("")) }
                        td { (count.assigned) }
                        td {
                            @if count.purchased == 0 { span class="muted" { "none yet (the first assignment buys 100)" } }
                            @else { (count.purchased) }
                        }
                    }
                }
            }
        }
        form method="get" action="/admin/gitlab_duo/seat_utilization" class="search" role="search" {
            label for="search" class="visually-hidden" { "Search users" }
            input id="search" name="search" type="search" maxlength=(duo_settings::MAX_SEARCH_CHARS)
                value=(search) placeholder="Search by username or name";
            button type="submit" { "Search" }
        }
        table class="admin-table" id="seats" {
            thead { tr { th { "User" } @for (_, label) in &ADD_ONS { th { (label) } } } }
            tbody {
                @for holder in &holders {
                    tr data-username=(holder.username) {
                        td {
                            strong { (holder.name) } " " span class="muted" { "@" (holder.username) }
                            @if holder.admin { " " span class="badge" { "admin" } }
                        }
                        @for (add_on, label) in &ADD_ONS {
                            @let held = holder.add_ons.contains(add_on);
                            td {
                                form method="post" action="/admin/gitlab_duo/seat_utilization" class="inline" {
                                    (hidden_token(session))
                                    input type="hidden" name="user_id" value=(holder.user_id);
                                    input type="hidden" name="add_on" value=(add_on.as_str());
                                    input type="hidden" name="search" value=(search);
                                    @if held {
                                        span class="badge opened" { "assigned" } " "
                                        input type="hidden" name="action" value="unassign";
                                        button type="submit" class="small" id={ "seat-" (add_on.as_str()) "-" (holder.username) }
                                            aria-label={ "Remove the " (label) " seat of @" (holder.username) } { "Remove" }
                                    } @else {
                                        input type="hidden" name="action" value="assign";
                                        button type="submit" class="small" id={ "seat-" (add_on.as_str()) "-" (holder.username) }
                                            aria-label={ "Assign a " (label) " seat to @" (holder.username) } { "Assign" }
                                    }
                                }
                            }
                        }
                    }
                }
                @if holders.is_empty() { tr { td colspan="3" class="muted" { "No users match." } } }
            }
        }
        @if more {
            p class="hint" { "Showing the first " (duo_settings::SEAT_PAGE_ROWS) " users: search to find others." }
        }
    };
    Ok(admin_page(
        session,
        status,
        "/admin/gitlab_duo/seat_utilization",
        "Duo seats",
        flash,
        body,
    ))
}

async fn seats_page(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<NoticeQuery>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    let search = query.search.as_deref().unwrap_or("");
    seats_response(&state, &session, StatusCode::OK, &query.flash(), search).await
}

#[derive(Deserialize)]
struct SeatForm {
    #[serde(default)]
    authenticity_token: String,
    #[serde(default)]
    user_id: String,
    #[serde(default)]
    add_on: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    search: String,
}

async fn change_seat(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<SeatForm>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let refuse = |why: &str| Flash::error(why);
    let (Ok(user_id), Some(add_on)) = (form.user_id.parse::<i64>(), AddOn::parse(&form.add_on))
    else {
        return seats_response(
            &state,
            &session,
            StatusCode::UNPROCESSABLE_ENTITY,
            &refuse("Choose a user and an add-on."),
            &form.search,
        )
        .await;
    };
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    let outcome = match form.action.as_str() {
        "assign" => duo_settings::assign_seat(&tx, add_on, user_id)
            .await
            .map(|_| "assigned"),
        "unassign" => duo_settings::unassign_seat(&tx, add_on, user_id)
            .await
            .map(|_| "unassigned"),
        _ => Err(DuoSettingsError::Invalid(
            "Unknown action: assign or unassign a seat.".into(),
        )),
    };
    match outcome {
        Ok(notice) => {
            tx.commit().await?;
            let search = form.search.trim();
            Ok(if search.is_empty() {
                back_to("/admin/gitlab_duo/seat_utilization", notice)
            } else {
                back_to(
                    &format!(
                        "/admin/gitlab_duo/seat_utilization?search={}",
                        url::form_urlencoded::byte_serialize(search.as_bytes()).collect::<String>()
                    ),
                    notice,
                )
            })
        }
        Err(DuoSettingsError::Db(e)) => Err(e.into()),
        Err(e) => {
            drop(tx);
            drop(db);
            let status = match e {
                DuoSettingsError::NoSeatsLeft => StatusCode::CONFLICT,
                DuoSettingsError::UnknownUser => StatusCode::NOT_FOUND,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            };
            seats_response(
                &state,
                &session,
                status,
                &refuse(&e.to_string()),
                &form.search,
            )
            .await
        }
    }
}

// ---- group and project switches --------------------------------------------------

fn switch_form(
    session: &SessionUser,
    kind: &str,
    id: i64,
    on: bool,
    what: &str,
    label: &str,
) -> Markup {
    html! {
        form method="post" action="/admin/gitlab_duo/switches" class="inline" {
            (hidden_token(session))
            input type="hidden" name="kind" value=(kind);
            input type="hidden" name="id" value=(id);
            input type="hidden" name="enabled" value=(if on { "false" } else { "true" });
            span class={ "badge " (if on { "opened" } else { "closed" }) } { (if on { "on" } else { "off" }) } " "
            button type="submit" class="small" id={ "switch-" (kind) "-" (id) }
                aria-label={ (if on { "Turn off " } else { "Turn on " }) (label) " for " (what) } {
                (if on { "Turn off" } else { "Turn on" })
            }
        }
    }
}

async fn switches_response(
    state: &AppState,
    session: &SessionUser,
    status: StatusCode,
    flash: &Flash,
) -> Result<HttpResponse, PageError> {
    let db = state.pool.get().await?;
    let groups = duo_settings::group_switches(&*db).await?;
    let projects = duo_settings::project_switches(&*db).await?;
    let body = html! {
        p class="hint" {
            "Duo features switched off on a group are off for all its subgroups and projects. "
            "Experiment and beta features, and whether Duo Workflow may use MCP servers "
            "(when the instance allows it too), are set on top-level groups."
        }
        h2 { "Groups" }
        table class="admin-table" id="group-switches" {
            thead { tr { th { "Group" } th { "Duo features" } th { "Experiment and beta features" } th { "MCP servers in Duo Workflow" } } }
            tbody {
                @for g in &groups {
                    tr {
                        td { a href={ "/" (g.full_path) } { (g.full_path) }
                             @if g.duo_features_enabled && !g.effective { " " span class="muted" { "(off through a parent group)" } } }
                        td { (switch_form(session, "group", g.id, g.duo_features_enabled, &g.full_path, "Duo features")) }
                        td {
                            @if g.top_level {
                                (switch_form(session, "group_experiments", g.id, g.experiment_features_enabled, &g.full_path, "experiment features"))
                            } @else { span class="muted" { "set on the top-level group" } }
                        }
                        td {
                            @if g.top_level {
                                (switch_form(session, "group_mcp", g.id, g.duo_workflow_mcp_enabled, &g.full_path, "MCP servers in Duo Workflow"))
                            } @else { span class="muted" { "set on the top-level group" } }
                        }
                    }
                }
                @if groups.is_empty() { tr { td colspan="4" class="muted" { "No groups yet." } } }
            }
        }
        h2 { "Projects" }
        table class="admin-table" id="project-switches" {
            thead { tr { th { "Project" } th { "Duo features" } } }
            tbody {
                @for p in &projects {
                    tr {
                        td { a href={ "/" (p.full_path) } { (p.full_path) }
                             @if p.duo_features_enabled && !p.effective { " " span class="muted" { "(off through its group)" } } }
                        td { (switch_form(session, "project", p.id, p.duo_features_enabled, &p.full_path, "Duo features")) }
                    }
                }
                @if projects.is_empty() { tr { td colspan="2" class="muted" { "No projects yet." } } }
            }
        }
    };
    Ok(admin_page(
        session,
        status,
        "/admin/gitlab_duo/switches",
        "Duo in groups and projects",
        flash,
        body,
    ))
}

async fn switches_page(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<NoticeQuery>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    switches_response(&state, &session, StatusCode::OK, &query.flash()).await
}

#[derive(Deserialize)]
struct SwitchForm {
    #[serde(default)]
    authenticity_token: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    enabled: String,
}

async fn change_switch(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<SwitchForm>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let enabled = match form.enabled.as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    };
    let (Ok(id), Some(enabled)) = (form.id.parse::<i64>(), enabled) else {
        return switches_response(
            &state,
            &session,
            StatusCode::UNPROCESSABLE_ENTITY,
            &Flash::error("Choose a group or project and on or off."),
        )
        .await;
    };
    let db = state.pool.get().await?;
    let attempts = state.config.code_index.max_attempts;
    let outcome = match form.kind.as_str() {
        "group" => duo_settings::set_group_duo(&*db, id, enabled, attempts).await,
        "group_experiments" => {
            duo_settings::set_top_level_group_switch(
                &*db,
                id,
                duo_settings::TopLevelGroupSwitch::Experiments,
                enabled,
            )
            .await
        }
        "group_mcp" => {
            duo_settings::set_top_level_group_switch(
                &*db,
                id,
                duo_settings::TopLevelGroupSwitch::WorkflowMcp,
                enabled,
            )
            .await
        }
        "project" => duo_settings::set_project_duo(&*db, id, enabled, attempts).await,
        _ => Err(DuoSettingsError::Invalid(
            "Unknown switch: group, group_experiments, group_mcp or project.".into(),
        )),
    };
    drop(db);
    match outcome {
        Ok(()) => Ok(back_to("/admin/gitlab_duo/switches", "switched")),
        Err(DuoSettingsError::Db(e)) => Err(e.into()),
        Err(e @ DuoSettingsError::CodeIndex(_)) => Err(e.into()),
        Err(e) => {
            let status = match e {
                DuoSettingsError::NotFound(_) => StatusCode::NOT_FOUND,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            };
            switches_response(&state, &session, status, &Flash::error(e.to_string())).await
        }
    }
}
