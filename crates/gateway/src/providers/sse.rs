//! A server-sent events parser that accepts input split at any byte.

/// One event: its `event:` name (if any) and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes of an incomplete line; only whole lines are decoded, so a UTF-8
    /// sequence split between reads is never decoded in halves.
    partial: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds bytes, returning the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in bytes {
            if byte != b'\n' {
                self.partial.push(byte);
                continue;
            }
            let mut line = std::mem::take(&mut self.partial);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if let Some(event) = self.line(&String::from_utf8_lossy(&line)) {
                events.push(event);
            }
        }
        events
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            if self.data.is_empty() && self.event.is_none() {
                return None;
            }
            return Some(SseEvent {
                event: self.event.take(),
                data: std::mem::take(&mut self.data).join("\n"),
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => self.data.push(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUT: &str =
        "event: a\ndata: {\"t\":\"héllo\"}\n\n: comment\r\ndata: x\r\ndata: y\r\n\r\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: Some("a".into()),
                data: "{\"t\":\"héllo\"}".into(),
            },
            SseEvent {
                event: None,
                data: "x\ny".into(),
            },
        ]
    }

    #[test]
    fn parses_whole_input() {
        assert_eq!(SseParser::default().push(INPUT.as_bytes()), expected());
    }

    #[test]
    fn parses_input_split_at_every_byte() {
        for split in 1..INPUT.len() {
            let mut parser = SseParser::default();
            let mut events = Vec::new();
            for piece in INPUT.as_bytes().chunks(split) {
                events.extend(parser.push(piece));
            }
            assert_eq!(events, expected(), "split every {split} bytes");
        }
    }
}
