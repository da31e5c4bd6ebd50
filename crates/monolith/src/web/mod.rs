//! Pages for people, served by the `web` role itself: server-rendered HTML
//! (maud) with a little JavaScript, assets embedded in the binary. Pages use the
//! same GraphQL API and subscriptions as every other client; every read goes
//! through the policy module.
//!
//! - [`assets`]: embedded CSS and JavaScript under content-hashed URLs;
//! - [`layout`]: the page shell and the security headers every page carries;
//! - [`sign_in`]: sign in and out (passwords, sessions, CSRF, rate limit);
//! - [`chat`]: the chat page;
//! - [`resources`]: project, issue, merge request and epic pages with "Ask Duo";
//! - [`repository_browser`]: a project's files, with "Ask Duo" about a file,
//!   a directory or the repository;
//! - [`workflow_pages`]: Duo Workflow sessions of a project: start (in the
//!   page, or as a run of the product, also with "Run with Duo" on an issue),
//!   follow, approve, stop;
//! - [`oauth_consent`]: authorizing an MCP client (OAuth consent), the
//!   user's authorized applications and the admin's list of them;
//! - [`jobs`]: a CI job's page, with "Explain this job failure";
//! - [`duo_prompts`]: the links that open chat with a predefined question;
//! - [`graphql_explorer`]: run GraphQL queries and browse the schema;
//! - [`help`]: the error-code help page;
//! - [`admin`], [`admin_models`]: the admin area (instance admins only), on
//!   the frame and gate of `admin_frame`.

pub mod admin;
pub mod admin_ai_usage;
pub mod admin_features;
mod admin_frame;
pub mod admin_models;
pub mod assets;
pub mod chat;
pub mod duo_prompts;
pub mod graphql_explorer;
pub mod help;
pub mod jobs;
pub mod layout;
pub mod oauth_consent;
pub mod repository_browser;
pub mod resources;
pub mod sign_in;
pub mod workflow_pages;

use actix_web::{HttpRequest, HttpResponse, web};

use crate::app_state::AppState;
use crate::identity::request;
use crate::identity::sessions::SessionUser;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.configure(assets::routes)
        .configure(sign_in::routes)
        .configure(chat::routes)
        .configure(help::routes)
        .configure(graphql_explorer::routes)
        .configure(jobs::routes)
        .configure(repository_browser::routes)
        .configure(workflow_pages::routes)
        .configure(resources::routes)
        .configure(admin::routes)
        .configure(admin_models::routes)
        .configure(admin_ai_usage::routes)
        .configure(admin_features::routes)
        .configure(oauth_consent::routes);
}

/// Why a page could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// Not signed in: go to the sign-in page and come back.
    #[error("sign in required")]
    SignIn { back_to: String },
    #[error("not found")]
    NotFound,
    #[error("forbidden: {0}")]
    Forbidden(&'static str),
    /// The request is understood but cannot be carried out (the reason is
    /// for the user).
    #[error("unprocessable: {0}")]
    Unprocessable(String),
    /// Not now: the thing is busy (the reason is for the user).
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("internal error: {0}")]
    Internal(String),
}

macro_rules! internal_from {
    ($($t:ty),*) => {$(
        impl From<$t> for PageError {
            fn from(e: $t) -> Self {
                PageError::Internal(e.to_string())
            }
        }
    )*};
}

internal_from!(
    tokio_postgres::Error,
    deadpool_postgres::PoolError,
    crate::policy::PolicyError,
    crate::identity::tokens::TokenError
);

impl actix_web::ResponseError for PageError {
    fn status_code(&self) -> actix_web::http::StatusCode {
        use actix_web::http::StatusCode;
        match self {
            PageError::SignIn { .. } => StatusCode::SEE_OTHER,
            PageError::NotFound => StatusCode::NOT_FOUND,
            PageError::Forbidden(_) => StatusCode::FORBIDDEN,
            PageError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            PageError::Conflict(_) => StatusCode::CONFLICT,
            PageError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            PageError::SignIn { back_to } => {
                let target = format!(
                    "/users/sign_in?redirect_to={}",
                    url::form_urlencoded::byte_serialize(back_to.as_bytes()).collect::<String>()
                );
                HttpResponse::SeeOther()
                    .insert_header(("Location", target))
                    .finish()
            }
            PageError::NotFound => layout::message_page(
                actix_web::http::StatusCode::NOT_FOUND,
                "Page not found",
                "The page you are looking for does not exist, or you do not have access to it.",
            ),
            PageError::Forbidden(why) => {
                layout::message_page(actix_web::http::StatusCode::FORBIDDEN, "Forbidden", why)
            }
            PageError::Unprocessable(why) => layout::message_page(
                actix_web::http::StatusCode::UNPROCESSABLE_ENTITY,
                "This cannot be done",
                why,
            ),
            PageError::Conflict(why) => {
                layout::message_page(actix_web::http::StatusCode::CONFLICT, "Not yet", why)
            }
            PageError::Internal(detail) => {
                tracing::error!(error = %detail, "page failed");
                layout::message_page(
                    actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "Something went wrong",
                    "Please try again.",
                )
            }
        }
    }
}

/// The signed-in user of the page request, or a redirect to sign in.
pub async fn signed_in(state: &AppState, req: &HttpRequest) -> Result<SessionUser, PageError> {
    match request::request_session(&state.pool, req).await {
        Ok(Some(session)) => Ok(session),
        Ok(None) => Err(PageError::SignIn {
            back_to: req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_else(|| "/".into()),
        }),
        Err(e) => Err(PageError::Internal(e.to_string())),
    }
}

/// The id of the project at `full_path` when the user may do every one of
/// `abilities` on it; otherwise a 404, as for a project that does not exist.
pub(crate) async fn project_with(
    state: &AppState,
    db: &impl crate::queries::Queries,
    session: &SessionUser,
    full_path: &str,
    abilities: &[crate::policy::Ability],
) -> Result<i64, PageError> {
    let Some(id) = crate::namespaces::project_id_by_full_path(db, full_path).await? else {
        return Err(PageError::NotFound);
    };
    let actor = Some(crate::policy::Actor::from(&session.user));
    for ability in abilities {
        if !state
            .policy
            .can(db, actor, *ability, crate::policy::Subject::Project(id))
            .await?
        {
            return Err(PageError::NotFound);
        }
    }
    Ok(id)
}

/// The session of the request, if any (pages that work signed out too).
pub async fn maybe_signed_in(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Option<SessionUser>, PageError> {
    request::request_session(&state.pool, req)
        .await
        .map_err(|e| PageError::Internal(e.to_string()))
}
