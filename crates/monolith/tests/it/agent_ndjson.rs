//! The agent stream decoder: events split across reads at every byte, several
//! events in one read, unknown event types and garbage skipped.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use contracts::AgentEvent;
use monolith::gateway_client::NdjsonDecoder;

fn stream() -> (String, Vec<AgentEvent>) {
    let events = vec![
        AgentEvent::delta("Grüße "),
        AgentEvent::delta("aus 東京 🚀"),
        AgentEvent::Action {
            tool: "issue_reader".into(),
            tool_input: "#1".into(),
            thought: "read it".into(),
        },
        AgentEvent::Unknown { text: "odd".into() },
        AgentEvent::Error {
            message: "overloaded_error".into(),
            retryable: true,
        },
    ];
    let mut text = String::new();
    for (i, event) in events.iter().enumerate() {
        text.push_str(&event.to_ndjson_line());
        if i == 1 {
            // Noise the decoder must skip.
            text.push_str("{\"type\": \"thinking_delta\", \"data\": {\"text\": \"hm\"}}\n");
            text.push('\n');
            text.push_str("not json at all\n");
        }
    }
    (text, events)
}

fn decode_in_pieces(bytes: &[u8], sizes: &[usize]) -> Vec<AgentEvent> {
    let mut decoder = NdjsonDecoder::default();
    let mut out = Vec::new();
    let mut rest = bytes;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].min(rest.len()).max(1);
        out.extend(decoder.push(&rest[..n]));
        rest = &rest[n..];
        i += 1;
    }
    out.extend(decoder.finish());
    out
}

#[test]
fn every_split_position_decodes_the_same_events() {
    let (text, expected) = stream();
    let bytes = text.as_bytes();
    for cut in 0..=bytes.len() {
        let mut decoder = NdjsonDecoder::default();
        let mut got = decoder.push(&bytes[..cut]);
        got.extend(decoder.push(&bytes[cut..]));
        got.extend(decoder.finish());
        assert_eq!(got, expected, "split at byte {cut}");
    }
}

#[test]
fn reads_of_many_sizes_decode_the_same_events() {
    let (text, expected) = stream();
    let table: &[&[usize]] = &[&[1], &[2], &[3, 7], &[13], &[64], &[1, 100], &[10_000]];
    for sizes in table {
        assert_eq!(
            decode_in_pieces(text.as_bytes(), sizes),
            expected,
            "read sizes {sizes:?}"
        );
    }
}

#[test]
fn a_last_line_without_newline_is_still_read() {
    let line = AgentEvent::delta("end").to_ndjson_line();
    let mut decoder = NdjsonDecoder::default();
    assert!(decoder.push(line.trim_end().as_bytes()).is_empty());
    assert_eq!(decoder.finish(), vec![AgentEvent::delta("end")]);
}
