//! The NDJSON events streamed by `POST /v2/chat/agent`.
//!
//! Each line is `{"type": T, "data": {...}}` followed by `\n`. We write the
//! same separators as the reference gateway (`", "` and `": "`) so that a
//! byte-level comparison of recorded streams stays meaningful.

use serde::{Deserialize, Serialize};
use std::io;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub enum AgentEvent {
    /// New answer text that arrived after `Final Answer:`.
    FinalAnswerDelta {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<String>,
    },
    /// The tool the model wants the monolith to run. Sent once, at the end.
    Action {
        tool: String,
        tool_input: String,
        thought: String,
    },
    /// The model's output when it followed neither format.
    Unknown { text: String },
    /// A failure; the stream ends after it.
    Error { message: String, retryable: bool },
}

impl AgentEvent {
    pub fn delta(text: impl Into<String>) -> Self {
        Self::FinalAnswerDelta {
            text: text.into(),
            finish_reason: None,
        }
    }

    /// Serialises the event as one NDJSON line, newline included.
    pub fn to_ndjson_line(&self) -> String {
        let mut out = Vec::with_capacity(96);
        let mut ser = serde_json::Serializer::with_formatter(&mut out, SpacedFormatter);
        // Serialising plain strings and booleans into a Vec cannot fail.
        if self.serialize(&mut ser).is_err() {
            return String::from(
                "{\"type\": \"error\", \"data\": {\"message\": \"serialisation failed\", \"retryable\": false}}\n",
            );
        }
        out.push(b'\n');
        String::from_utf8(out).unwrap_or_default()
    }
}

/// A tolerant reading of one NDJSON line: `None` for blank lines, an
/// `Err` for lines that are not an event we know (callers log and skip them).
pub fn parse_event_line(line: &str) -> Option<Result<AgentEvent, serde_json::Error>> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    Some(serde_json::from_str(line))
}

/// serde_json's compact output with a space after `,` and `:`.
struct SpacedFormatter;

impl serde_json::ser::Formatter for SpacedFormatter {
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_match_the_reference_layout() {
        let action = AgentEvent::Action {
            tool: "issue_reader".into(),
            tool_input: "#1".into(),
            thought: "look".into(),
        };
        assert_eq!(
            action.to_ndjson_line(),
            "{\"type\": \"action\", \"data\": {\"tool\": \"issue_reader\", \"tool_input\": \"#1\", \"thought\": \"look\"}}\n"
        );
        assert_eq!(
            AgentEvent::delta("Hi").to_ndjson_line(),
            "{\"type\": \"final_answer_delta\", \"data\": {\"text\": \"Hi\"}}\n"
        );
        assert_eq!(
            AgentEvent::Error {
                message: "overloaded_error".into(),
                retryable: true
            }
            .to_ndjson_line(),
            "{\"type\": \"error\", \"data\": {\"message\": \"overloaded_error\", \"retryable\": true}}\n"
        );
    }

    #[test]
    fn parsing_is_tolerant() {
        assert!(parse_event_line("  ").is_none());
        assert!(
            parse_event_line("{\"type\":\"brand_new\",\"data\":{}}")
                .unwrap()
                .is_err()
        );
        let ev = parse_event_line("{\"type\":\"unknown\",\"data\":{\"text\":\"x\",\"extra\":1}}")
            .unwrap()
            .unwrap();
        assert_eq!(ev, AgentEvent::Unknown { text: "x".into() });
        let ev = parse_event_line("{\"type\":\"final_answer_delta\",\"data\":{\"text\":\"a\",\"finish_reason\":\"stop\"}}")
            .unwrap()
            .unwrap();
        assert!(matches!(ev, AgentEvent::FinalAnswerDelta { .. }));
    }
}
