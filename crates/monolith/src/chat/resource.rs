//! What a chat question's `resourceId` names.

use crate::gid::parse;
use crate::policy::Subject;

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
