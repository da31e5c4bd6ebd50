//! Duo Workflow's periodic jobs: workflows stuck in `created` or `running`
//! are failed (by the job on the real queue, too), and old checkpoints go.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use monolith::workflows::{Status, maintenance};
use serde_json::json;

use crate::workflows_support::{World, world};

async fn aged(w: &World, status: Status, minutes: i32) -> i64 {
    let id = w.workflow(&w.dev_token, json!({})).await;
    w.fx
        .exec(
            "UPDATE duo_workflows_workflows SET status = $2, updated_at = now() - make_interval(mins => $3) WHERE id = $1",
            &[&id, &status.code(), &minutes],
        )
        .await;
    id
}

#[tokio::test]
async fn workflows_without_an_update_for_the_threshold_are_failed() {
    let w = world().await;
    let created_old = aged(&w, Status::Created, 31).await;
    let running_old = aged(&w, Status::Running, 45).await;
    let running_fresh = aged(&w, Status::Running, 5).await;
    let paused_old = aged(&w, Status::Paused, 120).await;
    let held_old = aged(&w, Status::Running, 120).await;
    {
        let db = w.fx.pool.get().await.unwrap();
        monolith::workflows::lease::acquire(&**db, held_old, Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
    }
    let mut client = w.fx.pool.get().await.unwrap();
    let mut failed = maintenance::fail_stuck(&mut client, Duration::from_secs(30 * 60))
        .await
        .unwrap();
    failed.sort_unstable();
    assert_eq!(failed, vec![created_old, running_old]);
    for (id, status) in [
        (created_old, Status::Failed),
        (running_old, Status::Failed),
        (running_fresh, Status::Running),
        (paused_old, Status::Paused),
        (held_old, Status::Running),
    ] {
        assert_eq!(w.status_of(id).await, status.code(), "workflow {id}");
    }
    let audited = w
        .fx
        .id(
            "SELECT count(*) FROM duo_workflows_audit_events WHERE action = 'duo_session_dropped_as_stuck'",
            &[],
        )
        .await;
    assert_eq!(audited, 2);
    // Nothing left to do the second time.
    assert!(
        maintenance::fail_stuck(&mut client, Duration::from_secs(30 * 60))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn the_worker_runs_the_stuck_workflow_job_on_its_period() {
    let w = world().await;
    let stuck = aged(&w, Status::Running, 3).await;
    let fresh = aged(&w, Status::Running, 0).await;
    let url = w.fx.db.url().to_string();
    let config = monolith::config::Config::from_lookup(|k| match k {
        "DATABASE_URL" => Some(url.clone()),
        "DUO_WORKFLOW_STUCK_AFTER_SECS" => Some("120".into()),
        "DUO_WORKFLOW_STUCK_CHECK_INTERVAL_SECS" => Some("1".into()),
        _ => None,
    })
    .unwrap();
    let worker = monolith::worker::spawn(
        w.fx.pool.clone(),
        w.fx.db.url(),
        std::sync::Arc::new(monolith::chat::jobs::NotYetAvailableResponder),
        "https://docs.gitlab.com".into(),
        monolith::worker::WorkerSettings {
            queue: job_queue::WorkerConfig {
                poll_interval: Duration::from_millis(100),
                ..Default::default()
            },
            retention_every: Duration::from_secs(3600),
            workflows: Some(config.duo_workflow.clone()),
            code_index: None,
            workflow_runs: None,
            review: None,
        },
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while w.status_of(stuck).await != Status::Failed.code() {
        assert!(tokio::time::Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;
    assert_eq!(w.status_of(fresh).await, Status::Running.code());
}

#[tokio::test]
async fn checkpoints_past_their_retention_are_deleted() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    assert_eq!(w.checkpoint(&token, id, "old", None).await.0, 201);
    assert_eq!(w.checkpoint(&token, id, "new", Some("old")).await.0, 201);
    w.fx
        .exec(
            "UPDATE duo_workflows_checkpoints SET created_at = now() - interval '31 days' WHERE thread_ts = 'old'",
            &[],
        )
        .await;
    let db = w.fx.pool.get().await.unwrap();
    assert_eq!(maintenance::apply_retention(&**db, 30).await.unwrap(), 1);
    let left: Vec<String> = db
        .query("SELECT thread_ts FROM duo_workflows_checkpoints", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec!["new".to_owned()]);
}
