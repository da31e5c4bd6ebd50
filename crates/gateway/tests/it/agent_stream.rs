//! `POST /v2/chat/agent` over real HTTP: the app, the model router and the
//! fake provider speaking Anthropic Messages or OpenAI chat completions, with
//! SSE events split at arbitrary bytes on the wire. The NDJSON answer is read
//! line by line as it arrives.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::stream_support;

use fake_provider::{Failure, FakeProvider, Scripted};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use stream_support::{WIRES, Wire, agent, line, question};

async fn fake() -> FakeProvider {
    let fake = FakeProvider::start().await.unwrap();
    // Odd sizes cut through event names, JSON and multi-byte characters.
    fake.set_wire_split(Some(7));
    fake
}

fn with_model(wire: Wire, fake: &FakeProvider, model: &str) -> Value {
    let mut body = question("How do I rebase?");
    body["model_metadata"] = wire.metadata(fake, model);
    body
}

fn strings(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|t| (*t).to_owned()).collect()
}

#[actix_web::test]
async fn answer_deltas_arrive_while_the_model_is_still_answering() {
    for wire in WIRES {
        let fake = fake().await;
        let gw = wire.gateway(&fake, &[]);
        fake.push(Scripted::Held {
            before: strings(&[
                "I know this.\nFinal Answer: Re",
                "base rewrites ",
                "hïstory",
            ]),
            after: strings(&[" — carefully ✓."]),
        });
        let mut answer = agent(&gw, "duo_chat", &question("How do I rebase?")).await;
        // The model has not finished (it waits for `release`), yet the
        // answer so far is already here.
        let mut live = Vec::new();
        for _ in 0..3 {
            live.push(answer.next_line().await.expect("a live delta"));
        }
        assert_eq!(
            live,
            vec![
                line("final_answer_delta", json!({"text": "Re"})),
                line("final_answer_delta", json!({"text": "base rewrites"})),
                line("final_answer_delta", json!({"text": " hïstory"})),
            ],
            "{wire:?}"
        );
        fake.release();
        assert_eq!(
            answer.rest().await,
            vec![line(
                "final_answer_delta",
                json!({"text": " — carefully ✓."})
            )],
            "{wire:?}: nothing follows the answer"
        );
    }
}

#[actix_web::test]
async fn an_action_comes_once_after_the_model_stream_ends() {
    for wire in WIRES {
        let fake = fake().await;
        fake.set_chunk_size(5);
        let gw = wire.gateway(&fake, &[]);
        fake.push_text("I should read it.\nAction: issue_reader\nAction Input: What is #7 about?");
        let mut answer = agent(&gw, "duo_chat,ask_issue", &question("What is #7 about?")).await;
        assert_eq!(
            answer.rest().await,
            vec![line(
                "action",
                json!({"tool": "issue_reader", "tool_input": "What is #7 about?", "thought": "I should read it."})
            )],
            "{wire:?}"
        );
        // The ReAct stop sequence went to the provider.
        let sent = &fake.requests()[0].body;
        let stop = if wire == Wire::Anthropic {
            &sent["stop_sequences"]
        } else {
            &sent["stop"]
        };
        assert_eq!(stop, &json!(["Observation:"]), "{wire:?}");
    }
}

#[actix_web::test]
async fn output_in_neither_format_is_unknown() {
    for wire in WIRES {
        let fake = fake().await;
        let gw = wire.gateway(&fake, &[]);
        fake.push_text("  Just chatting, no format at all.  ");
        let mut answer = agent(&gw, "duo_chat", &question("hi")).await;
        assert_eq!(
            answer.rest().await,
            vec![line(
                "unknown",
                json!({"text": "Just chatting, no format at all."})
            )],
            "{wire:?}"
        );
    }
}

#[actix_web::test]
async fn overload_is_retried_once_then_reported_as_retryable() {
    for wire in WIRES {
        let fake = fake().await;
        let gw = wire.gateway(&fake, &[]);
        let body = with_model(wire, &fake, "fake-overloaded");
        let lines = agent(&gw, "duo_chat", &body).await.rest().await;
        assert_eq!(lines.len(), 1, "{wire:?}: {lines:?}");
        let event: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(event["type"], "error", "{wire:?}");
        assert_eq!(event["data"]["retryable"], true, "{wire:?}");
        let message = event["data"]["message"].as_str().unwrap();
        assert!(message.contains("overloaded_error"), "{wire:?}: {message}");
        assert_eq!(fake.requests().len(), 2, "{wire:?}: one retry, no more");
    }
}

#[actix_web::test]
async fn a_server_error_is_not_retried_and_not_retryable() {
    for wire in WIRES {
        let fake = fake().await;
        let gw = wire.gateway(&fake, &[]);
        let body = with_model(wire, &fake, "fake-500");
        let lines = agent(&gw, "duo_chat", &body).await.rest().await;
        assert_eq!(lines.len(), 1, "{wire:?}: {lines:?}");
        let event: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(event["type"], "error", "{wire:?}");
        assert_eq!(event["data"]["retryable"], false, "{wire:?}");
        let message = event["data"]["message"].as_str().unwrap();
        assert!(message.starts_with("500: "), "{wire:?}: {message}");
        assert_eq!(fake.requests().len(), 1, "{wire:?}");
    }
}

#[actix_web::test]
async fn an_error_mid_stream_ends_the_answer() {
    for wire in WIRES {
        let fake = fake().await;
        let gw = wire.gateway(&fake, &[]);
        fake.push_failure(Failure::ErrorMidStream {
            text: "Sure.\nFinal Answer: Partial answ".to_owned(),
        });
        let mut answer = agent(&gw, "duo_chat", &question("q")).await;
        assert_eq!(
            answer.next_line().await,
            Some(line("final_answer_delta", json!({"text": "Partial answ"}))),
            "{wire:?}"
        );
        let error: Value = serde_json::from_str(&answer.next_line().await.unwrap()).unwrap();
        assert_eq!(error["type"], "error", "{wire:?}");
        assert_eq!(error["data"]["retryable"], false, "{wire:?}");
        assert_eq!(
            answer.next_line().await,
            None,
            "{wire:?}: cut after the error"
        );
        assert_eq!(fake.requests().len(), 1, "{wire:?}: not retried");
    }
}

#[actix_web::test]
async fn a_model_cut_off_while_answering_ends_with_an_error() {
    for wire in WIRES {
        let fake = fake().await;
        let gw = wire.gateway(&fake, &[]);
        fake.push(Scripted::Held {
            before: strings(&["Final Answer: Half"]),
            after: strings(&[" done"]),
        });
        let mut answer = agent(&gw, "duo_chat", &question("q")).await;
        assert_eq!(
            answer.next_line().await,
            Some(line("final_answer_delta", json!({"text": "Half"}))),
            "{wire:?}"
        );
        // The provider goes away with the answer held open.
        fake.stop().await;
        let error: Value = serde_json::from_str(&answer.next_line().await.unwrap()).unwrap();
        assert_eq!(error["type"], "error", "{wire:?}");
        assert_eq!(error["data"]["retryable"], false, "{wire:?}");
        assert_eq!(answer.next_line().await, None, "{wire:?}");
    }
}
