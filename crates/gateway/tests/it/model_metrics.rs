//! What the gateway measures about itself, scraped from `/metrics` after
//! real calls to the fake provider: model-call metrics with their labels, and
//! the gateway's own overhead, which must leave out time spent waiting on
//! the model even when the answer is streamed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::app_support;
use crate::stream_support;

use app_support::TEST_SCOPES;
use fake_provider::FakeProvider;
use serde_json::{Value, json};
use std::time::Duration;
use stream_support::{Wire, agent, client, metric, question, scrape};

const MODEL: &str = "claude-3-5-sonnet-20241022";
/// How long the fake waits before its first byte; overheads are compared
/// with half of it, far above what the gateway itself takes.
const FIRST_TOKEN_DELAY: Duration = Duration::from_millis(600);

fn explain_code(stream: bool) -> Value {
    json!({
        "inputs": {
            "file_content": "fn main() {}",
            "input": "",
            "language_info": "Rust",
            "selected_text": "fn main() {}",
        },
        "stream": stream,
    })
}

async fn seconds_header(response: &reqwest::Response, name: &str) -> f64 {
    response.headers()[name].to_str().unwrap().parse().unwrap()
}

#[actix_web::test]
async fn model_calls_are_counted_with_engine_model_and_feature_category() {
    let fake = FakeProvider::start().await.unwrap();
    fake.set_default_text("Final Answer: fine");
    let gw = Wire::Anthropic.gateway(
        &fake,
        &[(
            "AIGW_MODEL_ENGINE_CONCURRENCY_LIMITS",
            r#"{"anthropic": {"claude-3-5-sonnet-20241022": 7}}"#,
        )],
    );
    agent(&gw, "duo_chat", &question("q")).await.rest().await;
    let response = client()
        .post(format!("{gw}/v1/prompts/chat/explain_code"))
        .header(TEST_SCOPES, "explain_code")
        .header(
            crate::app_support::TEST_MODEL_ENDPOINTS,
            crate::app_support::vouched_by(&explain_code(false)),
        )
        .json(&explain_code(false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);

    let samples = scrape(&gw).await;
    let model = [("model_engine", "anthropic"), ("model_name", MODEL)];
    for category in ["duo_chat", "ai_abstraction_layer"] {
        let labels = [
            model[0],
            model[1],
            ("error", "no"),
            ("streaming", "yes"),
            ("feature_category", category),
        ];
        assert_eq!(
            metric(&samples, "model_inferences_total", &labels),
            1.0,
            "{category}"
        );
        assert_eq!(
            metric(
                &samples,
                "inference_request_duration_seconds_count",
                &labels
            ),
            1.0,
            "{category}"
        );
    }
    assert_eq!(
        metric(&samples, "model_inferences_max_concurrent", &model),
        7.0
    );
    assert_eq!(metric(&samples, "model_inferences_in_flight", &model), 0.0);
}

#[actix_web::test]
async fn failed_model_calls_are_counted_as_errors() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::OpenAi.gateway(&fake, &[]);
    let mut body = question("q");
    body["model_metadata"] = Wire::OpenAi.metadata(&fake, "fake-500");
    agent(&gw, "duo_chat", &body).await.rest().await;
    let samples = scrape(&gw).await;
    let labels = [
        ("model_engine", "openai_compatible"),
        ("model_name", "fake-500"),
        ("error", "yes"),
        ("feature_category", "duo_chat"),
    ];
    assert_eq!(metric(&samples, "model_inferences_total", &labels), 1.0);
}

