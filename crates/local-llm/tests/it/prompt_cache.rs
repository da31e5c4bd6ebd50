//! The prompt-prefix cache: a request that shares its start with the
//! previous one reuses that part of the KV cache, and greedy answers are the
//! same as without the cache, one at a time or concurrently.

use crate::common;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

const SYSTEM: &str = "You are GitLab Duo Chat. You help developers with GitLab, their projects and programming. Answer briefly.";

fn conversation(turns: &[&str]) -> Value {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    for (i, text) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": text}));
    }
    json!({
        "model": "smollm2-135m-instruct",
        "messages": messages,
        "temperature": 0,
        "max_tokens": 16,
    })
}

/// The answer's text and its cached prompt tokens.
async fn ask(base: &str, body: &Value) -> (String, u64) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::OK);
    let reply: Value = resp.json().await.expect("json");
    (
        reply["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
            .to_owned(),
        reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached tokens"),
    )
}

fn requests() -> Vec<Value> {
    vec![
        conversation(&["How do I create a branch?"]),
        conversation(&[
            "How do I create a branch?",
            "Use git branch or the web interface.",
            "And how do I delete it?",
        ]),
        conversation(&["What is a merge request?"]),
        conversation(&["Name a CI/CD keyword."]),
    ]
}

#[actix_web::test]
async fn shared_prefixes_hit_the_cache_and_answers_match_the_uncached_server() {
    let mut config = common::test_config();
    // Room for every concurrent request below.
    config.queue_capacity = 16;
    let cached = common::start_server(config).await;
    let mut config = common::test_config();
    config.prompt_cache = false;
    let uncached = common::start_server(config).await;

    let mut expected = Vec::new();
    for body in requests() {
        let (text, hits) = ask(&uncached, &body).await;
        assert_eq!(hits, 0, "the cache is off");
        expected.push(text);
    }

    // One at a time: the follow-up reuses the first conversation's prompt
    // (the system prompt, the first question and more).
    let bodies = requests();
    let (first, _) = ask(&cached, &bodies[0]).await;
    let (second, hits) = ask(&cached, &bodies[1]).await;
    assert_eq!(first, expected[0]);
    assert_eq!(second, expected[1]);
    assert!(hits > 20, "the follow-up reused only {hits} tokens");
    // The same request again reuses all but its last prompt token.
    let (again, hits_again) = ask(&cached, &bodies[1]).await;
    assert_eq!(again, expected[1]);
    assert!(hits_again > hits, "{hits_again} <= {hits}");

    // All at once, twice over, in an order that makes neighbours differ:
    // each answer is still exactly the uncached one.
    let order = [3, 1, 0, 2, 1, 3, 2, 0];
    let answers = join_all(order.iter().map(|&i| {
        let cached = cached.clone();
        let body = bodies[i].clone();
        async move { ask(&cached, &body).await.0 }
    }))
    .await;
    for (answer, &i) in answers.iter().zip(&order) {
        assert_eq!(answer, &expected[i], "request {i}");
    }
}
