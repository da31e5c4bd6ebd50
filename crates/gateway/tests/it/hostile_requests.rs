//! Hostile agent and prompt requests: refused at the schema's limits while the
//! body is parsed (422 in FastAPI's shape, before any rendering), the largest
//! allowed request built in time linear in its size, off the async workers (the
//! health check stays fast meanwhile), and memory proportional to what the
//! provider is sent.
//!
//! Memory is read from this test process's own peak RSS (`VmHWM`): nextest runs
//! every test in a process of its own, so the peak belongs to this test alone.
#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use crate::app_support;
use crate::stream_support;

use std::time::{Duration, Instant};

use app_support::TEST_SCOPES;
use contracts::limits;
use fake_provider::FakeProvider;
use serde_json::{Value, json};
use stream_support::{Wire, client};

fn peak_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap()
}

async fn post(gw: &str, path: &str, body: String) -> (u16, Value, Duration) {
    let started = Instant::now();
    let response = client()
        .post(format!("{gw}{path}"))
        .header(TEST_SCOPES, "*")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let elapsed = started.elapsed();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        elapsed,
    )
}

fn detail_msg(body: &Value) -> String {
    body["detail"][0]["msg"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Alternating user and assistant turns, ending with a user question.
fn turns(n: usize, text: &str) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let role = if (n - i) % 2 == 1 {
                "user"
            } else {
                "assistant"
            };
            json!({ "role": role, "content": text })
        })
        .collect()
}

#[actix_web::test]
async fn requests_past_the_schema_limits_are_refused_while_parsing() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::Anthropic.gateway(&fake, &[]);

    // The case: 2,000 turns with a 2,000-step scratchpad.
    let steps: Vec<Value> = (0..2_000)
        .map(|i| json!({ "thought": "t", "tool": "issue_reader", "tool_input": i.to_string(), "observation": "o" }))
        .collect();
    let body = json!({
        "messages": turns(2_001, "hi"),
        "options": { "agent_scratchpad": { "agent_type": "react", "steps": steps } },
    });
    let (status, reply, elapsed) = post(&gw, "/v2/chat/agent", body.to_string()).await;
    assert_eq!(status, 422, "{reply}");
    assert!(
        detail_msg(&reply).contains(&format!("at most {} items", limits::MAX_MESSAGES)),
        "{reply}"
    );
    assert!(elapsed < Duration::from_millis(500), "{elapsed:?}");

    let steps_only = json!({
        "messages": [{ "role": "user", "content": "q" }],
        "options": { "agent_scratchpad": { "steps": (0..limits::MAX_SCRATCHPAD_STEPS + 1).map(|_| json!({})).collect::<Vec<_>>() } },
    });
    let (status, reply, _) = post(&gw, "/v2/chat/agent", steps_only.to_string()).await;
    assert_eq!(status, 422);
    assert!(detail_msg(&reply).contains("at most 50 items"), "{reply}");

    // 100,000 additional-context items (about 4.9 MB): refused at item 101.
    let items: Vec<Value> = (0..100_000)
        .map(|i| json!({ "category": "file", "id": format!("f{i}"), "content": "x" }))
        .collect();
    let body =
        json!({ "messages": [{ "role": "user", "content": "q", "additional_context": items }] });
    let text = body.to_string();
    assert!(text.len() > 4_000_000);
    let before = peak_rss_kb();
    let (status, reply, elapsed) = post(&gw, "/v2/chat/agent", text).await;
    assert_eq!(status, 422, "{reply}");
    assert!(detail_msg(&reply).contains("at most 100 items"), "{reply}");
    assert!(elapsed < Duration::from_millis(500), "{elapsed:?}");
    // The body itself is held once (and once by the test's own copy of it).
    let grown_mb = (peak_rss_kb().saturating_sub(before)) / 1024;
    assert!(grown_mb < 40, "peak RSS grew by {grown_mb} MB");

    // One huge string past its field's limit.
    let body = json!({ "messages": [{ "role": "user", "content": "x".repeat(limits::MAX_MESSAGE_CONTENT + 1) }] });
    let (status, reply, _) = post(&gw, "/v2/chat/agent", body.to_string()).await;
    assert_eq!(status, 422);
    assert!(
        detail_msg(&reply).contains("at most 400000 characters"),
        "{reply}"
    );

    // Within every field's limit, but more text in all than a prompt may hold.
    let big = "y".repeat(380_000);
    let body = json!({ "messages": (0..13).map(|i| json!({ "role": if i % 2 == 0 { "user" } else { "assistant" }, "content": big })).collect::<Vec<_>>() });
    let (status, reply, _) = post(&gw, "/v2/chat/agent", body.to_string()).await;
    assert_eq!(status, 422, "{reply}");
    assert!(
        detail_msg(&reply).contains("AIGW_MAX_PROMPT_BYTES"),
        "{reply}"
    );

    // Prompt invocations: too many inputs, too much text.
    let inputs: serde_json::Map<String, Value> = (0..limits::MAX_PROMPT_INPUTS + 1)
        .map(|i| (format!("k{i}"), json!("v")))
        .collect();
    let (status, reply, _) = post(
        &gw,
        "/v1/prompts/chat/explain_code",
        json!({ "inputs": inputs }).to_string(),
    )
    .await;
    assert_eq!(status, 422, "{reply}");
    assert!(detail_msg(&reply).contains("at most 64 keys"), "{reply}");
    let (status, reply, _) = post(
        &gw,
        "/v1/prompts/chat/explain_code",
        json!({ "inputs": { "code": "z".repeat(5 * 1024 * 1024) } }).to_string(),
    )
    .await;
    assert_eq!(status, 422, "{reply}");
    assert!(
        detail_msg(&reply).contains("AIGW_MAX_PROMPT_BYTES"),
        "{reply}"
    );
}

