//! What of a project's code may reach an AI model: read access, Duo switched
//! on (for the instance, every ancestor group and the project), and GitLab's
//! Duo context exclusion (`duo_context_exclusion_settings.exclusion_rules`).
//!
//! [`Policy::code_for_ai`] is the one gate: the code index, codebase search,
//! file and selection context, `currentFile`, the slash commands,
//! `commit_reader` and the REST file reads of Duo Workflow all ask it before
//! any content of the project goes into a prompt or an embedding, and ask the
//! [`CodeForAi`] it returns about each path.

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::queries::Queries;

use super::*;

/// A project's exclusion rules, compiled.
#[derive(Debug, Clone)]
pub struct ContextExclusions {
    set: GlobSet,
    /// The stored rules did not compile: nothing of the project may go
    /// (rules are checked when saved, so this means a broken row; fail closed).
    everything: bool,
}

/// A glob that does not compile.
#[derive(Debug, thiserror::Error)]
#[error("{pattern:?} is not a valid glob: {reason}")]
pub struct BadGlob {
    pub pattern: String,
    pub reason: String,
}

/// Most rules a project may keep.
pub const MAX_RULES: usize = 100;
/// Longest rule accepted, in bytes.
pub const MAX_RULE_BYTES: usize = 255;

impl ContextExclusions {
    /// Gitignore-like matching: a pattern without a leading `/` matches at any
    /// depth, `dir/` or `dir/**` matches everything below `dir`, and a pattern
    /// naming a directory also covers the files below it.
    pub fn new(rules: &[String]) -> Result<Self, BadGlob> {
        let mut builder = GlobSetBuilder::new();
        for rule in rules {
            let rule = rule.trim();
            if rule.is_empty() {
                continue;
            }
            let rooted = rule.trim_start_matches('/');
            let mut patterns = Vec::new();
            if let Some(dir) = rooted.strip_suffix('/') {
                patterns.push(format!("{dir}/**"));
            } else {
                patterns.push(rooted.to_owned());
                patterns.push(format!("{rooted}/**"));
            }
            if !rule.starts_with('/') && !rooted.starts_with("**/") {
                let any_depth: Vec<String> = patterns.iter().map(|p| format!("**/{p}")).collect();
                patterns.extend(any_depth);
            }
            for pattern in patterns {
                let glob = Glob::new(&pattern).map_err(|e| BadGlob {
                    pattern: rule.to_owned(),
                    reason: e.kind().to_string(),
                })?;
                builder.add(glob);
            }
        }
        let set = builder.build().map_err(|e| BadGlob {
            pattern: rules.join(", "),
            reason: e.to_string(),
        })?;
        Ok(Self {
            set,
            everything: false,
        })
    }

    pub fn none() -> Self {
        Self {
            set: GlobSet::empty(),
            everything: false,
        }
    }

    /// Rules that exclude every file (stored rules that no longer compile).
    fn everything() -> Self {
        Self {
            set: GlobSet::empty(),
            everything: true,
        }
    }

    /// Whether `path` (relative to the repository root; a leading `/` or
    /// `./` is ignored) is excluded.
    pub fn excludes(&self, path: &str) -> bool {
        let path = path.trim_start_matches("./").trim_start_matches('/');
        self.everything || self.set.is_match(path)
    }
}

/// Checks the rules a project setting must meet before it is stored.
pub fn validate_rules(rules: &[String]) -> Result<(), String> {
    if rules.len() > MAX_RULES {
        return Err(format!("at most {MAX_RULES} exclusion rules"));
    }
    if let Some(r) = rules
        .iter()
        .find(|r| r.len() > MAX_RULE_BYTES || r.contains('\0'))
    {
        return Err(format!(
            "{:?} is too long or contains a NUL byte",
            r.chars().take(40).collect::<String>()
        ));
    }
    ContextExclusions::new(rules)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Who is about to send a project's code to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AiReader {
    /// A user's question, slash command, tool or workflow: they must read
    /// the project's code, and Duo must be on for them there.
    User(Actor),
    /// The code index, embedding for later searches: no user, Duo switched
    /// on for the project.
    Indexer,
}

/// A project's code as one reader may send it to AI: which files are left out.
#[derive(Debug, Clone)]
pub struct CodeForAi {
    project_id: i64,
    exclusions: ContextExclusions,
}

impl CodeForAi {
    pub fn project_id(&self) -> i64 {
        self.project_id
    }

    /// Whether the file at `path` may reach a model.
    pub fn allows(&self, path: &str) -> bool {
        !self.exclusions.excludes(path)
    }

    pub fn exclusions(&self) -> &ContextExclusions {
        &self.exclusions
    }

    /// What a model is told in place of an excluded file's content.
    pub fn excluded_note(path: &str) -> String {
        format!(
            "The content of {path} is not shown: the project's Duo context exclusion rules exclude it."
        )
    }
}

impl ContextExclusions {
    /// A unified diff (`diff --git a/<old> b/<new>` sections) without the
    /// hunks of excluded files: each such section keeps its header line and
    /// says its content was excluded.
    pub fn filter_unified_diff(&self, diff: &str) -> String {
        let mut out = String::with_capacity(diff.len());
        let mut skipping = false;
        for line in diff.split_inclusive('\n') {
            if let Some(header) = line.strip_prefix("diff --git ") {
                let (old, new) = diff_paths(header.trim_end());
                skipping = self.excludes(old) || self.excludes(new);
                out.push_str(line);
                if skipping {
                    if !line.ends_with('\n') {
                        out.push('\n');
                    }
                    out.push_str(&CodeForAi::excluded_note(new));
                    out.push('\n');
                }
                continue;
            }
            if !skipping {
                out.push_str(line);
            }
        }
        out
    }
}

