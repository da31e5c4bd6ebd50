//! OAuth pages: the consent page where a signed-in user authorizes an MCP
//! client (`/oauth/authorize`, code flow with PKCE S256), the user's list of
//! the applications they authorized (revocable), and the admin's list of
//! every registered application (deletable).
//!
//! Nothing is sent to a redirect URI before it is known to be one of the
//! client's: a bad client or URI gets an error page here; every other error
//! goes back to the client as OAuth's `error` parameter.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde::Deserialize;

use super::PageError;
use super::admin_frame::{self, Flash, check_form_token, hidden_token};
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::identity::oauth_clients::{self as clients, Application, NewGrant};
use crate::identity::sessions::SessionUser;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/oauth/authorize", web::get().to(consent_page))
        .route("/oauth/authorize", web::post().to(decide))
        .route(
            "/-/user_settings/applications",
            web::get().to(my_applications),
        )
        .route(
            "/-/user_settings/applications/{id}/revoke",
            web::post().to(revoke_mine),
        )
        .route("/admin/applications", web::get().to(all_applications))
        .route(
            "/admin/applications/{id}/delete",
            web::post().to(delete_application),
        );
}

/// The authorization request's parameters, as in the query and, echoed in
/// hidden fields, in the consent form.
#[derive(Debug, Clone, Deserialize)]
struct AuthorizeParams {
    response_type: Option<String>,
    client_id: Option<String>,
    redirect_uri: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
    scope: Option<String>,
    state: Option<String>,
    resource: Option<String>,
}

/// An authorization request checked far enough to answer its client.
struct Checked {
    app: Application,
    redirect_uri: String,
    state: Option<String>,
}

