//! Scrubbing secrets from text before it is written anywhere.
//!
//! Applied to every log line of every process (through [`RedactingWriter`])
//! and to the LLM debug log, so a token that slips into a message, an error
//! or a debug dump of a request is still never written. Patterns cover the
//! credentials this system handles: GitLab-style tokens (`glpat-` and
//! friends), provider API keys (`sk-…`), JWTs (the gateway's and workflow
//! tokens), `Bearer` credentials, cookies and `key: value` pairs whose key
//! names a secret.

use regex::Regex;
use std::borrow::Cow;
use std::io::{self, Write};
use std::sync::OnceLock;
use tracing_subscriber::fmt::MakeWriter;

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

struct Rule {
    pattern: Regex,
    /// Replacement; `$1` keeps the prefix (a key name, `Bearer `).
    with: &'static str,
}

fn rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        let spec: [(&str, &'static str); 6] = [
            // `Authorization: Bearer <credential>` and the like.
            (r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{6,}", "${1}[REDACTED]"),
            // GitLab's token families (personal, OAuth, runner, deploy, …).
            (
                r"\b(?:glpat|gloas|glrt|glcbt|gldt|glptt|glft|glimt|glagent|glsoat|glffct|glwt|gldw)-[A-Za-z0-9_.-]{6,}",
                "[REDACTED]",
            ),
            // Provider API keys: Anthropic `sk-ant-…`, OpenAI `sk-…`/`sk-proj-…`.
            (r"\bsk-[A-Za-z0-9_-]{8,}", "[REDACTED]"),
            // JSON Web Tokens (three base64url parts, the first a JSON header).
            (
                r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
                "[REDACTED]",
            ),
            // Session cookies, wherever they appear (`Cookie:` headers, URLs).
            (r"(?i)(\b_(?:duo|gitlab)_session=)[^;\s&]+", "${1}[REDACTED]"),
            // `name: value`, `name=value` and JSON `"name": "value"` pairs
            // whose name says the value is secret.
            (
                r#"(?i)(\b(?:x-api-key|x-goog-api-key|api[_-]?key|private[_-]token|job[_-]token|password|passwd|secret|client_secret|access_token|refresh_token|id_token|token|cookie|set-cookie|authorization|x-gitlab-oauth-token|x-gitlab-instance-token)["']?\s*[:=]\s*["']?)(?:bearer\s+|basic\s+)?[^"'\s,;&}\]]+"#,
                "${1}[REDACTED]",
            ),
        ];
        spec.into_iter()
            .filter_map(|(pattern, with)| {
                Regex::new(pattern)
                    .ok()
                    .map(|pattern| Rule { pattern, with })
            })
            .collect()
    })
}

/// `text` with every secret it contains replaced by [`REDACTED`]; borrowed
/// unchanged when there was none.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    for rule in rules() {
        if rule.pattern.is_match(&out) {
            out = Cow::Owned(rule.pattern.replace_all(&out, rule.with).into_owned());
        }
    }
    out
}

/// A `MakeWriter` whose writers redact what passes through them. The
/// formatting layer hands each event to the writer in one piece, so a secret
/// is never split across two writes.
#[derive(Debug, Clone, Copy)]
pub struct RedactingWriter<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for RedactingWriter<M> {
    type Writer = Redacting<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Redacting(self.0.make_writer())
    }
}

/// A writer that redacts each write before passing it on.
#[derive(Debug)]
pub struct Redacting<W>(W);

impl<W: Write> Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(redact(text).as_bytes())?,
            Err(_) => self
                .0
                .write_all(redact(&String::from_utf8_lossy(buf)).as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_secret_is_replaced() {
        let cases = [
            ("Authorization: Bearer abcdefghijkl123", "abcdefghijkl123"),
            (
                "PRIVATE-TOKEN: glpat-0123456789abcdef",
                "glpat-0123456789abcdef",
            ),
            (
                "key sk-ant-api03-AAAABBBBCCCC used",
                "sk-ant-api03-AAAABBBBCCCC",
            ),
            (
                "jwt eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl end",
                "eyJhbGciOiJSUzI1NiJ9",
            ),
            ("Cookie: _duo_session=s3cr3tv4lue; other=1", "s3cr3tv4lue"),
            (r#"{"api_key": "hunter2hunter2"}"#, "hunter2hunter2"),
            ("x-api-key=abc123xyz", "abc123xyz"),
            ("password: correct-horse", "correct-horse"),
            ("url ?private_token=tok987&x=1", "tok987"),
        ];
        for (text, secret) in cases {
            let out = redact(text);
            assert!(!out.contains(secret), "{text:?} kept its secret: {out:?}");
            assert!(out.contains(REDACTED), "{text:?} → {out:?}");
        }
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        for text in [
            "max_tokens=512 tokens_in=40 input_tokens: 12",
            "GET /api/v4/projects/1/issues 200",
            "token_kind=personal_access_token",
        ] {
            assert!(matches!(redact(text), Cow::Borrowed(_)), "{text:?} changed");
        }
    }

    #[test]
    fn the_writer_redacts_and_reports_the_length_it_was_given() {
        let mut out = Vec::new();
        let mut writer = Redacting(&mut out);
        let line = b"token=glpat-aaaaaaaaaaaa\n";
        assert_eq!(writer.write(line).ok(), Some(line.len()));
        let written = String::from_utf8_lossy(&out);
        assert!(!written.contains("glpat-aaaa"), "{written}");
    }
}
