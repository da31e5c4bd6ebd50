//! The code around a change, from the project's code index: for each piece
//! of a reviewed file, the chunks of other files nearest to what the changed
//! lines say and call (a called function's definition first), so the model
//! sees what the diff relies on.
//!
//! The same rules as chat's codebase search: the requester may read the
//! code (the review checked), the project's current Duo exclusion rules
//! drop files the index still holds, and nothing is searched without a
//! usable index. The reviewed file itself is never repeated (the prompt has
//! its diff and, when small, the whole file).

use contracts::ModelMetadata;
use uuid::Uuid;

use super::diff_lines::{DiffLine, LineKind};
use crate::code_index::search::{self, Hit, QueryVector, Retrieval, Scope};
use crate::code_index::{CodeIndex, CodeIndexError, store};
use crate::gateway_client::{EmbeddingPurpose, GatewayAuth};
use crate::policy::ContextExclusions;

/// Longest search text built from a piece (characters).
const MAX_QUERY_CHARS: usize = 2_000;
/// Chunks asked of the index before the reviewed file's own are dropped.
const CANDIDATES: usize = 10;
/// Words that look like calls but are the language's own.
const KEYWORDS: &[&str] = &[
    "if", "for", "while", "match", "switch", "return", "catch", "elif", "and", "or", "not", "in",
    "print", "len", "str", "int", "def", "fn", "function", "func", "sizeof", "typeof", "new",
    "super", "self", "this", "assert", "Some", "Ok", "Err", "vec", "format", "println",
];
/// How a definition of `name` starts in the common languages.
const DEFINERS: &[&str] = &[
    "def ",
    "fn ",
    "function ",
    "func ",
    "class ",
    "struct ",
    "const ",
    "let ",
    "var ",
    "static ",
    "sub ",
];

/// Limits of what one piece and one review add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelatedLimits {
    pub chunks: usize,
    pub chars: usize,
}

/// Related code for one review: the project's usable index and what
/// searching it needs; `None` from [`RelatedCode::open`] when there is none.
pub struct RelatedCode<'a> {
    index: &'a CodeIndex,
    project_id: i64,
    exclusions: &'a ContextExclusions,
    model: Option<ModelMetadata>,
    auth: GatewayAuth,
}

