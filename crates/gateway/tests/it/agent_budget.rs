//! The chat agent's prompt fits the model's context: with a small context
//! (`AIGW_MODEL_CONTEXT_TOKENS`), history is dropped and a long tool result
//! clipped with a marker before the model sees it; a question that cannot
//! fit is refused with the model, its context and the prompt's size; a model
//! server that refuses a prompt as too large (413) is reported in the words
//! the monolith turns into A1005.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::app_support::TEST_SCOPES;
use crate::stream_support::{self, Wire, agent, line};
use fake_provider::{Failure, FakeProvider};
use serde_json::{Value, json};

/// The native family (the bundled model's) on the fake, whose model is
/// said to hold 1,200 tokens: 900 for the prompt, 300 for the answer.
fn small_context() -> Vec<(&'static str, &'static str)> {
    vec![
        ("AIGW_DEFAULT_PROMPTS", r#"{"chat/react": "native"}"#),
        (
            "AIGW_MODEL_CONTEXT_TOKENS",
            r#"{"smollm2-135m-instruct": 1200}"#,
        ),
    ]
}

fn long_conversation() -> Value {
    let search_results = (1..=60)
        .map(|n| format!("src/module_{n}.rs:{n}: fn handler_{n}() -> Result<(), Error> {{ todo }}"))
        .collect::<Vec<_>>()
        .join("\n");
    json!({
        "messages": [
            {"role": "user", "content": format!("An old question. {}", "Tell me more. ".repeat(60))},
            {"role": "assistant", "content": format!("An old answer. {}", "Here is more. ".repeat(60))},
            {"role": "user", "content": "Where are the handlers defined?"},
        ],
        "options": {"agent_scratchpad": {"agent_type": "react", "steps": [{
            "thought": "I should search the repository.",
            "tool": "gitlab_documentation",
            "tool_input": "handlers",
            "observation": search_results,
        }]}},
    })
}

#[actix_web::test]
async fn a_prompt_over_the_context_loses_old_history_and_clips_the_long_result() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::OpenAi.gateway(&fake, &small_context());
    fake.push_text("They are in src/module_1.rs.");
    let lines = agent(&gw, "duo_chat,documentation_search", &long_conversation())
        .await
        .rest()
        .await;
    assert_eq!(
        lines,
        vec![line(
            "final_answer_delta",
            json!({"text": "They are in src/module_1.rs."})
        )]
    );
    let sent = fake.requests().last().unwrap().body.clone();
    let messages = sent["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    // The old turn is gone; the question and the search stay.
    assert_eq!(roles, ["system", "user", "assistant", "tool"], "{sent}");
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .contains("Where are the handlers defined?")
    );
    let result = messages[3]["content"].as_str().unwrap();
    assert!(result.starts_with("src/module_1.rs:1:"), "{result}");
    assert!(
        result.ends_with("characters.]")
            && result.contains("[Shortened to fit the model's context window: the first "),
        "{result}"
    );
    assert!(!result.contains("module_60"), "{result}");
    // What went out fits: at three characters a token, under 900 tokens.
    assert!(
        sent.to_string().len() / 3 < 1200,
        "{}",
        sent.to_string().len()
    );
}

#[actix_web::test]
async fn a_question_that_cannot_fit_names_the_model_and_the_sizes() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::OpenAi.gateway(&fake, &small_context());
    let body = json!({"messages": [{"role": "user", "content": "Explain this. ".repeat(400)}]});
    let response = stream_support::client()
        .post(format!("{gw}/v2/chat/agent"))
        .header(TEST_SCOPES, "duo_chat")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let detail = response.json::<Value>().await.unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        detail.starts_with("prompt is too long for the model smollm2-135m-instruct: its context holds 1200 tokens (300 kept for the answer), and the prompt needs about "),
        "{detail}"
    );
    assert!(detail.contains("DUO_LOCAL_LLM_CONTEXT"), "{detail}");
    assert!(
        fake.requests().iter().all(|r| !r.path.contains("chat")),
        "the model was not called"
    );
}

#[actix_web::test]
async fn a_model_server_refusing_the_prompt_as_too_large_is_reported_as_too_long() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::OpenAi.gateway(
        &fake,
        &[("AIGW_DEFAULT_PROMPTS", r#"{"chat/react": "native"}"#)],
    );
    fake.push_failure(Failure::Status {
        status: 413,
        kind: "invalid_request_error".into(),
        message: "the prompt has 2341 tokens; the context holds 2048".into(),
    });
    let lines = agent(&gw, "duo_chat", &stream_support::question("Hello"))
        .await
        .rest()
        .await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let event: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(event["type"], "error", "{event}");
    let message = event["data"]["message"].as_str().unwrap();
    assert!(message.starts_with("prompt is too long"), "{message}");
    assert!(
        message.contains("the prompt has 2341 tokens; the context holds 2048"),
        "{message}"
    );
}
