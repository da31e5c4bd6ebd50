//! The model's review, in GitLab's answer format:
//!
//! ```text
//! <review>
//! <comment file="app/user.rb" priority="2" old_line="" new_line="12">
//! The check is inverted: …
//! </comment>
//! </review>
//! ```
//!
//! Parsed leniently (text around the tags, single or double quotes, any
//! attribute order, a missing `</review>`), strictly in what it yields: a
//! comment needs a file and a line number, and its text is unescaped once.

/// One comment the model wants on a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewComment {
    pub file: String,
    /// 1 (minor) to 3 (must fix); 2 when missing or unreadable.
    pub priority: u8,
    pub old_line: Option<u32>,
    pub new_line: Option<u32>,
    pub body: String,
}

/// Most comments taken from one answer.
const MAX_COMMENTS: usize = 50;
/// Longest comment kept (characters).
const MAX_BODY_CHARS: usize = 4000;

fn attribute(tag: &str, name: &str) -> Option<String> {
    let mut rest = tag;
    while let Some(at) = rest.find(name) {
        let before_ok = rest[..at]
            .chars()
            .next_back()
            .is_none_or(char::is_whitespace);
        let after = rest[at + name.len()..].trim_start();
        rest = &rest[at + name.len()..];
        if !before_ok {
            continue;
        }
        let Some(value) = after.strip_prefix('=') else {
            continue;
        };
        let value = value.trim_start();
        let quote = value.chars().next()?;
        if quote != '"' && quote != '\'' {
            let end = value
                .find(|c: char| c.is_whitespace() || c == '>')
                .unwrap_or(value.len());
            return Some(unescape(&value[..end]));
        }
        let inner = &value[1..];
        let end = inner.find(quote)?;
        return Some(unescape(&inner[..end]));
    }
    None
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn line_number(value: Option<String>) -> Option<u32> {
    value
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
}

/// The comments of an answer, in order; anything outside `<comment>`
/// elements is ignored.
pub fn parse(answer: &str) -> Vec<ReviewComment> {
    let mut comments = Vec::new();
    let mut rest = answer;
    while let Some(open) = rest.find("<comment") {
        let after_open = &rest[open + "<comment".len()..];
        let Some(tag_end) = after_open.find('>') else {
            break;
        };
        let tag = &after_open[..tag_end];
        let body_start = &after_open[tag_end + 1..];
        let (body, next) = match body_start.find("</comment>") {
            Some(close) => (
                &body_start[..close],
                &body_start[close + "</comment>".len()..],
            ),
            None => match body_start.find("<comment") {
                Some(following) => (&body_start[..following], &body_start[following..]),
                None => (
                    body_start.split("</review>").next().unwrap_or(body_start),
                    "",
                ),
            },
        };
        rest = next;
        let Some(file) = attribute(tag, "file").filter(|f| !f.trim().is_empty()) else {
            continue;
        };
        let old_line = line_number(attribute(tag, "old_line"));
        let new_line = line_number(attribute(tag, "new_line"));
        if old_line.is_none() && new_line.is_none() {
            continue;
        }
        let body: String = unescape(body.trim()).chars().take(MAX_BODY_CHARS).collect();
        if body.is_empty() {
            continue;
        }
        let priority = attribute(tag, "priority")
            .and_then(|p| p.trim().parse::<u8>().ok())
            .filter(|p| (1..=3).contains(p))
            .unwrap_or(2);
        comments.push(ReviewComment {
            file: file.trim().trim_start_matches("./").to_owned(),
            priority,
            old_line,
            new_line,
            body,
        });
        if comments.len() == MAX_COMMENTS {
            break;
        }
    }
    comments
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_are_read_leniently_and_yielded_strictly() {
        let answer = r#"Here is my review.
<review>
<comment file="src/lib.rs" priority="3" old_line="" new_line="12">
The check is inverted: `a &lt; b` should be `a &gt;= b`.
</comment>
<comment new_line='4' file='./README.md'>Typo.</comment>
<comment file="src/x.rs" old_line="" new_line="">No line.</comment>
<comment priority="1" new_line="3">No file.</comment>
<comment file="src/y.rs" old_line="7" priority="9">
Removed too much.
<comment file="src/z.rs" new_line="1">Unclosed at the end
</review>"#;
        let comments = parse(answer);
        assert_eq!(comments.len(), 4, "{comments:#?}");
        assert_eq!(
            comments[0],
            ReviewComment {
                file: "src/lib.rs".into(),
                priority: 3,
                old_line: None,
                new_line: Some(12),
                body: "The check is inverted: `a < b` should be `a >= b`.".into(),
            }
        );
        assert_eq!(comments[1].file, "README.md");
        assert_eq!((comments[1].priority, comments[1].new_line), (2, Some(4)));
        assert_eq!(
            (comments[2].file.as_str(), comments[2].old_line),
            ("src/y.rs", Some(7))
        );
        assert_eq!(comments[2].priority, 2, "out-of-range priority");
        assert_eq!(comments[3].body, "Unclosed at the end");
        assert!(parse("LGTM, nothing to add.").is_empty());
    }
}
