//! Duo error codes: a layer letter (M = monolith, G = gateway, A = agent or
//! model) followed by a number whose thousands digit is the series. Users see
//! the code in the answer together with a link to its documentation.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Layer {
    /// The monolith (permissions, resources, tools).
    M,
    /// The AI gateway.
    G,
    /// The agent loop or the model provider.
    A,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DuoErrorCode {
    pub layer: Layer,
    pub number: u16,
}

/// The answer shown when a failure has no more specific message.
pub const DEFAULT_ERROR_MESSAGE: &str =
    "I'm sorry, I couldn't produce an answer this time. Please try again.";

/// The documentation page that explains every code; each code has an anchor.
pub const ERROR_CODES_DOC_PATH: &str = "docs/error-codes.md";

macro_rules! codes {
    ($($name:ident = $layer:ident $num:literal : $series:literal, $msg:literal;)*) => {
        impl DuoErrorCode {
            $(pub const $name: DuoErrorCode = DuoErrorCode { layer: Layer::$layer, number: $num };)*

            pub const ALL: &'static [DuoErrorCode] = &[$(DuoErrorCode::$name,)*];

            /// What the user reads in the chat answer.
            pub fn user_message(self) -> &'static str {
                match (self.layer, self.number) {
                    $((Layer::$layer, $num) => $msg,)*
                    _ => DEFAULT_ERROR_MESSAGE,
                }
            }

            /// The series this code belongs to, in words.
            pub fn series(self) -> &'static str {
                match (self.layer, self.number) {
                    $((Layer::$layer, $num) => $series,)*
                    _ => "unknown",
                }
            }
        }
    };
}

codes! {
    M2000 = M 2000 : "missing content", "I couldn't find any documentation that answers this question.";
    M3002 = M 3002 : "permissions", "I can't access this item because its owner has turned off GitLab Duo features for it.";
    M3003 = M 3003 : "permissions", "I can't answer that: the items you asked about don't exist, you don't have access to them, or your session has expired.";
    M3004 = M 3004 : "permissions", "You don't have access to GitLab Duo Chat. Ask an administrator for a GitLab Duo seat.";
    M3005 = M 3005 : "permissions", "This question needs a tool that your GitLab Duo subscription doesn't include. Upgrading to Duo Enterprise gives access to it.";
    M3006 = M 3006 : "permissions", "The AI gateway refused the request: your GitLab Duo subscription doesn't include Duo Chat.";
    M4000 = M 4000 : "execution", "I'm sorry, I couldn't run that command. Please try again.";
    M4001 = M 4001 : "execution", "I'm sorry, I couldn't work out which item you meant. Please try again.";
    M4002 = M 4002 : "execution", "I'm sorry, I couldn't read that CI job. Please try again.";
    M4003 = M 4003 : "execution", "This command only works on a vulnerability found by static analysis (SAST).";
    M4004 = M 4004 : "execution", "This item has no comments to summarize.";
    M4005 = M 4005 : "execution", "This command only works on a failed CI job that has a log.";
    M5000 = M 5000 : "serialization", "I'm sorry, I couldn't prepare that item for the model. Please try again.";
    G3001 = G 3001 : "permissions", "Answering this needs a tool that your GitLab Duo subscription doesn't include.";
    G3002 = G 3002 : "permissions", "No default GitLab Duo namespace is selected. Choose one in your preferences and try again.";
    A1000 = A 1000 : "network", "I'm sorry, I couldn't respond in time. Please try again.";
    A1001 = A 1001 : "network", "I'm sorry, I couldn't reach the AI service. Please try again; if it keeps failing, an administrator should check that the AI gateway runs and that AI_GATEWAY_URL points at it.";
    A1002 = A 1002 : "network", "I'm sorry, the AI service sent no answer in time. Please try again.";
    A1003 = A 1003 : "network", "I'm sorry, the answer stopped before it was complete. Please try again.";
    A1004 = A 1004 : "network", "I'm sorry, the AI service reported an error. Please try again; if it keeps failing, an administrator should look for the model's error in the AI gateway's log (which model failed, and why).";
    A1005 = A 1005 : "network", "This conversation and its context are too long for the model's context window. Run /clear or /reset and ask again with less context; an administrator can give the bundled model a larger context (DUO_LOCAL_LLM_CONTEXT) or choose a model with a larger one.";
    A1006 = A 1006 : "network", "I reached the limit of steps I may take for one question. Try a more specific question, or run /clear.";
    A6000 = A 6000 : "other", "I'm sorry, I couldn't respond in time. Try a more specific question, or run /clear.";
    A9999 = A 9999 : "other", "I'm sorry, something unexpected went wrong. Please try again.";
}

