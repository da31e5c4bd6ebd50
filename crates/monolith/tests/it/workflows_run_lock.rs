//! Runs the workflow service starts over gRPC hold the workflow in the
//! monolith as socket runs do: one running copy per workflow, a new run id
//! per start, and a run that lost the workflow (a zombie) cannot write.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

use crate::rest_support::{post, post_empty, send};
use crate::workflows_support::{World, world};

fn checkpoint(ts: &str, parent: Option<&str>) -> Value {
    json!({
        "thread_ts": ts,
        "parent_ts": parent,
        "checkpoint": { "v": 1, "id": ts, "ts": "2026-01-01T00:00:00+00:00", "channel_values": {} },
        "metadata": { "source": "loop", "step": 1 },
    })
}

async fn lock(w: &World, token: &str, id: i64) -> (u16, Value) {
    post_empty(
        &w.server,
        &format!("/ai/duo_workflows/workflows/{id}/run_lock"),
        token,
    )
    .await
}

#[tokio::test]
async fn one_run_holds_a_workflow_and_a_zombie_cannot_write() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;

    let (status, first) = lock(&w, &token, id).await;
    assert_eq!(status, 201, "{first}");
    let first_run = first["run_id"].as_str().unwrap().to_owned();
    assert!(first["ttl_seconds"].as_u64().unwrap() > 0);
    // A second start of the same workflow is refused while the first runs.
    let (status, body) = lock(&w, &token, id).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("already running"),
        "{body}"
    );
    // The holder writes; renews; gives the workflow up.
    let path = format!("/ai/duo_workflows/workflows/{id}/checkpoints?run_id={first_run}");
    assert_eq!(
        post(&w.server, &path, &token, checkpoint("ts-1", None))
            .await
            .0,
        201
    );
    let lock_path = format!("/ai/duo_workflows/workflows/{id}/run_lock/{first_run}");
    let renew = send(
        &w.server,
        reqwest::Method::PUT,
        &lock_path,
        Some(&token),
        None,
    )
    .await;
    assert_eq!(renew.status, 200);
    let release = send(
        &w.server,
        reqwest::Method::DELETE,
        &lock_path,
        Some(&token),
        None,
    )
    .await;
    assert_eq!(release.status, 204);

    // A new start gets a new run id; the old run is now a zombie.
    let (status, second) = lock(&w, &token, id).await;
    assert_eq!(status, 201, "{second}");
    let second_run = second["run_id"].as_str().unwrap().to_owned();
    assert_ne!(first_run, second_run);
    let (status, body) = post(&w.server, &path, &token, checkpoint("ts-2", Some("ts-1"))).await;
    assert_eq!(status, 409, "{body}");
    let zombie_status = send(
        &w.server,
        reqwest::Method::PATCH,
        &format!("/ai/duo_workflows/workflows/{id}?run_id={first_run}"),
        Some(&token),
        Some(json!({"status_event": "start"})),
    )
    .await;
    assert_eq!(zombie_status.status, 409);
    let renew = send(
        &w.server,
        reqwest::Method::PUT,
        &lock_path,
        Some(&token),
        None,
    )
    .await;
    assert_eq!(renew.status, 409, "a zombie cannot take the lock back");
    // The current run writes.
    let current = format!("/ai/duo_workflows/workflows/{id}/checkpoints?run_id={second_run}");
    assert_eq!(
        post(
            &w.server,
            &current,
            &token,
            checkpoint("ts-3", Some("ts-1"))
        )
        .await
        .0,
        201
    );

    // Nobody else's run may lock it, nor can a bad run id be given.
    let other = w.workflow_token(w.other).await;
    assert_eq!(lock(&w, &other, id).await.0, 404);
    let bad = format!("/ai/duo_workflows/workflows/{id}/checkpoints?run_id=not-a-uuid");
    assert_eq!(
        post(&w.server, &bad, &token, checkpoint("ts-4", Some("ts-3")))
            .await
            .0,
        400
    );
}

#[tokio::test]
async fn only_the_holders_id_takes_a_live_lock_over() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    let (_, first) = lock(&w, &token, id).await;
    let first_run = first["run_id"].as_str().unwrap();
    let takeover = |run: String| {
        let server = &w.server;
        let token = token.clone();
        async move {
            post_empty(
                server,
                &format!("/ai/duo_workflows/workflows/{id}/run_lock?takeover={run}"),
                &token,
            )
            .await
        }
    };
    // A guess does not take it; the holder's id (the service whose run hung
    // up without giving the lock back) does, with a new run id.
    let (status, _) = takeover(uuid::Uuid::new_v4().to_string()).await;
    assert_eq!(status, 409);
    let (status, taken) = takeover(first_run.to_owned()).await;
    assert_eq!(status, 201, "{taken}");
    assert_ne!(taken["run_id"], first["run_id"]);
    let (status, _) = takeover(first_run.to_owned()).await;
    assert_eq!(status, 409, "the old id is spent");
    let (status, _) = takeover("not-a-uuid".to_owned()).await;
    assert_eq!(status, 400);
}
