//! The page shell (header, navigation, the CSRF token for scripts) and the
//! headers every page is served with: a Content-Security-Policy that allows
//! only our own scripts and styles (no inline script at all), no framing, no
//! sniffing, no referrer to other sites.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::assets;
use crate::identity::sessions::SessionUser;

/// The policy every page carries. `connect-src 'self'` covers fetches and the
/// subscription socket of the same origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; font-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// A complete HTML response with the security headers.
pub fn html_response(status: StatusCode, markup: Markup) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header(("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        .insert_header(("X-Frame-Options", "DENY"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("Referrer-Policy", "same-origin"))
        .insert_header(("Cache-Control", "no-store"))
        .body(markup.into_string())
}

/// What a page needs besides its body.
pub struct Page<'a> {
    pub title: &'a str,
    pub session: Option<&'a SessionUser>,
    /// Scripts (asset names) the page loads as modules.
    pub scripts: &'a [&'static str],
    /// What the scripts read at start (a JSON data block, not executed).
    pub data: serde_json::Value,
}

pub fn render(page: Page<'_>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(session) = page.session {
                    meta name="csrf-token" content=(session.csrf_token);
                }
                title { (page.title) " · Duo" }
                link rel="stylesheet" href=(assets::url("app.css"));
                link rel="icon" href="data:,";
                @for script in page.scripts {
                    script type="module" src=(assets::url(script)) {}
                }
            }
            body data-user-id=[page.session.map(|s| s.user.id)]
                 data-username=[page.session.map(|s| s.user.username.as_str())]
                 data-admin=[page.session.map(|s| s.user.admin)] {
                script type="application/json" id="page-data" { (PreEscaped(json_for_html(&page.data))) }
                header class="topbar" {
                    a class="brand" href="/" { "Duo" }
                    nav {
                        @if let Some(session) = page.session {
                            a href="/-/chat" { "Chat" }
                            a href="/explore/projects" { "Projects" }
                            a href="/-/graphql-explorer" title="GraphQL explorer" { "GraphQL" }
                            @if session.user.admin {
                                a href="/admin" { "Admin" }
                            }
                            span class="who" { "@" (session.user.username) }
                            form method="post" action="/users/sign_out" class="inline" {
                                input type="hidden" name="authenticity_token" value=(session.csrf_token);
                                button type="submit" class="link" { "Sign out" }
                            }
                        } @else {
                            a href="/users/sign_in" { "Sign in" }
                        }
                    }
                }
                main id="main" { (body) }
            }
        }
    }
}

/// JSON that is safe inside a `<script>` data block: `<`, `>` and `&` escaped,
/// so no value can close the element or open a comment.
pub fn json_for_html(value: &serde_json::Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// A plain page with a heading and a sentence (errors, notices).
pub fn message_page(status: StatusCode, heading: &str, text: &str) -> HttpResponse {
    let page = Page {
        title: heading,
        session: None,
        scripts: &[],
        data: serde_json::Value::Null,
    };
    html_response(
        status,
        render(
            page,
            html! {
                section class="card narrow" {
                    h1 { (heading) }
                    p { (text) }
                    p { a href="/" { "Go to the start page" } }
                }
            },
        ),
    )
}
