//! Reading a work item for AI: the policy's chat authorizer first, then the
//! serialization, nothing of the item read before the policy said yes. Every
//! chat tool that reads an issue, epic, merge request or job, and the page
//! context, goes through [`read_for_ai`], so the same refusal ends with the
//! same Duo error code wherever it happens ([`AiReadError::code`]).

use contracts::{DuoErrorCode, ResourceContext};

use super::ai_serialization::serialize_for_ai;
use crate::policy::{Actor, ChatAuthError, Policy, Subject};
use crate::queries::Queries;

/// Why a work item was not read for AI.
#[derive(Debug, thiserror::Error)]
pub enum AiReadError {
    /// The policy refused, with the code it chose (M3003: missing or not
    /// readable, alike; M3002: Duo off in its group or project; M3004: no
    /// chat for this user), or the item is gone.
    #[error("not found or not readable ({0:?})")]
    Refused(DuoErrorCode),
    /// Finding or authorizing the item failed (the database, say).
    #[error("reading the item failed: {0}")]
    Failed(String),
    /// The item could not be serialised.
    #[error("serialising the item failed: {0}")]
    Serialization(String),
}

impl AiReadError {
    /// The Duo error code the user is shown, as GitLab's identifier tools
    /// answer: the policy's code for a refusal, M4001 for a failure while
    /// finding or authorizing, M5000 for a failed serialization.
    pub fn code(&self) -> DuoErrorCode {
        match self {
            AiReadError::Refused(code) => *code,
            AiReadError::Failed(_) => DuoErrorCode::M4001,
            AiReadError::Serialization(_) => DuoErrorCode::M5000,
        }
    }

    /// A failure to find or authorize the item.
    pub fn failed(e: impl std::fmt::Display) -> Self {
        AiReadError::Failed(e.to_string())
    }
}

impl From<ChatAuthError> for AiReadError {
    fn from(e: ChatAuthError) -> Self {
        match e {
            ChatAuthError::Denied(code) => AiReadError::Refused(code),
            ChatAuthError::Policy(e) => AiReadError::failed(e),
        }
    }
}

/// The item as the gateway gets it, once the policy lets `actor` send it to
/// AI; a missing item is refused like an unreadable one.
pub async fn read_for_ai(
    policy: &Policy,
    db: &impl Queries,
    actor: Actor,
    subject: Subject,
    base: &url::Url,
) -> Result<ResourceContext, AiReadError> {
    policy
        .authorize_chat_resource(db, Some(actor), subject)
        .await?;
    match serialize_for_ai(db, subject, base).await {
        Ok(Some(context)) => Ok(context),
        Ok(None) => Err(AiReadError::Refused(DuoErrorCode::M3003)),
        Err(e) => Err(AiReadError::Serialization(e.to_string())),
    }
}

/// The page resource as the context of the user's message: what
/// [`read_for_ai`] gives, or nothing when it is refused (GitLab leaves out a
/// page resource the user may not send, silently).
pub async fn page_context(
    policy: &Policy,
    db: &impl Queries,
    actor: Actor,
    subject: Subject,
    base: &url::Url,
) -> Result<Option<ResourceContext>, AiReadError> {
    match read_for_ai(policy, db, actor, subject, base).await {
        Ok(context) => Ok(Some(context)),
        Err(AiReadError::Refused(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_code_per_kind_of_failure() {
        for refused in [
            DuoErrorCode::M3002,
            DuoErrorCode::M3003,
            DuoErrorCode::M3004,
        ] {
            assert_eq!(AiReadError::Refused(refused).code(), refused);
        }
        assert_eq!(AiReadError::failed("down").code(), DuoErrorCode::M4001);
        assert_eq!(
            AiReadError::Serialization("bad".into()).code(),
            DuoErrorCode::M5000
        );
    }
}
