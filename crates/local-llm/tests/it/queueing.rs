//! Admission, fairness and cancellation through the real HTTP server, with
//! test engines that move only when the test lets them: every step is
//! synchronised on what the engine reports or what `/health` shows.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a failed fixture fails the test"
)]

use crate::common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use local_llm::config::Config;
use local_llm::engine::EngineFinish;
use local_llm::generation::GenerationQueue;
use local_llm::server::AppState;
use local_llm::testing::{EmbedGate, EngineGate, GateReport, gated_embedder, gated_engine};
use reqwest::StatusCode;
use serde_json::{Value, json};

const CHAT_MODEL: &str = "smollm2-135m-instruct";
const EMBED_MODEL: &str = "all-minilm-l6-v2";
const VERTEX_PATH: &str =
    "/v1/projects/p/locations/us-central1/publishers/google/models/text-embedding-005:predict";

struct Gated {
    base: String,
    engine: EngineGate,
    embedder: EmbedGate,
    state: AppState,
}

/// A server whose models are test doubles; no weights needed.
async fn gated_server(pieces: &[&str], tweak: impl FnOnce(&mut Config)) -> Gated {
    let mut config = Config::with_models_dir(PathBuf::from("/nonexistent-models"));
    config.addr = "127.0.0.1:0".parse().expect("addr");
    tweak(&mut config);
    let (engine, engine_gate) = gated_engine(pieces);
    let chat = GenerationQueue::start(config.queue_capacity, config.pieces_every, move || {
        Ok(engine)
    })
    .expect("queue");
    let (embedder, embed_gate) = gated_embedder();
    let state = AppState::from_parts(config, chat, Arc::new(embedder)).expect("app state");
    let base = common::start_app(state.clone()).await;
    Gated {
        base,
        engine: engine_gate,
        embedder: embed_gate,
        state,
    }
}

fn chat_body(text: &str, stream: bool) -> Value {
    json!({
        "model": CHAT_MODEL,
        "messages": [{ "role": "user", "content": text }],
        "stream": stream,
    })
}

/// Sends a request in the background; the handle yields status and body text.
fn spawn_post(
    base: &str,
    path: &str,
    body: Value,
) -> tokio::task::JoinHandle<(StatusCode, String)> {
    let url = format!("{base}{path}");
    actix_web::rt::spawn(async move {
        let resp = reqwest::Client::new()
            .post(url)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status();
        (status, resp.text().await.expect("body"))
    })
}

type Pending = tokio::task::JoinHandle<(StatusCode, String)>;

/// One chat request running in the gated engine and a second one (`waiting`)
/// in the queue behind it.
async fn one_running_one_waiting(app: &mut Gated, waiting: &str) -> (Pending, Pending) {
    let running = spawn_post(
        &app.base,
        "/v1/chat/completions",
        chat_body("running", false),
    );
    assert!(next_started(&mut app.engine).await.contains("running"));
    let queued = spawn_post(&app.base, "/v1/chat/completions", chat_body(waiting, false));
    until_health(&app.base, "one waiting chat job", |h| {
        h["chat_queue"]["waiting"] == 1
    })
    .await;
    (running, queued)
}

async fn health(base: &str) -> Value {
    common::get_json(&format!("{base}/health")).await
}

/// Polls `/health` until `done` holds: the server's own account of its queues
/// is the synchronisation point.
async fn until_health(base: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = health(base).await;
        if done(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {body}"
        );
        tokio::task::yield_now().await;
    }
}

/// The prompt text of the next run the engine starts.
async fn next_started(gate: &mut EngineGate) -> String {
    loop {
        match gate.next().await.expect("engine report") {
            GateReport::Started { prompt } => return prompt,
            GateReport::Piece { .. } | GateReport::Finished { .. } => {}
        }
    }
}

fn assert_queue_full(status: StatusCode, body: &str, queue: &str) {
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let body: Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["error"]["code"], "queue_full", "{body}");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains(&format!("{queue} queue is full")) && message.contains("retry"),
        "{message}"
    );
}

