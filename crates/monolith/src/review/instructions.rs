//! Review instructions as GitLab reads them: groups of
//! `{name, fileFilters, instructions}` from the instance's and the groups'
//! defaults and the project's `.gitlab/duo/mr-review-instructions.yaml`
//! (read from the target branch, so a merge request cannot rewrite the
//! rules of its own review). A group applies to a changed file that
//! matches one of its globs and none of its `!` exclusions.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use serde::Deserialize;

/// Where a project keeps its review instructions.
pub const INSTRUCTIONS_PATH: &str = ".gitlab/duo/mr-review-instructions.yaml";

/// Largest instructions document read (bytes).
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024;
/// Most groups taken from one document.
const MAX_GROUPS: usize = 50;
/// Most globs of one group.
const MAX_FILTERS: usize = 50;
/// Longest instruction text kept (characters).
const MAX_TEXT_CHARS: usize = 8 * 1024;

/// Where a group came from (shown in the summary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Instance,
    Group(String),
    Project,
}

#[derive(Debug, Clone)]
pub struct InstructionGroup {
    pub name: String,
    pub source: Source,
    pub text: String,
    include: Option<GlobSet>,
    exclude: GlobSet,
}

impl InstructionGroup {
    /// Whether the group applies to `path`.
    pub fn applies_to(&self, path: &str) -> bool {
        let included = self.include.as_ref().is_none_or(|set| set.is_match(path));
        included && !self.exclude.is_match(path)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InstructionsError {
    #[error("the review instructions are larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge,
    #[error("the review instructions are not valid YAML: {0}")]
    Yaml(String),
    #[error("the review instructions have a bad file filter {pattern:?}: {reason}")]
    Glob { pattern: String, reason: String },
}

#[derive(Deserialize)]
struct Document {
    #[serde(default)]
    instructions: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "fileFilters")]
    file_filters: Vec<String>,
    #[serde(default)]
    instructions: String,
}

/// `*` stays within a directory, `**` crosses them (fnmatch with
/// FNM_PATHNAME, as GitLab matches).
fn glob(pattern: &str) -> Result<Glob, InstructionsError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| InstructionsError::Glob {
            pattern: pattern.chars().take(100).collect(),
            reason: e.kind().to_string(),
        })
}

/// The groups of one instructions document (empty text: none).
pub fn parse(text: &str, source: Source) -> Result<Vec<InstructionGroup>, InstructionsError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(InstructionsError::TooLarge);
    }
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let document: Document =
        serde_norway::from_str(text).map_err(|e| InstructionsError::Yaml(e.to_string()))?;
    let mut groups = Vec::new();
    for entry in document.instructions.into_iter().take(MAX_GROUPS) {
        let text: String = entry
            .instructions
            .trim()
            .chars()
            .take(MAX_TEXT_CHARS)
            .collect();
        if text.is_empty() {
            continue;
        }
        let mut include = GlobSetBuilder::new();
        let mut exclude = GlobSetBuilder::new();
        let mut includes = 0;
        for filter in entry.file_filters.iter().take(MAX_FILTERS) {
            let filter = filter.trim();
            match filter.strip_prefix('!') {
                Some(negated) => {
                    exclude.add(glob(negated.trim())?);
                }
                None if !filter.is_empty() => {
                    include.add(glob(filter)?);
                    includes += 1;
                }
                None => {}
            }
        }
        let built = |builder: GlobSetBuilder| {
            builder.build().map_err(|e| InstructionsError::Glob {
                pattern: String::new(),
                reason: e.to_string(),
            })
        };
        groups.push(InstructionGroup {
            name: if entry.name.trim().is_empty() {
                "Review instructions".to_owned()
            } else {
                entry.name.trim().chars().take(200).collect()
            },
            source: source.clone(),
            text,
            include: if includes == 0 {
                None
            } else {
                Some(built(include)?)
            },
            exclude: built(exclude)?,
        });
    }
    Ok(groups)
}

/// The groups that apply to `path`, in order (instance, groups from the
/// top, project).
pub fn for_file<'a>(groups: &'a [InstructionGroup], path: &str) -> Vec<&'a InstructionGroup> {
    groups.iter().filter(|g| g.applies_to(path)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"
instructions:
  - name: Ruby style
    fileFilters:
      - "**/*.rb"
      - "!spec/**/*.rb"
    instructions: |
      Prefer guard clauses.
  - name: Top-level scripts
    fileFilters: ["*.sh"]
    instructions: Quote every variable.
  - name: Everything but docs
    fileFilters: ["!docs/**"]
    instructions: Check error handling.
  - name: Empty
    fileFilters: ["**"]
    instructions: ""
"#;

    #[test]
    fn globs_include_and_exclamation_marks_exclude() {
        let groups = parse(DOC, Source::Project).unwrap();
        assert_eq!(groups.len(), 3, "the empty group is dropped");
        let names = |path: &str| -> Vec<String> {
            for_file(&groups, path)
                .iter()
                .map(|g| g.name.clone())
                .collect()
        };
        assert_eq!(
            names("app/models/user.rb"),
            ["Ruby style", "Everything but docs"]
        );
        assert_eq!(names("spec/models/user_spec.rb"), ["Everything but docs"]);
        assert_eq!(
            names("deploy.sh"),
            ["Top-level scripts", "Everything but docs"]
        );
        assert_eq!(
            names("scripts/deploy.sh"),
            ["Everything but docs"],
            "* stays in a directory"
        );
        assert!(names("docs/index.md").is_empty());
    }

    #[test]
    fn bad_documents_say_why() {
        assert!(matches!(
            parse("instructions: [", Source::Project),
            Err(InstructionsError::Yaml(_))
        ));
        assert!(matches!(
            parse(
                "instructions:\n  - fileFilters: ['a[']\n    instructions: x",
                Source::Project
            ),
            Err(InstructionsError::Glob { .. })
        ));
        assert_eq!(
            parse(&"#".repeat(MAX_DOCUMENT_BYTES + 1), Source::Project).unwrap_err(),
            InstructionsError::TooLarge
        );
        assert!(parse("", Source::Instance).unwrap().is_empty());
    }
}
