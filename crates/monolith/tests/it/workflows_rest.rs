//! Duo Workflow's REST API: every endpoint's shape and refusals, in GitLab's
//! words, and nothing half-written when input is bad.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine;
use reqwest::Method;
use serde_json::{Value, json};

use crate::rest_support::{self, get, post, put};
use crate::workflows_support::{World, world};

/// Replaces ids, times and URLs that differ between runs.
pub fn normalize(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (k, val) in map.iter_mut() {
                    let volatile = matches!(
                        k.as_str(),
                        "id" | "project_id"
                            | "namespace_id"
                            | "workflow_id"
                            | "created_at"
                            | "updated_at"
                            | "gitlab_url"
                            | "base_url"
                            | "token"
                            | "token_expires_at"
                            | "correlation_id"
                            | "compressed_checkpoint"
                    );
                    if volatile && !val.is_null() {
                        *val = json!(format!("[{k}]"));
                    } else {
                        walk(val);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

async fn count(w: &World, table: &str) -> i64 {
    w.fx.id(&format!("SELECT count(*) FROM {table}"), &[]).await
}

#[tokio::test]
async fn create_show_list_and_privileges_have_gitlabs_shapes() {
    let w = world().await;
    let (status, created) = post(
        &w.server,
        "/ai/duo_workflows/workflows",
        &w.dev_token,
        json!({
            "project_id": w.project,
            "goal": "Add a line to README",
            "workflow_definition": "chat",
            "agent_privileges": [1, 2],
            "pre_approved_agent_privileges": [2],
            "environment": "ide",
            "additional_context": [{"Category": "file", "Content": "hello"}],
        }),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(created["project_id"], w.project);
    assert_eq!(created["status"], "created");
    let id = created["id"].as_i64().unwrap();

    // The service reads it back with a workflow token.
    let token = w.workflow_token(w.dev).await;
    let (status, shown) = get(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}"),
        &token,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(shown, created);

    // By path, with GitLab's defaults.
    let (status, by_path) = post(
        &w.server,
        "/ai/duo_workflows/workflows",
        &w.dev_token,
        json!({ "project_id": "acme/app" }),
    )
    .await;
    assert_eq!(status, 201, "{by_path}");

    let (status, list) = get(&w.server, "/ai/duo_workflows/workflows", &w.dev_token).await;
    assert_eq!(status, 200);
    assert_eq!(
        rest_support::integers(&list, "id"),
        vec![by_path["id"].as_i64().unwrap(), id]
    );
    let (_, privileges) = get(
        &w.server,
        "/ai/duo_workflows/workflows/agent_privileges",
        &w.dev_token,
    )
    .await;
    insta::assert_json_snapshot!(
        "workflow_shapes",
        json!({
            "created": normalize(created),
            "defaults": normalize(by_path),
            "agent_privileges": privileges,
        })
    );
}

#[tokio::test]
async fn creating_is_refused_in_gitlabs_words() {
    let w = world().await;
    let guest = w.fx.user("guest").await;
    w.fx.project_member(w.project, guest, 10).await;
    w.fx.seat(guest, "duo_enterprise", false).await;
    let guest_token = w.fx.token(guest, &["api"]).await;
    let seatless = w.fx.user("seatless").await;
    w.fx.project_member(w.project, seatless, 30).await;
    let seatless_token = w.fx.token(seatless, &["api"]).await;
    let read_only = w.fx.token(w.dev, &["read_api"]).await;
    let off_project = w.fx.project(w.group, "quiet", "private").await;
    w.fx.project_member(off_project, w.dev, 30).await;
    w.fx.project_duo(off_project, false).await;

    let p = w.project;
    let cases: Vec<(&str, &str, Value)> = vec![
        ("no container", &w.dev_token, json!({ "goal": "x" })),
        (
            "unknown project",
            &w.dev_token,
            json!({ "project_id": 999_999 }),
        ),
        (
            "unknown path",
            &w.dev_token,
            json!({ "project_id": "acme/nope" }),
        ),
        ("guest", &guest_token, json!({ "project_id": p })),
        ("no seat", &seatless_token, json!({ "project_id": p })),
        (
            "duo off",
            &w.dev_token,
            json!({ "project_id": off_project }),
        ),
        ("read_api token", &read_only, json!({ "project_id": p })),
        (
            "unknown privilege",
            &w.dev_token,
            json!({ "project_id": p, "agent_privileges": [1, 9] }),
        ),
        (
            "pre-approved not granted",
            &w.dev_token,
            json!({ "project_id": p, "agent_privileges": [1], "pre_approved_agent_privileges": [1, 3] }),
        ),
        (
            "goal too long",
            &w.dev_token,
            json!({ "project_id": p, "goal": "x".repeat(16_385) }),
        ),
        (
            "bad environment",
            &w.dev_token,
            json!({ "project_id": p, "environment": "moon" }),
        ),
        (
            "bad definition",
            &w.dev_token,
            json!({ "project_id": p, "workflow_definition": "a b" }),
        ),
    ];
    let mut transcript = Vec::new();
    for (name, token, body) in cases {
        let (status, answer) = post(&w.server, "/ai/duo_workflows/workflows", token, body).await;
        transcript.push(json!({ "case": name, "status": status, "body": answer }));
    }
    assert_eq!(count(&w, "duo_workflows_workflows").await, 0);
    insta::assert_json_snapshot!("create_refusals", transcript);
}

#[tokio::test]
async fn another_users_workflow_answers_404_and_admins_see_it() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let other = w.workflow_token(w.other).await;
    for (method, path, body) in [
        (
            Method::GET,
            format!("/ai/duo_workflows/workflows/{id}"),
            None,
        ),
        (
            Method::PATCH,
            format!("/ai/duo_workflows/workflows/{id}"),
            Some(json!({"status_event": "start"})),
        ),
        (
            Method::GET,
            format!("/ai/duo_workflows/workflows/{id}/checkpoints"),
            None,
        ),
        (
            Method::POST,
            format!("/ai/duo_workflows/workflows/{id}/events"),
            Some(json!({"event_type": "message", "message": "hi"})),
        ),
        (
            Method::GET,
            format!("/ai/duo_workflows/workflows/{id}/events"),
            None,
        ),
    ] {
        let reply = rest_support::send(&w.server, method.clone(), &path, Some(&other), body).await;
        assert_eq!(reply.status, 404, "{method} {path}");
        assert_eq!(reply.body, json!({"message": "404 Not found"}));
    }
    assert_eq!(w.status_of(id).await, 0);
    let (_, list) = get(&w.server, "/ai/duo_workflows/workflows", &w.other_token).await;
    assert_eq!(list, json!([]));
    let (status, _) = get(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}"),
        &w.admin_token,
    )
    .await;
    assert_eq!(status, 200);
    // The owner who lost access to the project is refused, not shown.
    w.fx.exec(
        "DELETE FROM project_members WHERE user_id = $1",
        &[&w.dev.id],
    )
    .await;
    let (status, _) = get(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}"),
        &w.dev_token,
    )
    .await;
    assert_eq!(status, 403);
}

fn compressed(value: &Value) -> String {
    monolith::workflows::checkpoints::compress(&value.to_string())
}

#[tokio::test]
async fn checkpoints_chain_newest_first_plain_or_compressed() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    let (status, first) = w.checkpoint(&token, id, "ts-1", None).await;
    assert_eq!(status, 201, "{first}");
    let body = json!({"v": 1, "id": "ts-2", "channel_values": {"ui_chat_log": [{"message_type": "agent", "content": "done"}]}});
    let (status, second) = post(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}/checkpoints"),
        &token,
        json!({
            "thread_ts": "ts-2",
            "parent_ts": "ts-1",
            "compressed_checkpoint": compressed(&body),
            "metadata": {"source": "loop", "step": 2},
            "model_metadata_json": r#"{"provider":"openai","name":"m","api_key":"sk-secret"}"#,
        }),
    )
    .await;
    assert_eq!(status, 201, "{second}");
    // A repeated post of the same checkpoint is answered as the first.
    let (status, again) = w.checkpoint(&token, id, "ts-1", None).await;
    assert_eq!((status, again["id"].clone()), (201, first["id"].clone()));

    let path = format!("/ai/duo_workflows/workflows/{id}/checkpoints");
    let (status, headers, newest) =
        rest_support::get_with_headers(&w.server, &format!("{path}?per_page=1"), &token).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "2");
    assert_eq!(newest[0]["thread_ts"], "ts-2");
    assert_eq!(newest[0]["checkpoint"], body);
    let (_, packed) = get(&w.server, &format!("{path}?accept_compressed=true"), &token).await;
    let inflated = monolith::workflows::checkpoints::decompress(
        packed[0]["compressed_checkpoint"].as_str().unwrap(),
        1 << 20,
    )
    .unwrap();
    assert_eq!(serde_json::from_str::<Value>(inflated.get()).unwrap(), body);
    assert!(packed[0].get("checkpoint").is_none());
    let one_id = first["id"].as_i64().unwrap();
    let (status, one) = get(&w.server, &format!("{path}/{one_id}"), &token).await;
    assert_eq!((status, one["thread_ts"].clone()), (200, json!("ts-1")));
    let (status, missing) = get(&w.server, &format!("{path}/999999"), &token).await;
    assert_eq!(
        (status, missing),
        (404, json!({"message": "404 Not found"}))
    );
    // The session's model is kept, without its key.
    let c = w.fx.pool.get().await.unwrap();
    let model: String = c
        .query_one(
            "SELECT model_metadata_json FROM duo_workflows_workflows WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        model.contains("openai") && !model.contains("sk-secret"),
        "{model}"
    );
    insta::assert_json_snapshot!(
        "checkpoint_shapes",
        json!({ "created": normalize(first), "listed": normalize(newest) })
    );
}

