//! Predefined questions a page can ask Duo Chat about what it shows (GitLab's
//! `sendDuoChatCommand`): "Explain this job failure" on a failed CI job,
//! "Summarize comments" on an issue, merge request or epic with comments. The
//! link opens the chat page with the item as the chat's resource and the
//! question named by a key (never free text from the URL); the chat page sends
//! it. A link is offered only where the user could ask it: chat allowed for
//! them and in the item's project or group, and the feature not switched off
//! by the admin's model selection.

use actix_web::HttpRequest;
use maud::{Markup, html};

use super::PageError;
use crate::ai_models::{Feature, Provider};
use crate::app_state::AppState;
use crate::identity::sessions::SessionUser;
use crate::policy::{Actor, Subject};

/// A question a page can send on the user's behalf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PredefinedPrompt {
    ExplainJobFailure,
    SummarizeComments,
}

impl PredefinedPrompt {
    /// The key in the chat page's `prompt` parameter.
    pub fn key(self) -> &'static str {
        match self {
            PredefinedPrompt::ExplainJobFailure => "explain_job_failure",
            PredefinedPrompt::SummarizeComments => "summarize_comments",
        }
    }

    pub fn parse(key: &str) -> Option<Self> {
        [
            PredefinedPrompt::ExplainJobFailure,
            PredefinedPrompt::SummarizeComments,
        ]
        .into_iter()
        .find(|p| p.key() == key)
    }

    /// What the chat sends: the slash command GitLab's buttons send, which
    /// reads the job's log or the item's comments for the prompt.
    pub fn question(self) -> &'static str {
        match self {
            PredefinedPrompt::ExplainJobFailure => "/troubleshoot",
            PredefinedPrompt::SummarizeComments => "/summarize_comments",
        }
    }

    /// The link's text.
    pub fn label(self) -> &'static str {
        match self {
            PredefinedPrompt::ExplainJobFailure => "Explain this job failure",
            PredefinedPrompt::SummarizeComments => "Summarize comments",
        }
    }

    fn feature(self) -> Feature {
        match self {
            PredefinedPrompt::ExplainJobFailure => Feature::TroubleshootJob,
            PredefinedPrompt::SummarizeComments => Feature::SummarizeComments,
        }
    }
}

/// Whether the user could ask `prompt` about `resource` now: the policy's
/// chat checks for the resource (readable, Duo on for its container, a seat),
/// and neither chat nor the prompt's feature switched off.
pub async fn offered(
    state: &AppState,
    session: &SessionUser,
    prompt: PredefinedPrompt,
    resource: Subject,
) -> Result<bool, PageError> {
    let db = state.pool.get().await?;
    let actor = Some(Actor::from(&session.user));
    if state
        .policy
        .authorize_chat_resource(&*db, actor, resource)
        .await
        .is_err()
    {
        return Ok(false);
    }
    let settings = state
        .models
        .feature_settings(&*db)
        .await
        .map_err(|e| PageError::Internal(e.to_string()))?;
    let switched_off = settings.iter().any(|s| {
        (s.feature == Feature::DuoChat || s.feature == prompt.feature())
            && s.provider == Provider::Disabled
    });
    Ok(!switched_off)
}

/// The link that opens the chat with `prompt` about the resource `gid`.
pub fn link(prompt: PredefinedPrompt, gid: &str, title: &str) -> Markup {
    let href = url::form_urlencoded::Serializer::new(String::from("/-/chat?"))
        .append_pair("resource", gid)
        .append_pair("resource_title", title)
        .append_pair("prompt", prompt.key())
        .finish();
    html! {
        a class="button secondary duo-prompt" href=(href) data-prompt=(prompt.key()) data-resource=(gid) {
            (prompt.label())
        }
    }
}

/// Whether the chat page was opened from one of our own pages (the browser's
/// `Sec-Fetch-Site`): only then does it send a predefined question by itself.
/// A link from elsewhere only fills the question in, so another site cannot
/// spend a user's questions.
pub fn opened_from_this_site(req: &HttpRequest) -> bool {
    req.headers()
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == "same-origin")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_unknown_keys_are_refused() {
        for prompt in [
            PredefinedPrompt::ExplainJobFailure,
            PredefinedPrompt::SummarizeComments,
        ] {
            assert_eq!(PredefinedPrompt::parse(prompt.key()), Some(prompt));
        }
        assert_eq!(PredefinedPrompt::parse("/troubleshoot"), None);
        assert_eq!(PredefinedPrompt::parse("delete everything"), None);
    }

    #[test]
    fn the_link_carries_the_resource_and_the_key() {
        let markup = link(
            PredefinedPrompt::ExplainJobFailure,
            "gid://gitlab/Ci::Build/7",
            "rspec & more",
        )
        .into_string();
        assert!(
            markup.contains("resource=gid%3A%2F%2Fgitlab%2FCi%3A%3ABuild%2F7"),
            "{markup}"
        );
        assert!(markup.contains("prompt=explain_job_failure"), "{markup}");
        assert!(markup.contains("rspec+%26+more"), "{markup}");
        assert!(markup.contains(">Explain this job failure<"), "{markup}");
    }
}