impl DuoErrorCode {
    /// `M3003`, `A1000`, ...
    pub fn code(self) -> String {
        self.to_string()
    }

    /// The anchor of this code in the error documentation: `error-m3003`.
    pub fn anchor(self) -> String {
        format!("error-{}", self.to_string().to_lowercase())
    }

    /// The documentation link for this code below a documentation base URL.
    pub fn doc_url(self, docs_base_url: &str) -> String {
        format!(
            "{}/{}#{}",
            docs_base_url.trim_end_matches('/'),
            ERROR_CODES_DOC_PATH,
            self.anchor()
        )
    }

    /// The text stored in an assistant message's `errors`:
    /// `<message> Error code: [M3003](<link>)`.
    pub fn error_text(self, docs_base_url: &str) -> String {
        format!(
            "{} Error code: [{}]({})",
            self.user_message(),
            self,
            self.doc_url(docs_base_url)
        )
    }

    pub fn parse(code: &str) -> Option<Self> {
        let mut chars = code.chars();
        let layer = match chars.next()?.to_ascii_uppercase() {
            'M' => Layer::M,
            'G' => Layer::G,
            'A' => Layer::A,
            _ => return None,
        };
        let number: u16 = chars.as_str().parse().ok()?;
        Self::ALL
            .iter()
            .copied()
            .find(|c| c.layer == layer && c.number == number)
    }
}

impl fmt::Display for DuoErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let letter = match self.layer {
            Layer::M => 'M',
            Layer::G => 'G',
            Layer::A => 'A',
        };
        write!(f, "{letter}{}", self.number)
    }
}

impl Serialize for DuoErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DuoErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown Duo error code {s}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_format_and_parse() {
        assert_eq!(DuoErrorCode::M3003.to_string(), "M3003");
        assert_eq!(DuoErrorCode::parse("a1006"), Some(DuoErrorCode::A1006));
        assert_eq!(DuoErrorCode::parse("Z1"), None);
        assert_eq!(DuoErrorCode::parse("M9"), None);
        for c in DuoErrorCode::ALL {
            assert_eq!(DuoErrorCode::parse(&c.code()), Some(*c));
            assert_ne!(c.user_message(), DEFAULT_ERROR_MESSAGE);
        }
    }

    #[test]
    fn error_text_links_to_the_anchor() {
        let text = DuoErrorCode::A1000.error_text("http://localhost:3000/");
        assert!(text.ends_with(
            "Error code: [A1000](http://localhost:3000/docs/error-codes.md#error-a1000)"
        ));
        assert!(text.starts_with("I'm sorry, I couldn't respond in time."));
    }

    #[test]
    fn codes_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for c in DuoErrorCode::ALL {
            assert!(seen.insert(c.code()), "duplicate {c}");
        }
    }
}

#[cfg(test)]
mod doc_tests {
    use super::*;

    /// Every code links to an anchor of docs/error-codes.md; keep the page in step.
    #[test]
    fn every_code_is_documented() {
        let doc = include_str!("../../../docs/error-codes.md");
        for c in DuoErrorCode::ALL {
            assert!(
                doc.contains(&format!("## Error {c}\n")),
                "docs/error-codes.md has no section for {c}"
            );
        }
    }
}
