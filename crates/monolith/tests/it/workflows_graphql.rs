//! Duo Workflow in GraphQL: `duoWorkflowWorkflows`, `duoWorkflowEvents`, and
//! `workflowEventsUpdated` pushing status changes and checkpoints to the owner.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::rest_support::send;
use crate::workflows_rest::normalize;
use crate::workflows_support::{World, world};

const DEADLINE: Duration = Duration::from_secs(20);

async fn gql(w: &World, token: &str, query: &str, variables: Value) -> Value {
    let res = reqwest::Client::new()
        .post(w.server.url("/api/graphql"))
        .bearer_auth(token)
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

fn gid(id: i64) -> String {
    format!("gid://gitlab/Ai::DuoWorkflows::Workflow/{id}")
}

const WORKFLOWS: &str = "query($id: AiDuoWorkflowsWorkflowID) {
  duoWorkflowWorkflows(workflowId: $id) {
    nodes { id goal status statusName humanStatus workflowDefinition agentPrivilegesNames
            preApprovedAgentPrivilegesNames allowAgentToRequestUser
            latestCheckpoint { workflowStatus executionStatus checkpoint } }
  }
}";

#[tokio::test]
async fn workflows_and_events_are_readable_by_their_owner_only() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({"goal": "mine"})).await;
    w.workflow(&w.other_token, json!({"goal": "theirs"})).await;
    let token = w.workflow_token(w.dev).await;
    assert_eq!(w.checkpoint(&token, id, "ts-1", None).await.0, 201);
    assert_eq!(w.checkpoint(&token, id, "ts-2", Some("ts-1")).await.0, 201);

    let list = gql(&w, &w.dev_token, WORKFLOWS, json!({})).await;
    let one = gql(&w, &w.dev_token, WORKFLOWS, json!({"id": gid(id)})).await;
    assert_eq!(list, one);
    let events = gql(
        &w,
        &w.dev_token,
        "query($id: AiDuoWorkflowsWorkflowID!) { duoWorkflowEvents(workflowId: $id) { nodes { workflowStatus executionStatus timestamp workflowGoal metadata } } }",
        json!({"id": gid(id)}),
    )
    .await;
    assert_eq!(
        events["data"]["duoWorkflowEvents"]["nodes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let foreign = gql(&w, &w.other_token, WORKFLOWS, json!({"id": gid(id)})).await;
    assert_eq!(
        foreign["errors"][0]["extensions"]["code"],
        "RESOURCE_NOT_AVAILABLE"
    );
    insta::assert_json_snapshot!(
        "graphql_workflows",
        json!({ "workflows": normalize(list), "events": events, "foreign": foreign })
    );
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn next_data(socket: &mut Socket) -> Value {
    loop {
        let frame = tokio::time::timeout(DEADLINE, socket.next())
            .await
            .expect("a message in time")
            .expect("socket open")
            .unwrap();
        if let Message::Text(text) = frame {
            let v: Value = serde_json::from_str(&text).unwrap();
            match v["type"].as_str() {
                Some("next") => return v["payload"]["data"]["workflowEventsUpdated"].clone(),
                Some("error") => panic!("subscription refused: {v}"),
                _ => continue,
            }
        }
    }
}

#[tokio::test]
async fn status_changes_and_checkpoints_reach_the_owners_subscription() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({"goal": "watched"})).await;
    let unwatched = w.workflow(&w.dev_token, json!({"goal": "unwatched"})).await;
    let token = w.workflow_token(w.dev).await;

    let mut request = w
        .server
        .url("/api/graphql")
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    headers.insert(
        "authorization",
        format!("Bearer {}", w.dev_token).parse().unwrap(),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    socket
        .send(Message::text(
            json!({"type": "connection_init", "payload": {}}).to_string(),
        ))
        .await
        .unwrap();
    socket
        .send(Message::text(
            json!({
                "id": "1",
                "type": "subscribe",
                "payload": {
                    "query": "subscription($id: AiDuoWorkflowsWorkflowID!) { workflowEventsUpdated(workflowId: $id) { workflowStatus executionStatus workflowGoal checkpoint } }",
                    "variables": {"id": gid(id)},
                },
            })
            .to_string(),
        ))
        .await
        .unwrap();
    let topic = monolith::workflows::live::user_topic(w.dev.id);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while w.server.state.live.receiver_count(&topic) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let patch = |wid: i64, event: &'static str| {
        let token = token.clone();
        let server = &w.server;
        async move {
            send(
                server,
                reqwest::Method::PATCH,
                &format!("/ai/duo_workflows/workflows/{wid}"),
                Some(&token),
                Some(json!({"status_event": event})),
            )
            .await
            .status
        }
    };
    // Another workflow's change is not for this subscription.
    assert_eq!(patch(unwatched, "start").await, 200);
    assert_eq!(patch(id, "start").await, 200);
    let first = next_data(&mut socket).await;
    assert_eq!(first["workflowStatus"], "RUNNING");
    assert_eq!(first["workflowGoal"], "watched");
    assert_eq!(w.checkpoint(&token, id, "ts-1", None).await.0, 201);
    let second = next_data(&mut socket).await;
    assert_eq!(second["executionStatus"], "Execution");
    let checkpoint: Value = serde_json::from_str(second["checkpoint"].as_str().unwrap()).unwrap();
    assert_eq!(checkpoint["id"], "ts-1");

    // Someone else cannot watch it.
    let foreign = gql(
        &w,
        &w.other_token,
        "query($id: AiDuoWorkflowsWorkflowID!) { duoWorkflowEvents(workflowId: $id) { nodes { workflowStatus } } }",
        json!({"id": gid(id)}),
    )
    .await;
    assert_eq!(
        foreign["errors"][0]["extensions"]["code"],
        "RESOURCE_NOT_AVAILABLE"
    );
}
