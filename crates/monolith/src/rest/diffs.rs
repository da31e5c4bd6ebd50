//! Splits the unified diff stored with a merge request into GitLab's per-file
//! diff objects (`old_path`, `new_path`, modes, flags and the hunks as `diff`).
//!
//! Both `git diff` output (`diff --git` headers, modes, renames) and plain
//! `diff -u` output (`---`/`+++` pairs only) are understood. Text before the first
//! file header is ignored.

use serde::Serialize;

const DEFAULT_MODE: &str = "100644";
const NO_MODE: &str = "0";

/// One file's change, as GitLab's REST API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileDiff {
    pub old_path: String,
    pub new_path: String,
    pub a_mode: String,
    pub b_mode: String,
    /// The hunks, from the first `@@` line on, newline-terminated.
    pub diff: String,
    pub new_file: bool,
    pub renamed_file: bool,
    pub deleted_file: bool,
    pub generated_file: bool,
}

#[derive(Debug, Default)]
struct Section<'a> {
    git_old: Option<String>,
    git_new: Option<String>,
    minus: Option<Option<String>>,
    plus: Option<Option<String>>,
    rename_from: Option<String>,
    rename_to: Option<String>,
    old_mode: Option<String>,
    new_mode: Option<String>,
    index_mode: Option<String>,
    new_file: bool,
    deleted_file: bool,
    in_hunks: bool,
    body: Vec<&'a str>,
}

/// `a/path` or `b/path` without its prefix; `None` for `/dev/null`. A trailing
/// tab and timestamp (plain `diff -u`) is dropped.
fn header_path(text: &str) -> Option<String> {
    let text = text.split('\t').next().unwrap_or(text).trim_end();
    if text == "/dev/null" {
        return None;
    }
    let stripped = text
        .strip_prefix("a/")
        .or_else(|| text.strip_prefix("b/"))
        .unwrap_or(text);
    Some(stripped.to_owned())
}

impl<'a> Section<'a> {
    fn from_git_line(rest: &str) -> Self {
        let (old, new) = match rest.rsplit_once(" b/") {
            Some((a, b)) => (a.strip_prefix("a/").unwrap_or(a).to_owned(), b.to_owned()),
            None => (rest.to_owned(), rest.to_owned()),
        };
        Section {
            git_old: Some(old),
            git_new: Some(new),
            ..Section::default()
        }
    }

    fn header_line(&mut self, line: &str) {
        if let Some(p) = line.strip_prefix("--- ") {
            self.minus = Some(header_path(p));
        } else if let Some(p) = line.strip_prefix("+++ ") {
            self.plus = Some(header_path(p));
        } else if let Some(m) = line.strip_prefix("new file mode ") {
            self.new_file = true;
            self.new_mode = Some(m.trim().to_owned());
        } else if let Some(m) = line.strip_prefix("deleted file mode ") {
            self.deleted_file = true;
            self.old_mode = Some(m.trim().to_owned());
        } else if let Some(m) = line.strip_prefix("old mode ") {
            self.old_mode = Some(m.trim().to_owned());
        } else if let Some(m) = line.strip_prefix("new mode ") {
            self.new_mode = Some(m.trim().to_owned());
        } else if let Some(p) = line.strip_prefix("rename from ") {
            self.rename_from = Some(p.to_owned());
        } else if let Some(p) = line.strip_prefix("rename to ") {
            self.rename_to = Some(p.to_owned());
        } else if let Some(rest) = line.strip_prefix("index ") {
            // `index abc..def 100644`
            if let Some((_, mode)) = rest.split_once(' ') {
                self.index_mode = Some(mode.trim().to_owned());
            }
        }
    }

    fn finish(self) -> Option<FileDiff> {
        let minus_null = matches!(self.minus, Some(None));
        let plus_null = matches!(self.plus, Some(None));
        let new_file = self.new_file || minus_null;
        let deleted_file = self.deleted_file || plus_null;
        let old = self.rename_from.or(self.minus.flatten()).or(self.git_old);
        let new = self.rename_to.or(self.plus.flatten()).or(self.git_new);
        let (old_path, new_path) = match (old, new) {
            (Some(o), Some(n)) => (o, n),
            (Some(o), None) => (o.clone(), o),
            (None, Some(n)) => (n.clone(), n),
            (None, None) => return None,
        };
        let renamed_file = !new_file && !deleted_file && old_path != new_path;
        let a_mode = if new_file {
            NO_MODE.to_owned()
        } else {
            self.old_mode
                .or_else(|| self.index_mode.clone())
                .unwrap_or_else(|| DEFAULT_MODE.to_owned())
        };
        let b_mode = if deleted_file {
            NO_MODE.to_owned()
        } else {
            self.new_mode
                .or(self.index_mode)
                .unwrap_or_else(|| DEFAULT_MODE.to_owned())
        };
        let mut diff = self.body.join("\n");
        if !diff.is_empty() {
            diff.push('\n');
        }
        Some(FileDiff {
            old_path,
            new_path,
            a_mode,
            b_mode,
            diff,
            new_file,
            renamed_file,
            deleted_file,
            generated_file: false,
        })
    }
}