#[actix_web::test]
async fn a_full_chat_queue_answers_503_with_a_clear_json_body() {
    let mut app = gated_server(&["one", " two"], |c| c.queue_capacity = 1).await;
    let (running, waiting) = one_running_one_waiting(&mut app, "waiting").await;

    let refused = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", app.base))
        .json(&chat_body("refused", true))
        .send()
        .await
        .expect("request");
    assert_eq!(
        refused.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let status = refused.status();
    assert_queue_full(status, &refused.text().await.expect("body"), "chat");

    app.engine.allow(4);
    for handle in [running, waiting] {
        let (status, body) = handle.await.expect("task");
        assert_eq!(status, StatusCode::OK, "{body}");
        let body: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(body["choices"][0]["message"]["content"], "one two");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
    }
    let health = health(&app.base).await;
    assert_eq!(health["chat_queue"]["completed"], 2, "{health}");
}

#[actix_web::test]
async fn waiting_chat_requests_are_served_in_arrival_order() {
    let mut app = gated_server(&["ok"], |c| c.queue_capacity = 8).await;
    let mut handles = vec![spawn_post(
        &app.base,
        "/v1/chat/completions",
        chat_body("request-0", false),
    )];
    assert!(next_started(&mut app.engine).await.contains("request-0"));
    // Each request is sent only once the previous one is seen waiting, so the
    // arrival order is the order of this loop.
    for i in 1..=4 {
        handles.push(spawn_post(
            &app.base,
            "/v1/chat/completions",
            chat_body(&format!("request-{i}"), false),
        ));
        until_health(&app.base, "the request to queue", |h| {
            h["chat_queue"]["waiting"] == i
        })
        .await;
    }
    app.engine.allow(5);
    let mut order = Vec::new();
    for _ in 0..5 {
        let (prompt, _) = app.engine.finished().await.expect("a run ends");
        let i = (0..=4)
            .find(|i| prompt.contains(&format!("request-{i}")))
            .expect("a known prompt");
        order.push(i);
    }
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
    for handle in handles {
        assert_eq!(handle.await.expect("task").0, StatusCode::OK);
    }
}

#[actix_web::test]
async fn closing_a_stream_stops_its_generation() {
    const PIECES: usize = 100_000;
    let pieces = vec!["x"; PIECES];
    let mut app = gated_server(&pieces, |_| {}).await;
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{}/v1/chat/completions", app.base))
        .json(&chat_body("stream then leave", true))
        .send();
    app.engine.allow(1);
    let resp = resp.await.expect("request");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.bytes_stream();
    let mut seen = String::new();
    while !seen.contains(r#""content":"x""#) {
        let chunk = body.next().await.expect("a chunk").expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(body);
    drop(client);

    // One piece at a time, so the engine can only run ahead as far as the
    // server takes to see the client gone.
    let run = loop {
        match app.engine.next().await.expect("engine report") {
            GateReport::Piece { .. } => app.engine.allow(1),
            GateReport::Finished { run, .. } => break run,
            GateReport::Started { .. } => {}
        }
    };
    assert_eq!(run.finish, EngineFinish::Halted);
    assert!(run.completion_tokens < PIECES, "{run:?}");
    let health = until_health(&app.base, "the generator to go idle", |h| {
        h["chat_queue"]["running"] == false
    })
    .await;
    assert_eq!(health["chat_queue"]["completed"], 1, "{health}");
}

#[actix_web::test]
async fn a_queued_request_whose_client_left_is_skipped() {
    let mut app = gated_server(&["done"], |c| c.queue_capacity = 4).await;
    let (running, leaver) = one_running_one_waiting(&mut app, "leaver").await;
    // Aborting the task drops the connection, as a client that gives up does.
    leaver.abort();
    assert!(leaver.await.expect_err("aborted").is_cancelled());
    until_health(&app.base, "the server to notice the leaver", |h| {
        h["chat_queue"]["waiting"] == 0
    })
    .await;
    let stayer = spawn_post(
        &app.base,
        "/v1/chat/completions",
        chat_body("stayer", false),
    );
    until_health(&app.base, "the stayer to queue", |h| {
        h["chat_queue"]["waiting"] == 1
    })
    .await;

    app.engine.allow(2);
    assert!(
        app.engine
            .finished()
            .await
            .expect("run")
            .0
            .contains("running")
    );
    assert!(next_started(&mut app.engine).await.contains("stayer"));
    assert!(
        app.engine
            .finished()
            .await
            .expect("run")
            .0
            .contains("stayer")
    );
    for handle in [running, stayer] {
        assert_eq!(handle.await.expect("task").0, StatusCode::OK);
    }
    let health = health(&app.base).await;
    assert_eq!(health["chat_queue"]["skipped"], 1, "{health}");
    assert_eq!(health["chat_queue"]["completed"], 2, "{health}");
    // Nothing else ran: the leaver's prompt never reached the engine.
    assert_eq!(app.engine.try_next(), None);
}

#[actix_web::test]
async fn streamed_usage_is_sent_when_asked_for() {
    let app = gated_server(&["a", "b", "c"], |_| {}).await;
    app.engine.allow(3);
    let mut body = chat_body("count me", true);
    body["stream_options"] = json!({ "include_usage": true });
    body["max_tokens"] = json!(2);
    let text = common::post_text(&format!("{}/v1/chat/completions", app.base), &body).await;
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last().copied(), Some("data: [DONE]"), "{text}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(&e["data: ".len()..]).expect("chunk"))
        .collect();
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length", "{text}");
    let usage_chunk = &chunks[chunks.len() - 1];
    assert_eq!(usage_chunk["choices"], json!([]), "{text}");
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 2, "{text}");
    let prompt_tokens = usage_chunk["usage"]["prompt_tokens"].as_u64().expect("n");
    assert!(prompt_tokens > 0);
    assert_eq!(usage_chunk["usage"]["total_tokens"], prompt_tokens + 2);
    // Without the option there is no usage chunk.
    app.engine.allow(3);
    let plain = common::post_text(
        &format!("{}/v1/chat/completions", app.base),
        &chat_body("no usage", true),
    )
    .await;
    assert!(!plain.contains("\"usage\""), "{plain}");
}

#[actix_web::test]
async fn embeddings_are_admitted_boundedly_and_refused_with_503_when_full() {
    let mut app = gated_server(&[], |c| {
        c.embed_concurrency = 1;
        c.embed_queue_capacity = 1;
    })
    .await;
    // Index-sized batches: a request of a few short inputs is a question,
    // which has a lane of its own (below).
    let embed = |text: &str| json!({ "model": EMBED_MODEL, "input": vec![text; 5] });
    let batch = |text: &str| vec![text.to_owned(); 5];
    let running = spawn_post(&app.base, "/v1/embeddings", embed("running"));
    assert_eq!(
        app.embedder.entered().await.expect("the first call runs"),
        batch("running")
    );
    let waiting = spawn_post(&app.base, "/v1/embeddings", embed("waiting"));
    until_health(&app.base, "one waiting embedding request", |h| {
        h["embedding_queue"]["waiting"] == 1 && h["embedding_queue"]["running"] == 1
    })
    .await;

    let (status, body) = spawn_post(&app.base, "/v1/embeddings", embed("refused"))
        .await
        .expect("task");
    assert_queue_full(status, &body, "embeddings");
    let (status, body) = spawn_post(
        &app.base,
        VERTEX_PATH,
        json!({ "instances": vec![json!({ "content": "refused too" }); 5] }),
    )
    .await
    .expect("task");
    assert_queue_full(status, &body, "embeddings");
    // The waiting request has not reached the model yet.
    assert_eq!(app.embedder.try_entered(), None);

    app.embedder.allow(1);
    let (status, body) = running.await.expect("task");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        app.embedder.entered().await.expect("the waiter runs next"),
        batch("waiting")
    );
    app.embedder.allow(1);
    assert_eq!(waiting.await.expect("task").0, StatusCode::OK);

    // The Vertex route goes through the same admission and reports the
    // embedder's own token counts.
    let vertex = spawn_post(
        &app.base,
        VERTEX_PATH,
        json!({ "instances": [{ "content": "three word text" }] }),
    );
    app.embedder.entered().await.expect("vertex call");
    app.embedder.allow(1);
    let (status, body) = vertex.await.expect("task");
    assert_eq!(status, StatusCode::OK, "{body}");
    let body: Value = serde_json::from_str(&body).expect("json");
    let stats = &body["predictions"][0]["embeddings"]["statistics"];
    assert_eq!(stats["token_count"], 5, "{body}");
    assert_eq!(stats["truncated"], false, "{body}");
    let health = health(&app.base).await;
    assert_eq!(health["embedding_queue"]["waiting"], 0, "{health}");
    assert_eq!(health["embedding_queue"]["running"], 0, "{health}");
}

