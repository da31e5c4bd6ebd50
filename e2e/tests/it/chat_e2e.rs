//! Duo Chat end to end: real gateway and monolith processes, real PostgreSQL,
//! the fake provider as the model. Only public interfaces are used.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use e2e_tests::{Options, System};
use serde_json::json;

const LOGIN_ISSUE_TEXT: &str = "Users with a session older than 30 days";
const SECRET_ISSUE_TEXT: &str = "prints the Authorization header";

#[tokio::test]
async fn a_direct_answer_is_stored_and_readable() {
    let system = System::start().await.unwrap();
    system.fake.push_text(
        "Thought: I can answer this myself.\nFinal Answer: Merge requests propose changes.",
    );
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "What is a merge request?" }))
        .await
        .unwrap();
    assert_eq!(
        answer["content"], "Merge requests propose changes.",
        "{answer}"
    );
    assert_eq!(answer["errors"], json!([]));
    // The question reached the model through the gateway's ReAct prompt.
    let bodies = system.provider_bodies();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert!(bodies[0].contains("What is a merge request?"));
}

#[tokio::test]
async fn the_issue_reader_observation_reaches_the_next_model_call() {
    let system = System::start().await.unwrap();
    system.fake.push_text(
        "Thought: I need the issue.\nAction: issue_reader\nAction Input: Summarise acme/platform/api#1",
    );
    system
        .fake
        .set_default_text("Thought: I have it.\nFinal Answer: Old sessions break the login.");
    // alice holds a Duo Enterprise seat (issue_reader needs ask_issue) and owns acme.
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(
            &alice,
            json!({ "content": "Summarise acme/platform/api#1" }),
        )
        .await
        .unwrap();
    assert_eq!(
        answer["content"], "Old sessions break the login.",
        "{answer}"
    );
    let bodies = system.provider_bodies();
    assert!(bodies.len() >= 2, "{bodies:?}");
    // The question names the issue, so it is attached to the first call.
    assert!(
        bodies[0].contains(LOGIN_ISSUE_TEXT),
        "the named issue is missing from the first call"
    );
    assert!(
        bodies.last().unwrap().contains(LOGIN_ISSUE_TEXT),
        "the observation is missing from the last call: {}",
        bodies.last().unwrap()
    );
}

#[tokio::test]
async fn a_confidential_issue_never_reaches_a_user_without_access() {
    let system = System::start().await.unwrap();
    system.fake.push_text(
        "Thought: I need the issue.\nAction: issue_reader\nAction Input: acme/platform/api#2",
    );
    system
        .fake
        .set_default_text("Thought: done.\nFinal Answer: I could not read it.");
    // dave has a seat but no membership in the private project.
    let dave = system.token("dave").unwrap();
    let answer = system
        .ask_and_wait(&dave, json!({ "content": "Summarise acme/platform/api#2" }))
        .await
        .unwrap();
    let text = answer.to_string();
    assert!(
        text.contains("M3003") || !bodies_contain(&system, SECRET_ISSUE_TEXT),
        "{text}"
    );
    assert!(
        !bodies_contain(&system, SECRET_ISSUE_TEXT),
        "the confidential issue leaked to the model"
    );
    assert!(!text.contains(SECRET_ISSUE_TEXT));
}

fn bodies_contain(system: &System, needle: &str) -> bool {
    system.provider_bodies().iter().any(|b| b.contains(needle))
}

#[tokio::test]
async fn a_user_without_a_seat_gets_m3004_and_no_model_call() {
    let system = System::start().await.unwrap();
    let carol = system.token("carol").unwrap();
    let accepted = system
        .ask(&carol, json!({ "content": "Hello?" }))
        .await
        .unwrap();
    let text = accepted.to_string();
    if accepted["requestId"].is_string() {
        let answer = system
            .answer(&carol, accepted["requestId"].as_str().unwrap())
            .await
            .unwrap();
        assert!(answer.to_string().contains("M3004"), "{answer}");
    } else {
        assert!(
            text.contains("M3004") || text.contains("Duo Chat"),
            "{text}"
        );
    }
    assert!(system.fake.requests().is_empty());
}

