//! The chat page: threads on the side, the conversation, the question box with
//! the slash-command menu. The page itself carries no data but the user and what
//! to attach; `chat.js` reads and writes everything through the GraphQL API and
//! its subscription, as any client would.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::html;
use serde::Deserialize;
use serde_json::json;

use super::PageError;
use super::duo_prompts::{self, PredefinedPrompt};
use super::layout::{self, Page};
use super::repository_browser::{self, AskAbout};
use crate::ai_models::{Feature, Provider};
use crate::app_state::AppState;
use crate::gid;
use crate::identity::sessions::SessionUser;
use crate::policy::{Ability, Actor, NoDuoChat, Subject};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/-/chat", web::get().to(page));
}

#[derive(Deserialize)]
struct ChatQuery {
    /// A thread to open (`gid://gitlab/Ai::Conversation::Thread/N`).
    thread: Option<String>,
    /// A resource to ask about (its global id), and how to show it.
    resource: Option<String>,
    resource_title: Option<String>,
    /// "Ask Duo about this file / directory / repository" of the repository
    /// browser: `file`, `directory` or `repository`, with the ref and path.
    context: Option<String>,
    context_ref: Option<String>,
    context_path: Option<String>,
    /// A predefined question to ask about `resource` (a key of
    /// [`PredefinedPrompt`], never the text itself).
    prompt: Option<String>,
}

/// The slash commands the menu offers, with what each does.
pub const SLASH_COMMANDS: &[(&str, &str)] = &[
    ("/help", "What Duo Chat can do"),
    ("/explain", "Explain the selected code"),
    ("/tests", "Write tests for the selected code"),
    ("/refactor", "Refactor the selected code"),
    ("/fix", "Fix the selected code"),
    ("/troubleshoot", "Troubleshoot a failed CI job"),
    (
        "/summarize_comments",
        "Summarize the comments of this issue or merge request",
    ),
    ("/clear", "Start over: clear this conversation"),
    ("/reset", "Forget the earlier questions"),
    ("/new", "Start a new conversation"),
];

/// Why Duo Chat is unavailable to the user, in words, or `None` when it is
/// available: the policy's reason, then the admin's model selection.
async fn unavailable_reason(
    state: &AppState,
    session: &SessionUser,
) -> Result<Option<String>, PageError> {
    let db = state.pool.get().await?;
    let actor = Some(Actor::from(&session.user));
    let reason = match state.policy.why_no_duo_chat(&*db, actor).await? {
        Some(NoDuoChat::NoSeat) => {
            "Duo Chat is not available to you: you need a GitLab Duo seat. Ask an administrator to assign you one."
        }
        Some(NoDuoChat::TurnedOff) => {
            "Duo Chat is not available: an administrator turned GitLab Duo off for this instance."
        }
        Some(NoDuoChat::NotIncluded) => {
            "Duo Chat is not available: GitLab Duo is not part of this instance's subscription (on GitLab.com: of a paid group of yours with Duo on)."
        }
        Some(NoDuoChat::SignedOut) => "Sign in to use Duo Chat.",
        None => {
            let settings = state
                .models
                .feature_settings(&*db)
                .await
                .map_err(|e| PageError::Internal(e.to_string()))?;
            let off = settings
                .iter()
                .any(|s| s.feature == Feature::DuoChat && s.provider == Provider::Disabled);
            if !off {
                return Ok(None);
            }
            "Duo Chat is not available: an administrator turned it off for this instance."
        }
    };
    let mut text = reason.to_owned();
    if state
        .policy
        .can(&*db, actor, Ability::AdministerInstance, Subject::Global)
        .await?
    {
        text.push_str(" As an administrator, you can change this in the Admin area.");
    }
    Ok(Some(text))
}

async fn page(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<ChatQuery>,
) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(&state, &req).await?;
    let query = query.into_inner();
    // Only well-formed ids of the kinds chat accepts are passed on; the server
    // checks access again when the question is asked.
    let resource = query
        .resource
        .filter(|r| crate::chat::resource::parse_chat_resource(r).is_some());
    let thread = query
        .thread
        .filter(|t| matches!(gid::parse(t), Some(("Ai::Conversation::Thread", _))));
    let unavailable = unavailable_reason(&state, &session).await?;
    // The additional context of the repository browser's "Ask Duo" buttons,
    // rebuilt here (never taken from the URL as is).
    let context = match (
        query.context.as_deref().and_then(AskAbout::parse),
        resource.as_deref().and_then(gid::parse),
    ) {
        (Some(about), Some(("Project", project_id))) => {
            repository_browser::chat_context_item(
                &state,
                &session,
                project_id,
                about,
                query.context_ref.as_deref(),
                query.context_path.as_deref(),
            )
            .await?
        }
        _ => None,
    };
    // Only about a resource, and sent by the page only when opened from this
    // site; otherwise the question is filled in for the user to send.
    let prompt = query
        .prompt
        .as_deref()
        .and_then(PredefinedPrompt::parse)
        .filter(|_| resource.is_some())
        .map(PredefinedPrompt::question);
    let send_prompt = prompt.is_some() && duo_prompts::opened_from_this_site(&req);
    let data = json!({
        "userGid": gid::format("User", session.user.id),
        "unavailable": unavailable,
        "thread": thread,
        "resource": resource,
        "resourceTitle": query.resource_title.map(|t| t.chars().take(200).collect::<String>()),
        "additionalContext": context.as_ref().map(|(item, _)| vec![item.clone()]),
        "contextTitle": context.map(|(_, title)| title),
        "prompt": prompt,
        "sendPrompt": send_prompt,
        "commands": SLASH_COMMANDS.iter().map(|(c, d)| json!({ "command": c, "description": d })).collect::<Vec<_>>(),
    });
    let body = html! {
        div class="chat" {
            aside class="threads" aria-label="Conversations" {
                button id="new-chat" class="primary wide" type="button" { "New chat" }
                ul id="thread-list" {}
            }
            section class="conversation" aria-label="Duo Chat" {
                div id="availability" class="flash notice" hidden {}
                div id="attached" class="attached" hidden {}
                ol id="messages" aria-live="polite" {}
                form id="ask" class="ask" autocomplete="off" {
                    div id="slash-menu" class="slash-menu" role="listbox" hidden {}
                    textarea id="question" name="question" rows="3" maxlength="100000"
                        placeholder="Ask a question, or type / for commands"
                        aria-label="Question" {}
                    div class="ask-actions" {
                        button id="stop" type="button" class="secondary" hidden { "Stop" }
                        button id="send" type="submit" class="primary" { "Send" }
                    }
                }
            }
        }
    };
    let markup = layout::render(
        Page {
            title: "Duo Chat",
            session: Some(&session),
            scripts: &["chat.js"],
            data,
        },
        body,
    );
    Ok(layout::html_response(StatusCode::OK, markup))
}
