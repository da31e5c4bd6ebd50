//! A failed pipeline ends in a merge request with a fix, end to end with real
//! processes: a maintainer turns the project's `pipeline_failed` trigger on,
//! a failed CI job is imported through REST, the worker starts a
//! software-development run in the product as the reporter (the local runner,
//! the real executor in its sandbox), the scripted model reads the code the
//! log names, plans and — once the reporter approved the plan and the edit —
//! fixes the file; the finished run's work becomes a branch and a merge
//! request into the failed ref. With the trigger off (the default) nothing
//! starts.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::fixtures::project_id;
use crate::workflow_runs_e2e::{assert_nothing_left_running, legs, system, wait_legs_ended};
use e2e_tests::System;
use fake_provider::ToolCall;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const PLAN_APPROVAL_REQUIRED: i16 = 7;
const TOOL_CALL_APPROVAL_REQUIRED: i16 = 8;
const FINISHED: i16 = 3;
const FAILED: i16 = 4;
const STOPPED: i16 = 5;

/// The bug the failed job reports: a session exactly `max_age_days` old is
/// still accepted.
const BUGGY: &str = "self.age_days > max_age_days";
const FIXED: &str = "self.age_days >= max_age_days";

const FAILED_LOG: &str = "\
$ cargo test
   Compiling acme-api v0.1.0 (/builds/acme/platform/api)
running 4 tests
test session::tests::a_fresh_session_signs_in ... ok
test session::tests::a_session_at_its_maximum_age_is_expired ... FAILED

failures:

---- session::tests::a_session_at_its_maximum_age_is_expired stdout ----
thread 'session::tests::a_session_at_its_maximum_age_is_expired' panicked at src/session.rs:31:9:
a session exactly max_age_days old must be expired (Session::expired in src/session.rs)

test result: FAILED. 3 passed; 1 failed
ERROR: Job failed: exit code 101
";

