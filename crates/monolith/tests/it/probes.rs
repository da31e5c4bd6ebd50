//! What orchestrators ask the `web` role: liveness, readiness (false while
//! migrations are pending and once stopping begins), queue metrics for
//! autoscaling, and subscription sockets told to reconnect when it stops.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::{Fx, Server};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

async fn get(server: &Server, path: &str) -> (u16, String) {
    let res = reqwest::get(server.url(path)).await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

#[tokio::test]
async fn readiness_follows_migrations_and_stopping() {
    let fx = Fx::new().await;
    let server = Server::start(&fx).await;
    let (status, body) = get(&server, "/-/liveness").await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));

    let (status, body) = get(&server, "/-/readiness").await;
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["checks"]["database"], "ok");
    assert_eq!(body["checks"]["migrations"], "ok");
    // No gateway runs here: reported, but the web role stays ready.
    assert_eq!(body["checks"]["ai_gateway"], "unreachable");

    // A newer release on an older schema is not ready.
    let db = fx.pool.get().await.unwrap();
    db.execute(
        "CREATE TEMP TABLE newest AS SELECT * FROM refinery_schema_history
         WHERE version = (SELECT max(version) FROM refinery_schema_history)",
        &[],
    )
    .await
    .unwrap();
    db.execute(
        "DELETE FROM refinery_schema_history WHERE version = (SELECT version FROM newest)",
        &[],
    )
    .await
    .unwrap();
    let (status, body) = get(&server, "/-/readiness").await;
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["checks"]["migrations"], "failed");
    db.execute(
        "INSERT INTO refinery_schema_history SELECT * FROM newest",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(get(&server, "/-/readiness").await.0, 200);

    // Stopping: not ready any more, but still alive and serving.
    server.lifecycle.begin_stopping();
    let (status, body) = get(&server, "/-/readiness").await;
    assert_eq!(status, 503);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["checks"]["shutdown"], "stopping");
    assert_eq!(get(&server, "/-/liveness").await.0, 200);
}

#[tokio::test]
async fn metrics_show_queue_depth_to_allowed_addresses_only() {
    let fx = Fx::new().await;
    let db = fx.pool.get().await.unwrap();
    for i in 0..3 {
        job_queue::enqueue_raw(
            &**db,
            "test_kind",
            &json!({ "n": i }),
            job_queue::EnqueueOptions::default().queue("default"),
        )
        .await
        .unwrap();
    }
    // One more, due in an hour: pending but not due.
    job_queue::enqueue_raw(
        &**db,
        "test_kind",
        &json!({}),
        job_queue::EnqueueOptions {
            delay: Duration::from_secs(3600),
            ..Default::default()
        }
        .queue("default"),
    )
    .await
    .unwrap();
    let server = Server::start(&fx).await;
    let (status, text) = get(&server, "/-/metrics").await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("duo_job_queue_pending{queue=\"default\"} 4\n"),
        "{text}"
    );
    assert!(
        text.contains("duo_job_queue_due{queue=\"default\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("duo_job_queue_running{queue=\"default\"} 0\n"),
        "{text}"
    );
    assert!(text.contains("duo_stopping 0\n"), "{text}");

    // Loopback is not in this allow-list: the page does not exist for it.
    let strict = Server::start_with_settings(
        &fx,
        fx.pool.clone(),
        &[("DUO_MONITORING_ALLOWLIST", "10.0.0.0/8")],
    )
    .await;
    assert_eq!(get(&strict, "/-/metrics").await.0, 404);
}

#[tokio::test]
async fn subscription_sockets_are_told_to_reconnect_when_the_server_stops() {
    let fx = Fx::new().await;
    let user = fx.user("alice").await;
    let token = fx.token(user, &["api"]).await;
    let server = Server::start(&fx).await;
    let mut request = server
        .url("/api/graphql")
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    socket
        .send(Message::Text(
            json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } })
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    let ack = socket.next().await.unwrap().unwrap();
    assert!(ack.to_text().unwrap().contains("connection_ack"));

    server.lifecycle.begin_stopping();
    let close = loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("no close within 10 s")
            .expect("stream ended without a close frame")
            .unwrap();
        if let Message::Close(close) = frame {
            break close.expect("a close frame with a code");
        }
    };
    assert_eq!(close.code, CloseCode::Restart);
    assert_eq!(close.reason.as_str(), "Server restarting: reconnect");
}
