//! Answers survive a gateway that dies: a model step cut off by a killed
//! gateway is asked again once it is back (or of another replica), every
//! answer arrives whole and once; a gateway that stays down ends the answer
//! with the documented code after the retries, never "unexpected"; a
//! stopping gateway finishes the answers in flight.

use e2e_tests::{Options, System};
use fake_provider::Scripted;
use serde_json::json;
use std::time::{Duration, Instant};

const ANSWER: &str = "The answer is forty-two.";

fn held() -> Scripted {
    Scripted::Held {
        before: vec![
            "Thought: I know this.\nFinal Answer: The answer".into(),
            " is".into(),
        ],
        after: vec![" forty-two.".into()],
    }
}

async fn wait_for_model_requests(system: &System, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while system.fake.requests().len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} model calls started:\n{}",
            system.fake.requests().len(),
            system
                .worker
                .as_ref()
                .map(|w| w.log_tail(30))
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn answers_in_flight_when_the_gateway_is_killed_arrive_whole_and_once() {
    const QUESTIONS: usize = 16;
    let mut system = System::start_with(Options {
        monolith_env: vec![("DUO_WORKER_CONCURRENCY".into(), QUESTIONS.to_string())],
        ..Options::default()
    })
    .await
    .unwrap();
    for _ in 0..QUESTIONS {
        system.fake.push(held());
    }
    // What the model says when asked again.
    system
        .fake
        .set_default_text(format!("Thought: I know this.\nFinal Answer: {ANSWER}"));
    let alice = system.token("alice").unwrap();
    let mut request_ids = Vec::new();
    for i in 0..QUESTIONS {
        let accepted = system
            .ask(
                &alice,
                json!({ "content": format!("Question {i}: what is the answer?") }),
            )
            .await
            .unwrap();
        request_ids.push(accepted["requestId"].as_str().unwrap().to_owned());
    }
    // Every answer is streaming (its first words sent) when the gateway dies.
    wait_for_model_requests(&system, QUESTIONS).await;
    system.gateway.kill().await.unwrap();
    system.restart_gateway().await.unwrap();

    for request_id in &request_ids {
        let answer = system.answer(&alice, request_id).await.unwrap();
        assert_eq!(answer["errors"], json!([]), "{answer}");
        assert_eq!(answer["content"], ANSWER, "{answer}");
    }
    // Each answer stored once, however many attempts it took.
    let messages = system.messages(&alice).await.unwrap();
    for request_id in &request_ids {
        let stored = messages
            .iter()
            .filter(|m| m["requestId"] == request_id.as_str() && m["role"] == "ASSISTANT")
            .count();
        assert_eq!(stored, 1, "answer to {request_id} stored {stored} times");
    }
    let worker = system.worker.as_ref().unwrap();
    assert!(
        worker.log_contains("retrying the step"),
        "no step was retried, so the gateway was not killed mid-answer"
    );
}

#[tokio::test]
async fn a_gateway_that_stays_down_ends_the_answer_with_a1001_after_the_retries() {
    let mut system = System::start().await.unwrap();
    system.gateway.kill().await.unwrap();
    let alice = system.token("alice").unwrap();
    let started = Instant::now();
    let accepted = system
        .ask(&alice, json!({ "content": "Is anyone there?" }))
        .await
        .unwrap();
    let answer = system
        .answer_within(
            &alice,
            accepted["requestId"].as_str().unwrap(),
            Duration::from_secs(40),
        )
        .await
        .unwrap();
    let took = started.elapsed();
    let errors = answer["errors"].to_string();
    assert!(errors.contains("A1001"), "{answer}");
    assert!(!errors.contains("A9999"), "{answer}");
    // It tried again before giving up, and gave up within the step's budget.
    let worker = system.worker.as_ref().unwrap();
    assert!(
        worker.log_contains("retrying the step"),
        "{}",
        worker.log_tail(20)
    );
    assert!(took < Duration::from_secs(30), "gave up after {took:?}");
}

#[tokio::test]
async fn a_stopping_gateway_finishes_the_answers_in_flight() {
    let mut system = System::start().await.unwrap();
    system.fake.push(held());
    let alice = system.token("alice").unwrap();
    let accepted = system
        .ask(&alice, json!({ "content": "What is the answer?" }))
        .await
        .unwrap();
    wait_for_model_requests(&system, 1).await;
    system.gateway.terminate().unwrap();
    // The gateway drains: the held answer goes on once the model goes on.
    system.fake.release();
    let answer = system
        .answer(&alice, accepted["requestId"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(answer["errors"], json!([]), "{answer}");
    assert_eq!(answer["content"], ANSWER, "{answer}");
    let exit = system
        .gateway
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    // Asked once: the drain let the first attempt finish.
    assert_eq!(system.fake.requests().len(), 1);
}