impl<'a> RelatedCode<'a> {
    /// The project's index when it answers searches, with the embedding
    /// model the admin chose; `None` (and a log line) otherwise.
    pub async fn open(
        index: &'a CodeIndex,
        user_id: i64,
        project_id: i64,
        exclusions: &'a ContextExclusions,
    ) -> Result<Option<Self>, CodeIndexError> {
        let db = index.pool.get().await?;
        let usable = store::status(&*db, project_id)
            .await?
            .is_some_and(|s| s.searchable());
        if !usable {
            tracing::info!(
                project_id,
                "no usable code index: the review goes without related code"
            );
            return Ok(None);
        }
        let model = match index.embedding_model(&*db).await {
            Ok(model) => model,
            Err(CodeIndexError::SwitchedOff) => {
                tracing::info!(
                    project_id,
                    "code embeddings are switched off: the review goes without related code"
                );
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let auth = crate::code_index::embedding_auth(&*db, user_id, Uuid::new_v4()).await?;
        Ok(Some(Self {
            index,
            project_id,
            exclusions,
            model,
            auth,
        }))
    }

    /// The chunks of other files related to `lines` (a piece of the file
    /// at `reviewed`), within `limits`, best first.
    pub async fn around(
        &self,
        reviewed: &[&str],
        lines: &[DiffLine],
        limits: RelatedLimits,
    ) -> Result<Vec<Hit>, CodeIndexError> {
        let called = called_names(lines);
        let query = search_text(&called, lines);
        if query.trim().is_empty() || limits.chunks == 0 || limits.chars == 0 {
            return Ok(Vec::new());
        }
        let answer = self
            .index
            .gateway
            .code_embeddings(
                &self.auth,
                EmbeddingPurpose::Search,
                std::slice::from_ref(&query),
                self.model.as_ref(),
            )
            .await?;
        let vector = answer.vectors.into_iter().next().map(|vector| QueryVector {
            model: answer.model,
            vector,
        });
        let mut db = self.index.pool.get().await?;
        let hits = search::search(
            &mut db,
            &Scope {
                project_id: self.project_id,
                directory: None,
            },
            &query,
            vector.as_ref(),
            Retrieval::Fused,
            CANDIDATES,
            self.exclusions,
        )
        .await?;
        Ok(pick(hits, reviewed, &called, limits))
    }
}

/// The names the added lines call (`name(`), not defined in the piece
/// itself and not keywords, in order of first use.
pub fn called_names(lines: &[DiffLine]) -> Vec<String> {
    let mut defined: Vec<String> = Vec::new();
    let mut called: Vec<String> = Vec::new();
    for line in lines {
        let text = line.text.as_str();
        let mut chars = text.char_indices().peekable();
        let mut start: Option<usize> = None;
        while let Some((i, c)) = chars.next() {
            let ident = c.is_alphanumeric() || c == '_';
            if ident && start.is_none() {
                start = Some(i);
            }
            let next_is_ident = chars
                .peek()
                .is_some_and(|(_, n)| n.is_alphanumeric() || *n == '_');
            if let Some(s) = start
                && ident
                && !next_is_ident
            {
                start = None;
                let name = &text[s..i + c.len_utf8()];
                let after = text[i + c.len_utf8()..].trim_start();
                if !after.starts_with('(')
                    || name.chars().next().is_some_and(|f| f.is_ascii_digit())
                    || KEYWORDS.contains(&name)
                {
                    continue;
                }
                let before = text[..s].trim_end();
                if DEFINERS
                    .iter()
                    .any(|d| before.ends_with(d.trim_end()) && !d.trim_end().is_empty())
                {
                    defined.push(name.to_owned());
                } else if line.kind == LineKind::Added && !called.iter().any(|n| n == name) {
                    called.push(name.to_owned());
                }
            }
        }
    }
    called.retain(|n| !defined.contains(n));
    called
}

/// What the index is searched for: the called names first (the text
/// search weighs its first words), then the added lines.
fn search_text(called: &[String], lines: &[DiffLine]) -> String {
    let mut text = called.join(" ");
    for line in lines.iter().filter(|l| l.kind == LineKind::Added) {
        if text.len() + line.text.len() + 1 > MAX_QUERY_CHARS {
            break;
        }
        text.push('\n');
        text.push_str(line.text.trim());
    }
    text
}

/// Whether `content` defines one of `names` (the whole name: defining
/// `tax_rate_override` is not defining `tax_rate`).
fn defines(content: &str, names: &[String]) -> bool {
    names.iter().any(|name| {
        DEFINERS.iter().any(|d| {
            let needle = format!("{d}{name}");
            content.match_indices(&needle).any(|(at, _)| {
                !content[at + needle.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
    })
}

/// The hits to show: not from the reviewed file, a definition of a called
/// name first, within the limits (the first chunk cut to fit, the rest
/// skipped when they would not).
fn pick(hits: Vec<Hit>, reviewed: &[&str], called: &[String], limits: RelatedLimits) -> Vec<Hit> {
    let mut others: Vec<Hit> = hits
        .into_iter()
        .filter(|h| !reviewed.contains(&h.path.as_str()))
        .collect();
    // Stable: the search's order holds within each group.
    others.sort_by_key(|h| !defines(&h.content, called));
    let mut out = Vec::new();
    let mut used = 0;
    for mut hit in others {
        if out.len() == limits.chunks {
            break;
        }
        let size = hit.content.len();
        if used + size > limits.chars {
            if out.is_empty() {
                hit.content = hit
                    .content
                    .chars()
                    .scan(0, |n, c| {
                        *n += c.len_utf8();
                        (*n <= limits.chars).then_some(c)
                    })
                    .collect();
            } else {
                continue;
            }
        }
        used += hit.content.len();
        out.push(hit);
    }
    out
}

/// The prompt's text for the chunks ("" for none).
pub fn prompt_text(hits: &[Hit]) -> String {
    hits.iter()
        .map(|h| {
            format!(
                "<code path=\"{}\" lines=\"{}-{}\">\n{}\n</code>",
                h.path,
                h.start_line,
                h.end_line,
                h.content.trim_end()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(kind: LineKind, text: &str) -> DiffLine {
        DiffLine {
            kind,
            old_line: None,
            new_line: Some(1),
            text: text.into(),
            hunk_start: false,
        }
    }

    fn hit(path: &str, content: &str) -> Hit {
        Hit {
            path: path.into(),
            start_line: 1,
            end_line: 3,
            content: content.into(),
            score: 0.0,
        }
    }

    #[test]
    fn called_names_are_the_added_lines_calls_not_their_definitions() {
        let lines = [
            line(LineKind::Context, "def total(order):"),
            line(LineKind::Added, "    rate = tax_rate(order.region)"),
            line(
                LineKind::Added,
                "    if len(order.items) > 0: log.info(rate)",
            ),
            line(LineKind::Deleted, "    rate = old_rate(order)"),
            line(LineKind::Added, "def helper(x): return tax_rate(x) + 2"),
        ];
        assert_eq!(called_names(&lines), ["tax_rate", "info"]);
        let text = search_text(&called_names(&lines), &lines);
        assert!(
            text.starts_with("tax_rate info\n    rate") || text.starts_with("tax_rate info\nrate")
        );
        assert!(!text.contains("old_rate"));
    }

    #[test]
    fn picks_skip_the_reviewed_file_put_definitions_first_and_fit_the_limits() {
        let called = vec!["tax_rate".to_owned()];
        let hits = vec![
            hit("app.py", "def tax_rate(r): ..."),
            hit("docs.md", "tax rates are documented"),
            hit("lib/tax.py", "def tax_rate(region):\n    return 0.2"),
            hit("lib/other.py", "x = 1"),
        ];
        let limits = RelatedLimits {
            chunks: 2,
            chars: 6_000,
        };
        assert!(!defines("def tax_rate_override(r):", &called));
        assert!(defines("x = 1\ndef tax_rate(r):", &called));
        let picked = pick(hits.clone(), &["app.py"], &called, limits);
        let paths: Vec<&str> = picked.iter().map(|h| h.path.as_str()).collect();
        assert_eq!(paths, ["lib/tax.py", "docs.md"]);

        let tight = RelatedLimits {
            chunks: 3,
            chars: 10,
        };
        let picked = pick(hits, &["app.py"], &called, tight);
        assert_eq!(picked.len(), 1, "{picked:?}");
        assert_eq!(picked[0].content, "def tax_ra");
        let text = prompt_text(&picked);
        assert_eq!(
            text,
            "<code path=\"lib/tax.py\" lines=\"1-3\">\ndef tax_ra\n</code>"
        );
        assert_eq!(prompt_text(&[]), "");
    }
}