/// One figure from the Prometheus text of `/metrics`.
async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(text.contains(&format!("# TYPE {name} ")), "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[actix_web::test]
async fn metrics_show_queue_generations_and_tokens_and_readiness_ends_when_stopping() {
    let mut app = gated_server(&["a", "b"], |_| {}).await;
    assert_eq!(
        metric(&app.base, "duo_local_llm_completion_tokens_total").await,
        0.0
    );
    let (running, queued) = one_running_one_waiting(&mut app, "waiting").await;
    assert_eq!(
        metric(&app.base, "duo_local_llm_generations_in_flight").await,
        1.0
    );
    assert_eq!(
        metric(&app.base, "duo_local_llm_chat_queue_waiting").await,
        1.0
    );
    assert_eq!(
        metric(&app.base, "duo_local_llm_chat_queue_capacity").await,
        16.0
    );

    app.engine.allow(4);
    for pending in [running, queued] {
        let (status, body) = pending.await.expect("request");
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(
        metric(&app.base, "duo_local_llm_generations_in_flight").await,
        0.0
    );
    assert_eq!(
        metric(&app.base, "duo_local_llm_generations_total").await,
        2.0
    );
    assert_eq!(
        metric(&app.base, "duo_local_llm_completion_tokens_total").await,
        4.0
    );
    assert!(metric(&app.base, "duo_local_llm_prompt_tokens_total").await > 0.0);

    let ready = format!("{}/ready", app.base);
    assert_eq!(
        reqwest::get(&ready).await.expect("ready").status(),
        StatusCode::OK
    );
    app.state.begin_stopping();
    let answer = reqwest::get(&ready).await.expect("ready");
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        answer.json::<Value>().await.expect("json")["status"],
        "stopping"
    );
    assert_eq!(metric(&app.base, "duo_local_llm_stopping").await, 1.0);
    // Still alive and serving while it drains.
    assert_eq!(health(&app.base).await["status"], "ok");
}
