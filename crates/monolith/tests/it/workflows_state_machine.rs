//! The workflow status state machine through `PATCH
//! /ai/duo_workflows/workflows/:id`: every event from every status, with
//! GitLab's answers word for word, and racing updates of which only one wins.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use monolith::workflows::{Status, StatusEvent};
use serde_json::json;

use crate::rest_support::{Reply, send};
use crate::support::Server;
use crate::workflows_support::world;

/// `PATCH /ai/duo_workflows/workflows/:id` with one status event.
async fn status_event(server: &Server, id: i64, token: &str, event: &str) -> Reply {
    send(
        server,
        reqwest::Method::PATCH,
        &format!("/ai/duo_workflows/workflows/{id}"),
        Some(token),
        Some(json!({ "status_event": event })),
    )
    .await
}

#[tokio::test]
async fn every_event_from_every_status() {
    let w = world().await;
    let token = w.workflow_token(w.dev).await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let mut events: Vec<&str> = StatusEvent::ALL.iter().map(|e| e.name()).collect();
    events.push("jump");
    let mut table = String::new();
    for from in Status::ALL {
        for event in &events {
            w.set_status(id, from.code()).await;
            let reply = status_event(&w.server, id, &token, event).await;
            let after = Status::from_code(w.status_of(id).await).unwrap();
            let message = match reply.status {
                200 => reply.body["message"].as_str().unwrap().to_owned(),
                _ => reply.body["message"].as_str().unwrap_or("?").to_owned(),
            };
            if reply.status == 200 {
                assert_eq!(reply.body["workflow"]["status"], after.name());
            } else {
                assert_eq!(after, from, "a refused event changed the status");
            }
            table.push_str(&format!(
                "{:<28} {:<27} {} {:<28} {}\n",
                from.name(),
                event,
                reply.status,
                after.name(),
                message
            ));
        }
    }
    insta::assert_snapshot!("status_table", table);
}

#[tokio::test]
async fn racing_updates_cannot_both_win() {
    let w = world().await;
    let token = w.workflow_token(w.dev).await;
    for round in 0..5 {
        let id = w.workflow(&w.dev_token, json!({})).await;
        w.set_status(id, Status::Running.code()).await;
        let (a, b) = tokio::join!(
            status_event(&w.server, id, &token, "finish"),
            status_event(&w.server, id, &token, "drop")
        );
        let winners: Vec<&str> = [(&a, "finish"), (&b, "drop")]
            .iter()
            .filter(|(r, _)| r.status == 200 && r.body["message"] == "Workflow status updated")
            .map(|(_, e)| *e)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {} / {}", a.body, b.body);
        let expected = if winners[0] == "finish" {
            Status::Finished
        } else {
            Status::Failed
        };
        assert_eq!(w.status_of(id).await, expected.code());
        let loser = if winners[0] == "finish" { &b } else { &a };
        assert_eq!(loser.status, 400, "{}", loser.body);
        let changes = w
            .fx
            .id(
                "SELECT count(*) FROM duo_workflows_audit_events WHERE workflow_id = $1 AND action = 'duo_session_status_changed'",
                &[&id],
            )
            .await;
        assert_eq!(changes, 1);
    }
}

/// A product run's executor restarts a stopped workflow when it starts up
/// (`retry`); a request of its that passed authentication just before the
/// user's stop cancelled the leg must not undo that stop afterwards.
#[tokio::test]
async fn a_run_token_restarts_its_workflow_only_while_its_leg_runs() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let run_token = {
        let c = w.fx.pool.get().await.unwrap();
        monolith::identity::oauth::mint_for_run(
            &**c,
            None,
            w.dev.id,
            monolith::identity::credentials::RunBinding {
                workflow_id: id,
                project_id: w.project,
            },
            chrono::Duration::minutes(10),
        )
        .await
        .unwrap()
    };
    w.fx.exec(
        "INSERT INTO duo_workflow_workloads (workflow_id, leg, runner, state, token_id)
         VALUES ($1, 1, 'local', 'running', $2)",
        &[&id, &run_token.id],
    )
    .await;
    let stopped = Status::Stopped.code();
    // While its leg runs, the executor starting up moves the stopped
    // workflow on, as GitLab's service does.
    w.set_status(id, stopped).await;
    let reply = status_event(&w.server, id, &run_token.token, "retry").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(w.status_of(id).await, Status::Running.code());
    // The user stopped it and the leg was cancelled: the run's late request
    // is refused and the workflow stays stopped.
    w.set_status(id, stopped).await;
    w.fx.exec(
        "UPDATE duo_workflow_workloads SET state = 'cancelled' WHERE workflow_id = $1",
        &[&id],
    )
    .await;
    let reply = status_event(&w.server, id, &run_token.token, "retry").await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(
        reply.body["message"]
            .as_str()
            .unwrap()
            .contains("has ended"),
        "{}",
        reply.body
    );
    assert_eq!(w.status_of(id).await, stopped);
    // A user's own token retries a stopped workflow as before.
    let user_token = w.workflow_token(w.dev).await;
    let reply = status_event(&w.server, id, &user_token, "retry").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(w.status_of(id).await, Status::Running.code());
}
