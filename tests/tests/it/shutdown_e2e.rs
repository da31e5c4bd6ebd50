//! Stopping real processes as an orchestrator does (SIGTERM): the web role
//! turns "not ready" first, hands its subscription sockets off with a
//! reconnect code and exits 0; the worker finishes or releases the job it holds
//! within the grace period and exits 0, and the answer arrives exactly once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use std::time::{Duration, Instant};

use e2e_tests::{Options, System};
use serde_json::json;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn a_stopping_web_process_drains_hands_off_sockets_and_exits_cleanly() {
    let mut system = System::start_with(Options {
        monolith_env: env(&[
            ("DUO_SHUTDOWN_DRAIN_SECS", "2"),
            ("DUO_SHUTDOWN_GRACE_SECS", "5"),
        ]),
        ..Default::default()
    })
    .await
    .unwrap();
    let alice = system.token("alice").unwrap();
    let web_url = system.web_url.clone();
    let mut subscription = system
        .subscribe_everywhere(&alice, "tab-1", &[&web_url])
        .await
        .unwrap()
        .pop()
        .unwrap();
    let ready = format!("{web_url}/-/readiness");
    assert_eq!(system.http.get(&ready).send().await.unwrap().status(), 200);

    system.web.terminate().unwrap();
    // During the drain: alive, serving, but not ready.
    let deadline = Instant::now() + Duration::from_secs(2);
    let status = loop {
        let status = system.http.get(&ready).send().await.unwrap().status();
        if status == 503 || Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, 503);
    let live = system
        .http
        .get(format!("{web_url}/-/liveness"))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);

    // The socket is told to reconnect (1012), then the process exits 0.
    let code = subscription.closed(Duration::from_secs(5)).await.unwrap();
    assert_eq!(code, Some(1012));
    let exit = system.web.wait_exit(Duration::from_secs(15)).await.unwrap();
    assert!(exit.success(), "{exit}");
}

#[tokio::test]
async fn a_stopping_worker_releases_its_job_and_the_answer_arrives_once() {
    let mut system = System::start_with(Options {
        monolith_env: env(&[("DUO_SHUTDOWN_GRACE_SECS", "1")]),
        ..Default::default()
    })
    .await
    .unwrap();
    // The model hangs on the first call, so the worker holds the job when asked to stop.
    system.fake.push_failure(fake_provider::Failure::Hang);
    system
        .fake
        .set_default_text("Thought: ok.\nFinal Answer: Answered by the next worker.");
    let alice = system.token("alice").unwrap();
    let accepted = system
        .ask(&alice, json!({ "content": "Will you survive a restart?" }))
        .await
        .unwrap();
    let request_id = accepted["requestId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + e2e_tests::ANSWER_TIMEOUT;
    while system.fake.requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the worker never called the model"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let worker = system.worker.as_mut().unwrap();
    worker.terminate().unwrap();
    let exit = worker.wait_exit(Duration::from_secs(15)).await.unwrap();
    assert!(exit.success(), "{exit}");
    assert!(
        worker.log_contains("releasing a job at shutdown"),
        "{}",
        worker.log_tail(20)
    );

    system.restart_worker().await.unwrap();
    let answer = system.answer(&alice, &request_id).await.unwrap();
    assert_eq!(
        answer["content"], "Answered by the next worker.",
        "{answer}"
    );
    let answers = system
        .messages(&alice)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m["requestId"] == request_id.as_str() && m["role"] == "ASSISTANT")
        .count();
    assert_eq!(answers, 1);
}