#[tokio::test]
async fn a_model_failure_ends_with_a_coded_error_not_silence() {
    let system = System::start().await.unwrap();
    system
        .fake
        .push_failure(fake_provider::Failure::ServerError);
    system
        .fake
        .push_failure(fake_provider::Failure::ServerError);
    system
        .fake
        .push_failure(fake_provider::Failure::ServerError);
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "Will this work?" }))
        .await
        .unwrap();
    let errors = answer["errors"].to_string();
    assert!(errors.contains("Error code: [A"), "{answer}");
    assert!(errors.contains("error-codes.md#error-a"), "{answer}");
}

#[tokio::test]
async fn help_answers_without_the_model() {
    let system = System::start().await.unwrap();
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "/help" }))
        .await
        .unwrap();
    assert!(
        answer["content"].as_str().unwrap().contains("/explain"),
        "{answer}"
    );
    assert!(system.fake.requests().is_empty());
}

#[tokio::test]
async fn explain_sends_the_selected_code_to_the_explain_prompt() {
    let system = System::start().await.unwrap();
    system.fake.set_default_text("It adds two numbers.");
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(
            &alice,
            json!({
                "content": "/explain",
                "currentFile": { "fileName": "math.rs", "selectedText": "fn add(a: i32, b: i32) -> i32 { a + b }" }
            }),
        )
        .await
        .unwrap();
    assert_eq!(answer["content"], "It adds two numbers.", "{answer}");
    let bodies = system.provider_bodies();
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].contains("fn add(a: i32, b: i32)"));
}

#[tokio::test]
async fn reset_drops_earlier_questions_from_the_history() {
    let system = System::start().await.unwrap();
    system
        .fake
        .set_default_text("Thought: ok.\nFinal Answer: Noted.");
    let alice = system.token("alice").unwrap();
    system
        .ask_and_wait(&alice, json!({ "content": "My favourite colour is teal." }))
        .await
        .unwrap();
    system
        .ask_and_wait(&alice, json!({ "content": "What did I say?" }))
        .await
        .unwrap();
    let before_reset = system.provider_bodies();
    assert!(
        before_reset
            .last()
            .unwrap()
            .contains("favourite colour is teal")
    );

    let reset = system
        .ask(&alice, json!({ "content": "/reset" }))
        .await
        .unwrap();
    assert_eq!(reset["errors"], json!([]), "{reset}");
    system
        .ask_and_wait(&alice, json!({ "content": "And now?" }))
        .await
        .unwrap();
    let after_reset = system.provider_bodies();
    let last = after_reset.last().unwrap();
    assert!(last.contains("And now?"));
    assert!(!last.contains("favourite colour is teal"), "{last}");
}

#[tokio::test]
async fn a_worker_killed_mid_request_answers_once_after_restart() {
    let mut system = System::start().await.unwrap();
    // The model hangs on the first call, so the worker is mid-request when it dies.
    system.fake.push_failure(fake_provider::Failure::Hang);
    system
        .fake
        .set_default_text("Thought: ok.\nFinal Answer: Answered after a restart.");
    let alice = system.token("alice").unwrap();
    let accepted = system
        .ask(&alice, json!({ "content": "Are you resilient?" }))
        .await
        .unwrap();
    let request_id = accepted["requestId"].as_str().unwrap().to_owned();
    // Wait until the model call is in flight, then crash the worker.
    let deadline = std::time::Instant::now() + e2e_tests::ANSWER_TIMEOUT;
    while system.fake.requests().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never called the model"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    system.worker.as_mut().unwrap().kill().await.unwrap();
    system.restart_worker().await.unwrap();
    let answer = system.answer(&alice, &request_id).await.unwrap();
    assert_eq!(answer["content"], "Answered after a restart.", "{answer}");
    let answers = system
        .messages(&alice)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m["requestId"] == request_id.as_str() && m["role"] == "ASSISTANT")
        .count();
    assert_eq!(answers, 1);
}

#[tokio::test]
async fn a_web_process_that_runs_jobs_answers_without_a_worker() {
    let system = System::start_with(Options {
        web_runs_jobs: true,
        ..Options::default()
    })
    .await
    .unwrap();
    assert!(system.worker.is_none());
    system
        .fake
        .push_text("Thought: Easy.\nFinal Answer: One process does it all.");
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "Can one process answer?" }))
        .await
        .unwrap();
    assert_eq!(answer["content"], "One process does it all.", "{answer}");
    assert!(system.web.log_contains("also runs queued jobs"));
}
