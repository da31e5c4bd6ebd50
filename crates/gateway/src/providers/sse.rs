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

/// Longest line kept, and most data one event may gather: a provider that
/// never ends a line (or an event) cannot make the gateway hold more.
const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

impl SseParser {
    /// Feeds bytes, returning the events they complete.
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(end) = memchr::memchr(b'\n', bytes) {
            let (head, rest) = bytes.split_at(end);
            bytes = &rest[1..];
            let joined;
            let mut line = if self.partial.is_empty() {
                &head[..head.len().min(MAX_LINE_BYTES)]
            } else {
                self.keep_partial(head);
                joined = std::mem::take(&mut self.partial);
                &joined[..]
            };
            if let Some(stripped) = line.strip_suffix(b"\r") {
                line = stripped;
            }
            // Valid UTF-8 (every well-behaved provider) is checked by the
            // fast validator; only a broken line pays for the lossy one.
            let text = match std::str::from_utf8(line) {
                Ok(text) => std::borrow::Cow::Borrowed(text),
                Err(_) => String::from_utf8_lossy(line),
            };
            if let Some(event) = self.line(&text) {
                events.push(event);
            }
        }
        self.keep_partial(bytes);
        events
    }

    /// Holds the start of a line until its end arrives, up to the limit.
    fn keep_partial(&mut self, bytes: &[u8]) {
        let room = MAX_LINE_BYTES.saturating_sub(self.partial.len());
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            if self.data.is_empty() && self.event.is_none() {
                return None;
            }
            let mut lines = std::mem::take(&mut self.data);
            // Nearly every event has one data line: it is the data as it is.
            let data = match lines.len() {
                1 => lines.pop().unwrap_or_default(),
                _ => lines.join("\n"),
            };
            return Some(SseEvent {
                event: self.event.take(),
                data,
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => {
                let held: usize = self.data.iter().map(String::len).sum();
                if held + value.len() <= MAX_LINE_BYTES {
                    self.data.push(value.to_owned());
                }
            }
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
    fn a_line_that_is_not_utf8_is_read_with_replacement_characters() {
        let events = SseParser::default().push(b"data: caf\xc3\xa9 \xff!\n\n");
        assert_eq!(
            events,
            vec![SseEvent {
                event: None,
                data: "café \u{fffd}!".into(),
            }]
        );
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

#[cfg(test)]
mod fuzz_tests {
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("DUO_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256)
    }

    fn event() -> impl Strategy<Value = SseEvent> {
        (
            proptest::option::of("[a-z_]{1,12}"),
            proptest::collection::vec("[^\\r\\n]{0,30}", 1..4),
        )
            .prop_map(|(event, lines)| SseEvent {
                event,
                data: lines.join("\n"),
            })
    }

    fn encode(events: &[SseEvent], crlf: bool) -> Vec<u8> {
        let nl = if crlf { "\r\n" } else { "\n" };
        let mut out = String::new();
        for e in events {
            out.push_str(&format!(": keep-alive{nl}"));
            if let Some(name) = &e.event {
                out.push_str(&format!("event: {name}{nl}"));
            }
            for line in e.data.split('\n') {
                out.push_str(&format!("data: {line}{nl}"));
            }
            out.push_str(nl);
        }
        out.into_bytes()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

        /// Events come out the same however the stream is cut into reads.
        #[test]
        fn fuzz_sse_parser_splits(
            events in proptest::collection::vec(event(), 0..6),
            crlf in any::<bool>(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
        ) {
            let bytes = encode(&events, crlf);
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut parser = SseParser::default();
            let mut seen = Vec::new();
            let mut start = 0;
            for p in points.into_iter().chain([bytes.len()]) {
                seen.extend(parser.push(&bytes[start..p]));
                start = p;
            }
            prop_assert_eq!(seen, events);
        }

        /// Arbitrary bytes never panic the parser.
        #[test]
        fn fuzz_sse_parser_bytes(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..8)) {
            let mut parser = SseParser::default();
            for chunk in &chunks {
                let _ = parser.push(chunk);
            }
        }
    }
}