fn strip(side: &str) -> &str {
    side.strip_prefix("a/")
        .or_else(|| side.strip_prefix("b/"))
        .unwrap_or(side)
}

/// The two paths of a `diff --git` header (`a/<old> b/<new>`); paths with
/// spaces split at the ` b/` that gives two equal halves when there is one.
fn diff_paths(header: &str) -> (&str, &str) {
    let candidates: Vec<usize> = header.match_indices(" b/").map(|(i, _)| i).collect();
    let split = candidates
        .iter()
        .copied()
        .find(|&i| strip(&header[..i]) == strip(&header[i + 1..]))
        .or_else(|| candidates.first().copied());
    match split {
        Some(i) => (strip(&header[..i]), strip(&header[i + 1..])),
        None => (strip(header), strip(header)),
    }
}

impl Policy {
    /// The gate for repository content on its way to a model: `None` when
    /// nothing of the project may go (the reader cannot read its code, or
    /// Duo is off for the instance, a group above it or the project itself);
    /// otherwise the project's exclusion rules, which every path then applies
    /// to each file it would send.
    pub async fn code_for_ai(
        &self,
        db: &impl Queries,
        reader: AiReader,
        project_id: i64,
    ) -> Result<Option<CodeForAi>, PolicyError> {
        let subject = Subject::Project(project_id);
        let allowed = match reader {
            AiReader::User(actor) => {
                self.can(db, Some(actor), Ability::ReadCode, subject)
                    .await?
                    && self.may_send_to_ai(db, actor, subject).await?
                    && Self::duo_switched_on(db, subject).await?
            }
            AiReader::Indexer => Self::duo_switched_on(db, subject).await?,
        };
        if !allowed {
            return Ok(None);
        }
        let exclusions = Self::context_exclusions(db, project_id).await?;
        Ok(Some(CodeForAi {
            project_id,
            exclusions,
        }))
    }

    /// The project's exclusion rules alone, for content whose reader was
    /// authorized already (a merge request's diff in a prompt); every other
    /// path asks [`Policy::code_for_ai`], which uses this.
    pub async fn context_exclusions(
        db: &impl Queries,
        project_id: i64,
    ) -> Result<ContextExclusions, PolicyError> {
        let rules: Vec<String> = db
            .query_opt(
                "SELECT duo_context_exclusion_rules FROM projects WHERE id = $1",
                &[&project_id],
            )
            .await?
            .map(|row| row.get(0))
            .unwrap_or_default();
        Ok(ContextExclusions::new(&rules).unwrap_or_else(|e| {
            tracing::warn!(project_id, error = %e, "stored exclusion rules do not compile; excluding every file");
            ContextExclusions::everything()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(r: &[&str]) -> ContextExclusions {
        ContextExclusions::new(&r.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn exclusion_globs_match_like_gitignore() {
        let ex = rules(&["*.env", "secrets/", "/config/prod.yml", "**/fixtures/**"]);
        assert!(ex.excludes("a.env"));
        assert!(ex.excludes("deep/down/x.env"));
        assert!(ex.excludes("secrets/key.txt"));
        assert!(ex.excludes("svc/secrets/key.txt"));
        assert!(ex.excludes("config/prod.yml"));
        assert!(
            ex.excludes("/config/prod.yml"),
            "a leading slash is the root"
        );
        assert!(ex.excludes("./secrets/key.txt"));
        assert!(!ex.excludes("other/config/prod.yml"));
        assert!(ex.excludes("spec/fixtures/data.json"));
        assert!(!ex.excludes("src/main.rs"));
        assert!(!ContextExclusions::none().excludes("anything"));
        assert!(ContextExclusions::everything().excludes("anything"));
        assert!(ContextExclusions::new(&["[".to_owned()]).is_err());
    }

    #[test]
    fn excluded_files_leave_a_unified_diff() {
        let ex = rules(&["secrets/"]);
        let diff = "diff --git a/src/a.rs b/src/a.rs\n@@ -1 +1 @@\n-old\n+new\n\
                    diff --git a/secrets/key b/secrets/key\n@@ -1 +1 @@\n-hunter1\n+hunter2\n\
                    diff --git a/my file b/my file\n+x\n";
        let out = ex.filter_unified_diff(diff);
        assert!(out.contains("+new"));
        assert!(!out.contains("hunter"), "{out}");
        assert!(out.contains("diff --git a/secrets/key b/secrets/key"));
        assert!(out.contains("secrets/key is not shown"));
        assert!(out.contains("+x"));
        // A rename out of an excluded directory is excluded too.
        let renamed = "diff --git a/secrets/key b/public/key\n+hunter3\n";
        assert!(!ex.filter_unified_diff(renamed).contains("hunter3"));
        assert_eq!(diff_paths("a/my file b/my file"), ("my file", "my file"));
    }

    #[test]
    fn stored_rules_are_bounded() {
        assert!(validate_rules(&["*.env".into()]).is_ok());
        assert!(validate_rules(&vec!["a".to_owned(); MAX_RULES + 1]).is_err());
        assert!(validate_rules(&["a".repeat(MAX_RULE_BYTES + 1)]).is_err());
        assert!(validate_rules(&["a\0b".into()]).is_err());
        assert!(validate_rules(&["[".into()]).is_err());
    }
}
