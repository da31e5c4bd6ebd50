//! Where a diff note sits in a merge request's diff: GitLab's position, as
//! notes store it and the discussions API takes it.

use serde::{Deserialize, Serialize};

use super::WorkItemError;

/// Where a diff note sits, in GitLab's shape (`Gitlab::Diff::Position` of
/// type `text`): the diff between `start_sha` and `head_sha` (on top of
/// `base_sha`), a file by its old and new path, and a line by its number in
/// the old file (a removed line), the new file (an added line) or both (an
/// unchanged line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub base_sha: String,
    pub start_sha: String,
    pub head_sha: String,
    pub old_path: String,
    pub new_path: String,
    /// Always `text` here (GitLab also has `image` and `file`).
    #[serde(default = "text_position")]
    pub position_type: String,
    #[serde(default)]
    pub old_line: Option<i32>,
    #[serde(default)]
    pub new_line: Option<i32>,
}

fn text_position() -> String {
    "text".to_owned()
}

/// Longest path a position names (bytes), as git's own limit on one path.
const MAX_PATH_BYTES: usize = 4096;

impl Position {
    /// Whether the position is one GitLab would take: a text position with
    /// commit ids, both paths, and at least one positive line number.
    pub fn check(&self) -> Result<(), WorkItemError> {
        if self.position_type != "text" {
            return Err(WorkItemError::BadRequest(
                "position[position_type] does not have a valid value".into(),
            ));
        }
        for (name, sha) in [
            ("base_sha", &self.base_sha),
            ("start_sha", &self.start_sha),
            ("head_sha", &self.head_sha),
        ] {
            let hex = (4..=64).contains(&sha.len()) && sha.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex {
                return Err(WorkItemError::BadRequest(format!(
                    "position[{name}] is not a commit id"
                )));
            }
        }
        for (name, path) in [("old_path", &self.old_path), ("new_path", &self.new_path)] {
            if path.trim().is_empty() {
                return Err(WorkItemError::BadRequest(format!(
                    "position[{name}] is empty"
                )));
            }
            if path.len() > MAX_PATH_BYTES || path.contains('\0') {
                return Err(WorkItemError::BadRequest(format!(
                    "position[{name}] is invalid"
                )));
            }
        }
        if self.old_line.is_none() && self.new_line.is_none() {
            return Err(WorkItemError::BadRequest(
                "position[old_line], position[new_line] are missing, at least one parameter must be provided".into(),
            ));
        }
        for (name, line) in [("old_line", self.old_line), ("new_line", self.new_line)] {
            if line.is_some_and(|l| l < 1) {
                return Err(WorkItemError::BadRequest(format!(
                    "position[{name}] must be a positive line number"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position() -> Position {
        Position {
            base_sha: "aaaa1111".into(),
            start_sha: "bbbb2222".into(),
            head_sha: "cccc3333".into(),
            old_path: "src/a.rs".into(),
            new_path: "src/a.rs".into(),
            position_type: "text".into(),
            old_line: None,
            new_line: Some(3),
        }
    }

    #[test]
    fn positions_need_commits_paths_and_a_positive_line() {
        assert!(position().check().is_ok());
        let bad = |change: fn(&mut Position)| {
            let mut p = position();
            change(&mut p);
            p.check().is_err()
        };
        assert!(bad(|p| p.position_type = "image".into()));
        assert!(bad(|p| p.head_sha = "not hex".into()));
        assert!(bad(|p| p.base_sha = String::new()));
        assert!(bad(|p| p.new_path = " ".into()));
        assert!(bad(|p| p.old_path = String::new()));
        assert!(bad(|p| p.new_line = None));
        assert!(bad(|p| p.new_line = Some(0)));
        assert!(bad(|p| p.old_line = Some(-2)));
    }

    #[test]
    fn a_position_reads_gitlabs_json_and_defaults_to_text() {
        let p: Position = serde_json::from_value(serde_json::json!({
            "base_sha": "aaaa1111", "start_sha": "bbbb2222", "head_sha": "cccc3333",
            "old_path": "src/a.rs", "new_path": "src/a.rs", "new_line": 3,
        }))
        .unwrap();
        assert_eq!(p, position());
    }
}
