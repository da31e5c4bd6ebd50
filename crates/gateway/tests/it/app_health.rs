//! App-wide behaviour over real HTTP: health, readiness, metrics, headers,
//! body rules and the JSON 404.

use crate::app_support;

use crate::stream_support::{metric, scrape};
use app_support::{local_model_config, offline_config, spawn_gateway, spawn_upstream};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// Small bodies, to test the body rules cheaply.
const SMALL_BODIES: &[(&str, &str)] = &[("AIGW_MAX_REQUEST_BODY_BYTES", "1024")];

#[actix_web::test]
async fn healthz_answers_with_timing_and_request_id_headers() {
    let gw = spawn_gateway(offline_config(SMALL_BODIES));
    let client = reqwest::Client::new();
    let resp = client
        .get(format!("{gw}/monitoring/healthz"))
        .header("x-request-id", "req-123")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req-123");
    for name in ["x-process-time", "x-gateway-overhead-time"] {
        let secs: f64 = resp.headers()[name].to_str().unwrap().parse().unwrap();
        assert!((0.0..5.0).contains(&secs), "{name}: {secs}");
    }
    let generated = client
        .get(format!("{gw}/monitoring/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(generated.headers()["x-request-id"].len(), 32);
}

#[actix_web::test]
async fn unknown_routes_are_json_404() {
    let gw = spawn_gateway(offline_config(SMALL_BODIES));
    let resp = reqwest::get(format!("{gw}/no/such/route")).await.unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    assert!(resp.headers().get("x-process-time").is_some());
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"detail": "Not Found"})
    );
}

#[actix_web::test]
async fn ready_probes_the_local_model_server() {
    let down = spawn_gateway(offline_config(SMALL_BODIES));
    let resp = reqwest::get(format!("{down}/monitoring/ready"))
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"detail": "Model providers not reachable: local model server (unreachable)"})
    );

    let upstream = spawn_upstream();
    let up = spawn_gateway(local_model_config(&upstream.url, SMALL_BODIES));
    let resp = reqwest::get(format!("{up}/monitoring/ready"))
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(upstream.requests()[0].target, "/v1/models");
    // The success is cached: a second call does not probe again.
    let resp = reqwest::get(format!("{up}/monitoring/ready"))
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(upstream.requests().len(), 1);
}

#[actix_web::test]
async fn metrics_use_route_patterns_as_handler_labels() {
    let gw = spawn_gateway(offline_config(SMALL_BODIES));
    reqwest::get(format!("{gw}/monitoring/healthz"))
        .await
        .unwrap();
    reqwest::Client::new()
        .post(format!("{gw}/v1/proxy/anthropic/v1/some/raw/path"))
        .send()
        .await
        .unwrap();
    let text = reqwest::get(format!("{gw}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"http_request_duration_seconds_bucket{handler="/monitoring/healthz",method="GET",status="200""#),
        "{text}"
    );
    assert!(
        text.contains(r#"handler="/v1/proxy/anthropic/{path:.*}",method="POST",status="401""#),
        "{text}"
    );
    assert!(!text.contains("some/raw/path"));
    assert!(text.contains(r#"gateway_overhead_seconds_count{handler="/monitoring/healthz"}"#));
}

#[actix_web::test]
async fn a_made_up_method_is_counted_as_other_not_as_a_label_of_its_own() {
    let gw = spawn_gateway(offline_config(SMALL_BODIES));
    let client = reqwest::Client::new();
    for method in ["BREWCOFFEE", "XQZZY1", "XQZZY2"] {
        client
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                format!("{gw}/monitoring/healthz"),
            )
            .send()
            .await
            .unwrap();
    }
    // The same label set again, now from the worker's kept histograms.
    for _ in 0..2 {
        reqwest::get(format!("{gw}/monitoring/healthz"))
            .await
            .unwrap();
    }
    let samples = scrape(&gw).await;
    assert!(
        !samples.iter().any(|s| s
            .labels
            .values()
            .any(|v| v.contains("BREWCOFFEE") || v.contains("XQZZY"))),
        "{samples:?}"
    );
    let count = "http_request_duration_seconds_count";
    assert_eq!(metric(&samples, count, &[("method", "other")]), 3.0);
    assert_eq!(
        metric(
            &samples,
            count,
            &[("handler", "/monitoring/healthz"), ("method", "GET")]
        ),
        2.0
    );
}

#[actix_web::test]
async fn malformed_and_mistyped_json_is_422() {
    let gw = spawn_gateway(offline_config(SMALL_BODIES));
    let client = reqwest::Client::new();
    for body in ["{not json", r#"{"count": "three"}"#, "{}"] {
        let resp = client
            .post(format!("{gw}/test/typed-json"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 422, "{body}");
        let json: Value = resp.json().await.unwrap();
        assert_eq!(json["detail"][0]["loc"], json!(["body"]), "{body}");
    }
    let ok = client
        .post(format!("{gw}/test/typed-json"))
        .json(&json!({"count": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.json::<Value>().await.unwrap(), json!({"count": 3}));
}

#[actix_web::test]
async fn oversized_json_is_413() {
    let gw = spawn_gateway(offline_config(SMALL_BODIES));
    let resp = reqwest::Client::new()
        .post(format!("{gw}/test/typed-json"))
        .json(&json!({"count": 3, "pad": "x".repeat(2000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"detail": "Request body too large"})
    );
}
