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

/// A checkpoint whose conversation holds `messages` (type, content).
async fn conversation_checkpoint(
    w: &World,
    token: &str,
    id: i64,
    ts: &str,
    parent: Option<&str>,
    messages: &[(&str, &str)],
) -> u16 {
    let log: Vec<Value> = messages
        .iter()
        .enumerate()
        .map(|(i, (kind, content))| {
            json!({
                "message_type": kind,
                "content": content,
                "timestamp": format!("2026-01-01T00:00:0{i}+00:00"),
                "status": "success",
                "correlation_id": null,
                "tool_info": if *kind == "tool" { json!({"name": "read_file", "args": {"file_path": "README.md"}}) } else { Value::Null },
            })
        })
        .collect();
    crate::rest_support::post(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}/checkpoints"),
        token,
        json!({
            "thread_ts": ts,
            "parent_ts": parent,
            "checkpoint": { "v": 1, "id": ts, "ts": "2026-01-01T00:00:00+00:00",
                            "channel_values": { "status": "Execution", "ui_chat_log": log } },
            "metadata": { "source": "loop", "step": 1 },
        }),
    )
    .await
    .0
}

#[tokio::test]
async fn events_carry_the_conversation_and_the_subscription_only_what_is_new() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({"goal": "talk"})).await;
    let token = w.workflow_token(w.dev).await;
    let first = [("user", "Fix the README"), ("tool", "Read README.md")];
    assert_eq!(
        conversation_checkpoint(&w, &token, id, "ts-1", None, &first).await,
        201
    );
    let events = gql(
        &w,
        &w.dev_token,
        "query($id: AiDuoWorkflowsWorkflowID!) { duoWorkflowEvents(workflowId: $id) { nodes {
            duoMessages { content messageType status toolInfo timestamp role }
            lastDuoMessage { content } } } }",
        json!({"id": gid(id)}),
    )
    .await;
    let node = &events["data"]["duoWorkflowEvents"]["nodes"][0];
    assert_eq!(
        node["duoMessages"],
        json!([
            {"content": "Fix the README", "messageType": "user", "status": "success",
             "toolInfo": null, "timestamp": "2026-01-01T00:00:00.000Z", "role": "user"},
            {"content": "Read README.md", "messageType": "tool", "status": "success",
             "toolInfo": "{\"name\":\"read_file\",\"args\":{\"file_path\":\"README.md\"}}",
             "timestamp": "2026-01-01T00:00:01.000Z", "role": "tool"},
        ]),
        "{events}"
    );
    assert_eq!(node["lastDuoMessage"]["content"], "Read README.md");

    // A subscriber that has read the history gets only the new messages.
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
    for frame in [
        json!({"type": "connection_init", "payload": {}}),
        json!({
            "id": "1",
            "type": "subscribe",
            "payload": {
                "query": "subscription($id: AiDuoWorkflowsWorkflowID!) { workflowEventsUpdated(workflowId: $id) { duoMessages { content messageType } lastDuoMessage { content } } }",
                "variables": {"id": gid(id)},
            },
        }),
    ] {
        socket.send(Message::text(frame.to_string())).await.unwrap();
    }
    let topic = monolith::workflows::live::user_topic(w.dev.id);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while w.server.state.live.receiver_count(&topic) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = [
        ("user", "Fix the README"),
        ("tool", "Read README.md"),
        ("agent", "The title is wrong."),
    ];
    assert_eq!(
        conversation_checkpoint(&w, &token, id, "ts-2", Some("ts-1"), &second).await,
        201
    );
    let update = next_data(&mut socket).await;
    assert_eq!(
        update["duoMessages"],
        json!([{"content": "The title is wrong.", "messageType": "agent"}])
    );
    assert_eq!(update["lastDuoMessage"]["content"], "The title is wrong.");
    let third = [
        ("user", "Fix the README"),
        ("tool", "Read README.md"),
        ("agent", "The title is wrong."),
        ("request", "May I edit README.md?"),
        ("workflow_end", "Done"),
    ];
    assert_eq!(
        conversation_checkpoint(&w, &token, id, "ts-3", Some("ts-2"), &third).await,
        201
    );
    let update = next_data(&mut socket).await;
    let kinds: Vec<&str> = update["duoMessages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["messageType"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["request", "workflow_end"]);
}

const CREATE: &str = "mutation($input: AiDuoWorkflowCreateInput!) {
  aiDuoWorkflowCreate(input: $input) {
    workflow { id goal status workflowDefinition }
    workload { id message }
    errors
  }
}";

#[tokio::test]
async fn workflows_are_created_and_started_through_graphql_as_through_rest() {
    let w = world().await;
    let project = w.project.to_string();
    let created = gql(
        &w,
        &w.dev_token,
        CREATE,
        json!({"input": {"projectPath": project, "goal": "Tidy the README"}}),
    )
    .await;
    let payload = &created["data"]["aiDuoWorkflowCreate"];
    assert_eq!(payload["errors"], json!([]), "{created}");
    assert_eq!(payload["workflow"]["goal"], "Tidy the README");
    assert_eq!(payload["workflow"]["status"], "CREATED");
    assert!(payload["workload"].is_null());

    // Starting needs commits to work on: this project's repository is empty,
    // said as GitLab's 422 says it, and nothing is queued.
    let started = gql(
        &w,
        &w.dev_token,
        CREATE,
        json!({"input": {"projectPath": project, "goal": "Run it", "startWorkflow": true}}),
    )
    .await;
    let payload = &started["data"]["aiDuoWorkflowCreate"];
    assert!(payload["workflow"].is_null(), "{started}");
    assert!(
        payload["errors"][0]
            .as_str()
            .unwrap_or_default()
            .contains("no repository"),
        "{started}"
    );
    let queued: i64 =
        w.fx.pool
            .get()
            .await
            .unwrap()
            .query_one("SELECT count(*) FROM duo_workflow_workloads", &[])
            .await
            .unwrap()
            .get(0);
    assert_eq!(queued, 0);

    // A source branch without a start, or one that does not exist.
    let wrong = gql(
        &w,
        &w.dev_token,
        CREATE,
        json!({"input": {"projectPath": project, "sourceBranch": "main"}}),
    )
    .await;
    assert!(
        wrong["data"]["aiDuoWorkflowCreate"]["errors"][0]
            .as_str()
            .unwrap()
            .contains("start_workflow"),
        "{wrong}"
    );
    // A project the caller cannot see is not available (as one they may not
    // run workflows in: the REST tests cover the policy's refusals).
    let refused = gql(
        &w,
        &w.dev_token,
        CREATE,
        json!({"input": {"projectPath": "nobody/nothing", "goal": "Not there"}}),
    )
    .await;
    assert_eq!(
        refused["errors"][0]["extensions"]["code"], "RESOURCE_NOT_AVAILABLE",
        "{refused}"
    );
}
