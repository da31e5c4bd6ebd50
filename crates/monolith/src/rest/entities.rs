//! The small JSON fragments GitLab repeats in its entities: a user, who closed
//! an item, an item's references.

use serde_json::{Value, json};

use crate::work_items::UserRef;

/// GitLab's basic user fragment.
pub(super) fn user_basic(user: &UserRef, base: &url::Url) -> Value {
    json!({
        "id": user.id,
        "username": user.username,
        "name": user.name,
        "state": user.state,
        "avatar_url": Value::Null,
        "web_url": format!("{}{}", base.as_str(), user.username),
    })
}

/// Who closed an item (`null` when open or unknown).
pub(super) fn closed_by(closer: Option<&UserRef>, base: &url::Url) -> Value {
    closer.map_or(Value::Null, |user| user_basic(user, base))
}

/// GitLab's `references` of an item: `short` (`#1`), `relative` (the same inside
/// its own project or group) and `full` (`acme/api#1`).
pub(super) fn references(full_path: &str, sigil: char, iid: i32) -> Value {
    json!({
        "short": format!("{sigil}{iid}"),
        "relative": format!("{sigil}{iid}"),
        "full": format!("{full_path}{sigil}{iid}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_the_item_in_and_outside_its_container() {
        assert_eq!(
            references("acme/api", '#', 3),
            json!({"short": "#3", "relative": "#3", "full": "acme/api#3"})
        );
    }
}