/// The workflows `token`'s user sees in `project`.
async fn workflows(system: &System, token: &str, project: i64) -> Vec<Value> {
    let (status, list) = system
        .rest(
            token,
            reqwest::Method::GET,
            &format!("/ai/duo_workflows/workflows?project_id={project}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{list}");
    list.as_array().unwrap().clone()
}

/// Imports a finished job of `main` at `sha` with `log`; the job's JSON.
async fn import_job(
    system: &System,
    token: &str,
    project: i64,
    (status, sha): (&str, &str),
    log: &str,
) -> Value {
    let (code, job) = system
        .rest(
            token,
            reqwest::Method::POST,
            &format!("/projects/{project}/jobs/import"),
            Some(json!({
                "name": "rust-test",
                "stage": "test",
                "status": status,
                "ref": "main",
                "sha": sha,
                "log": log,
            })),
        )
        .await
        .unwrap();
    assert_eq!(code, 201, "{job}");
    job
}

/// How many `duo_pipeline_failed` jobs were ever queued.
async fn fix_jobs_queued(system: &System) -> i64 {
    system
        .db
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM background_jobs WHERE kind = 'duo_pipeline_failed'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn status_of(system: &System, workflow: i64) -> i16 {
    system
        .db
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT status FROM duo_workflows_workflows WHERE id = $1",
            &[&workflow],
        )
        .await
        .unwrap()
        .get(0)
}

/// The workflow's status once it is `wanted`; fails with its legs otherwise.
async fn wait_for(system: &System, workflow: i64, wanted: i16, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let status = status_of(system, workflow).await;
        if status == wanted {
            return;
        }
        if Instant::now() > deadline || [FINISHED, FAILED, STOPPED].contains(&status) {
            panic!(
                "workflow {workflow} is in status {status}, not {wanted}; legs: {:#?}\nworker: {}",
                legs(system, workflow).await,
                system.worker.as_ref().unwrap().log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Approves what the run waits for (the plan, or the tool calls).
async fn approve(system: &System, token: &str, workflow: i64) {
    let (status, body) = system
        .rest(
            token,
            reqwest::Method::POST,
            &format!("/ai/duo_workflows/workflows/{workflow}/events"),
            Some(json!({"event_type": "resume", "message": ""})),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn a_failed_pipeline_ends_in_a_merge_request_with_the_fix() {
    let system = system().await;
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    let (status, main) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/repository/branches/main"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{main}");
    let sha = main["commit"]["id"].as_str().unwrap().to_owned();

    // The trigger is off by default: a failed job starts nothing.
    let (status, triggers) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/duo_triggers"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{triggers}");
    let off = triggers
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["event"] == "pipeline_failed")
        .unwrap();
    assert_eq!(off["enabled"], false, "{triggers}");
    import_job(&system, &alice, project, ("failed", &sha), FAILED_LOG).await;
    assert_eq!(fix_jobs_queued(&system).await, 0);
    assert!(workflows(&system, &alice, project).await.is_empty());

    // Alice (the owner) turns it on.
    let (status, trigger) = system
        .rest(
            &alice,
            reqwest::Method::PUT,
            &format!("/projects/{project}/duo_triggers/pipeline_failed"),
            Some(json!({"enabled": true})),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{trigger}");
    assert_eq!(trigger["enabled"], true, "{trigger}");
    // A job that passed starts nothing either.
    import_job(&system, &alice, project, ("success", &sha), "ok").await;
    assert_eq!(fix_jobs_queued(&system).await, 0);

    // The model of the run: the context builder reads the file the log
    // names and reports, the planner plans.
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "call-read",
            "read_file",
            json!({"file_path": "src/session.rs"}),
        )],
    );
    system.fake.push_text(format!(
        "Session::expired in src/session.rs compares with `{BUGGY}`: a session of exactly max_age_days is not expired."
    ));
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "plan",
            "create_plan",
            json!({"steps": ["Expire sessions at max_age_days in src/session.rs"]}),
        )],
    );

    // A failed job of main: the run starts, as alice.
    let job = import_job(&system, &alice, project, ("failed", &sha), FAILED_LOG).await;
    let pipeline = job["pipeline"]["id"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let created = loop {
        if let Some(found) = workflows(&system, &alice, project).await.pop() {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no workflow was started: {}",
            system.worker.as_ref().unwrap().log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let workflow = created["id"].as_i64().unwrap();
    let branch = format!("duo/workflow-{workflow}");
    let goal = created["goal"].as_str().unwrap();
    assert!(
        goal.starts_with(&format!(
            "Started by a failed pipeline: job `rust-test` of pipeline #{pipeline} failed on `main` ({})",
            &sha[..8]
        )),
        "{goal}"
    );
    assert!(
        goal.contains("a merge request into `main` is opened"),
        "{goal}"
    );
    assert!(
        goal.contains("a session exactly max_age_days old must be expired"),
        "the goal carries the end of the log: {goal}"
    );
    assert_eq!(created["workflow_definition"], "software_development");
    assert_eq!(fix_jobs_queued(&system).await, 1);

    // Leg 1: cloned, read the file, planned; the plan waits for alice.
    wait_for(
        &system,
        workflow,
        PLAN_APPROVAL_REQUIRED,
        Duration::from_secs(90),
    )
    .await;
    wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;
    let bodies = system.provider_bodies().join("\n");
    assert!(
        bodies.contains("Started by a failed pipeline") && bodies.contains(BUGGY),
        "the model saw the goal and the clone's file"
    );

    // The plan approved, the executor fixes the file; the edit waits for
    // alice's approval, then the run finishes.
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "call-edit",
            "edit_file",
            json!({"file_path": "src/session.rs", "old_str": BUGGY, "new_str": FIXED}),
        )],
    );
    system
        .fake
        .push_text("Sessions now expire at their maximum age.");
    approve(&system, &alice, workflow).await;
    wait_for(
        &system,
        workflow,
        TOOL_CALL_APPROVAL_REQUIRED,
        Duration::from_secs(90),
    )
    .await;
    wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;
    approve(&system, &alice, workflow).await;
    wait_for(&system, workflow, FINISHED, Duration::from_secs(90)).await;
    wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;

    let states: Vec<String> = legs(&system, workflow)
        .await
        .into_iter()
        .map(|l| l.0)
        .collect();
    assert_eq!(states, ["paused", "paused", "finished"]);

    // The merge request from the run's branch into main, opened by Duo for
    // alice, and the fix on that branch; main is untouched.
    let (status, requests) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/merge_requests?source_branch=duo%2Fworkflow-{workflow}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{requests}");
    assert_eq!(
        requests.as_array().map(Vec::len),
        Some(1),
        "one merge request from {branch}: {requests}\nlegs: {:#?}",
        legs(&system, workflow).await
    );
    let request = &requests[0];
    assert_eq!(request["target_branch"], "main", "{request}");
    assert_eq!(request["author"]["username"], "duo-developer", "{request}");
    assert!(
        request["title"]
            .as_str()
            .unwrap()
            .contains("Started by a failed pipeline"),
        "{request}"
    );
    let iid = request["iid"].as_i64().unwrap();
    let (_, diffs) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/merge_requests/{iid}/diffs"),
            None,
        )
        .await
        .unwrap();
    let diff = diffs[0]["diff"].as_str().unwrap();
    assert!(
        diff.contains(&format!("+        {FIXED}")) && diff.contains(&format!("-        {BUGGY}")),
        "{diff}"
    );
    let (status, file) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/repository/files/src%2Fsession.rs/raw?ref=duo%2Fworkflow-{workflow}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{file}");
    let file = file.as_str().unwrap();
    assert!(file.contains(FIXED), "{file}");
    let (_, main) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/repository/files/src%2Fsession.rs/raw?ref=main"),
            None,
        )
        .await
        .unwrap();
    assert!(main.as_str().unwrap().contains(BUGGY), "{main}");

    // One run and one merge request in all: the job that passed and the one
    // before the trigger was on started nothing.
    assert_eq!(workflows(&system, &alice, project).await.len(), 1);
    let (_, all) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/merge_requests?state=all"),
            None,
        )
        .await
        .unwrap();
    let by_duo: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["author"]["username"] == "duo-developer")
        .collect();
    assert_eq!(by_duo.len(), 1, "{all}");
    assert_nothing_left_running();
}
