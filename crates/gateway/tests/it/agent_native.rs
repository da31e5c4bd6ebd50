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

/// The chat completion requests the fake received (the gateway also asks
/// the bundled server for its context size).
fn completions(fake: &FakeProvider) -> Vec<fake_provider::RecordedRequest> {
    fake.requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .collect()
}

/// A gateway whose model is the bundled model server, played by `fake`.
fn bundled_gateway(fake: &FakeProvider) -> String {
    crate::app_support::spawn_gateway(crate::app_support::local_model_config(
        fake.url().trim_end_matches('/'),
        &[],
    ))
}

/// The text of every `final_answer_delta`, joined, and the other lines.
fn answer_text(lines: &[String]) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut others = Vec::new();
    for line in lines {
        let event: Value = serde_json::from_str(line).unwrap();
        if event["type"] == "final_answer_delta" {
            text.push_str(event["data"]["text"].as_str().unwrap());
        } else {
            others.push(line.clone());
        }
    }
    (text, others)
}

fn system_prompt(body: &Value) -> String {
    body["messages"][0]["content"].as_str().unwrap().to_owned()
}

#[actix_web::test]
async fn the_bundled_model_answers_in_plain_text_once_it_chooses_to_answer_directly() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = bundled_gateway(&fake);
    // What a small model writes inside the call is not what the user gets.
    fake.push_tool_calls(
        "",
        vec![call(
            "answer_directly",
            r#"{"answer": "The answer, in Markdown, is: "}"#,
        )],
    );
    fake.push_text("Issue #1 asks for a dark mode.");
    let lines = agent(&gw, "duo_chat,ask_issue", &question("Summarize issue #1"))
        .await
        .rest()
        .await;
    let (text, others) = answer_text(&lines);
    assert_eq!(text, "Issue #1 asks for a dark mode.");
    assert!(others.is_empty(), "{others:?}");
    let requests = completions(&fake);
    assert_eq!(requests.len(), 2, "the choice, then the answer");
    let choice = &requests[0].body;
    assert!(
        choice["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "answer_directly"),
        "{choice}"
    );
    let answer = &requests[1].body;
    assert!(answer.get("tools").is_none(), "{answer}");
    assert!(answer.get("tool_choice").is_none(), "{answer}");
    let system = system_prompt(answer);
    assert!(system.contains("GitLab Duo Chat"), "{system}");
    assert!(!system.contains("calling exactly one function"), "{system}");
    assert!(
        answer["max_tokens"].as_u64().unwrap() <= 400,
        "a small model's plain answer is bounded: {answer}"
    );
    // Its plain answer is kept from looping; the grammar-bound choice is not touched.
    assert_eq!(answer["dry_multiplier"], json!(0.8), "{answer}");
    assert!(choice.get("dry_multiplier").is_none(), "{choice}");
    let last = answer["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("Summarize issue #1"),
        "{last}"
    );
}

#[actix_web::test]
async fn the_bundled_model_answers_a_question_naming_nothing_to_read_without_choosing() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = bundled_gateway(&fake);
    fake.push_text("A merge request proposes the changes of one branch for another.");
    let lines = agent(
        &gw,
        "duo_chat,ask_issue,ask_merge_request,documentation_search",
        &question("What is a merge request?"),
    )
    .await
    .rest()
    .await;
    let (text, others) = answer_text(&lines);
    assert_eq!(
        text,
        "A merge request proposes the changes of one branch for another."
    );
    assert!(others.is_empty(), "{others:?}");
    // No reader has anything to read, and documentation answers need a
    // model that writes from passages: one plain request, no tools.
    let requests = completions(&fake);
    assert_eq!(requests.len(), 1, "{requests:?}");
    let sent = &requests[0].body;
    assert!(sent.get("tools").is_none(), "{sent}");
    assert_eq!(sent["dry_multiplier"], json!(0.8), "{sent}");
}

#[actix_web::test]
async fn the_bundled_model_answers_a_question_with_its_context_without_choosing_a_tool() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = bundled_gateway(&fake);
    fake.push_text("Issue #1, Add a dark mode, is open.");
    let mut body = question("Summarize acme/platform/api#1");
    body["messages"][0]["context"] = json!({
        "type": "issue",
        "content": "<title>Add a dark mode</title><state>opened</state>",
    });
    let lines = agent(&gw, "duo_chat,ask_issue", &body).await.rest().await;
    let (text, others) = answer_text(&lines);
    // The gateway writes the resource's facts first; the model goes on.
    assert_eq!(
        text,
        "**Add a dark mode** (open)\n\nIssue #1, Add a dark mode, is open."
    );
    assert!(others.is_empty(), "{others:?}");
    let requests = completions(&fake);
    assert_eq!(requests.len(), 1, "no tool choice: one plain request");
    let sent = &requests[0].body;
    assert!(sent.get("tools").is_none(), "{sent}");
    let user = sent["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(user.contains("Add a dark mode"), "{user}");
    assert!(user.contains("Summarize acme/platform/api#1"), "{user}");
}

#[actix_web::test]
async fn after_a_tool_ran_the_bundled_model_answers_from_its_result_in_plain_text() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = bundled_gateway(&fake);
    fake.push_text("The issue asks for a dark mode.");
    let mut body = question("Summarize issue #1");
    body["options"] = json!({"agent_scratchpad": {"agent_type": "react", "steps": [{
        "thought": "I should read the issue.",
        "tool": "issue\\_reader",
        "tool_input": "Summarize issue #1",
        "observation": "Issue #1: Add a dark mode."
    }]}});
    let lines = agent(&gw, "duo_chat,ask_issue", &body).await.rest().await;
    let (text, _) = answer_text(&lines);
    assert_eq!(text, "The issue asks for a dark mode.");
    let requests = completions(&fake);
    assert_eq!(requests.len(), 1);
    let sent = &requests[0].body;
    assert!(sent.get("tools").is_none(), "{sent}");
    let messages = sent["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    // No tool-role messages for a request that declares no tools.
    assert_eq!(roles, ["system", "user", "user"], "{sent}");
    let results = messages[2]["content"].as_str().unwrap();
    assert!(results.contains("From issue_reader:"), "{results}");
    assert!(results.contains("Issue #1: Add a dark mode."), "{results}");
}

#[actix_web::test]
async fn a_bundled_model_choosing_a_tool_still_gets_it() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = bundled_gateway(&fake);
    fake.push_tool_calls("", vec![call("issue_reader", "{}")]);
    let lines = agent(&gw, "duo_chat,ask_issue", &question("Summarize issue #1"))
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
        )]
    );
    let requests = completions(&fake);
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0].body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "issue_reader"),
        "a question naming an issue is offered its reader"
    );
}