/// The largest request the limits allow: the most turns, the most steps, and
/// enough text to fill most of the prompt limit.
fn largest_allowed() -> Value {
    let text = "w".repeat(9_000);
    let steps: Vec<Value> = (0..limits::MAX_SCRATCHPAD_STEPS)
        .map(|i| json!({ "thought": "thinking", "tool": "issue_reader", "tool_input": i.to_string(), "observation": "o".repeat(10_000) }))
        .collect();
    json!({
        "messages": turns(limits::MAX_MESSAGES - 1, &text),
        "options": { "agent_scratchpad": { "agent_type": "react", "steps": steps } },
    })
}

#[actix_web::test]
async fn the_largest_allowed_request_is_prepared_in_linear_time_off_the_workers() {
    let fake = FakeProvider::start().await.unwrap();
    fake.set_default_text("Thought: ok\nFinal Answer: done");
    let gw = Wire::Anthropic.gateway(&fake, &[]);
    let body = largest_allowed().to_string();
    assert!(body.len() > 2_000_000, "{} bytes", body.len());

    // Warm up (prompt templates compiled, connections open).
    let (status, _, _) = post(&gw, "/v2/chat/agent", body.clone()).await;
    assert_eq!(status, 200);

    let before = peak_rss_kb();
    let started = Instant::now();
    let (status, reply, _) = post(&gw, "/v2/chat/agent", body.clone()).await;
    let elapsed = started.elapsed();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["type"], "final_answer_delta", "{reply}");
    // Linear work: well under a second for ~2.5 MB (quadratic work took 4 s
    // for a tenth of the turns).
    assert!(elapsed < Duration::from_millis(800), "{elapsed:?}");
    let grown_mb = peak_rss_kb().saturating_sub(before) / 1024;
    assert!(grown_mb < 50, "peak RSS grew by {grown_mb} MB");

    // Two such requests at once: the health check still answers at once.
    let pair_started = Instant::now();
    let a = tokio::spawn(post_owned(gw.clone(), body.clone()));
    let b = tokio::spawn(post_owned(gw.clone(), body.clone()));
    let mut slowest = Duration::ZERO;
    while !(a.is_finished() && b.is_finished()) {
        let started = Instant::now();
        let ok = client()
            .get(format!("{gw}/monitoring/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .is_success();
        assert!(ok);
        slowest = slowest.max(started.elapsed());
    }
    assert_eq!(a.await.unwrap(), 200);
    assert_eq!(b.await.unwrap(), 200);
    let pair = pair_started.elapsed();
    // Blocked behind the preparation, a health check would wait about as
    // long as the two requests took; off the workers it stays well under
    // that, whatever else loads the machine (the bound scales with how slow
    // the machine is right now).
    let bound = Duration::from_millis(250).max(pair * 3 / 4);
    assert!(
        slowest < bound,
        "healthz took {slowest:?} (bound {bound:?}, the two requests {pair:?}, one alone {elapsed:?})"
    );
}

async fn post_owned(gw: String, body: String) -> u16 {
    post(&gw, "/v2/chat/agent", body).await.0
}