#[tokio::test]
async fn bad_checkpoints_are_refused_and_store_nothing() {
    let w = w_small().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    assert_eq!(w.checkpoint(&token, id, "ts-1", None).await.0, 201);
    let path = format!("/ai/duo_workflows/workflows/{id}/checkpoints");
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let big = json!({ "blob": "x".repeat(5000) });
    let cases: Vec<(&str, Value)> = vec![
        (
            "no body",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "metadata": {}}),
        ),
        (
            "no metadata",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "checkpoint": {"a": 1}}),
        ),
        (
            "no thread_ts",
            json!({"parent_ts": "ts-1", "checkpoint": {"a": 1}, "metadata": {}}),
        ),
        (
            "not base64",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "compressed_checkpoint": "%%%", "metadata": {}}),
        ),
        (
            "not zlib",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "compressed_checkpoint": b64(b"plain text"), "metadata": {}}),
        ),
        (
            "zlib of not json",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "compressed_checkpoint": b64(&zlib(b"{not json")), "metadata": {}}),
        ),
        (
            "not an object",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "checkpoint": [1, 2], "metadata": {}}),
        ),
        (
            "too large",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "checkpoint": big, "metadata": {}}),
        ),
        (
            "too large inflated",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "compressed_checkpoint": compressed(&big), "metadata": {}}),
        ),
        (
            "wrong parent",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-0", "checkpoint": {"a": 1}, "metadata": {}}),
        ),
        (
            "no parent",
            json!({"thread_ts": "ts-2", "checkpoint": {"a": 1}, "metadata": {}}),
        ),
        (
            "taken thread_ts",
            json!({"thread_ts": "ts-1", "checkpoint": {"other": 1}, "metadata": {}}),
        ),
        (
            "NUL inside",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "compressed_checkpoint": compressed(&json!({"a": "\u{0}"})), "metadata": {}}),
        ),
        (
            "NUL inside, plain",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "checkpoint": {"a": ["x", {"b\u{0}": 1}]}, "metadata": {}}),
        ),
        (
            "empty checkpoint",
            json!({"thread_ts": "ts-2", "parent_ts": "ts-1", "checkpoint": {}, "metadata": {}}),
        ),
        (
            "long thread_ts",
            json!({"thread_ts": "t".repeat(256), "parent_ts": "ts-1", "checkpoint": {"a": 1}, "metadata": {}}),
        ),
    ];
    let mut transcript = Vec::new();
    for (name, body) in cases {
        let (status, answer) = post(&w.server, &path, &token, body).await;
        transcript.push(json!({ "case": name, "status": status, "body": answer }));
    }
    assert_eq!(count(&w, "duo_workflows_checkpoints").await, 1);
    insta::assert_json_snapshot!("checkpoint_refusals", transcript);
}

