//! The proxies over real HTTP against an upstream stub.
#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use crate::app_support;

use app_support::{TEST_SCOPES, closed_port_url, spawn_gateway, spawn_upstream};
use futures::StreamExt;
use gateway::Config;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const MESSAGES: &str = "/v1/proxy/anthropic/v1/messages";
const VERTEX_EMBED: &str = "/v1/proxy/vertex-ai/v1/projects/theirs/locations/there/publishers/google/models/text-embedding-005:predict";

fn config(upstream: &str, extra: &[(&str, &str)]) -> Config {
    let mut vars = vec![
        ("ANTHROPIC_API_KEY", "test-anthropic-key"),
        ("ANTHROPIC_BASE_URL", upstream),
        ("AIGW_VERTEX_TEXT_MODEL__ENDPOINT", upstream),
        ("AIGW_GOOGLE_CLOUD_PLATFORM__PROJECT", "our-project"),
        ("AIGW_GOOGLE_CLOUD_PLATFORM__LOCATION", "our-location"),
        ("AIGW_GOOGLE_CLOUD_PLATFORM__ACCESS_TOKEN", "gcp-token"),
        ("AIGW_MAX_REQUEST_BODY_BYTES", "4096"),
    ];
    vars.extend_from_slice(extra);
    Config::for_tests(&vars).unwrap()
}

