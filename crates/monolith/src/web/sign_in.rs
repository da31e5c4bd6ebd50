//! Signing in and out of the web pages.
//!
//! - The sign-in form is protected by a double-submit CSRF token (a cookie and a
//!   form field that must match), so another site cannot sign a browser in.
//! - Failed attempts are counted per username and per address; after
//!   [`sign_in_throttle::MAX_FAILURES`] within
//!   [`sign_in_throttle::FAILURE_WINDOW_SECS`] further attempts are refused
//!   without checking the password.
//! - A successful sign-in always starts a new session (whatever session cookie
//!   the browser had is ended), so a planted session id is worthless.
//! - The session cookie is HttpOnly, SameSite=Lax, and Secure when the instance's
//!   external URL is https.

use actix_web::cookie::{Cookie, SameSite, time::Duration as CookieDuration};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use serde::Deserialize;

use super::PageError;
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::identity::{passwords, request, sessions, sign_in_throttle, users};
/// The double-submit cookie of the sign-in form.
const FORM_CSRF_COOKIE: &str = "_duo_signin_csrf";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(start))
        .route("/users/sign_in", web::get().to(form))
        .route("/users/sign_in", web::post().to(sign_in))
        .route("/users/sign_out", web::post().to(sign_out));
}

async fn start(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, PageError> {
    let target = match super::maybe_signed_in(&state, &req).await? {
        Some(_) => "/-/chat",
        None => "/users/sign_in",
    };
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", target))
        .finish())
}

#[derive(Deserialize)]
struct FormQuery {
    redirect_to: Option<String>,
}

/// Where the browser goes after signing in when `redirect_to` is absent or
/// refused; the start page sends a signed-in user on to the chat.
const FALLBACK_TARGET: &str = "/";

/// Longer `redirect_to` values are refused (a page's own path never is).
const MAX_REDIRECT_CHARS: usize = 2048;

/// How many rounds of percent-decoding are looked through; a value still
/// changing after them is refused.
const MAX_DECODE_ROUNDS: usize = 3;

/// The sign-in's `redirect_to`, kept only when it is a path on this site (see
/// [`same_origin_path`]); otherwise [`FALLBACK_TARGET`].
fn redirect_target(candidate: Option<&str>, external_url: &url::Url) -> String {
    candidate
        .and_then(|c| same_origin_path(c, external_url))
        .unwrap_or_else(|| FALLBACK_TARGET.to_owned())
}

/// `candidate` as a path (with query and fragment) on this instance's origin,
/// or `None`. Browsers drop tabs and newlines inside URLs and read `\` as
/// `/`, so `/<TAB>/evil.example` or `/\evil.example` would take them to
/// another host: control characters, backslashes and encoded slashes are
/// refused in the value and in each percent-decoded form of it; what is left
/// is resolved against the external URL, and its origin must be ours. The
/// answer is the resolved URL's own path, so it is always a valid header.
fn same_origin_path(candidate: &str, external_url: &url::Url) -> Option<String> {
    if candidate.chars().count() > MAX_REDIRECT_CHARS || !candidate.starts_with('/') {
        return None;
    }
    let mut forms = vec![candidate.to_owned()];
    loop {
        let last = forms.last()?;
        let decoded = crate::percent::decode(last)?;
        if decoded == *last {
            break;
        }
        if forms.len() > MAX_DECODE_ROUNDS {
            return None;
        }
        forms.push(decoded);
    }
    let ours = external_url.origin();
    for form in &forms {
        let lower = form.to_ascii_lowercase();
        if form
            .chars()
            .any(|c| c.is_control() || c == '\\' || (c.is_whitespace() && c != ' '))
            || lower.contains("%2f")
            || lower.contains("%5c")
            || !form.starts_with('/')
            || form.starts_with("//")
            || external_url.join(form).ok()?.origin() != ours
        {
            return None;
        }
    }
    let resolved = external_url.join(candidate).ok()?;
    let path = &resolved[url::Position::BeforePath..];
    // Dot segments can leave a path starting with `//` (`/.//host`), which a
    // browser reads as another host.
    if !path.starts_with('/') || path.starts_with("//") {
        return None;
    }
    Some(path.to_owned())
}

fn secure_cookies(state: &AppState) -> bool {
    state.config.external_url.scheme() == "https"
}

fn form_page(
    state: &AppState,
    csrf: &str,
    redirect_to: &str,
    error: Option<&str>,
    status: StatusCode,
) -> HttpResponse {
    let body = html! {
        section class="card narrow" {
            h1 { "Sign in" }
            @if let Some(error) = error {
                p class="flash error" role="alert" { (error) }
            }
            form method="post" action="/users/sign_in" class="stack" {
                input type="hidden" name="authenticity_token" value=(csrf);
                input type="hidden" name="redirect_to" value=(redirect_to);
                label for="username" { "Username" }
                input id="username" name="username" autocomplete="username" required autofocus maxlength="255";
                label for="password" { "Password" }
                input id="password" name="password" type="password" autocomplete="current-password" required maxlength="128";
                button type="submit" class="primary" { "Sign in" }
            }
        }
    };
    let markup = layout::render(
        Page {
            title: "Sign in",
            session: None,
            scripts: &[],
            data: serde_json::Value::Null,
        },
        body,
    );
    let mut response = layout::html_response(status, markup);
    let cookie = Cookie::build(FORM_CSRF_COOKIE, csrf.to_owned())
        .path("/users")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure_cookies(state))
        .finish();
    let _ = response.add_cookie(&cookie);
    response
}

