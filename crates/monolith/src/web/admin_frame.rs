//! What every admin page shares: the gate in front of the admin area (instance
//! admins only; "not found" for anyone else), the form token each form
//! carries, and the frame a page sits in (side navigation, notice or refusal).
//! The pages themselves live in [`super::admin`] and [`super::admin_models`].

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use maud::{Markup, html};
use serde::Deserialize;

use super::PageError;
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::identity::sessions::{self, SessionUser};
use crate::policy::{Ability, Actor, Subject};

/// The signed-in instance admin, or "not found" for anyone else.
pub(super) async fn admin_session(
    state: &AppState,
    req: &HttpRequest,
) -> Result<SessionUser, PageError> {
    let session = super::signed_in(state, req).await?;
    let db = state.pool.get().await?;
    let allowed = state
        .policy
        .can(
            &*db,
            Some(Actor::from(&session.user)),
            Ability::AdministerInstance,
            Subject::Global,
        )
        .await?;
    if !allowed {
        return Err(PageError::NotFound);
    }
    Ok(session)
}

/// The form's token matches the session's, or the form is refused.
pub(super) fn check_form_token(session: &SessionUser, presented: &str) -> Result<(), PageError> {
    if sessions::csrf_matches(&session.csrf_token, Some(presented)) {
        Ok(())
    } else {
        Err(PageError::Forbidden(
            "Invalid form token. Reload the page and try again.",
        ))
    }
}

/// The admin area's sections, for its side navigation.
const SECTIONS: &[(&str, &str)] = &[
    ("/admin/gitlab_duo", "Duo settings"),
    ("/admin/gitlab_duo/seat_utilization", "Seats"),
    ("/admin/gitlab_duo/switches", "Groups and projects"),
    ("/admin/ai/duo_self_hosted", "Self-hosted models"),
    ("/admin/ai/duo_self_hosted/features", "AI features"),
    ("/admin/ai_usage", "AI usage"),
    ("/admin/applications", "Applications"),
    ("/admin/feature_flags", "Feature flags"),
];

/// What a page says above its content: a notice after a change, or why a
/// change was refused.
#[derive(Debug, Default, Clone)]
pub(super) struct Flash {
    pub notice: Option<String>,
    pub error: Option<String>,
}

impl Flash {
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            notice: None,
            error: Some(text.into()),
        }
    }
    pub fn notice(text: impl Into<String>) -> Self {
        Self {
            notice: Some(text.into()),
            error: None,
        }
    }
}

/// An admin page: the side navigation, the flash, the section's content.
pub(super) fn admin_page(
    session: &SessionUser,
    status: StatusCode,
    current: &str,
    title: &str,
    flash: &Flash,
    body: Markup,
) -> HttpResponse {
    let markup = layout::render(
        Page {
            title,
            session: Some(session),
            scripts: &[],
            data: serde_json::Value::Null,
        },
        html! {
            div class="admin" {
                nav class="admin-nav" aria-label="Admin area" {
                    h2 { "Admin" }
                    ul {
                        @for (href, label) in SECTIONS {
                            li { a href=(href) aria-current=[(*href == current).then_some("page")] { (label) } }
                        }
                    }
                }
                section class="admin-body" {
                    h1 { (title) }
                    @if let Some(notice) = &flash.notice {
                        p class="flash notice" role="status" { (notice) }
                    }
                    @if let Some(error) = &flash.error {
                        p class="flash error" role="alert" id="form-error" { (error) }
                    }
                    (body)
                }
            }
        },
    );
    layout::html_response(status, markup)
}

/// A redirect back to `path` after a change, with a notice chosen by key (so
/// no text travels in the URL).
pub(super) fn back_to(path: &str, notice: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((
            "Location",
            format!(
                "{path}{}notice={notice}",
                if path.contains('?') { '&' } else { '?' }
            ),
        ))
        .finish()
}

#[derive(Deserialize)]
pub(super) struct NoticeQuery {
    pub notice: Option<String>,
    /// The seats page's user search.
    pub search: Option<String>,
}

impl NoticeQuery {
    /// The notice for a key the admin pages use; unknown keys show nothing.
    pub fn flash(&self) -> Flash {
        let text = match self.notice.as_deref() {
            Some("saved") => "Settings saved.",
            Some("assigned") => "Seat assigned.",
            Some("unassigned") => "Seat removed.",
            Some("switched") => "Switch changed.",
            Some("created") => "Self-hosted model created.",
            Some("updated") => "Self-hosted model updated.",
            Some("deleted") => "Self-hosted model deleted.",
            Some("features") => "Model selection saved.",
            _ => return Flash::default(),
        };
        Flash::notice(text)
    }
}

/// The form field every admin form carries.
pub(super) fn hidden_token(session: &SessionUser) -> Markup {
    html! { input type="hidden" name="authenticity_token" value=(session.csrf_token); }
}