/// Every file a unified diff changes, in order. Empty when the text holds no file
/// header at all.
pub fn parse(text: &str) -> Vec<FileDiff> {
    let lines: Vec<&str> = text.lines().collect();
    let mut files = Vec::new();
    let mut current: Option<Section> = None;
    for (i, line) in lines.iter().enumerate() {
        // A plain `diff -u` file starts with `---`, `+++` and a hunk header; inside
        // a hunk those three lines in a row are (practically) never content.
        let plain_start = line.starts_with("--- ")
            && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ "))
            && lines.get(i + 2).is_some_and(|l| l.starts_with("@@"));
        if let Some(rest) = line.strip_prefix("diff --git ") {
            files.extend(current.take().and_then(Section::finish));
            current = Some(Section::from_git_line(rest));
            continue;
        }
        if plain_start && current.as_ref().is_none_or(|s| s.in_hunks) {
            files.extend(current.take().and_then(Section::finish));
            current = Some(Section::default());
        }
        let Some(section) = current.as_mut() else {
            continue;
        };
        if section.in_hunks {
            section.body.push(line);
        } else if line.starts_with("@@") {
            section.in_hunks = true;
            section.body.push(line);
        } else {
            section.header_line(line);
        }
    }
    files.extend(current.and_then(Section::finish));
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_unified_diff() {
        let files = parse(
            "--- a/src/session.rs\n+++ b/src/session.rs\n@@ -10,3 +10,6 @@\n-    return Err(Expired);\n+    ok\n",
        );
        assert_eq!(files.len(), 1);
        let f = &files[0];
        assert_eq!(f.old_path, "src/session.rs");
        assert_eq!(f.new_path, "src/session.rs");
        assert_eq!((f.a_mode.as_str(), f.b_mode.as_str()), ("100644", "100644"));
        assert_eq!(
            f.diff,
            "@@ -10,3 +10,6 @@\n-    return Err(Expired);\n+    ok\n"
        );
        assert!(!f.new_file && !f.deleted_file && !f.renamed_file);
    }

    #[test]
    fn git_diff_with_new_deleted_renamed_and_mode_changes() {
        let text = "\
diff --git a/README.md b/README.md
index 1111111..2222222 100644
--- a/README.md
+++ b/README.md
@@ -1 +1 @@
-old
+new
diff --git a/src/new.rs b/src/new.rs
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/src/new.rs
@@ -0,0 +1,2 @@
+fn main() {}
+// --- not a header
diff --git a/gone.txt b/gone.txt
deleted file mode 100755
index 4444444..0000000
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
diff --git a/old name.rs b/new name.rs
similarity index 90%
rename from old name.rs
rename to new name.rs
diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
";
        let files = parse(text);
        assert_eq!(files.len(), 5, "{files:#?}");
        assert_eq!(files[0].new_path, "README.md");
        assert_eq!(files[0].diff, "@@ -1 +1 @@\n-old\n+new\n");
        assert!(files[1].new_file);
        assert_eq!(files[1].old_path, "src/new.rs");
        assert_eq!(files[1].a_mode, "0");
        assert_eq!(files[1].b_mode, "100644");
        assert!(files[1].diff.ends_with("+// --- not a header\n"));
        assert!(files[2].deleted_file);
        assert_eq!(files[2].new_path, "gone.txt");
        assert_eq!(
            (files[2].a_mode.as_str(), files[2].b_mode.as_str()),
            ("100755", "0")
        );
        assert!(files[3].renamed_file);
        assert_eq!(files[3].old_path, "old name.rs");
        assert_eq!(files[3].new_path, "new name.rs");
        assert_eq!(files[3].diff, "");
        assert_eq!(
            (files[4].a_mode.as_str(), files[4].b_mode.as_str()),
            ("100644", "100755")
        );
    }

    #[test]
    fn several_plain_files_and_junk() {
        let text = "Some preamble\n--- a/a.txt\t2024-01-01\n+++ b/a.txt\t2024-01-02\n@@ -1 +1 @@\n-a\n+A\n--- a/b.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-b\n+B\n";
        let files = parse(text);
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].old_path, "a.txt");
        assert_eq!(files[0].diff, "@@ -1 +1 @@\n-a\n+A\n");
        assert_eq!(files[1].new_path, "b.txt");
        assert!(parse("just some words\n").is_empty());
        assert!(parse("").is_empty());
    }
}
