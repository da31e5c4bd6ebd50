//! Oversized bodies get 413 with a JSON body on every endpoint that reads
//! one, whether the size is announced (`content-length`) or only found out
//! while reading (chunked).
#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use crate::app_support;

use app_support::{TEST_SCOPES, offline_config, spawn_gateway};
use bytes::Bytes;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const LIMIT: usize = 1024;

const ENDPOINTS: [&str; 3] = [
    "/v2/chat/agent",
    "/v1/prompts/chat/explain_code",
    "/v1/search/gitlab-docs",
];

fn gateway() -> String {
    spawn_gateway(offline_config(&[("AIGW_MAX_REQUEST_BODY_BYTES", "1024")]))
}

/// Valid JSON for any of the endpoints, padded past the limit.
fn oversized() -> String {
    json!({"pad": "x".repeat(LIMIT * 4)}).to_string()
}

async fn reply(response: reqwest::Response) -> (u16, String, Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, content_type, response.json().await.unwrap())
}

#[actix_web::test]
async fn announced_oversized_bodies_are_json_413() {
    let gw = gateway();
    let client = reqwest::Client::new();
    for path in ENDPOINTS {
        let response = client
            .post(format!("{gw}{path}"))
            .header(TEST_SCOPES, "*")
            .header("content-type", "application/json")
            .body(oversized())
            .send()
            .await
            .unwrap();
        assert_eq!(
            reply(response).await,
            (
                413,
                "application/json".to_owned(),
                json!({"detail": "Request body too large"})
            ),
            "{path}"
        );
    }
}

#[actix_web::test]
async fn chunked_oversized_bodies_are_json_413() {
    let gw = gateway();
    let client = reqwest::Client::new();
    for path in ENDPOINTS {
        // Several chunks, none of them too large alone: the limit is only
        // crossed while reading.
        let chunks: Vec<Result<Bytes, std::io::Error>> = oversized()
            .into_bytes()
            .chunks(LIMIT / 2)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let response = client
            .post(format!("{gw}{path}"))
            .header(TEST_SCOPES, "*")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
            .send()
            .await
            .unwrap();
        let (status, _, body) = reply(response).await;
        assert_eq!(
            (status, body),
            (413, json!({"detail": "Request body too large"})),
            "{path}"
        );
    }
}

#[actix_web::test]
async fn bodies_within_the_limit_are_read() {
    let gw = gateway();
    // Not too large, but not valid for the endpoint either: a 422 shows the
    // body was read and handed to validation.
    let response = reqwest::Client::new()
        .post(format!("{gw}/v1/search/gitlab-docs"))
        .header(TEST_SCOPES, "*")
        .body("x".repeat(LIMIT))
        .send()
        .await
        .unwrap();
    let (status, _, body) = reply(response).await;
    assert_eq!(status, 422);
    assert_eq!(body["detail"][0]["loc"], json!(["body"]));
}

#[actix_web::test]
async fn the_caller_is_checked_before_the_body_is_read() {
    let gw = gateway();
    for path in ENDPOINTS {
        let response = reqwest::Client::new()
            .post(format!("{gw}{path}"))
            .body(oversized())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 401, "{path}");
    }
}
