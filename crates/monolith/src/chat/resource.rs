//! What a chat question's `resourceId` names.

use crate::gid::parse;
use crate::policy::{Actor, AiResourceAccess, Policy, PolicyError, Subject};
use crate::queries::Queries;

/// What a chat `resourceId` points at. A user's own GID means "no page resource".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatResource {
    User(i64),
    Item(Subject),
}

pub fn parse_chat_resource(gid: &str) -> Option<ChatResource> {
    let (model, id) = parse(gid)?;
    Some(match model {
        "User" => ChatResource::User(id),
        "Issue" => ChatResource::Item(Subject::Issue(id)),
        "Epic" => ChatResource::Item(Subject::Epic(id)),
        "MergeRequest" => ChatResource::Item(Subject::MergeRequest(id)),
        "Project" => ChatResource::Item(Subject::Project(id)),
        "Group" => ChatResource::Item(Subject::Group(id)),
        "Ci::Build" | "CommitStatus" => ChatResource::Item(Subject::Build(id)),
        _ => return None,
    })
}

/// How a question's `resourceId` stands for its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatResourceAccess {
    /// The user's own GID: the question has no page resource.
    NoResource,
    /// Readable, with Duo features on: it goes into the prompt.
    Item(Subject),
    /// Unknown, unparsable or unreadable (indistinguishable on purpose).
    NotFound,
    /// Readable, but Duo features are off where it lives.
    DuoOff,
}

/// The one authorization of a question's resource, used when the question is
/// submitted (to refuse it) and again when it is answered (the user's rights
/// may have changed in between; then the resource is left out).
pub async fn authorize(
    policy: &Policy,
    db: &impl Queries,
    user: Actor,
    gid_text: &str,
) -> Result<ChatResourceAccess, PolicyError> {
    let subject = match parse_chat_resource(gid_text) {
        Some(ChatResource::User(id)) if id == user.id => return Ok(ChatResourceAccess::NoResource),
        Some(ChatResource::Item(subject)) => subject,
        _ => return Ok(ChatResourceAccess::NotFound),
    };
    Ok(match policy.ai_resource_access(db, user, subject).await? {
        AiResourceAccess::Allowed => ChatResourceAccess::Item(subject),
        AiResourceAccess::NotFound => ChatResourceAccess::NotFound,
        AiResourceAccess::DuoOff => ChatResourceAccess::DuoOff,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ids_mean_no_page_resource_and_unknown_models_are_refused() {
        assert_eq!(
            parse_chat_resource("gid://gitlab/User/7"),
            Some(ChatResource::User(7))
        );
        assert_eq!(
            parse_chat_resource("gid://gitlab/Issue/3"),
            Some(ChatResource::Item(Subject::Issue(3)))
        );
        assert_eq!(parse_chat_resource("gid://gitlab/Vulnerability/7"), None);
    }
}
