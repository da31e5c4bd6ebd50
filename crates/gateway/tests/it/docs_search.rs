//! `POST /v1/search/gitlab-docs` over real HTTP, indexing the project's own
//! `docs/` directory.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on bad fixtures"
)]

use crate::app_support;

use app_support::{offline_config, post_json, spawn_gateway};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use std::path::PathBuf;

const PATH: &str = "/v1/search/gitlab-docs";

fn docs_dir() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .display()
        .to_string()
}

fn gateway_with(extra: &[(&str, &str)]) -> String {
    let docs = docs_dir();
    let mut env = vec![("AIGW_DOCS__DIR", docs.as_str())];
    env.extend_from_slice(extra);
    spawn_gateway(offline_config(&env))
}

async fn post(gw: &str, scopes: &str, body: Value) -> (u16, Value) {
    post_json(gw, PATH, scopes, &body).await
}

fn search(query: &str) -> Value {
    json!({
        "type": "search-docs",
        "metadata": {"source": "GitLab EE", "version": "17.5.0"},
        "payload": {"query": query}
    })
}

#[actix_web::test]
async fn an_error_code_finds_its_section() {
    let gw = gateway_with(&[]);
    let (status, body) = post(
        &gw,
        "documentation_search",
        search("What does error A1005 mean?"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let first = &body["response"]["results"][0];
    assert_eq!(first["id"], "docs/error-codes.md#error-a1005");
    assert_eq!(
        first["metadata"]["source_url"],
        "docs/error-codes.md#error-a1005"
    );
    assert_eq!(first["metadata"]["title"], "Duo Chat error codes");
    assert!(
        first["content"]
            .as_str()
            .unwrap()
            .starts_with("## Error A1005")
    );
    assert_eq!(body["metadata"]["provider"], "tantivy");
    assert!(body["response"]["results"].as_array().unwrap().len() <= 4);
}

#[actix_web::test]
async fn a_configuration_question_finds_the_configuration_page() {
    let gw = gateway_with(&[("AIGW_DOCS__BASE_URL", "http://gitlab.example/")]);
    let (status, body) = post(
        &gw,
        "documentation_search",
        search("which variable sets the gateway port"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let sources: Vec<&str> = body["response"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["metadata"]["source_url"].as_str().unwrap())
        .collect();
    assert!(
        sources.contains(&"http://gitlab.example/docs/configuration.md"),
        "{sources:?}"
    );
}

#[actix_web::test]
async fn page_size_is_honoured_and_capped() {
    let gw = gateway_with(&[]);
    let mut body = search("error code remedy");
    body["payload"]["page_size"] = json!(2);
    let (_, two) = post(&gw, "documentation_search", body.clone()).await;
    assert_eq!(two["response"]["results"].as_array().unwrap().len(), 2);
    body["payload"]["page_size"] = json!(20);
    let (_, many) = post(&gw, "documentation_search", body).await;
    assert_eq!(
        many["response"]["results"].as_array().unwrap().len(),
        gateway::docs_search::MAX_RESULTS
    );
}

#[actix_web::test]
async fn no_match_is_an_empty_result() {
    let gw = gateway_with(&[]);
    let (status, body) = post(&gw, "documentation_search", search("xylophonist")).await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["results"], json!([]));
}

#[actix_web::test]
async fn without_the_unit_primitive_the_answer_is_403() {
    let gw = gateway_with(&[]);
    let (status, body) = post(&gw, "duo_chat", search("error codes")).await;
    assert_eq!(status, 403);
    assert_eq!(
        body,
        json!({"detail": "Unauthorized to access documentation_search"})
    );
}

#[actix_web::test]
async fn bad_bodies_are_422() {
    let gw = gateway_with(&[]);
    for bad in [
        search(""),
        search("   "),
        search(&"word ".repeat(300)),
        json!({"type": "search-docs", "payload": {}}),
        json!({"type": "search-docs", "payload": {"query": "x", "page_size": 0}}),
        json!({"type": "search-docs", "payload": {"query": "x", "page_size": 21}}),
        json!("not an object"),
    ] {
        let (status, body) = post(&gw, "documentation_search", bad.clone()).await;
        assert_eq!(status, 422, "{bad} -> {body}");
        assert!(body["detail"].is_array(), "{body}");
    }
    let (_, empty) = post(&gw, "documentation_search", search("")).await;
    assert_eq!(
        empty["detail"][0]["loc"],
        json!(["body", "payload", "query"])
    );
}

#[actix_web::test]
async fn unknown_fields_are_ignored() {
    let gw = gateway_with(&[]);
    let mut body = search("error A1000");
    body["extra"] = json!(true);
    body["payload"]["filters"] = json!({"anything": 1});
    body["metadata"]["new_field"] = json!("x");
    let (status, answer) = post(&gw, "documentation_search", body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["response"]["results"][0]["id"],
        "docs/error-codes.md#error-a1000"
    );
}

#[actix_web::test]
async fn a_missing_docs_directory_gives_empty_results() {
    let gw = gateway_with(&[("AIGW_DOCS__DIR", "/nonexistent/docs")]);
    let (status, body) = post(&gw, "documentation_search", search("error")).await;
    assert_eq!(status, 200);
    assert_eq!(body["response"]["results"], json!([]));
}

#[actix_web::test]
async fn response_body_snapshot() {
    let dir = std::env::temp_dir().join(format!("docs-search-{}", std::process::id()));
    let docs = dir.join("docs");
    std::fs::create_dir_all(docs.join("guides")).unwrap();
    std::fs::write(
        docs.join("guides/tokens.md"),
        "# Personal access tokens\n\nTokens let scripts call the API.\n\n## Rotating a token\nCreate a new token, switch your scripts to it, then revoke the old one.\n\n## Scopes\nA token's scopes limit what it may do.\n",
    )
    .unwrap();
    let docs_path = docs.display().to_string();
    let gw = spawn_gateway(offline_config(&[("AIGW_DOCS__DIR", docs_path.as_str())]));
    let mut request = search("how do I rotate a token?");
    request["payload"]["page_size"] = json!(1);
    let (status, body) = post(&gw, "documentation_search", request).await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(status, 200);
    assert!(body["metadata"]["timestamp"].as_i64().unwrap() > 1_700_000_000);
    insta::assert_json_snapshot!(body, {".metadata.timestamp" => "[timestamp]"});
}