/// What went wrong with a request, and where to say it.
enum Refusal {
    /// Shown on our page: the client or its redirect URI is not trusted.
    Page(String),
    /// Sent back to the client's redirect URI.
    Client(Checked, &'static str, String),
}

const MAX_PARAM_CHARS: usize = 2048;

async fn check(
    state: &AppState,
    p: &AuthorizeParams,
) -> Result<(Checked, Vec<String>, String), Refusal> {
    let too_long = [
        &p.client_id,
        &p.redirect_uri,
        &p.code_challenge,
        &p.scope,
        &p.state,
        &p.resource,
    ]
    .iter()
    .any(|v| {
        v.as_deref()
            .is_some_and(|v| v.len() > MAX_PARAM_CHARS || v.contains('\0'))
    });
    if too_long {
        return Err(Refusal::Page(
            "A parameter of the request is too long.".into(),
        ));
    }
    let Some(client_id) = p.client_id.as_deref() else {
        return Err(Refusal::Page(
            "The request names no client (client_id).".into(),
        ));
    };
    let db = state
        .pool
        .get()
        .await
        .map_err(|_| Refusal::Page("The service is busy; try again.".into()))?;
    let app = match clients::find(&*db, client_id).await {
        Ok(Some(app)) => app,
        Ok(None) => return Err(Refusal::Page("This application is not registered.".into())),
        Err(_) => return Err(Refusal::Page("The service is busy; try again.".into())),
    };
    let redirect_uri = match p.redirect_uri.as_deref() {
        Some(uri) if clients::redirect_uri_matches(&app, uri) => uri.to_owned(),
        None if app.redirect_uris.len() == 1 => app.redirect_uris[0].clone(),
        _ => {
            return Err(Refusal::Page(
                "The redirect URI is not one this application registered.".into(),
            ));
        }
    };
    let checked = Checked {
        app,
        redirect_uri,
        state: p.state.clone(),
    };
    if p.response_type.as_deref() != Some("code") {
        return Err(Refusal::Client(
            checked,
            "unsupported_response_type",
            "response_type must be code".into(),
        ));
    }
    let challenge = match (
        p.code_challenge.as_deref(),
        p.code_challenge_method.as_deref(),
    ) {
        (Some(c), Some("S256")) if c.len() == 43 => c.to_owned(),
        _ => {
            return Err(Refusal::Client(
                checked,
                "invalid_request",
                "a PKCE code_challenge with code_challenge_method S256 is required".into(),
            ));
        }
    };
    let scopes = match clients::check_scope(p.scope.as_deref()) {
        Ok(s) => s,
        Err(e) => return Err(Refusal::Client(checked, "invalid_scope", e.to_string())),
    };
    if let Some(resource) = p.resource.as_deref()
        && resource.trim_end_matches('/') != clients::mcp_resource(&state.config.external_url)
    {
        return Err(Refusal::Client(
            checked,
            "invalid_target",
            "resource is not this instance's MCP server".into(),
        ));
    }
    Ok((checked, scopes, challenge))
}

/// The client's redirect URI with OAuth's answer parameters added.
fn redirect_to(checked: &Checked, params: &[(&str, &str)], issuer: &str) -> HttpResponse {
    let mut target = match url::Url::parse(&checked.redirect_uri) {
        Ok(u) => u,
        Err(_) => {
            return layout::message_page(
                StatusCode::BAD_REQUEST,
                "Authorization failed",
                "The redirect URI is not valid.",
            );
        }
    };
    {
        let mut query = target.query_pairs_mut();
        for (k, v) in params {
            query.append_pair(k, v);
        }
        if let Some(s) = &checked.state {
            query.append_pair("state", s);
        }
        // RFC 9207: says which server answered.
        query.append_pair("iss", issuer);
    }
    HttpResponse::Found()
        .insert_header(("Location", target.to_string()))
        .insert_header(("Cache-Control", "no-store"))
        .finish()
}

fn refusal_response(state: &AppState, refusal: Refusal) -> HttpResponse {
    match refusal {
        Refusal::Page(why) => {
            layout::message_page(StatusCode::BAD_REQUEST, "Authorization failed", &why)
        }
        Refusal::Client(checked, code, description) => redirect_to(
            &checked,
            &[("error", code), ("error_description", &description)],
            issuer(state).as_str(),
        ),
    }
}

fn issuer(state: &AppState) -> String {
    clients::issuer(&state.config.external_url)
}

/// The consent form may send the browser on to the client's redirect URI:
/// the page's CSP allows that one target besides this site.
fn consent_csp(redirect_uri: &str) -> String {
    let target = url::Url::parse(redirect_uri)
        .ok()
        .map(|u| match u.scheme() {
            "http" | "https" => u.origin().ascii_serialization(),
            scheme => format!("{scheme}:"),
        })
        .unwrap_or_default();
    layout::CONTENT_SECURITY_POLICY.replace(
        "form-action 'self'",
        &format!("form-action 'self' {target}"),
    )
}

async fn consent_page(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<AuthorizeParams>,
) -> Result<HttpResponse, PageError> {
    let params = q.into_inner();
    let (checked, _, _) = match check(&state, &params).await {
        Ok(ok) => ok,
        Err(refusal) => return Ok(refusal_response(&state, refusal)),
    };
    let session = super::signed_in(&state, &req).await?;
    let target_host = url::Url::parse(&checked.redirect_uri)
        .ok()
        .map(|u| {
            u.host_str()
                .map(str::to_owned)
                .unwrap_or_else(|| u.scheme().to_owned())
        })
        .unwrap_or_default();
    let field = |name: &'static str, value: &Option<String>| {
        html! { @if let Some(v) = value { input type="hidden" name=(name) value=(v); } }
    };
    let body = html! {
        main class="consent" {
            h1 { "Authorize " (checked.app.name) "?" }
            p { "An application registered as " strong { (checked.app.name) } " asks to use your account, "
                strong { (session.user.username) } ", through the GitLab MCP server." }
            p class="warning" { "Anyone can register an application under any name. Authorize it only if you started this from a tool you trust." }
            h2 { "It will be able to" }
            ul {
                li { strong { "mcp" } ": read and change issues, merge requests, pipelines and notes, search, and search code, with your permissions, through the MCP server only." }
            }
            p { "After you authorize it, you return to " code { (target_host) } "." }
            form method="post" action="/oauth/authorize" id="consent-form" {
                (hidden_token(&session))
                (field("response_type", &params.response_type))
                (field("client_id", &params.client_id))
                input type="hidden" name="redirect_uri" value=(checked.redirect_uri);
                (field("code_challenge", &params.code_challenge))
                (field("code_challenge_method", &params.code_challenge_method))
                (field("scope", &params.scope))
                (field("state", &params.state))
                (field("resource", &params.resource))
                button type="submit" name="decision" value="approve" id="authorize" { "Authorize" }
                " "
                button type="submit" name="decision" value="deny" id="deny" { "Deny" }
            }
        }
    };
    let markup = layout::render(
        Page {
            title: "Authorize application",
            session: Some(&session),
            scripts: &[],
            data: serde_json::Value::Null,
        },
        body,
    );
    let mut response = layout::html_response(StatusCode::OK, markup);
    if let Ok(value) =
        actix_web::http::header::HeaderValue::from_str(&consent_csp(&checked.redirect_uri))
    {
        response
            .headers_mut()
            .insert(actix_web::http::header::CONTENT_SECURITY_POLICY, value);
    }
    Ok(response)
}

#[derive(Debug, Deserialize)]
struct Decision {
    authenticity_token: String,
    decision: String,
    #[serde(flatten)]
    params: AuthorizeParams,
}