#[tokio::test]
async fn a_checkpoint_is_served_as_the_text_it_was_posted_as() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    // Keys out of alphabetical order, a backslash followed by the text
    // "u0000" (not a NUL), non-ASCII text and numbers as written.
    let body = json!({
        "v": 1,
        "id": "ts-1",
        "channel_values": {"zeta": "\\u0000 is text", "alpha": "héllo ✓", "n": 1.5e3},
    });
    let (status, created) = post(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}/checkpoints"),
        &token,
        json!({"thread_ts": "ts-1", "checkpoint": body, "metadata": {"source": "input", "step": -1}}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (status, listed) = get(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}/checkpoints"),
        &token,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        listed[0]["checkpoint"].to_string(),
        body.to_string(),
        "same keys in the same order, same text"
    );
}

fn zlib(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A world whose checkpoints may be at most 4 KiB.
async fn w_small() -> World {
    crate::workflows_support::setup()
        .await
        .start(None, &[("DUO_WORKFLOW_MAX_CHECKPOINT_BYTES", "4096")])
        .await
}

#[tokio::test]
async fn checkpoint_writes_are_stored_all_or_nothing() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    assert_eq!(w.checkpoint(&token, id, "ts-1", None).await.0, 201);
    let path = format!("/ai/duo_workflows/workflows/{id}/checkpoint_writes_batch");
    let write = |idx: i64, data: &str| json!({"task": "t1", "idx": idx, "channel": "__interrupt__", "write_type": "msgpack", "data": data});
    let (status, body) = post(
        &w.server,
        &path,
        &token,
        json!({"thread_ts": "ts-1", "checkpoint_writes": [write(0, "AAA="), write(1, "AQI=")]}),
    )
    .await;
    assert_eq!((status, body), (200, json!({})));
    let mut transcript = Vec::new();
    for (name, body) in [
        (
            "empty",
            json!({"thread_ts": "ts-1", "checkpoint_writes": []}),
        ),
        ("missing list", json!({"thread_ts": "ts-1"})),
        (
            "missing field",
            json!({"thread_ts": "ts-1", "checkpoint_writes": [write(2, "x"), {"task": "t"}]}),
        ),
        (
            "data too long",
            json!({"thread_ts": "ts-1", "checkpoint_writes": [write(2, "x"), write(3, &"y".repeat(10_001))]}),
        ),
    ] {
        let (status, answer) = post(&w.server, &path, &token, body).await;
        transcript.push(json!({ "case": name, "status": status, "body": answer }));
    }
    assert_eq!(count(&w, "duo_workflows_checkpoint_writes").await, 2);
    let (_, listed) = get(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}/checkpoints"),
        &token,
    )
    .await;
    assert_eq!(listed[0]["checkpoint_writes"].as_array().unwrap().len(), 2);
    insta::assert_json_snapshot!("checkpoint_write_refusals", transcript);
}

