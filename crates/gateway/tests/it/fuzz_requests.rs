//! Property-based fuzzing of the gateway's request schemas and the ReAct
//! parser (the SSE parser's targets live beside it, in `providers/sse.rs`).
//! `DUO_FUZZ_CASES` sets the case count (default 256); see docs/fuzzing.md.

use contracts::{AgentRequest, PromptRequest, limits};
use gateway::chat::react_parser::{ReactOutcome, ReactParser, parse};
use proptest::prelude::*;
use serde_json::{Value, json};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("DUO_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            4 => any::<char>(),
            1 => prop::sample::select(vec!['\n', ' ', ':', '"', '\\', 'é']),
        ],
        0..24,
    )
    .prop_map(|c| c.into_iter().collect())
}

/// JSON shaped like an agent request, with noise: sometimes valid, sometimes not.
fn agent_body() -> impl Strategy<Value = Value> {
    let role = prop::sample::select(vec!["user", "assistant", "system", "robot"]);
    let category = prop::sample::select(vec!["file", "issue", "directory", "nope"]);
    let context = (
        category,
        proptest::option::of(text()),
        proptest::option::of(text()),
    )
        .prop_map(
            |(category, id, content)| json!({ "category": category, "id": id, "content": content }),
        );
    let message = (
        role,
        text(),
        proptest::option::of(proptest::collection::vec(context, 0..4)),
    )
        .prop_map(|(role, content, additional_context)| {
            json!({ "role": role, "content": content, "additional_context": additional_context })
        });
    let step = (text(), text(), text(), text()).prop_map(|(thought, tool, tool_input, observation)| {
        json!({ "thought": thought, "tool": tool, "tool_input": tool_input, "observation": observation })
    });
    (
        proptest::collection::vec(message, 0..6),
        proptest::option::of(proptest::collection::vec(step, 0..4)),
        proptest::option::of(proptest::collection::vec(text(), 0..3)),
    )
        .prop_map(|(messages, steps, unavailable)| {
            let mut body = json!({ "messages": messages });
            if let Some(steps) = steps {
                body["options"] =
                    json!({ "agent_scratchpad": { "agent_type": "react", "steps": steps } });
            }
            if let Some(u) = unavailable {
                body["unavailable_resources"] = json!(u);
            }
            body
        })
}

proptest! {
    #![proptest_config(config())]

    /// Any bytes: a parse error or a request, never a panic.
    #[test]
    fn fuzz_agent_request_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = serde_json::from_slice::<AgentRequest>(&bytes);
        let _ = serde_json::from_slice::<PromptRequest>(&bytes);
    }

    /// Request-shaped JSON: what parses round-trips unchanged, and its text
    /// size is what the limits allow.
    #[test]
    fn fuzz_agent_request_round_trip(body in agent_body()) {
        if let Ok(request) = serde_json::from_value::<AgentRequest>(body) {
            prop_assert!(request.messages.len() <= limits::MAX_MESSAGES);
            let again: AgentRequest = serde_json::from_str(&serde_json::to_string(&request).unwrap()).unwrap();
            prop_assert_eq!(&again, &request);
            prop_assert_eq!(again.text_bytes(), request.text_bytes());
        }
    }

    /// Prompt bodies: inputs of any JSON shape round-trip; too many are refused.
    #[test]
    fn fuzz_prompt_request(keys in proptest::collection::vec("[a-z]{1,6}", 0..80), stream in any::<bool>()) {
        let inputs: serde_json::Map<String, Value> = keys.iter().map(|k| (k.clone(), json!(k))).collect();
        let body = json!({ "inputs": inputs, "stream": stream });
        match serde_json::from_value::<PromptRequest>(body) {
            Ok(request) => {
                prop_assert!(inputs.len() <= limits::MAX_PROMPT_INPUTS);
                prop_assert_eq!(request.inputs, inputs);
                prop_assert_eq!(request.stream, stream);
            }
            Err(e) => {
                prop_assert!(inputs.len() > limits::MAX_PROMPT_INPUTS, "{}", e);
            }
        }
    }

    /// The streamed answer is exactly the final answer, however the model's
    /// output is cut into chunks; without a final answer nothing streams.
    #[test]
    fn fuzz_react_parser_chunks(
        thought in text(),
        answer in text(),
        final_answer in any::<bool>(),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let output = if final_answer {
            format!("{thought}\nAction: DirectAnswer\nFinal Answer: {answer}")
        } else {
            format!("{thought}\nAction: issue_reader\nAction Input: {answer}")
        };
        let chars: Vec<char> = output.chars().collect();
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(chars.len() + 1)).collect();
        points.sort_unstable();
        let mut parser = ReactParser::new();
        let mut streamed = String::new();
        let mut start = 0;
        for p in points.into_iter().chain([chars.len()]) {
            let chunk: String = chars[start..p].iter().collect();
            if let Some(delta) = parser.push(&chunk) {
                streamed.push_str(&delta);
            }
            start = p;
        }
        let outcome = parser.finish();
        prop_assert_eq!(&outcome, &parse(&output));
        match outcome {
            ReactOutcome::FinalAnswer(text) => prop_assert_eq!(streamed, text),
            _ => prop_assert!(streamed.is_empty() || output.contains("Final Answer:")),
        }
    }
}