fn claude(extra: Value) -> Value {
    let mut body = json!({"model": "claude-3-5-sonnet-20241022", "max_tokens": 10, "messages": []});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

async fn post(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn as_chat(up: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("x-gitlab-unit-primitive", up),
        (
            TEST_SCOPES,
            "duo_chat,explain_code,generate_embeddings_codebase,complete_code",
        ),
    ]
}

#[actix_web::test]
async fn header_checks_come_first_and_in_order() {
    let upstream = spawn_upstream();
    let gw = spawn_gateway(config(&upstream.url, &[]));
    let body = claude(json!({})).to_string();
    type Case<'a> = (Vec<(&'a str, &'a str)>, u16, Value);
    let cases: Vec<Case> = vec![
        (
            vec![(TEST_SCOPES, "duo_chat")],
            400,
            json!({"detail": "Missing x-gitlab-unit-primitive header"}),
        ),
        (
            vec![
                ("x-gitlab-unit-primitive", "duo_chatt"),
                (TEST_SCOPES, "duo_chat"),
            ],
            400,
            json!({"detail": "Unknown unit primitive header duo_chatt"}),
        ),
        (
            vec![
                ("x-gitlab-unit-primitive", "explain_code"),
                (TEST_SCOPES, "duo_chat"),
            ],
            403,
            json!({"detail": "Unauthorized to access explain_code"}),
        ),
        (
            as_chat("generate_embeddings_codebase"),
            400,
            json!({"detail": "This endpoint cannot be used for generate_embeddings_codebase purpose"}),
        ),
        (
            vec![("x-gitlab-unit-primitive", "duo_chat")],
            401,
            json!({"error": "No authorization header presented"}),
        ),
    ];
    for (headers, status, expected) in cases {
        assert_eq!(
            post(&gw, MESSAGES, &headers, body.clone()).await,
            (status, expected),
            "{headers:?}"
        );
    }
    assert!(upstream.requests().is_empty());
}

#[actix_web::test]
async fn anthropic_body_path_and_model_errors() {
    let upstream = spawn_upstream();
    let gw = spawn_gateway(config(&upstream.url, &[]));
    let h = as_chat("duo_chat");
    let cases = vec![
        (MESSAGES, "{not json".to_owned(), 400, "Invalid JSON"),
        (
            "/v1/proxy/anthropic/v1/models",
            claude(json!({})).to_string(),
            404,
            "Not found",
        ),
        (
            "/v1/proxy/anthropic/v1/%2E%2E/admin",
            claude(json!({})).to_string(),
            404,
            "Not found",
        ),
        (
            MESSAGES,
            json!({"messages": []}).to_string(),
            400,
            "Failed to extract model name",
        ),
        (
            MESSAGES,
            claude(json!({"model": "gpt-4o"})).to_string(),
            400,
            "Unsupported model",
        ),
    ];
    for (path, body, status, detail) in cases {
        assert_eq!(
            post(&gw, path, &h, body).await,
            (status, json!({ "detail": detail })),
            "{path}"
        );
    }
    assert!(upstream.requests().is_empty());

    let no_key =
        spawn_gateway(Config::for_tests(&[("ANTHROPIC_BASE_URL", upstream.url.as_str())]).unwrap());
    assert_eq!(
        post(&no_key, MESSAGES, &h, claude(json!({})).to_string()).await,
        (400, json!({"detail": "API key not found"}))
    );
}

#[actix_web::test]
async fn anthropic_headers_are_filtered_both_ways_and_status_passes_through() {
    let upstream = spawn_upstream();
    let gw = spawn_gateway(config(&upstream.url, &[]));
    let resp = reqwest::Client::new()
        .post(format!("{gw}{MESSAGES}"))
        .header("x-gitlab-unit-primitive", "duo_chat")
        .header(TEST_SCOPES, "duo_chat")
        .header("accept", "application/json")
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("authorization", "Bearer caller-token")
        .header("cookie", "session=1")
        .header("x-api-key", "caller-supplied")
        .body(claude(json!({"stub_status": 429})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().get("x-upstream-secret").is_none());
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["target"], "/v1/messages");
    assert_eq!(body["echo"]["stub_status"], 429);

    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    let mut names: Vec<&str> = seen[0].headers.keys().map(String::as_str).collect();
    // Transport headers reqwest adds itself are not ours to filter.
    names.retain(|n| !matches!(*n, "host" | "content-length"));
    assert_eq!(
        names,
        ["accept", "anthropic-version", "content-type", "x-api-key"]
    );
    assert_eq!(seen[0].headers["x-api-key"], "test-anthropic-key");
}

#[actix_web::test]
async fn vertex_paths_are_rewritten_with_our_project_and_token() {
    let upstream = spawn_upstream();
    let gw = spawn_gateway(config(&upstream.url, &[]));
    let (status, body) = post(
        &gw,
        VERTEX_EMBED,
        &[
            ("x-gitlab-unit-primitive", "generate_embeddings_codebase"),
            (TEST_SCOPES, "generate_embeddings_codebase"),
            ("content-type", "application/json"),
            ("authorization", "Bearer caller-token"),
        ],
        json!({"instances": [{"content": "fn main() {}"}]}).to_string(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body["target"],
        "/v1/projects/our-project/locations/our-location/publishers/google/models/text-embedding-005:predict"
    );
    let seen = upstream.requests();
    assert_eq!(seen[0].headers["authorization"], "Bearer gcp-token");
    assert_eq!(seen[0].headers["content-type"], "application/json");
}

#[actix_web::test]
async fn vertex_path_and_model_errors() {
    let upstream = spawn_upstream();
    let gw = spawn_gateway(config(&upstream.url, &[]));
    let h = as_chat("complete_code");
    let body = json!({"instances": []}).to_string();
    let base = "/v1/proxy/vertex-ai/v1/projects/p/locations/l/publishers/google/models";
    for (path, status, detail) in [
        (
            format!("{base}/gemini-pro:predict"),
            400,
            "Unsupported model",
        ),
        (
            format!("{base}/code-gecko@002:generateContent"),
            404,
            "Not found",
        ),
        (
            format!("{base}/..%2F..%2Fcode-gecko:predict"),
            404,
            "Not found",
        ),
        ("/v1/proxy/vertex-ai/v1/models".to_owned(), 404, "Not found"),
    ] {
        assert_eq!(
            post(&gw, &path, &h, body.clone()).await,
            (status, json!({ "detail": detail })),
            "{path}"
        );
    }
    assert!(upstream.requests().is_empty());
}

/// Reads the first chunk through the gateway while the upstream is still
/// holding back the rest, then lets it finish.
async fn first_bytes_arrive_before_upstream_finishes(path: &str, up: &'static str, body: String) {
    let upstream = spawn_upstream();
    let gw = spawn_gateway(config(&upstream.url, &[]));
    let resp = reqwest::Client::new()
        .post(format!("{gw}{path}"))
        .header("x-gitlab-unit-primitive", up)
        .header(TEST_SCOPES, up)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(&first[..], b"data: first\n\n");
    upstream.release();
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(rest, b"data: second\n\n");
}

#[actix_web::test]
async fn anthropic_streams_without_buffering() {
    first_bytes_arrive_before_upstream_finishes(
        MESSAGES,
        "duo_chat",
        claude(json!({"stream": true})).to_string(),
    )
    .await;
}

#[actix_web::test]
async fn vertex_streams_without_buffering() {
    first_bytes_arrive_before_upstream_finishes(
        "/v1/proxy/vertex-ai/v1/projects/p/locations/l/publishers/google/models/code-gecko@002:serverStreamingPredict?alt=sse",
        "complete_code",
        json!({"instances": []}).to_string(),
    )
    .await;
}

#[actix_web::test]
async fn unreachable_upstream_is_bad_gateway() {
    let gw = spawn_gateway(config(&closed_port_url(), &[]));
    assert_eq!(
        post(
            &gw,
            MESSAGES,
            &as_chat("duo_chat"),
            claude(json!({})).to_string()
        )
        .await,
        (502, json!({"detail": "Bad Gateway"}))
    );
    assert_eq!(
        post(
            &gw,
            VERTEX_EMBED,
            &as_chat("generate_embeddings_codebase"),
            "{}"
        )
        .await,
        (502, json!({"detail": "Bad Gateway"}))
    );
}

#[actix_web::test]
async fn mock_mode_answers_without_calling_upstream() {
    let upstream = spawn_upstream();
    let gw = spawn_gateway(config(
        &upstream.url,
        &[("AIGW_MOCK_MODEL_RESPONSES", "true")],
    ));
    assert_eq!(
        post(
            &gw,
            MESSAGES,
            &as_chat("duo_chat"),
            claude(json!({})).to_string()
        )
        .await,
        (200, json!({"response": "mocked"}))
    );
    assert!(upstream.requests().is_empty());
}

#[actix_web::test]
async fn oversized_bodies_are_refused() {
    let upstream = spawn_upstream();
    let gw = spawn_gateway(config(&upstream.url, &[]));
    let big = claude(json!({"padding": "x".repeat(5000)})).to_string();
    assert_eq!(
        post(&gw, MESSAGES, &as_chat("duo_chat"), big).await,
        (413, json!({"detail": "Request body too large"}))
    );
    assert!(upstream.requests().is_empty());
}

/// A provider that answers with a redirect to another address: the proxy
/// passes the redirect back and never follows it, so the credentials it adds
/// (`x-api-key`) reach no one else; a model call behind a prompt does not
/// follow it either.
#[actix_web::test]
async fn provider_redirects_are_never_followed_with_our_credentials() {
    let elsewhere = spawn_upstream();
    let port = elsewhere.url.rsplit(':').next().unwrap().to_owned();
    let provider = spawn_upstream();
    let redirecting = format!("{}/redirect/{port}", provider.url);
    let gw = spawn_gateway(config(&redirecting, &[]));

    let (status, _) = post(
        &gw,
        MESSAGES,
        &as_chat("duo_chat"),
        claude(json!({})).to_string(),
    )
    .await;
    assert_eq!(status, 307, "the redirect goes back to the caller as it is");

    let resp = reqwest::Client::new()
        .post(format!("{gw}/v1/prompts/chat/explain_code"))
        .header("x-gitlab-unit-primitive", "explain_code")
        .header(TEST_SCOPES, "explain_code")
        .json(&json!({"inputs": {"selected_text": "fn main() {}", "file_content": "fn main() {}", "language_info": "The code is written in Rust.", "input": ""}}))
        .send()
        .await
        .unwrap();
    assert!(!resp.status().is_success(), "{}", resp.status());

    let asked = provider.requests();
    assert_eq!(asked.len(), 2, "both calls reached the provider");
    assert!(
        asked
            .iter()
            .all(|r| r.headers["x-api-key"] == "test-anthropic-key")
    );
    assert_eq!(
        elsewhere.requests().len(),
        0,
        "nothing was sent where the provider pointed"
    );
}