#[tokio::test]
async fn events_are_queued_delivered_and_refused() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let mine = w.workflow(&w.other_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    let path = format!("/ai/duo_workflows/workflows/{id}/events");
    let (status, created) = post(
        &w.server,
        &path,
        &token,
        json!({"event_type": "message", "message": "Use tabs", "correlation_id": "123e4567-e89b-12d3-a456-426614174000"}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (_, queued) = get(&w.server, &path, &token).await;
    assert_eq!(
        rest_support::integers(&queued, "id"),
        vec![created["id"].as_i64().unwrap()]
    );
    let event_id = created["id"].as_i64().unwrap();
    let (status, delivered) = put(
        &w.server,
        &format!("{path}/{event_id}"),
        &token,
        json!({"event_status": "delivered"}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, queued_after) = get(&w.server, &path, &token).await;
    assert_eq!(queued_after, json!([]));

    let mut transcript = Vec::new();
    for (name, body) in [
        (
            "unknown type",
            json!({"event_type": "dance", "message": "x"}),
        ),
        ("no type", json!({"message": "x"})),
        ("no message", json!({"event_type": "stop"})),
        (
            "bad correlation id",
            json!({"event_type": "stop", "message": "x", "correlation_id": "nope"}),
        ),
        (
            "taken correlation id",
            json!({"event_type": "stop", "message": "x", "correlation_id": "123e4567-e89b-12d3-a456-426614174000"}),
        ),
    ] {
        let (status, answer) = post(&w.server, &path, &token, body).await;
        transcript.push(json!({ "case": name, "status": status, "body": answer }));
    }
    let (status, answer) = put(
        &w.server,
        &format!("{path}/{event_id}"),
        &token,
        json!({"event_status": "lost"}),
    )
    .await;
    transcript.push(json!({ "case": "bad status", "status": status, "body": answer }));
    // An event id of another workflow is not found through this one.
    let other_token = w.workflow_token(w.other).await;
    let (_, foreign) = post(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{mine}/events"),
        &other_token,
        json!({"event_type": "pause", "message": "x"}),
    )
    .await;
    let (status, answer) = put(
        &w.server,
        &format!("{path}/{}", foreign["id"]),
        &token,
        json!({"event_status": "delivered"}),
    )
    .await;
    transcript
        .push(json!({ "case": "event of another workflow", "status": status, "body": answer }));
    assert_eq!(count(&w, "duo_workflows_events").await, 2);
    insta::assert_json_snapshot!(
        "events",
        json!({ "created": normalize(created), "delivered": normalize(delivered), "refusals": transcript })
    );
}

#[tokio::test]
async fn deleting_a_workflow_is_its_owners_and_waits_for_its_run() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let path = format!("/ai/duo_workflows/workflows/{id}");
    let other =
        rest_support::send(&w.server, Method::DELETE, &path, Some(&w.other_token), None).await;
    assert_eq!(other.status, 404);
    w.fx.exec(
        "INSERT INTO duo_workflow_workloads (workflow_id, leg, runner, state) VALUES ($1, 1, 'local', 'running')",
        &[&id],
    )
    .await;
    let busy = rest_support::send(&w.server, Method::DELETE, &path, Some(&w.dev_token), None).await;
    assert_eq!(busy.status, 409, "{}", busy.body);
    w.fx.exec(
        "UPDATE duo_workflow_workloads SET state = 'finished' WHERE workflow_id = $1",
        &[&id],
    )
    .await;
    let deleted =
        rest_support::send(&w.server, Method::DELETE, &path, Some(&w.dev_token), None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    let gone = rest_support::send(&w.server, Method::GET, &path, Some(&w.dev_token), None).await;
    assert_eq!(gone.status, 404);
}

#[tokio::test]
async fn refused_answers_to_a_product_run_are_not_kept() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    // A product run waiting for a tool approval whose leg is still saving.
    w.fx.exec(
        "INSERT INTO duo_workflow_workloads (workflow_id, leg, runner, state) VALUES ($1, 1, 'local', 'running')",
        &[&id],
    )
    .await;
    w.fx.exec(
        "UPDATE duo_workflows_workflows SET status = 8 WHERE id = $1",
        &[&id],
    )
    .await;
    let events = format!("/ai/duo_workflows/workflows/{id}/events");
    let (status, body) = post(
        &w.server,
        &events,
        &token,
        json!({"event_type": "resume", "message": ""}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    // Once the leg ended, an answer longer than a leg carries is refused.
    w.fx.exec(
        "UPDATE duo_workflow_workloads SET state = 'paused' WHERE workflow_id = $1",
        &[&id],
    )
    .await;
    let (status, body) = post(
        &w.server,
        &events,
        &token,
        json!({"event_type": "response", "message": "x".repeat(5000)}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, queued) = get(&w.server, &events, &token).await;
    assert_eq!(status, 200);
    assert_eq!(queued, json!([]), "refused events are not kept");
}

#[tokio::test]
async fn the_workflow_service_account_is_set_shown_and_unset_by_admins_only() {
    let w = world().await;
    let path = "/ai/duo_workflows/service_account";
    assert_eq!(
        get(&w.server, path, &w.admin_token).await,
        (200, json!({"service_account_id": null}))
    );
    // A person is not a service account, and an unknown user is not found.
    let (status, body) = put(
        &w.server,
        path,
        &w.admin_token,
        json!({"user_id": w.dev.id}),
    )
    .await;
    assert_eq!(
        (status, body),
        (
            400,
            json!({"message": {"user_id": ["must be a service account user"]}})
        )
    );
    let (status, _) = put(
        &w.server,
        path,
        &w.admin_token,
        json!({"user_id": i64::MAX}),
    )
    .await;
    assert_eq!(status, 404);
    w.fx.exec(
        "UPDATE users SET service_account = true WHERE id = $1",
        &[&w.other.id],
    )
    .await;
    // Only an admin sets or reads it.
    let (status, _) = put(
        &w.server,
        path,
        &w.dev_token,
        json!({"user_id": w.other.id}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = get(&w.server, path, &w.dev_token).await;
    assert_eq!(status, 403);
    assert_eq!(
        get(&w.server, path, &w.admin_token).await,
        (200, json!({"service_account_id": null}))
    );
    let set = put(
        &w.server,
        path,
        &w.admin_token,
        json!({"user_id": w.other.id}),
    )
    .await;
    assert_eq!(set, (200, json!({"service_account_id": w.other.id})));
    assert_eq!(
        get(&w.server, path, &w.admin_token).await,
        (200, json!({"service_account_id": w.other.id}))
    );
    let unset = put(&w.server, path, &w.admin_token, json!({"user_id": null})).await;
    assert_eq!(unset, (200, json!({"service_account_id": null})));
    assert_eq!(
        get(&w.server, path, &w.admin_token).await,
        (200, json!({"service_account_id": null}))
    );
}