async fn decide(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<Decision>,
) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    let form = form.into_inner();
    check_form_token(&session, &form.authenticity_token)?;
    let (checked, scopes, challenge) = match check(&state, &form.params).await {
        Ok(ok) => ok,
        Err(refusal) => return Ok(refusal_response(&state, refusal)),
    };
    let issuer = issuer(&state);
    if form.decision != "approve" {
        return Ok(redirect_to(
            &checked,
            &[
                ("error", "access_denied"),
                ("error_description", "the user denied the request"),
            ],
            &issuer,
        ));
    }
    let db = state.pool.get().await?;
    let code = clients::grant(
        &*db,
        NewGrant {
            app: &checked.app,
            user_id: session.user.id,
            redirect_uri: &checked.redirect_uri,
            code_challenge: &challenge,
            scopes: &scopes,
            resource: form.params.resource.as_deref(),
        },
    )
    .await
    .map_err(|e| PageError::Internal(e.to_string()))?;
    tracing::info!(
        user_id = session.user.id,
        application_id = checked.app.id,
        "OAuth application authorized"
    );
    Ok(redirect_to(&checked, &[("code", &code)], &issuer))
}

#[derive(Debug, Deserialize)]
struct FormToken {
    authenticity_token: String,
}

#[derive(Debug, Deserialize)]
struct Notice {
    notice: Option<String>,
}

fn user_page(session: &SessionUser, flash: &Flash, body: Markup) -> HttpResponse {
    let markup = layout::render(
        Page {
            title: "Applications",
            session: Some(session),
            scripts: &[],
            data: serde_json::Value::Null,
        },
        html! {
            main class="settings" {
                h1 { "Authorized applications" }
                @if let Some(n) = &flash.notice { p class="flash notice" role="status" { (n) } }
                (body)
            }
        },
    );
    layout::html_response(StatusCode::OK, markup)
}

async fn my_applications(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<Notice>,
) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    let db = state.pool.get().await?;
    let apps = clients::authorized_by(&*db, session.user.id)
        .await
        .map_err(|e| PageError::Internal(e.to_string()))?;
    let flash = match q.notice.as_deref() {
        Some("revoked") => Flash::notice("Access revoked."),
        _ => Flash::default(),
    };
    let body = html! {
        @if apps.is_empty() {
            p id="no-applications" { "You have not authorized any application." }
        } @else {
            table class="applications" {
                thead { tr { th { "Application" } th { "Scopes" } th { "Last authorized" } th {} } }
                tbody {
                    @for a in &apps {
                        tr data-application=(a.app.client_id) {
                            td { (a.app.name) }
                            td { (a.app.scopes.join(" ")) }
                            td { (a.last_granted_at.format("%Y-%m-%d %H:%M UTC")) }
                            td {
                                form method="post" action=(format!("/-/user_settings/applications/{}/revoke", a.app.id)) {
                                    (hidden_token(&session))
                                    button type="submit" class="revoke" { "Revoke" }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(user_page(&session, &flash, body))
}

async fn revoke_mine(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    form: web::Form<FormToken>,
) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let db = state.pool.get().await?;
    clients::revoke_authorization(&*db, session.user.id, path.into_inner())
        .await
        .map_err(|e| PageError::Internal(e.to_string()))?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", "/-/user_settings/applications?notice=revoked"))
        .finish())
}

async fn all_applications(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<Notice>,
) -> Result<HttpResponse, PageError> {
    let session = admin_frame::admin_session(&state, &req).await?;
    let db = state.pool.get().await?;
    let apps = clients::all(&*db)
        .await
        .map_err(|e| PageError::Internal(e.to_string()))?;
    let flash = match q.notice.as_deref() {
        Some("deleted") => Flash::notice("Application deleted."),
        _ => Flash::default(),
    };
    let body = html! {
        p { "Applications registered by MCP clients (dynamic client registration). Deleting one revokes every token it holds." }
        table class="applications" {
            thead { tr { th { "Application" } th { "Client ID" } th { "Redirect URIs" } th { "Users" } th { "Registered" } th {} } }
            tbody {
                @for (app, users) in &apps {
                    tr data-application=(app.client_id) {
                        td { (app.name) }
                        td { code { (app.client_id) } }
                        td { (app.redirect_uris.join(", ")) }
                        td { (users) }
                        td { (app.created_at.format("%Y-%m-%d %H:%M UTC")) }
                        td {
                            form method="post" action=(format!("/admin/applications/{}/delete", app.id)) {
                                (hidden_token(&session))
                                button type="submit" class="delete" { "Delete" }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(admin_frame::admin_page(
        &session,
        StatusCode::OK,
        "/admin/applications",
        "Applications",
        &flash,
        body,
    ))
}

async fn delete_application(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    form: web::Form<FormToken>,
) -> Result<HttpResponse, PageError> {
    let session = admin_frame::admin_session(&state, &req).await?;
    check_form_token(&session, &form.authenticity_token)?;
    let db = state.pool.get().await?;
    clients::delete(&*db, path.into_inner())
        .await
        .map_err(|e| PageError::Internal(e.to_string()))?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", "/admin/applications?notice=deleted"))
        .finish())
}
