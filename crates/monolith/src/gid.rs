//! GitLab global IDs: `gid://gitlab/<Model>/<id>`.

use crate::policy::Subject;

pub fn format(model: &str, id: i64) -> String {
    format!("gid://gitlab/{model}/{id}")
}

/// Splits a global ID into its model name and numeric id.
pub fn parse(gid: &str) -> Option<(&str, i64)> {
    let rest = gid.strip_prefix("gid://gitlab/")?;
    let (model, id) = rest.rsplit_once('/')?;
    if model.is_empty() || !model.chars().all(|c| c.is_ascii_alphanumeric() || c == ':') {
        return None;
    }
    let id: i64 = id.parse().ok().filter(|n| *n > 0)?;
    Some((model, id))
}

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
    fn parses_and_rejects() {
        assert_eq!(parse("gid://gitlab/Issue/12"), Some(("Issue", 12)));
        assert_eq!(parse("gid://gitlab/Ci::Build/3"), Some(("Ci::Build", 3)));
        assert_eq!(parse("gid://gitlab/Issue/abc"), None);
        assert_eq!(parse("gid://gitlab/Issue/-1"), None);
        assert_eq!(parse("gid://other/Issue/1"), None);
        assert_eq!(parse("gid://gitlab/../1"), None);
        assert_eq!(
            parse_chat_resource("gid://gitlab/User/7"),
            Some(ChatResource::User(7))
        );
        assert_eq!(parse_chat_resource("gid://gitlab/Vulnerability/7"), None);
        assert_eq!(format("Issue", 5), "gid://gitlab/Issue/5");
    }
}
