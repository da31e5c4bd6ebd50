//! The admin page of feature flags (`/admin/feature_flags`): every flag the
//! code knows or an administrator set, with its state, gates, default and
//! description, and a form per flag to turn it on for everyone, off for
//! everyone, or back to its default. Finer gates (actors, percentages) are
//! set through the Features API; the page shows them.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Deserialize;

use super::PageError;
use super::admin_frame::{
    Flash, NoticeQuery, admin_page, admin_session, back_to, check_form_token, hidden_token,
};
use crate::app_state::AppState;
use crate::features::{self, Flag, GateChange, store};
use crate::identity::sessions::SessionUser;

const PAGE: &str = "/admin/feature_flags";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PAGE, web::get().to(flags_page))
        .route(PAGE, web::post().to(change_flag));
}

/// A gate as the page shows it: `percentage_of_actors: 30`.
fn gate_text(key: &str, value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Array(items) => format!(
            "{key}: {}",
            items
                .iter()
                .filter_map(serde_json::Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => format!("{key}: {other}"),
    }
}

fn switch_form(session: &SessionUser, name: &str, action: &str, label: &str) -> Markup {
    html! {
        form method="post" action=(PAGE) class="inline" {
            (hidden_token(session))
            input type="hidden" name="name" value=(name);
            input type="hidden" name="action" value=(action);
            button type="submit" class="small" id={ "flag-" (action) "-" (name) }
                aria-label={ (label) ": " (name) } { (label) }
        }
    }
}

fn flags_body(session: &SessionUser, flags: &[Flag], entered: &str) -> Markup {
    html! {
        p class="hint" {
            "Flags decide which new behaviour Duo uses, such as the tools chat may run. "
            "A flag nobody set follows its default; once set, its gates decide. "
            "Actor and percentage gates are set through the Features API ("
            code { "POST /api/v4/features/:name" } ")."
        }
        table class="admin-table" id="feature-flags" {
            thead { tr { th { "Flag" } th { "State" } th { "Gates" } th { "Default" } th { "Description" } th { "Change" } } }
            tbody {
                @for flag in flags {
                    @let state = flag.state().as_str();
                    @let definition = flag.definition();
                    tr data-flag=(flag.name) data-state=(state) {
                        td { code { (flag.name) } }
                        td { span class={ "badge" @if state == "on" { " opened" } } { (state) } }
                        td {
                            @match &flag.gates {
                                Some(gates) => {
                                    @for (key, value) in gates.gate_list() {
                                        div { (gate_text(key, &value)) }
                                    }
                                }
                                None => { span class="muted" { "not set (default)" } }
                            }
                        }
                        td {
                            @match definition {
                                Some(d) => { (if d.default_enabled { "on" } else { "off" }) }
                                None => { span class="muted" { "unknown flag: off" } }
                            }
                        }
                        td { (definition.map_or("", |d| d.description)) }
                        td class="actions" {
                            (switch_form(session, &flag.name, "on", "Turn on"))
                            (switch_form(session, &flag.name, "off", "Turn off"))
                            @if flag.gates.is_some() {
                                (switch_form(session, &flag.name, "reset", "Reset to default"))
                            }
                        }
                    }
                }
            }
        }
        form method="post" action=(PAGE) class="search" id="set-flag" {
            (hidden_token(session))
            label for="flag-name" { "Another flag" }
            input id="flag-name" name="name" type="text" maxlength=(features::MAX_NAME_CHARS)
                pattern="[a-z][a-z0-9_]*" value=(entered) placeholder="flag_name";
            input type="hidden" name="action" value="on";
            button type="submit" { "Turn on" }
        }
    }
}

async fn flags_response(
    state: &AppState,
    session: &SessionUser,
    status: StatusCode,
    flash: &Flash,
    entered: &str,
) -> Result<HttpResponse, PageError> {
    let db = state.pool.get().await?;
    let flags = store::all(&*db).await?;
    Ok(admin_page(
        session,
        status,
        PAGE,
        "Feature flags",
        flash,
        flags_body(session, &flags, entered),
    ))
}

async fn flags_page(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<NoticeQuery>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    flags_response(&state, &session, StatusCode::OK, &query.flash(), "").await
}

#[derive(Deserialize)]
struct FlagForm {
    #[serde(default)]
    authenticity_token: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    action: String,
}

async fn change_flag(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<FlagForm>,
) -> Result<HttpResponse, PageError> {
    let session = admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let name = form.name.trim();
    let refuse = |why: &'static str| {
        let flash = Flash::error(why);
        let (state, session) = (&state, &session);
        async move {
            flags_response(
                state,
                session,
                StatusCode::UNPROCESSABLE_ENTITY,
                &flash,
                name,
            )
            .await
        }
    };
    if !features::valid_name(name) {
        return refuse(
            "A flag name is lower-case letters, digits and underscores, starting with a letter.",
        )
        .await;
    }
    let mut db = state.pool.get().await?;
    match form.action.as_str() {
        "on" | "off" => {
            let on = form.action == "on";
            store::set(&mut db, name, &[GateChange::Boolean(on)])
                .await
                .map_err(|e| PageError::Internal(e.to_string()))?;
        }
        "reset" => {
            store::delete(&*db, name).await?;
        }
        _ => return refuse("Unknown action: turn the flag on, off, or reset it.").await,
    }
    Ok(back_to(PAGE, "switched"))
}
