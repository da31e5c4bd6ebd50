//! The HTTP API against a real server with real weights on 127.0.0.1.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::common;

use reqwest::StatusCode;
use serde_json::{Value, json};

const CHAT_MODEL: &str = "smollm2-135m-instruct";
const EMBED_MODEL: &str = "all-minilm-l6-v2";

async fn post(base: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = resp.status();
    (status, resp.json().await.expect("json body"))
}

fn greedy_request(stop: Option<&str>, stream: bool) -> Value {
    let mut body = json!({
        "model": CHAT_MODEL,
        "messages": [
            { "role": "system", "content": "You are a helpful assistant." },
            { "role": "user", "content": "Write one sentence about the sea." }
        ],
        "temperature": 0,
        "max_tokens": 20,
        "stream": stream,
    });
    if let Some(stop) = stop {
        body["stop"] = json!([stop]);
    }
    body
}

fn assert_openai_error(body: &Value, code: &str) {
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    assert_eq!(error["code"], code, "{body}");
}

#[actix_web::test]
async fn generation_is_well_formed_and_stops_at_a_stop_sequence_without_emitting_it() {
    let base = common::start_server(common::test_config()).await;
    let (status, full) = post(&base, "/v1/chat/completions", greedy_request(None, false)).await;
    assert_eq!(status, StatusCode::OK, "{full}");
    assert_eq!(full["object"], "chat.completion");
    assert_eq!(full["choices"][0]["message"]["role"], "assistant");
    let text = full["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();
    assert!(!text.trim().is_empty());
    assert!(!text.contains("<|im_end|>"));
    let usage = &full["usage"];
    assert!(usage["prompt_tokens"].as_u64().expect("prompt tokens") > 10);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap_or(0)
                + usage["completion_tokens"].as_u64().unwrap_or(0)
        )
    );

    // A stop string taken from the middle of the greedy answer: the second run
    // must end right before it, whichever tokens it spans.
    let chars: Vec<char> = text.chars().collect();
    assert!(
        chars.len() >= 12,
        "answer too short to pick a stop from: {text:?}"
    );
    let stop: String = chars[6..10].iter().collect();
    let expected = &text[..text.find(&stop).expect("stop occurs")];
    let (status, stopped) = post(
        &base,
        "/v1/chat/completions",
        greedy_request(Some(&stop), false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stopped["choices"][0]["message"]["content"], expected);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
}

