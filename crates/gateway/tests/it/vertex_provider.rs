//! Prompts on Vertex AI text models, end to end: `/v1/prompts` → the model
//! router → the fake provider's Vertex AI predict endpoints.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::app_support;
use crate::stream_support;

use app_support::{TEST_SCOPES, offline_config, spawn_gateway};
use fake_provider::FakeProvider;
use gateway::Config;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use std::path::PathBuf;
use stream_support::client;

const PATH: &str = "/v1/projects/duo-test/locations/europe-west4/publishers/google/models";

fn vertex_gateway(fake: &FakeProvider, extra: &[(&str, &str)]) -> String {
    let url = fake.url();
    let mut env = vec![
        ("AIGW_VERTEX_TEXT_MODEL__ENDPOINT", url.as_str()),
        ("AIGW_GOOGLE_CLOUD_PLATFORM__PROJECT", "duo-test"),
        ("AIGW_GOOGLE_CLOUD_PLATFORM__LOCATION", "europe-west4"),
        ("AIGW_GOOGLE_CLOUD_PLATFORM__ACCESS_TOKEN", "gcp-token"),
        ("AIGW_DEFAULT_PROMPTS", r#"{"chat/explain_code": "vertex"}"#),
    ];
    env.extend_from_slice(extra);
    spawn_gateway(offline_config(&env))
}

fn explain(stream: bool) -> Value {
    json!({
        "inputs": {
            "file_content": "fn add(a: i32, b: i32) -> i32 { a + b }",
            "input": "",
            "language_info": "The code is Rust.",
            "selected_text": "a + b",
        },
        "stream": stream,
    })
}

async fn invoke(gw: &str, body: &Value) -> (u16, String) {
    let response = client()
        .post(format!("{gw}/v1/prompts/chat/explain_code"))
        .header(TEST_SCOPES, "explain_code")
        .header(
            crate::app_support::TEST_MODEL_ENDPOINTS,
            crate::app_support::vouched_by(body),
        )
        .json(body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[actix_web::test]
async fn a_one_shot_answer_uses_predict() {
    let fake = FakeProvider::start().await.unwrap();
    fake.set_default_text("It adds two numbers.");
    let gw = vertex_gateway(&fake, &[]);
    let (status, body) = invoke(&gw, &explain(false)).await;
    assert_eq!((status, body.as_str()), (200, "\"It adds two numbers.\""));

    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.path, format!("{PATH}/text-bison@002:predict"));
    assert_eq!(sent.header("authorization"), Some("Bearer gcp-token"));
    let prompt = sent.body["instances"][0]["prompt"].as_str().unwrap();
    assert!(prompt.starts_with("You help a developer"), "{prompt}");
    assert!(
        prompt.contains("<selected_code>\na + b\n</selected_code>"),
        "{prompt}"
    );
    assert_eq!(sent.body["parameters"]["maxOutputTokens"], 1024);
}

#[actix_web::test]
async fn a_streamed_answer_uses_server_streaming_predict() {
    let fake = FakeProvider::start().await.unwrap();
    fake.set_default_text("It adds a and b — nothing more ✓.");
    fake.set_chunk_size(4);
    fake.set_wire_split(Some(5));
    let gw = vertex_gateway(&fake, &[]);
    let (status, body) = invoke(&gw, &explain(true)).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "It adds a and b — nothing more ✓.")
    );
    let sent = &fake.requests()[0];
    assert_eq!(
        sent.path,
        format!("{PATH}/text-bison@002:serverStreamingPredict?alt=sse")
    );
    let prompt = &sent.body["inputs"][0]["structVal"]["prompt"]["stringVal"][0];
    assert!(prompt.as_str().unwrap().contains("a + b"), "{prompt}");
    assert_eq!(
        sent.body["parameters"]["structVal"]["maxOutputTokens"],
        json!({"intVal": [1024]})
    );
}

fn with_model(fake: &FakeProvider, body: &mut Value, model: &str) {
    body["model_metadata"] = json!({
        "name": "vertex",
        "provider": "vertex_ai",
        "endpoint": fake.url(),
        "identifier": model,
    });
}

#[actix_web::test]
async fn overload_is_retried_once_then_421() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = vertex_gateway(&fake, &[("AIGW_CUSTOM_MODELS__ENABLED", "true")]);
    for stream in [false, true] {
        fake.reset();
        let mut body = explain(stream);
        with_model(&fake, &mut body, "fake-overloaded");
        let (status, text) = invoke(&gw, &body).await;
        assert_eq!(status, 421, "stream {stream}");
        let detail: Value = serde_json::from_str(&text).unwrap();
        let detail = detail["detail"].as_str().unwrap();
        assert!(detail.contains("overloaded_error"), "{detail}");
        assert_eq!(fake.requests().len(), 2, "stream {stream}: one retry");
    }
}

#[actix_web::test]
async fn a_refusal_is_421_without_a_retry() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = vertex_gateway(&fake, &[("AIGW_CUSTOM_MODELS__ENABLED", "true")]);
    let mut body = explain(false);
    with_model(&fake, &mut body, "fake-500");
    let (status, text) = invoke(&gw, &body).await;
    assert_eq!(status, 421);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"detail": "500: Internal error"})
    );
    assert_eq!(fake.requests().len(), 1);
}

#[actix_web::test]
async fn an_error_in_the_stream_ends_the_answer() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = vertex_gateway(&fake, &[("AIGW_CUSTOM_MODELS__ENABLED", "true")]);
    let mut body = explain(true);
    with_model(&fake, &mut body, "fake-error-mid-stream");
    let (status, text) = invoke(&gw, &body).await;
    // The first text committed the answer; the error just ends it.
    assert_eq!((status, text.as_str()), (200, "partial answer "));
}

/// A prompt's `params.vertex_location` wins over the configured location.
#[actix_web::test]
async fn a_prompt_can_pick_its_location() {
    let dir = std::env::temp_dir().join(format!("gw-vertex-location-{}", std::process::id()));
    let file = dir.join("chat/explain_code/vertex/1.0.0.yml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(
        &file,
        r#"
name: located
model:
  name: text-bison@002
  params:
    model_class_provider: litellm
    custom_llm_provider: vertex_ai
unit_primitives: [explain_code]
prompt_template:
  user: "Explain {{ selected_text }}"
params:
  vertex_location: asia-northeast1
"#,
    )
    .unwrap();
    let fake = FakeProvider::start().await.unwrap();
    let prompts = dir.display().to_string();
    let gw = vertex_gateway(&fake, &[("AIGW_PROMPTS_DIR", prompts.as_str())]);
    let (status, _) = invoke(&gw, &explain(false)).await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        fake.requests()[0].path,
        "/v1/projects/duo-test/locations/asia-northeast1/publishers/google/models/text-bison@002:predict"
    );
}

#[test]
fn the_shipped_vertex_prompt_is_chosen_by_its_family() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../prompts");
    let registry = gateway::prompts::PromptRegistry::load(&dir).unwrap();
    let definition = registry
        .resolve("chat/explain_code", "vertex", None)
        .unwrap();
    let config = Config::for_tests(&[]).unwrap();
    let target = definition
        .model_target(
            &config.providers,
            None,
            &gateway::providers::EndpointGuard::NOTHING,
        )
        .unwrap();
    assert_eq!(target.kind, gateway::providers::ProviderKind::VertexAi);
    assert_eq!(target.model, "text-bison@002");
    assert_eq!(target.location, None);
}