#[actix_web::test]
async fn proxied_calls_are_counted_too() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = Wire::Anthropic.gateway(&fake, &[("AIGW_VERTEX_TEXT_MODEL__ENDPOINT", &fake.url())]);
    let response = client()
        .post(format!(
            "{gw}/v1/proxy/vertex-ai/v1/projects/p/locations/l/publishers/google/models/text-bison:predict"
        ))
        .header(TEST_SCOPES, "explain_code")
        .header("x-gitlab-unit-primitive", "explain_code")
        .json(&json!({"instances": [{"prompt": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let samples = scrape(&gw).await;
    let labels = [
        ("model_engine", "vertex_ai"),
        ("model_name", "text-bison"),
        ("error", "no"),
        ("streaming", "no"),
        ("feature_category", "explain_code"),
    ];
    assert_eq!(metric(&samples, "model_inferences_total", &labels), 1.0);
}

#[actix_web::test]
async fn a_streamed_prompt_answer_does_not_count_the_first_token_wait_as_overhead() {
    let fake = FakeProvider::start().await.unwrap();
    fake.set_slow_first_token_delay(FIRST_TOKEN_DELAY);
    let gw = Wire::Anthropic.gateway(&fake, &[]);
    let mut body = explain_code(true);
    body["model_metadata"] = Wire::Anthropic.metadata(&fake, "fake-slow-first-token");
    let before = scrape(&gw).await;
    let response = client()
        .post(format!("{gw}/v1/prompts/chat/explain_code"))
        .header(TEST_SCOPES, "explain_code")
        .header(
            crate::app_support::TEST_MODEL_ENDPOINTS,
            crate::app_support::vouched_by(&body),
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    // The head waits for the first token, which took the injected delay...
    let process = seconds_header(&response, "x-process-time").await;
    assert!(process >= FIRST_TOKEN_DELAY.as_secs_f64(), "{process}");
    // ...but that was the model's time, not the gateway's.
    let overhead = seconds_header(&response, "x-gateway-overhead-time").await;
    assert!(
        overhead < FIRST_TOKEN_DELAY.as_secs_f64() / 2.0,
        "{overhead}"
    );
    assert!(!response.text().await.unwrap().is_empty());

    let after = scrape(&gw).await;
    let handler = [("handler", "/v1/prompts/{prompt_id:.*}")];
    let grew = |name| metric(&after, name, &handler) - metric(&before, name, &handler);
    let total = grew("http_request_duration_seconds_sum");
    let own = grew("gateway_overhead_seconds_sum");
    assert!(total >= FIRST_TOKEN_DELAY.as_secs_f64(), "{total}");
    assert!(own < FIRST_TOKEN_DELAY.as_secs_f64() / 2.0, "{own}");
}

#[actix_web::test]
async fn a_streamed_agent_answer_is_measured_to_its_end() {
    // The ReAct step calls the model through the router, the native step
    // through the tool-calling client: both count their waits as the model's.
    for (wire, family) in [(Wire::Anthropic, "base"), (Wire::OpenAi, "native")] {
        let fake = FakeProvider::start().await.unwrap();
        fake.set_slow_first_token_delay(FIRST_TOKEN_DELAY);
        fake.set_default_text("Final Answer: slow but sure");
        let gw = wire.gateway(&fake, &[]);
        let mut body = question("q");
        body["model_metadata"] = wire.metadata(&fake, "fake-slow-first-token");
        body["model_metadata"]["name"] = family.into();
        let before = scrape(&gw).await;
        let lines = agent(&gw, "duo_chat", &body).await.rest().await;
        assert!(!lines.is_empty(), "{wire:?}");

        let after = scrape(&gw).await;
        let handler = [("handler", "/v2/chat/agent")];
        let grew = |name| metric(&after, name, &handler) - metric(&before, name, &handler);
        // The head waits for the first event; the metrics cover the whole
        // stream, model wait included in the duration only.
        let total = grew("http_request_duration_seconds_sum");
        let own = grew("gateway_overhead_seconds_sum");
        assert_eq!(grew("gateway_overhead_seconds_count"), 1.0, "{wire:?}");
        assert!(
            total >= FIRST_TOKEN_DELAY.as_secs_f64(),
            "{wire:?}: {total}"
        );
        assert!(
            own < FIRST_TOKEN_DELAY.as_secs_f64() / 2.0,
            "{wire:?}: {own}"
        );
    }
}