async fn form(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<FormQuery>,
) -> Result<HttpResponse, PageError> {
    let redirect_to = redirect_target(query.redirect_to.as_deref(), &state.config.external_url);
    if super::maybe_signed_in(&state, &req).await?.is_some() {
        return Ok(HttpResponse::SeeOther()
            .insert_header(("Location", redirect_to))
            .finish());
    }
    let csrf = req
        .cookie(FORM_CSRF_COOKIE)
        .map(|c| c.value().to_owned())
        .filter(|v| v.len() == 64)
        .unwrap_or_else(|| sessions::random_secret(32));
    Ok(form_page(&state, &csrf, &redirect_to, None, StatusCode::OK))
}

#[derive(Deserialize)]
struct SignInForm {
    #[serde(default)]
    authenticity_token: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    redirect_to: Option<String>,
}

async fn sign_in(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<SignInForm>,
) -> Result<HttpResponse, PageError> {
    let form = form.into_inner();
    let redirect_to = redirect_target(form.redirect_to.as_deref(), &state.config.external_url);
    let cookie_csrf = req.cookie(FORM_CSRF_COOKIE).map(|c| c.value().to_owned());
    if cookie_csrf
        .as_deref()
        .is_none_or(|c| !sessions::csrf_matches(c, Some(&form.authenticity_token)))
    {
        // A fresh form, with a fresh token: the old one expired or was forged.
        let csrf = sessions::random_secret(32);
        return Ok(form_page(
            &state,
            &csrf,
            &redirect_to,
            Some("Your session expired. Please sign in again."),
            StatusCode::FORBIDDEN,
        ));
    }
    let csrf = form.authenticity_token.clone();
    let username = form.username.trim().to_lowercase();
    let address = req
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    let keys = vec![format!("user:{username}"), format!("ip:{address}")];
    let db = state.pool.get().await?;
    if sign_in_throttle::too_many_failures(&*db, &keys).await? {
        return Ok(form_page(
            &state,
            &csrf,
            &redirect_to,
            Some("Too many sign-in attempts. Try again in a few minutes."),
            StatusCode::TOO_MANY_REQUESTS,
        ));
    }
    let (user_id, stored) = match users::password_of_active(&*db, &username).await? {
        Some((id, stored)) => (Some(id), stored),
        None => (None, None),
    };
    let password = form.password;
    // Hashing takes tens of milliseconds of CPU: off the async workers.
    let matches = web::block(move || passwords::verify(&password, stored.as_deref()))
        .await
        .map_err(|e| PageError::Internal(e.to_string()))?;
    let Some(user_id) = user_id.filter(|_| matches) else {
        sign_in_throttle::record_failure(&*db, &keys).await?;
        tracing::info!("failed sign-in attempt");
        return Ok(form_page(
            &state,
            &csrf,
            &redirect_to,
            Some("Invalid username or password."),
            StatusCode::UNAUTHORIZED,
        ));
    };
    sign_in_throttle::forget_failures(&*db, &keys[0]).await?;
    // Never reuse a session the browser brought along.
    if let Some(old) = request::session_cookie(&req) {
        sessions::destroy(&*db, &old).await?;
    }
    let session = sessions::create(&*db, user_id).await?;
    let cookie = Cookie::build(sessions::SESSION_COOKIE, session.cookie_value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure_cookies(&state))
        .max_age(CookieDuration::seconds(sessions::SESSION_LIFETIME_SECS))
        .finish();
    let mut clear_form = Cookie::build(FORM_CSRF_COOKIE, "").path("/users").finish();
    clear_form.make_removal();
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", redirect_to))
        .cookie(cookie)
        .cookie(clear_form)
        .finish())
}

#[derive(Deserialize)]
struct SignOutForm {
    #[serde(default)]
    authenticity_token: String,
}

async fn sign_out(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<SignOutForm>,
) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    if !sessions::csrf_matches(&session.csrf_token, Some(&form.authenticity_token)) {
        return Err(PageError::Forbidden(
            "Invalid form token. Reload the page and try again.",
        ));
    }
    if let Some(cookie) = request::session_cookie(&req) {
        let db = state.pool.get().await?;
        sessions::destroy(&*db, &cookie).await?;
    }
    let mut removal = Cookie::build(sessions::SESSION_COOKIE, "")
        .path("/")
        .finish();
    removal.make_removal();
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", "/users/sign_in"))
        .cookie(removal)
        .finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_on_this_site_are_redirect_targets() {
        let ours = url::Url::parse("https://gitlab.example/").unwrap();
        for (candidate, expected) in [
            ("/acme/site/-/issues/1", "/acme/site/-/issues/1"),
            (
                "/acme/site/-/blob/main/a%20b.rb?x=1#L2",
                "/acme/site/-/blob/main/a%20b.rb?x=1#L2",
            ),
            ("/a b", "/a%20b"),
            ("/acme/../-/chat", "/-/chat"),
            ("//evil.example", "/"),
            ("https://evil.example", "/"),
            ("https://gitlab.example/-/chat", "/"),
            ("/\\evil.example", "/"),
            ("/\t/evil.example", "/"),
            ("/\n/evil.example", "/"),
            ("/%09/evil.example", "/"),
            ("/%2F/evil.example", "/"),
            ("/%252F/evil.example", "/"),
            ("/%5Cevil.example", "/"),
            ("/.//evil.example", "/"),
            ("/%2e//evil.example", "/"),
            ("/%", "/"),
            ("/%25252525", "/"),
            ("", "/"),
        ] {
            assert_eq!(
                redirect_target(Some(candidate), &ours),
                expected,
                "{candidate:?}"
            );
        }
        assert_eq!(redirect_target(None, &ours), "/");
        let long = format!("/{}", "a".repeat(MAX_REDIRECT_CHARS));
        assert_eq!(redirect_target(Some(&long), &ours), "/");
    }
}
