//! `POST /v2/chat/agent` with a prompt family that asks for native tool
//! calling: the tools go to the provider as functions, earlier steps as calls
//! and results, and the events are the ones the ReAct path emits.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::stream_support;

use fake_provider::{FakeProvider, ToolCall};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use stream_support::{Wire, agent, line, question};

const NATIVE: &[(&str, &str)] = &[("AIGW_DEFAULT_PROMPTS", r#"{"chat/react": "native"}"#)];
const NATIVE_ANTHROPIC: &[(&str, &str)] = &[(
    "AIGW_DEFAULT_PROMPTS",
    r#"{"chat/react": "native_anthropic"}"#,
)];

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: "call_1".into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// The last model request the fake received.
fn last_request(fake: &FakeProvider) -> Value {
    fake.requests()
        .last()
        .expect("a model request")
        .body
        .clone()
}

#[actix_web::test]
async fn a_native_tool_call_becomes_an_action_event() {
    for (wire, env) in [(Wire::OpenAi, NATIVE), (Wire::Anthropic, NATIVE_ANTHROPIC)] {
        let fake = FakeProvider::start().await.unwrap();
        let gw = wire.gateway(&fake, env);
        fake.push_tool_calls(
            "",
            vec![call("issue_reader", r#"{"input": "Summarize issue #1"}"#)],
        );
        let lines = agent(
            &gw,
            "duo_chat,ask_issue,documentation_search",
            &question("Summarize issue #1"),
        )
        .await
        .rest()
        .await;
        assert_eq!(
            lines,
            vec![line(
                "action",
                json!({
                    "tool": "issue_reader",
                    "tool_input": "Summarize issue #1",
                    "thought": "I should use issue_reader to answer this.",
                })
            )],
            "{wire:?}"
        );
        // The tools went out as functions, only those the caller may use,
        // and the prompt carries no ReAct format.
        let body = last_request(&fake);
        let names: Vec<String> = match wire {
            Wire::OpenAi => body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect(),
            Wire::Anthropic => body["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect(),
        };
        assert!(names.contains(&"issue_reader".to_owned()), "{names:?}");
        assert!(
            names.contains(&"gitlab_documentation".to_owned()),
            "{names:?}"
        );
        assert!(!names.contains(&"epic_reader".to_owned()), "{names:?}");
        assert!(!body.to_string().contains("Action Input"), "{body}");
    }
}

#[actix_web::test]
async fn a_text_answer_is_a_final_answer_and_earlier_steps_are_calls_with_results() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::OpenAi.gateway(&fake, NATIVE);
    fake.push_text("The issue asks for a dark mode.");
    let mut body = question("Summarize issue #1");
    body["options"] = json!({"agent_scratchpad": {"agent_type": "react", "steps": [{
        "thought": "I should read the issue.",
        "tool": "issue\\_reader",
        "tool_input": "Summarize issue #1",
        "observation": "Issue #1: Add a dark mode."
    }]}});
    let lines = agent(&gw, "duo_chat,ask_issue", &body).await.rest().await;
    assert_eq!(
        lines,
        vec![line(
            "final_answer_delta",
            json!({"text": "The issue asks for a dark mode."})
        )]
    );
    let sent = last_request(&fake);
    let messages = sent["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"], "{sent}");
    let step = &messages[2]["tool_calls"][0];
    assert_eq!(step["function"]["name"], "issue_reader");
    assert_eq!(
        serde_json::from_str::<Value>(step["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"input": "Summarize issue #1"})
    );
    assert_eq!(messages[3]["tool_call_id"], step["id"]);
    assert_eq!(messages[3]["content"], "Issue #1: Add a dark mode.");
}

#[actix_web::test]
async fn a_call_to_a_tool_the_caller_may_not_use_is_refused() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::OpenAi.gateway(&fake, NATIVE);
    fake.push_tool_calls("", vec![call("epic_reader", r#"{"input": "&1"}"#)]);
    let lines = agent(&gw, "duo_chat,ask_issue", &question("What is epic &1?"))
        .await
        .rest()
        .await;
    assert_eq!(
        lines,
        vec![line(
            "error",
            json!({"message": "tool not available", "retryable": false})
        )]
    );
}

#[actix_web::test]
async fn the_react_family_is_unchanged() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::OpenAi.gateway(&fake, &[]);
    fake.push_text("Thought: easy\nAction: DirectAnswer\nFinal Answer: Hi.");
    let lines = agent(&gw, "duo_chat,ask_issue", &question("Hello"))
        .await
        .rest()
        .await;
    assert_eq!(
        lines,
        vec![line("final_answer_delta", json!({"text": "Hi."}))]
    );
    let sent = last_request(&fake);
    assert!(sent.get("tools").is_none(), "{sent}");
    assert!(sent.to_string().contains("Action Input"));
}
