//! One file's diff as numbered lines: what the model reads (each line with
//! its numbers in the old and the new file, so it can point at one), how a
//! large diff is cut into pieces that fit a prompt, and where a comment the
//! model placed may really go (only on a line of the diff, as GitLab places
//! diff notes).

use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    Added,
    Deleted,
    Context,
}

impl LineKind {
    fn name(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Deleted => "deleted",
            Self::Context => "context",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffLine {
    pub kind: LineKind,
    pub old_line: Option<u32>,
    pub new_line: Option<u32>,
    pub text: String,
    /// The first line of a hunk (where a long diff may be cut).
    pub hunk_start: bool,
}

/// `@@ -a,b +c,d @@` → (a, c).
fn hunk_header(line: &str) -> Option<(u32, u32)> {
    let rest = line.strip_prefix("@@ ")?;
    let mut parts = rest.split_whitespace();
    let old = parts.next()?.strip_prefix('-')?;
    let new = parts.next()?.strip_prefix('+')?;
    let start = |s: &str| s.split(',').next()?.parse::<u32>().ok();
    Some((start(old)?, start(new)?))
}

/// The numbered lines of a file's hunks (from its first `@@` on).
pub fn lines(diff: &str) -> Vec<DiffLine> {
    let mut out = Vec::new();
    let (mut old, mut new) = (0u32, 0u32);
    let mut in_hunk = false;
    let mut starts = false;
    for raw in diff.lines() {
        if let Some((o, n)) = hunk_header(raw) {
            (old, new) = (o, n);
            in_hunk = true;
            starts = true;
            continue;
        }
        if !in_hunk || raw.starts_with('\\') {
            continue;
        }
        let (kind, text) = match raw.as_bytes().first() {
            Some(b'+') => (LineKind::Added, &raw[1..]),
            Some(b'-') => (LineKind::Deleted, &raw[1..]),
            Some(b' ') => (LineKind::Context, &raw[1..]),
            None => (LineKind::Context, ""),
            _ => continue,
        };
        let (old_line, new_line) = match kind {
            LineKind::Added => {
                new += 1;
                (None, Some(new - 1))
            }
            LineKind::Deleted => {
                old += 1;
                (Some(old - 1), None)
            }
            LineKind::Context => {
                old += 1;
                new += 1;
                (Some(old - 1), Some(new - 1))
            }
        };
        out.push(DiffLine {
            kind,
            old_line,
            new_line,
            text: text.to_owned(),
            hunk_start: std::mem::take(&mut starts),
        });
    }
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn number(n: Option<u32>) -> String {
    n.map(|n| n.to_string()).unwrap_or_default()
}

/// The lines as the prompt shows them.
pub fn annotate(lines: &[DiffLine]) -> String {
    let mut out = String::new();
    for line in lines {
        out.push_str(&format!(
            "<line type=\"{}\" old_line=\"{}\" new_line=\"{}\">{}</line>\n",
            line.kind.name(),
            number(line.old_line),
            number(line.new_line),
            escape(&line.text)
        ));
    }
    out
}

fn annotated_len(line: &DiffLine) -> usize {
    line.text.len() + 60
}

/// Pieces of at most `max_chars` annotated characters, cut between hunks
/// where possible and between lines when a hunk alone is too long.
pub fn pieces(lines: &[DiffLine], max_chars: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 0;
    let mut last_hunk = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.hunk_start {
            last_hunk = i;
        }
        let len = annotated_len(line);
        if size + len > max_chars && i > start {
            // Cut at the hunk this line is in when that leaves something.
            let cut = if last_hunk > start { last_hunk } else { i };
            out.push(start..cut);
            start = cut;
            size = lines[cut..i].iter().map(annotated_len).sum();
        }
        size += len;
    }
    if start < lines.len() {
        out.push(start..lines.len());
    }
    out
}

/// Where a comment at (`old_line`, `new_line`) goes: the diff line it names
/// (`new_line` first), with both numbers as GitLab positions it; `None`
/// when the diff has no such line (the comment is then dropped).
pub fn place(
    lines: &[DiffLine],
    old_line: Option<u32>,
    new_line: Option<u32>,
) -> Option<&DiffLine> {
    if let Some(n) = new_line
        && let Some(line) = lines.iter().find(|l| l.new_line == Some(n))
    {
        return Some(line);
    }
    old_line.and_then(|n| {
        lines
            .iter()
            .find(|l| l.old_line == Some(n) && l.kind != LineKind::Added)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIFF: &str = "@@ -1,3 +1,4 @@\n def average(values):\n-    return sum(values) / len(values)\n+    if not values:\n+        return 0\n+    return sum(values) / len(values)\n@@ -10,2 +11,2 @@ def median(values):\n     ordered = sorted(values)\n-    return ordered[len(ordered) // 2]\n+    return ordered[len(ordered) / 2]\n\\ No newline at end of file\n";

    #[test]
    fn lines_carry_both_numbers() {
        let lines = lines(DIFF);
        assert_eq!(lines.len(), 8);
        assert_eq!((lines[0].old_line, lines[0].new_line), (Some(1), Some(1)));
        assert_eq!(
            (lines[1].kind, lines[1].old_line, lines[1].new_line),
            (LineKind::Deleted, Some(2), None)
        );
        assert_eq!(
            (lines[2].kind, lines[2].new_line),
            (LineKind::Added, Some(2))
        );
        assert_eq!(lines[4].new_line, Some(4));
        assert!(lines[5].hunk_start);
        assert_eq!((lines[5].old_line, lines[5].new_line), (Some(10), Some(11)));
        assert_eq!(lines[7].new_line, Some(12));
        let text = annotate(&lines[..3]);
        assert!(text.contains("<line type=\"deleted\" old_line=\"2\" new_line=\"\">"));
    }

    #[test]
    fn comments_go_only_on_diff_lines() {
        let lines = lines(DIFF);
        assert_eq!(
            place(&lines, None, Some(12)).map(|l| l.kind),
            Some(LineKind::Added)
        );
        assert_eq!(
            place(&lines, Some(2), None).map(|l| l.kind),
            Some(LineKind::Deleted)
        );
        assert_eq!(
            place(&lines, Some(10), None).map(|l| l.new_line),
            Some(Some(11))
        );
        assert!(place(&lines, None, Some(40)).is_none());
        assert!(place(&lines, Some(40), None).is_none());
    }

    #[test]
    fn long_diffs_are_cut_between_hunks_then_lines() {
        let lines = lines(DIFF);
        let whole = pieces(&lines, 100_000);
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0], 0..8);
        let per_hunk = pieces(&lines, 430);
        assert_eq!(per_hunk[0], 0..5, "cut at the second hunk");
        let tiny = pieces(&lines, 70);
        assert_eq!(tiny.len(), 8, "one line each when nothing else fits");
        assert!(pieces(&[], 10).is_empty());
    }
}
