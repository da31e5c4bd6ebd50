//! `/v1/embeddings/code_embeddings/{index,search}` over real HTTP against the
//! fake provider's OpenAI-compatible `/embeddings`: shapes, batching, halving
//! a batch the model refuses as too long, retries, and the refusals.

use fake_provider::FakeProvider;
use gateway::Config;
use serde_json::json;

use crate::app_support::{post_json, spawn_gateway};

fn gateway(fake: &FakeProvider, model: &str, batch: &str) -> String {
    let base = fake.openai_base_url();
    spawn_gateway(
        Config::for_tests(&[
            ("OPENAI_BASE_URL", base.as_str()),
            ("AIGW_CODE_EMBEDDINGS__PROVIDER", "openai"),
            ("AIGW_CODE_EMBEDDINGS__MODEL", model),
            ("AIGW_CODE_EMBEDDINGS__BATCH_SIZE", batch),
        ])
        .unwrap(),
    )
}

fn embedding_calls(fake: &FakeProvider) -> Vec<usize> {
    fake.requests()
        .iter()
        .filter(|r| r.path.ends_with("/embeddings"))
        .map(|r| r.body["input"].as_array().unwrap().len())
        .collect()
}

const SCOPE: &str = "generate_embeddings_codebase";

#[actix_web::test]
async fn texts_come_back_as_vectors_in_order_in_batches() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = gateway(&fake, "fake-bow-minilm", "2");
    let contents: Vec<String> = (0..5).map(|i| format!("fn item_{i}() {{}}")).collect();
    let (status, body) = post_json(
        &gw,
        "/v1/embeddings/code_embeddings/index",
        SCOPE,
        &json!({ "contents": contents }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["model"],
        json!({"engine": "openai", "name": "fake-bow-minilm", "identifier": "fake-bow-minilm"})
    );
    let predictions = body["predictions"].as_array().unwrap();
    assert_eq!(predictions.len(), 5);
    for (i, p) in predictions.iter().enumerate() {
        assert_eq!(p["index"], i);
        assert_eq!(p["embedding"].as_array().unwrap().len(), 384);
    }
    assert_eq!(embedding_calls(&fake), vec![2, 2, 1]);
    // The search path answers the same way, and the legacy path too.
    for path in [
        "/v1/embeddings/code_embeddings/search",
        "/v1/embeddings/code_embeddings",
    ] {
        let (status, body) = post_json(
            &gw,
            path,
            SCOPE,
            &json!({ "contents": ["where is the rate limit"] }),
        )
        .await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(body["predictions"].as_array().unwrap().len(), 1);
    }
}

#[actix_web::test]
async fn a_batch_the_model_finds_too_long_is_halved() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = gateway(&fake, "fake-max-batch-2", "8");
    let contents: Vec<String> = (0..7).map(|i| format!("text {i}")).collect();
    let (status, body) = post_json(
        &gw,
        "/v1/embeddings/code_embeddings/index",
        SCOPE,
        &json!({ "contents": contents }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["predictions"].as_array().unwrap().len(), 7);
    // 7 refused → 3 refused → 1, 2 accepted; 4 refused → 2, 2 accepted.
    assert_eq!(embedding_calls(&fake), vec![7, 3, 1, 2, 4, 2, 2]);

    // One text over the limit is the caller's problem, said plainly.
    let gw = gateway(&fake, "fake-max-batch-0", "8");
    let (status, body) = post_json(
        &gw,
        "/v1/embeddings/code_embeddings/index",
        SCOPE,
        &json!({ "contents": ["x"] }),
    )
    .await;
    assert_eq!(
        (status, body),
        (
            400,
            json!({"detail": "an input is too long for the embedding model"})
        )
    );
}

#[actix_web::test]
async fn failures_and_refusals() {
    let fake = FakeProvider::start().await.unwrap();
    let gw = gateway(&fake, "fake-bow", "8");
    let path = "/v1/embeddings/code_embeddings/index";
    let (status, body) = post_json(&gw, path, "duo_chat", &json!({ "contents": ["x"] })).await;
    assert_eq!(
        (status, body),
        (
            403,
            json!({"detail": "Unauthorized to access generate_embeddings_codebase"})
        )
    );
    for bad in [
        json!({}),
        json!({ "contents": [] }),
        json!({ "contents": ["  "] }),
        json!({ "contents": "x" }),
    ] {
        let (status, _) = post_json(&gw, path, SCOPE, &bad.clone()).await;
        assert_eq!(status, 422, "{bad}");
    }
    let too_many: Vec<String> = (0..1001).map(|i| i.to_string()).collect();
    let (status, _) = post_json(&gw, path, SCOPE, &json!({ "contents": too_many })).await;
    assert_eq!(status, 422);

    // A failing model is retried once, then reported.
    fake.reset();
    fake.set_embeddings_failing(true);
    let (status, _) = post_json(&gw, path, SCOPE, &json!({ "contents": ["x"] })).await;
    assert_eq!(status, 421);
    assert_eq!(embedding_calls(&fake).len(), 2);
    fake.set_embeddings_failing(false);
    let (status, _) = post_json(&gw, path, SCOPE, &json!({ "contents": ["x"] })).await;
    assert_eq!(status, 200);

    let rate_limited = gateway(&fake, "fake-overloaded", "8");
    let (status, _) = post_json(&rate_limited, path, SCOPE, &json!({ "contents": ["x"] })).await;
    assert_eq!(status, 429);
}
