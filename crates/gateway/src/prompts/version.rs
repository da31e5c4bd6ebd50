//! Version constraints for prompt definitions.
//!
//! Requests name versions the way GitLab's gateway does (poetry syntax):
//! `^1.0.0`, `~1.0`, `>=1.0.0`, `=1.0.0`, or a bare `1.0.0`. The `semver`
//! crate reads all of them except the bare form, which Cargo would treat as
//! a caret requirement; here a bare version is exact, as in poetry.
//!
//! Pre-releases (`1.1.0-dev`) follow the `semver` crate's rule: they only match
//! a constraint that itself names a pre-release of the same `major.minor.patch`
//! (for example `=1.1.0-dev` or `>=1.1.0-dev`), so a default request never
//! picks a prompt that is still being worked on.

use semver::{Version, VersionReq};

/// The constraint used when a request names none.
pub const DEFAULT_CONSTRAINT: &str = contracts::prompts::DEFAULT_PROMPT_VERSION;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionConstraint(VersionReq);

impl VersionConstraint {
    /// Parses a constraint; `None` is the default `^1.0.0`.
    pub fn parse(constraint: Option<&str>) -> Option<Self> {
        let text = constraint.unwrap_or(DEFAULT_CONSTRAINT).trim();
        if text.is_empty() {
            return None;
        }
        // A bare version is an exact pin (poetry), not a caret range (Cargo).
        let starts_with_digit = text.chars().next().is_some_and(|c| c.is_ascii_digit());
        let req = if starts_with_digit && !text.contains(',') {
            VersionReq::parse(&format!("={text}"))
        } else {
            VersionReq::parse(text)
        };
        req.ok().map(Self)
    }

    pub fn matches(&self, version: &Version) -> bool {
        self.0.matches(version)
    }

    /// The highest of `versions` that matches.
    pub fn best_match<'a, I>(&self, versions: I) -> Option<&'a Version>
    where
        I: IntoIterator<Item = &'a Version>,
    {
        versions.into_iter().filter(|v| self.matches(v)).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions(list: &[&str]) -> Vec<Version> {
        list.iter().map(|v| Version::parse(v).unwrap()).collect()
    }

    #[test]
    fn resolution_table() {
        let available = versions(&["1.0.0", "1.0.1", "1.1.0", "1.2.0-dev", "2.0.0"]);
        let table: &[(Option<&str>, Option<&str>)] = &[
            (None, Some("1.1.0")),
            (Some("^1.0.0"), Some("1.1.0")),
            (Some("^1.0"), Some("1.1.0")),
            (Some("~1.0"), Some("1.0.1")),
            (Some("~1.0.0"), Some("1.0.1")),
            (Some(">=1.0.0"), Some("2.0.0")),
            (Some(">=1.0.0, <2.0.0"), Some("1.1.0")),
            (Some("1.0.0"), Some("1.0.0")),
            (Some("=1.0.0"), Some("1.0.0")),
            (Some("1.0"), Some("1.0.1")),
            (Some("^2"), Some("2.0.0")),
            (Some("^3.0.0"), None),
            (Some("=1.2.0-dev"), Some("1.2.0-dev")),
            (Some(">=1.2.0-dev"), Some("2.0.0")),
            (Some("*"), Some("2.0.0")),
        ];
        for (constraint, expected) in table {
            let parsed = VersionConstraint::parse(*constraint)
                .unwrap_or_else(|| panic!("{constraint:?} should parse"));
            let got = parsed.best_match(&available).map(ToString::to_string);
            assert_eq!(got.as_deref(), *expected, "constraint {constraint:?}");
        }
    }

    #[test]
    fn invalid_constraints_are_rejected() {
        for bad in ["", "  ", "abc", "^x", "1.0.0.0", ">=>1", "latest"] {
            assert_eq!(VersionConstraint::parse(Some(bad)), None, "{bad:?}");
        }
    }
}
