//! `/-/graphql-explorer` (the path GitLab serves GraphiQL at): write a GraphQL
//! query with variables, run it against this instance's `/api/graphql` as the
//! signed-in user (the session and its CSRF token, as every page script
//! sends them), read the pretty-printed answer, and browse the schema by
//! introspection. The page carries no data; `graphql_explorer.js` does the
//! work with our own small code (no CDN, no third-party editor).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use serde_json::json;

use super::PageError;
use super::layout::{self, Page};
use crate::app_state::AppState;

pub const PATH: &str = "/-/graphql-explorer";

/// What the editor holds the first time (a query any signed-in user can run).
const FIRST_QUERY: &str =
    "query whoAmI {\n  currentUser {\n    username\n    id\n    duoChatAvailable\n  }\n}\n";

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(PATH, web::get().to(page));
}

async fn page(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    let body = html! {
        div class="explorer" {
            section class="explorer-editors" aria-label="Query" {
                div class="explorer-toolbar" {
                    h1 { "GraphQL explorer" }
                    span class="muted" { "Runs against " code { "/api/graphql" } " as @" (session.user.username) ". Ctrl+Enter runs." }
                    button id="run" type="button" class="primary" title="Run (Ctrl+Enter)" { "Run" }
                }
                label for="query" { "Query" }
                textarea id="query" class="code-editor" rows="14" spellcheck="false"
                    autocomplete="off" { (FIRST_QUERY) }
                label for="variables" { "Variables (JSON)" }
                textarea id="variables" class="code-editor" rows="4" spellcheck="false"
                    autocomplete="off" placeholder="{}" {}
                p id="variables-error" class="flash error" role="alert" hidden {}
                div class="explorer-result-head" {
                    h2 { "Result" }
                    span id="result-status" class="muted" {}
                }
                pre id="result" class="explorer-result" aria-live="polite" {}
                details id="history-box" {
                    summary { "History" }
                    ol id="history" class="explorer-history" {}
                }
            }
            aside class="explorer-schema" aria-label="Schema" {
                h2 { "Schema" }
                input id="type-filter" type="search" placeholder="Filter types" aria-label="Filter types";
                p id="schema-status" class="muted" { "Loading the schema…" }
                ul id="types" class="explorer-types" {}
                div id="type-detail" class="explorer-type" hidden {}
            }
        }
    };
    let markup = layout::render(
        Page {
            title: "GraphQL explorer",
            session: Some(&session),
            scripts: &["graphql_explorer.js"],
            data: json!({ "username": session.user.username }),
        },
        body,
    );
    Ok(layout::html_response(StatusCode::OK, markup))
}