#[actix_web::test]
async fn streaming_sends_sse_chunks_then_done_with_the_same_text() {
    let base = common::start_server(common::test_config()).await;
    let (_, full) = post(&base, "/v1/chat/completions", greedy_request(None, false)).await;
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&greedy_request(None, true))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .expect("header")
            .starts_with("text/event-stream")
    );
    let body = resp.text().await.expect("body");
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert!(events.iter().all(|e| e.starts_with("data: ")), "{body}");
    assert_eq!(events.last().copied(), Some("data: [DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(&e["data: ".len()..]).expect("chunk json"))
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        streamed,
        full["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
    );
    let last = chunks.last().expect("final chunk");
    assert!(last["choices"][0]["finish_reason"].is_string());
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
}

fn cosine(a: &Value, b: &Value) -> f64 {
    let a = a.as_array().expect("vector");
    let b = b.as_array().expect("vector");
    a.iter()
        .zip(b)
        .map(|(x, y)| x.as_f64().unwrap_or(0.0) * y.as_f64().unwrap_or(0.0))
        .sum()
}

#[actix_web::test]
async fn embeddings_are_unit_vectors_that_rank_a_paraphrase_first() {
    let base = common::start_server(common::test_config()).await;
    let input = [
        "How do I reset my password?",
        "What are the steps to change my password?",
        "The recipe needs two cups of flour.",
    ];
    let (status, body) = post(
        &base,
        "/v1/embeddings",
        json!({ "model": EMBED_MODEL, "input": input }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let data = body["data"].as_array().expect("data");
    assert_eq!(data.len(), 3);
    for (i, item) in data.iter().enumerate() {
        assert_eq!(item["index"], i);
        let vector = item["embedding"].as_array().expect("embedding");
        assert_eq!(vector.len(), 384);
        assert!((cosine(&item["embedding"], &item["embedding"]) - 1.0).abs() < 1e-4);
    }
    let paraphrase = cosine(&data[0]["embedding"], &data[1]["embedding"]);
    let unrelated = cosine(&data[0]["embedding"], &data[2]["embedding"]);
    assert!(paraphrase > unrelated + 0.2, "{paraphrase} vs {unrelated}");
    assert!(body["usage"]["prompt_tokens"].as_u64().expect("usage") > 10);
}

#[actix_web::test]
async fn vertex_predict_returns_embedding_values_per_instance() {
    let base = common::start_server(common::test_config()).await;
    let path =
        "/v1/projects/p/locations/us-central1/publishers/google/models/text-embedding-005:predict";
    let (status, body) = post(
        &base,
        path,
        json!({ "instances": [{ "content": "one" }, { "content": "two words" }] }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let predictions = body["predictions"].as_array().expect("predictions");
    assert_eq!(predictions.len(), 2);
    for p in predictions {
        assert_eq!(
            p["embeddings"]["values"].as_array().expect("values").len(),
            384
        );
    }
    let (single, _) = post(
        &base,
        "/v1/embeddings",
        json!({ "model": EMBED_MODEL, "input": "two words" }),
    )
    .await;
    assert_eq!(single, StatusCode::OK);
}

#[actix_web::test]
async fn models_and_health_describe_the_served_models() {
    let base = common::start_server(common::test_config()).await;
    let models: Value = common::get_json(&format!("{base}/v1/models")).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, vec![CHAT_MODEL, EMBED_MODEL]);
    // The chat model's context, as the engine runs it: clients size their
    // prompts by it (the same figure under both names, and in /health).
    let context = models["data"][0]["context_length"].as_u64().unwrap_or(0);
    assert!(context > 0, "{models}");
    assert_eq!(models["data"][0]["max_model_len"], context);
    assert!(models["data"][1].get("context_length").is_none());
    let health: Value = common::get_json(&format!("{base}/health")).await;
    assert_eq!(health["chat_context_tokens"], context);
}

#[actix_web::test]
async fn bad_input_gets_clear_openai_errors() {
    let base = common::start_server(common::test_config()).await;
    let client = reqwest::Client::new();

    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        json!({ "model": CHAT_MODEL, "messages": [] }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_openai_error(&body, "invalid_request");

    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        json!({ "model": "gpt-9", "messages": [{ "role": "user", "content": "hi" }] }),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_openai_error(&body, "model_not_found");

    let (status, body) = post(
        &base,
        "/v1/embeddings",
        json!({ "model": "nope", "input": "x" }),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_openai_error(&body, "model_not_found");

    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_openai_error(&resp.json().await.expect("json"), "invalid_request");

    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        json!({ "model": CHAT_MODEL, "messages": "hi" }),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_openai_error(&body, "invalid_value");

    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        json!({ "model": CHAT_MODEL, "messages": [{ "role": "user", "content": "hi" }], "temperature": 7 }),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_openai_error(&body, "invalid_value");

    for (field, value) in [
        ("dry_multiplier", json!(9)),
        ("dry_multiplier", json!(-1)),
        ("frequency_penalty", json!(3)),
        ("presence_penalty", json!(-2.5)),
    ] {
        let mut body =
            json!({ "model": CHAT_MODEL, "messages": [{ "role": "user", "content": "hi" }] });
        body[field] = value;
        let (status, body) = post(&base, "/v1/chat/completions", body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}");
        assert_openai_error(&body, "invalid_value");
    }

    // Bigger than the body limit.
    let huge = "x".repeat(100 * 1024);
    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        json!({ "model": CHAT_MODEL, "messages": [{ "role": "user", "content": huge }] }),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_openai_error(&body, "input_too_large");

    // Within the body limit but longer than the context window.
    let long = "lorem ipsum dolor sit amet ".repeat(1000);
    let (status, body) = post(
        &base,
        "/v1/chat/completions",
        json!({ "model": CHAT_MODEL, "messages": [{ "role": "user", "content": long }] }),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_openai_error(&body, "input_too_large");

    let (status, body) = post(
        &base,
        "/v1/embeddings",
        json!({ "model": EMBED_MODEL, "input": [] }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_openai_error(&body, "invalid_request");

    let resp = client
        .get(format!("{base}/v2/nothing"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_openai_error(&resp.json().await.expect("json"), "not_found");
}

/// The final chunk's finish reason and the usage chunk's completion tokens of a stream.
async fn stream_outcome(base: &str, mut body: Value) -> (String, String, u64) {
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let text = common::post_text(&format!("{base}/v1/chat/completions"), &body).await;
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk json"))
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let reason = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
        .expect("a finish reason")
        .to_owned();
    let completion_tokens = chunks
        .iter()
        .find_map(|c| c["usage"]["completion_tokens"].as_u64())
        .expect("a usage chunk");
    (content, reason, completion_tokens)
}

#[actix_web::test]
async fn finish_reason_is_length_at_max_tokens_and_stop_at_a_stop_sequence() {
    let base = common::start_server(common::test_config()).await;
    let mut body = greedy_request(None, false);
    body["messages"][1]["content"] = json!("Write a long story about a lighthouse keeper.");
    body["max_tokens"] = json!(3);
    let (status, cut) = post(&base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{cut}");
    assert_eq!(cut["choices"][0]["finish_reason"], "length", "{cut}");
    assert_eq!(cut["usage"]["completion_tokens"], 3, "{cut}");
    let (streamed, reason, tokens) = stream_outcome(&base, body).await;
    assert_eq!(reason, "length");
    assert_eq!(tokens, 3);
    assert_eq!(streamed, cut["choices"][0]["message"]["content"]);

    // A stop string from the greedy answer's second word on ends it early.
    let (_, full) = post(&base, "/v1/chat/completions", greedy_request(None, false)).await;
    let text = full["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let second_word = text.split_whitespace().nth(1).expect("two words");
    let (streamed, reason, _) =
        stream_outcome(&base, greedy_request(Some(second_word), false)).await;
    assert_eq!(reason, "stop");
    assert!(!streamed.contains(second_word), "{streamed:?}");
    assert!(text.starts_with(&streamed), "{streamed:?} vs {text:?}");
}

#[actix_web::test]
async fn greedy_answers_repeat_exactly_even_after_other_requests() {
    let base = common::start_server(common::test_config()).await;
    let answer = |body: Value| {
        let base = base.clone();
        async move {
            let (status, reply) = post(&base, "/v1/chat/completions", body).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            reply["choices"][0]["message"]["content"]
                .as_str()
                .expect("content")
                .to_owned()
        }
    };
    let first = answer(greedy_request(None, false)).await;
    // A different, longer conversation in between must leave nothing behind
    // in the model's state.
    let mut other = greedy_request(None, false);
    other["messages"][1]["content"] =
        json!("List the planets of the solar system in order, with one fact each.");
    other["max_tokens"] = json!(40);
    let between = answer(other).await;
    let second = answer(greedy_request(None, false)).await;
    assert_eq!(first, second);
    assert_ne!(first, between);
}

#[actix_web::test]
async fn sampling_follows_a_given_seed_and_draws_a_fresh_one_otherwise() {
    let base = common::start_server(common::test_config()).await;
    let sampled = |seed: Option<u32>| {
        let base = base.clone();
        async move {
            let mut body = greedy_request(None, false);
            body["temperature"] = json!(1.2);
            body["max_tokens"] = json!(16);
            if let Some(seed) = seed {
                body["seed"] = json!(seed);
            }
            let (status, reply) = post(&base, "/v1/chat/completions", body).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            reply["choices"][0]["message"]["content"]
                .as_str()
                .expect("content")
                .to_owned()
        }
    };
    assert_eq!(sampled(Some(42)).await, sampled(Some(42)).await);
    let mut unseeded = Vec::new();
    for _ in 0..4 {
        unseeded.push(sampled(None).await);
    }
    // Four 16-token samples at temperature 1.2 agreeing would mean a fixed seed.
    assert!(
        unseeded.iter().any(|text| *text != unseeded[0]),
        "{unseeded:?}"
    );
}

#[actix_web::test]
async fn health_reports_the_queues() {
    let base = common::start_server(common::test_config()).await;
    let health: Value = common::get_json(&format!("{base}/health")).await;
    assert_eq!(health["status"], "ok");
    assert_eq!(health["chat_queue"]["capacity"], 4, "{health}");
    assert_eq!(health["chat_queue"]["waiting"], 0, "{health}");
    assert_eq!(health["embedding_queue"]["concurrency"], 1, "{health}");
    assert_eq!(health["embedding_queue"]["capacity"], 16, "{health}");
}

#[test]
fn serving_without_weights_prints_one_line_and_exits_2() {
    let dir = std::env::temp_dir().join(format!("local-llm-no-weights-{}", std::process::id()));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_duo-local-llm"))
        .env("DUO_MODELS_DIR", &dir)
        .env_remove("DUO_LOCAL_LLM_CHAT_MODEL")
        .env_remove("DUO_LOCAL_LLM_EMBED_MODEL")
        .output()
        .expect("run duo-local-llm");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("fetch-models"), "{stderr}");
}

/// The bundled model loops under greedy decoding ("- Code review: ..." until
/// the budget ends); llama.cpp's DRY sampler, asked for by the gateway for
/// plain answers, stops the verbatim repeats, and leaves a request without
/// it exactly as it was.
#[actix_web::test]
async fn the_dry_penalty_stops_verbatim_repeats_and_is_off_unless_asked() {
    let base = common::start_server(common::test_config()).await;
    let ask = |dry: Option<f64>| {
        let mut body = json!({
            "model": CHAT_MODEL,
            "messages": [
                { "role": "system", "content": "You are GitLab Duo Chat, the assistant built into this self-hosted GitLab-compatible service. You help software developers with GitLab, with their projects, and with programming in general. Answer accurately and concisely, in Markdown, and say so when you do not know something." },
                { "role": "user", "content": "What can you do?" }
            ],
            "temperature": 0,
            "max_tokens": 300,
        });
        if let Some(dry) = dry {
            body["dry_multiplier"] = json!(dry);
        }
        body
    };
    let repeats = |text: &str| {
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.len() >= 20)
            .collect();
        lines
            .iter()
            .map(|l| lines.iter().filter(|m| *m == l).count())
            .max()
            .unwrap_or(0)
    };
    let (status, plain) = post(&base, "/v1/chat/completions", ask(None)).await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    let plain = plain["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, off) = post(&base, "/v1/chat/completions", ask(Some(0.0))).await;
    let off = off["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(repeats(&off) >= 3, "a multiplier of 0 is no penalty: {off}");
    let (status, dry) = post(&base, "/v1/chat/completions", ask(Some(0.8))).await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    let dry = dry["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        repeats(&plain) >= 3,
        "the greedy answer no longer loops; pick another prompt: {plain}"
    );
    assert!(repeats(&dry) < 3, "the DRY answer still loops: {dry}");
}
