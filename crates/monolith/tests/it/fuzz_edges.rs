//! Property-based fuzzing of the monolith's parsers at its edges: the agent
//! stream decoder, GraphQL cost measurement, REST path ids and the NUL guard.
//!
//! Each property runs `DUO_FUZZ_CASES` cases (default 256, a few seconds in
//! all); `docs/fuzzing.md` gives the command for a long run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use contracts::AgentEvent;
use monolith::gateway_client::{MAX_EVENT_LINE_BYTES, NdjsonDecoder};
use monolith::graphql::limits;
use monolith::percent::decode as percent_decode;
use monolith::rest::input_guard::{encoded_has_nul, json_text_has_nul};
use monolith::rest::path_ids::path_segment;
use proptest::prelude::*;
use proptest::test_runner::Config;

fn config() -> Config {
    let cases = std::env::var("DUO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Any text, with more than its share of the characters parsers care about.
fn tricky_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            3 => any::<char>(),
            1 => prop::sample::select(vec!['\0', '\\', '"', '\n', '{', '}', '%', '/', 'é', '🚀']),
        ],
        0..40,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn agent_event() -> impl Strategy<Value = AgentEvent> {
    prop_oneof![
        tricky_text().prop_map(AgentEvent::delta),
        (tricky_text(), tricky_text(), tricky_text()).prop_map(|(tool, tool_input, thought)| {
            AgentEvent::Action {
                tool,
                tool_input,
                thought,
            }
        }),
        tricky_text().prop_map(|text| AgentEvent::Unknown { text }),
        (tricky_text(), any::<bool>())
            .prop_map(|(message, retryable)| AgentEvent::Error { message, retryable }),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        tricky_text().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(tricky_text(), inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn has_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(has_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

proptest! {
    #![proptest_config(config())]

    /// Events survive any split of the stream into reads, with noise lines
    /// between them skipped.
    #[test]
    fn fuzz_ndjson_decoder_splits(
        events in proptest::collection::vec(agent_event(), 0..8),
        noise in proptest::collection::vec(tricky_text(), 0..4),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut stream = Vec::new();
        for (i, event) in events.iter().enumerate() {
            stream.extend_from_slice(event.to_ndjson_line().as_bytes());
            if let Some(n) = noise.get(i) {
                // Noise never looks like an event line: it has no `{"type"`.
                let line = n.replace('\n', " ");
                if !line.contains("\"type\"") {
                    stream.extend_from_slice(line.as_bytes());
                    stream.push(b'\n');
                }
            }
        }
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        points.sort_unstable();
        let mut decoder = NdjsonDecoder::default();
        let mut decoded = Vec::new();
        let mut start = 0;
        for p in points.into_iter().chain([stream.len()]) {
            decoded.extend(decoder.push(&stream[start..p]));
            start = p;
        }
        decoded.extend(decoder.finish());
        prop_assert_eq!(decoded, events);
    }

    /// Arbitrary bytes never panic the decoder.
    #[test]
    fn fuzz_ndjson_decoder_bytes(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
        let mut decoder = NdjsonDecoder::default();
        for chunk in &chunks {
            let _ = decoder.push(chunk);
        }
        let _ = decoder.finish();
    }

    /// GraphQL measurement never panics on any text and always finishes.
    #[test]
    fn fuzz_graphql_measure_any_text(query in tricky_text()) {
        let _ = limits::measure(&query, None);
    }

    /// Token soups that look like GraphQL (braces, spreads, fragments, strings)
    /// never panic the measurement, and parse or fail in bounded time.
    #[test]
    fn fuzz_graphql_measure_token_soup(tokens in proptest::collection::vec(prop::sample::select(vec![
        "query", "subscription", "{", "}", "(", ")", "...F0", "...F1", "...on __Type",
        "fragment F0 on __Type", "fragment F1 on __Type", "__schema", "types", "fields",
        "name", "currentUser", "id", "\"x{\"", "#c\n", "$v", ":", "1", "@include(if: true)",
    ]), 0..80)) {
        let doc = tokens.join(" ");
        let started = std::time::Instant::now();
        let _ = limits::measure(&doc, None);
        prop_assert!(started.elapsed() < std::time::Duration::from_millis(200));
    }

    /// A chain of fragments, each spreading the next `fanout` times, is counted
    /// exactly as its expansion, however large.
    #[test]
    fn fuzz_graphql_fragment_chains(levels in 1usize..12, fanout in 1usize..9) {
        let mut doc = String::from("query { __schema { types { ...F0 } } }");
        for level in 0..levels {
            let spreads = format!("...F{} ", level + 1).repeat(fanout);
            doc.push_str(&format!(" fragment F{level} on __Type {{ {spreads}}}"));
        }
        doc.push_str(&format!(" fragment F{levels} on __Type {{ name }}"));
        let cost = limits::measure(&doc, None).unwrap();
        let expanded = (fanout as u128).pow(levels as u32);
        let expected = usize::try_from(expanded + 2).unwrap_or(usize::MAX);
        prop_assert_eq!(cost.complexity, expected);
        prop_assert_eq!(cost.depth, 3);
    }

    /// Path ids: never a panic; an encoded path decodes back to itself.
    #[test]
    fn fuzz_rest_path_ids(path in tricky_text(), id in "[a-zA-Z0-9_./-]{1,40}") {
        let _ = path_segment(&path);
        let _ = percent_decode(&path);
        prop_assert_eq!(percent_decode(&percent_encode(&id)), Some(id.clone()));
        // Fully encoded, the segment is a path (never a numeric id) and found whole.
        let url = format!("/api/v4/projects/{}/issues", percent_encode(&id));
        let (_, range) = path_segment(&url).unwrap();
        prop_assert_eq!(&url[range], percent_encode(&id));
        // Plain digits are an id, left alone.
        let digits: String = id.chars().filter(char::is_ascii_digit).collect();
        if !digits.is_empty() {
            let numeric = format!("/api/v4/projects/{digits}/issues");
            prop_assert!(path_segment(&numeric).is_none());
        }
    }

    /// The NUL guard finds a NUL in any JSON body exactly when one is there,
    /// and in any percent-encoded text exactly when it decodes to one.
    #[test]
    fn fuzz_nul_guard(value in json_value(), text in tricky_text()) {
        let body = serde_json::to_vec(&value).unwrap();
        prop_assert_eq!(json_text_has_nul(&body), has_nul(&value));
        prop_assert_eq!(encoded_has_nul(&percent_encode(&text)), text.contains('\0'));
    }
}

#[test]
fn an_endless_line_is_dropped_and_the_stream_goes_on() {
    let mut decoder = NdjsonDecoder::default();
    let chunk = vec![b'x'; 1024 * 1024];
    for _ in 0..(MAX_EVENT_LINE_BYTES / chunk.len() + 2) {
        assert!(decoder.push(&chunk).is_empty());
    }
    // The rest of the long line, then a real event.
    let mut tail = b"still the long line\n".to_vec();
    tail.extend_from_slice(AgentEvent::delta("after").to_ndjson_line().as_bytes());
    assert_eq!(decoder.push(&tail), vec![AgentEvent::delta("after")]);
}
