//! Stopping real processes as an orchestrator does (SIGTERM): the web role
//! turns "not ready" first, hands its subscription sockets off with a
//! reconnect code and exits 0; the worker finishes or releases the job it holds
//! within the grace period and exits 0, and the answer arrives exactly once;
//! the gateway and the model server drain while not ready, then finish the
//! streams and generations in flight (a generation past the grace period is
//! cancelled) and exit 0.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a failed fixture fails the test"
)]

use std::time::{Duration, Instant};

use e2e_tests::{Options, System};
use serde_json::json;

/// grpc.health.v1 statuses.
const SERVING: u8 = 1;
const NOT_SERVING: u8 = 2;

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

/// Reads a streamed body chunk by chunk into one string.
struct Streamed {
    response: reqwest::Response,
    text: String,
}

impl Streamed {
    /// Reads until `needle` has arrived; fails if the body ends first.
    async fn until(&mut self, needle: &str) {
        while !self.text.contains(needle) {
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.response.chunk())
                .await
                .expect("no chunk within 60 s")
                .expect("the stream broke")
                .unwrap_or_else(|| panic!("the stream ended before {needle:?}: {}", self.text));
            self.text.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Reads to the end; `Err` when the connection broke before the end.
    async fn rest(&mut self) -> Result<(), reqwest::Error> {
        while let Some(chunk) = self.response.chunk().await? {
            self.text.push_str(&String::from_utf8_lossy(&chunk));
        }
        Ok(())
    }
}

/// Polls `url` until it answers `status` (true) or `limit` passes (false).
async fn answers_within(http: &reqwest::Client, url: &str, status: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(resp) = http.get(url).send().await
            && resp.status() == status
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Polls until nothing accepts connections on `url` any more.
async fn refuses_connections_within(http: &reqwest::Client, url: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if http.get(url).send().await.is_err_and(|e| e.is_connect()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn a_stopping_gateway_finishes_the_streams_in_flight_and_exits_cleanly() {
    let fake = fake_provider::FakeProvider::start().await.unwrap();
    let root = e2e_tests::repo_root();
    let port = e2e_tests::free_port().unwrap();
    let workflow_port = e2e_tests::free_port().unwrap();
    let workflow_listen = format!("127.0.0.1:{workflow_port}");
    let mut gateway = e2e_tests::Service::spawn(
        "gateway",
        &e2e_tests::binary("duo-gateway").unwrap(),
        &[],
        &env(&[
            ("AIGW_FASTAPI__API_HOST", "127.0.0.1"),
            ("AIGW_FASTAPI__API_PORT", &port.to_string()),
            ("ANTHROPIC_API_KEY", "e2e-test-key"),
            ("ANTHROPIC_BASE_URL", &fake.url()),
            // Any caller is allowed: the test speaks to the gateway directly.
            ("AIGW_AUTH__BYPASS_EXTERNAL", "true"),
            (
                "AIGW_PROMPTS_DIR",
                &root.join("prompts").display().to_string(),
            ),
            ("AIGW_DOCS__DIR", &root.join("docs").display().to_string()),
            ("AIGW_SHUTDOWN__DRAIN_SECONDS", "2"),
            ("AIGW_SHUTDOWN__GRACE_SECONDS", "30"),
            ("AIGW_LOGGING__FORMAT_JSON", "true"),
            ("AIGW_WORKFLOW_SERVICE__LISTEN", &workflow_listen),
        ]),
    )
    .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let ready = format!("{base}/monitoring/ready");
    gateway.wait_ready(&http, &ready).await.unwrap();
    let workflow = format!("http://{workflow_listen}");
    assert_eq!(e2e_tests::grpc_health(&workflow).await.unwrap(), SERVING);

    // The model answers half, then waits for the test.
    fake.push(fake_provider::Scripted::Held {
        before: vec!["Thought: easy.\nFinal Answer: Stopping".into()],
        after: vec![" gracefully works.".into()],
    });
    let response = http
        .post(format!("{base}/v2/chat/agent"))
        .json(&json!({ "messages": [{ "role": "user", "content": "Will my answer survive?" }] }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = Streamed {
        response,
        text: String::new(),
    };
    stream.until("Stopping").await;

    gateway.terminate().unwrap();
    // Draining: alive, still serving, but not ready.
    assert!(
        answers_within(&http, &ready, 503, Duration::from_secs(2)).await,
        "readiness never turned 503:\n{}",
        gateway.log_tail(20)
    );
    let live = http
        .get(format!("{base}/monitoring/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    // The workflow service (same process) tells gRPC health checkers too,
    // while it still answers (its own runtime notices within moments).
    let deadline = Instant::now() + Duration::from_secs(1);
    let health = loop {
        let health = e2e_tests::grpc_health(&workflow).await.unwrap();
        if health == NOT_SERVING || Instant::now() > deadline {
            break health;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(health, NOT_SERVING, "{}", gateway.log_tail(20));
    // After the drain no new connection is accepted, while the stream goes on.
    assert!(
        refuses_connections_within(&http, &ready, Duration::from_secs(10)).await,
        "still accepting connections:\n{}",
        gateway.log_tail(20)
    );
    assert!(
        gateway.exited().is_none(),
        "the gateway exited with a stream in flight"
    );

    fake.release();
    stream.rest().await.unwrap();
    let events: Vec<serde_json::Value> = stream
        .text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        events.last().unwrap(),
        &json!({ "type": "final_answer_delta", "data": { "text": " gracefully works." } }),
        "{}",
        stream.text
    );
    let exit = gateway.wait_exit(Duration::from_secs(15)).await.unwrap();
    assert!(exit.success(), "{exit}");
    // Its JSON log lines went to stdout.
    let json_lines: Vec<serde_json::Value> = gateway
        .stdout_lines()
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        json_lines
            .iter()
            .any(|l| l["fields"]["message"] == "gateway stopped"),
        "{}",
        gateway.log_tail(20)
    );
}

/// Starts the real model server with these shutdown settings.
async fn model_server(drain: &str, grace: &str) -> (e2e_tests::Service, String) {
    let (binary, models) = e2e_tests::local_model_server().await.unwrap();
    let port = e2e_tests::free_port().unwrap();
    let mut server = e2e_tests::Service::spawn(
        "local-llm",
        &binary,
        &["serve"],
        &env(&[
            ("DUO_LOCAL_LLM_ADDR", &format!("127.0.0.1:{port}")),
            ("DUO_MODELS_DIR", &models.display().to_string()),
            ("DUO_LOCAL_LLM_THREADS", "1"),
            ("DUO_SHUTDOWN_DRAIN_SECS", drain),
            ("DUO_SHUTDOWN_GRACE_SECS", grace),
            ("DUO_LOG_FORMAT", "json"),
        ]),
    )
    .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    server
        .wait_ready(&reqwest::Client::new(), &format!("{base}/ready"))
        .await
        .unwrap();
    (server, base)
}

fn story(max_tokens: u32, stream: bool) -> serde_json::Value {
    json!({
        "model": "smollm2-135m-instruct",
        "messages": [{ "role": "user", "content": "Write a long story about a lighthouse keeper and a storm." }],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

#[tokio::test]
async fn a_stopping_model_server_finishes_running_and_queued_generations_and_exits_cleanly() {
    let (mut server, base) = model_server("1", "60").await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let running = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&story(120, true))
        .send()
        .await
        .unwrap();
    assert_eq!(running.status(), 200);
    let mut running = Streamed {
        response: running,
        text: String::new(),
    };
    running.until(r#""content":""#).await;
    // A second request waits in the queue behind the running one.
    let queued = tokio::spawn({
        let http = http.clone();
        let url = format!("{base}/v1/chat/completions");
        async move { http.post(url).json(&story(16, false)).send().await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health: serde_json::Value = http
            .get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if health["chat_queue"]["waiting"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "never queued: {health}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before_stop = running.text.len();

    server.terminate().unwrap();
    assert!(answers_within(&http, &format!("{base}/ready"), 503, Duration::from_secs(1)).await);

    // Both answers are whole: the stream ends normally, the queued one runs.
    running.rest().await.unwrap();
    assert!(
        running.text.len() > before_stop,
        "the generation had ended before the stop request"
    );
    assert!(
        running.text.contains(r#""finish_reason":"#),
        "{}",
        running.text
    );
    assert!(
        running.text.ends_with("data: [DONE]\n\n"),
        "{}",
        running.text
    );
    let queued = queued.await.unwrap().unwrap();
    assert_eq!(queued.status(), 200);
    let queued: serde_json::Value = queued.json().await.unwrap();
    assert_eq!(queued["choices"][0]["finish_reason"], "length", "{queued}");
    assert!(
        !queued["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty()
    );

    let exit = server.wait_exit(Duration::from_secs(30)).await.unwrap();
    assert!(exit.success(), "{exit}");
    assert!(
        server
            .stdout_lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|l| l["fields"]["message"] == "duo-local-llm stopped"),
        "{}",
        server.log_tail(20)
    );
}

#[tokio::test]
async fn a_generation_longer_than_the_grace_period_is_cancelled_and_the_server_still_exits() {
    let (mut server, base) = model_server("0", "1").await;
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&story(1500, true))
        .send()
        .await
        .unwrap();
    let mut stream = Streamed {
        response,
        text: String::new(),
    };
    stream.until(r#""content":""#).await;
    let stopped_at = Instant::now();
    server.terminate().unwrap();
    let exit = server.wait_exit(Duration::from_secs(20)).await.unwrap();
    assert!(exit.success(), "{exit}");
    // Cut off at the end of the grace period, not after 1500 tokens.
    assert!(stopped_at.elapsed() < Duration::from_secs(10));
    let _ = stream.rest().await;
    assert!(!stream.text.contains("[DONE]"), "{}", stream.text);
}
