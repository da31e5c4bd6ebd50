//! Workflows the product runs itself, end to end with real processes: the
//! monolith's REST API starts a run, its worker hands each leg to the local
//! runner (the real `duo-workflow-executor` in a bubblewrap sandbox, cloning
//! and pushing through the monolith's git HTTP), the gateway's workflow
//! service runs the flow against the fake provider, approvals and stops go
//! through the events API, and the work comes back as a branch and a merge
//! request authored by the Duo service account.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::fixtures::{git, project_id};
use e2e_tests::System;
use fake_provider::{Failure, ToolCall};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const PLAN_APPROVAL_REQUIRED: i16 = 7;
const TOOL_CALL_APPROVAL_REQUIRED: i16 = 8;
const FINISHED: i16 = 3;
const FAILED: i16 = 4;
const STOPPED: i16 = 5;

/// A system whose worker runs legs, with `duo-developer` as the instance's
/// workflow service account (a developer of every demo project).
pub(crate) async fn system() -> System {
    let executor = e2e_tests::binary("duo-workflow-executor").unwrap();
    System::start_with(e2e_tests::Options {
        monolith_env: vec![
            ("DUO_WORKFLOW_RUNNER".into(), "local".into()),
            (
                "DUO_WORKFLOW_EXECUTOR".into(),
                executor.display().to_string(),
            ),
            // Waiting legs are admitted at once in these tests.
            ("DUO_WORKFLOW_RUN_DISPATCH_INTERVAL_SECS".into(), "1".into()),
        ],
        ..Default::default()
    })
    .await
    .unwrap()
}

async fn start_run(system: &System, token: &str, project: i64, goal: &str) -> (u16, Value) {
    system
        .rest(
            token,
            reqwest::Method::POST,
            "/ai/duo_workflows/workflows",
            Some(json!({
                "project_id": project,
                "goal": goal,
                "workflow_definition": "software_development",
                "start_workflow": true,
                "agent_privileges": [1, 2, 4],
                "pre_approved_agent_privileges": [2],
            })),
        )
        .await
        .unwrap()
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

/// The workflow's status once it is one of `wanted` (legs take seconds: a
/// clone, the executor, a push); fails with the leg's log after `limit`.
async fn wait_for(system: &System, workflow: i64, wanted: &[i16], limit: Duration) -> i16 {
    let deadline = Instant::now() + limit;
    loop {
        let status = status_of(system, workflow).await;
        if wanted.contains(&status) {
            return status;
        }
        // A workflow that ended otherwise will not get there.
        if Instant::now() > deadline || [FINISHED, FAILED, STOPPED].contains(&status) {
            let gateway: Vec<String> = system
                .gateway
                .stdout_lines()
                .into_iter()
                .filter(|l| l.contains("workflow") || l.contains("lock"))
                .collect();
            panic!(
                "workflow {workflow} is in status {status}, not {wanted:?}; legs: {:#?}\ngateway: {:#?}",
                legs(system, workflow).await,
                &gateway[gateway.len().saturating_sub(30)..]
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every leg's state, failure and log, for failure messages and checks.
pub(crate) async fn legs(
    system: &System,
    workflow: i64,
) -> Vec<(String, Option<String>, Option<String>)> {
    system
        .db
        .client()
        .await
        .unwrap()
        .query(
            "SELECT state, failure_reason, log_tail FROM duo_workflow_workloads
             WHERE workflow_id = $1 ORDER BY leg",
            &[&workflow],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Waits until no leg of `workflow` is queued or running.
pub(crate) async fn wait_legs_ended(system: &System, workflow: i64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while legs(system, workflow)
        .await
        .iter()
        .any(|(state, _, _)| state == "queued" || state == "running")
    {
        if Instant::now() > deadline {
            let jobs: Vec<String> = system
                .db
                .client()
                .await
                .unwrap()
                .query("SELECT row_to_json(j)::text FROM background_jobs j", &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!(
                "{:#?}\n{jobs:#?}\n{}",
                legs(system, workflow).await,
                system.worker.as_ref().unwrap().log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn event(system: &System, token: &str, workflow: i64, kind: &str, message: &str) -> u16 {
    let (status, body) = system
        .rest(
            token,
            reqwest::Method::POST,
            &format!("/ai/duo_workflows/workflows/{workflow}/events"),
            Some(json!({"event_type": kind, "message": message})),
        )
        .await
        .unwrap();
    assert!(status == 201 || status >= 400, "{status} {body}");
    status
}

/// No process of any leg is left: no sandbox and no executor anywhere.
pub(crate) fn assert_nothing_left_running() {
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains("/opt/duo/duo-workflow-executor") {
            left.push(text);
        }
    }
    assert!(left.is_empty(), "left running: {left:#?}");
}

pub(crate) fn edit_readme() -> ToolCall {
    ToolCall::new(
        "call-edit",
        "edit_file",
        json!({"file_path": "README.md", "old_str": "# API", "new_str": "# Acme API"}),
    )
}

#[tokio::test]
async fn a_run_started_from_rest_asks_its_user_and_ends_in_a_merge_request() {
    let system = system().await;
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    // Context builder reads, reports; the planner plans; the executor edits
    // (after approval) and finishes.
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "call-read",
            "read_file",
            json!({"file_path": "README.md"}),
        )],
    );
    system
        .fake
        .push_text("README.md starts with the title # API.");
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "plan",
            "create_plan",
            json!({"steps": ["Rename the title of README.md to Acme API"]}),
        )],
    );
    system.fake.push_tool_calls("", vec![edit_readme()]);
    system.fake.push_text("Renamed the title.");

    let (status, created) = start_run(&system, &alice, project, "Call the API Acme API").await;
    assert_eq!(status, 201, "{created}");
    let workflow = created["id"].as_i64().unwrap();
    assert!(created["workload"]["id"].as_i64().is_some(), "{created}");
    let message = created["workload"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("/acme/platform/api/-/workflows/{workflow}")),
        "{message}"
    );

    // Leg 1: cloned, read the file in the sandbox, planned; waits for the plan.
    let started = Instant::now();
    wait_for(
        &system,
        workflow,
        &[PLAN_APPROVAL_REQUIRED],
        Duration::from_secs(60),
    )
    .await;
    wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;
    println!("first leg to the plan: {:?}", started.elapsed());
    let bodies = system.provider_bodies().join("\n");
    assert!(
        bodies.contains("The Acme platform API"),
        "the model read the clone's README"
    );

    // The plan approved: leg 2 continues until the edit needs approval.
    assert_eq!(event(&system, &alice, workflow, "resume", "").await, 201);
    wait_for(
        &system,
        workflow,
        &[TOOL_CALL_APPROVAL_REQUIRED],
        Duration::from_secs(60),
    )
    .await;
    wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;

    // The edit approved: leg 3 edits, finishes, and the merge request opens.
    assert_eq!(event(&system, &alice, workflow, "resume", "").await, 201);
    wait_for(&system, workflow, &[FINISHED], Duration::from_secs(60)).await;
    wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;
    let states: Vec<String> = legs(&system, workflow)
        .await
        .into_iter()
        .map(|l| l.0)
        .collect();
    assert_eq!(states, ["paused", "paused", "finished"]);

    let (status, requests) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/merge_requests?source_branch=duo/workflow-{workflow}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{requests}");
    assert_eq!(
        requests.as_array().map(Vec::len),
        Some(1),
        "one merge request: {:#?}\n{}",
        legs(&system, workflow).await,
        system.worker.as_ref().unwrap().log_tail(30)
    );
    let request = &requests.as_array().unwrap()[0];
    assert_eq!(request["target_branch"], "main");
    assert_eq!(request["author"]["username"], "duo-developer");
    assert!(
        request["description"]
            .as_str()
            .unwrap()
            .contains(&format!("workflow {workflow}")),
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
        diff.contains("+# Acme API") && diff.contains("-# API"),
        "{diff}"
    );

    // The branch holds the edit; main is untouched.
    let (_, file) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!(
                "/projects/{project}/repository/files/README.md/raw?ref=duo%2Fworkflow-{workflow}"
            ),
            None,
        )
        .await
        .unwrap();
    assert!(file.as_str().unwrap().starts_with("# Acme API"), "{file}");
    let (_, main) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/repository/files/README.md/raw?ref=main"),
            None,
        )
        .await
        .unwrap();
    assert!(main.as_str().unwrap().starts_with("# API"), "{main}");

    // The checkpoint ref exists in the repository but no clone sees it.
    let clone =
        std::env::temp_dir().join(format!("runs-e2e-clone-{workflow}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&clone);
    let url = system
        .web_url
        .replace("http://", &format!("http://alice:{alice}@"));
    let advertised = git(
        &std::env::temp_dir(),
        &["ls-remote", &format!("{url}/acme/platform/api.git")],
    );
    assert!(advertised.contains("refs/heads/main"), "{advertised}");
    assert!(!advertised.contains("refs/workloads"), "{advertised}");
    assert!(
        workload_refs(&system).contains(&format!("refs/workloads/{workflow}")),
        "{:?}",
        workload_refs(&system)
    );
    let db = system.db.client().await.unwrap();
    let sha: Option<String> = db
        .query_one(
            "SELECT checkpoint_sha FROM duo_workflow_workloads WHERE workflow_id = $1 AND leg = 3",
            &[&workflow],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sha.map(|s| s.len()), Some(40));
    // The run's tokens are gone.
    let live: i64 = db
        .query_one(
            "SELECT count(*) FROM oauth_access_tokens WHERE workflow_id = $1 AND revoked_at IS NULL",
            &[&workflow],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, 0);
    assert_nothing_left_running();

    // Deleting the workflow removes its hidden ref; the merge request stays.
    let (status, body) = system
        .rest(
            &alice,
            reqwest::Method::DELETE,
            &format!("/ai/duo_workflows/workflows/{workflow}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 204, "{body}");
    assert!(
        workload_refs(&system).is_empty(),
        "{:?}",
        workload_refs(&system)
    );
    let (status, _) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/merge_requests/{iid}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
}

/// Every `refs/workloads/*` ref of every repository of the system.
fn workload_refs(system: &System) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![system.repositories.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "git") {
                let out = git(
                    &path,
                    &[
                        "--git-dir",
                        ".",
                        "for-each-ref",
                        "--format=%(refname)",
                        "refs/workloads",
                    ],
                );
                found.extend(out.lines().map(str::to_owned));
            } else if path.is_dir() {
                dirs.push(path);
            }
        }
    }
    found
}

#[tokio::test]
async fn a_stop_ends_a_running_leg_and_a_killed_one_fails_the_workflow() {
    let system = system().await;
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    // The context builder's model calls hang: the legs keep running.
    system.fake.push_failure(Failure::Hang);
    system.fake.push_failure(Failure::Hang);
    let (status, created) = start_run(&system, &alice, project, "Look around").await;
    assert_eq!(status, 201, "{created}");
    let workflow = created["id"].as_i64().unwrap();
    wait_for(&system, workflow, &[1], Duration::from_secs(30)).await;
    let stopping = Instant::now();
    assert_eq!(event(&system, &alice, workflow, "stop", "").await, 201);
    wait_legs_ended(&system, workflow, Duration::from_secs(10)).await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopping.elapsed()
    );
    assert_eq!(status_of(&system, workflow).await, STOPPED);
    assert_eq!(legs(&system, workflow).await[0].0, "cancelled");
    assert_nothing_left_running();

    // A second run whose executor is killed ends FAILED with the reason.
    let (_, created) = start_run(&system, &alice, project, "Look around again").await;
    let workflow = created["id"].as_i64().unwrap();
    wait_for(&system, workflow, &[1], Duration::from_secs(30)).await;
    let executor = loop {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c).starts_with("/opt/duo/duo-workflow-executor")
            })
        });
        if let Some(entry) = found {
            break entry.file_name().to_string_lossy().parse::<i32>().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    std::process::Command::new("kill")
        .args(["-9", &executor.to_string()])
        .status()
        .unwrap();
    wait_for(&system, workflow, &[FAILED], Duration::from_secs(30)).await;
    let leg = &legs(&system, workflow).await[0];
    assert_eq!(leg.0, "failed");
    assert!(leg.1.as_deref().unwrap().contains("signal"), "{leg:?}");
    assert_nothing_left_running();
}

#[tokio::test]
async fn a_sandboxed_command_sees_neither_the_host_nor_the_tokens() {
    let system = system().await;
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    // The context builder has seen enough, the planner plans; the executor
    // runs a command that looks outside the workspace (privilege 4 is not
    // pre-approved: the user approves it), then ends.
    system.fake.push_text("Seen enough.");
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "plan",
            "create_plan",
            json!({"steps": ["Look around the sandbox"]}),
        )],
    );
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "call-env",
            "run_command",
            json!({"program": "sh", "args": ["-c", "env; ls /; cat /etc/hostname /root/.bashrc; ls /proc | head -50; echo END"]}),
        )],
    );
    system.fake.push_text("Looked around.");
    let (status, created) = start_run(&system, &alice, project, "Look around").await;
    assert_eq!(status, 201, "{created}");
    let workflow = created["id"].as_i64().unwrap();
    for waiting in [PLAN_APPROVAL_REQUIRED, TOOL_CALL_APPROVAL_REQUIRED] {
        wait_for(&system, workflow, &[waiting], Duration::from_secs(60)).await;
        wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;
        assert_eq!(event(&system, &alice, workflow, "resume", "").await, 201);
    }
    wait_for(&system, workflow, &[FINISHED], Duration::from_secs(60)).await;
    wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;
    let bodies = system.provider_bodies().join("\n");
    let seen = bodies
        .split("END")
        .find(|b| b.contains("PATH="))
        .map(str::to_owned)
        .unwrap_or_else(|| {
            panic!(
                "no command output reached the model: {}",
                &bodies[bodies.len().saturating_sub(3000)..]
            )
        });
    for secret in [
        &alice,
        "DUO_GITLAB_TOKEN",
        "DUO_SERVICE_TOKEN",
        "glpat-",
        "Bearer",
    ] {
        assert!(!seen.contains(secret), "{secret} reached a command: {seen}");
    }
    assert!(seen.contains("workspace"), "{seen}");
    assert!(
        !seen.contains("home"),
        "the host's directories are not there: {seen}"
    );
    // `ls /` (JSON-escaped lines): the host's home and root are not there,
    // and `ls /proc` shows only the sandbox's few processes.
    assert!(!seen.contains("\\nroot\\n"), "{seen}");
    let pids = seen
        .split("\\n")
        .filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_digit()))
        .count();
    assert!((1..10).contains(&pids), "{pids} processes seen: {seen}");
    assert_nothing_left_running();
}

#[tokio::test]
async fn who_may_not_run_workflows_there_can_neither_start_nor_follow_one() {
    let system = system().await;
    let alice = system.token("alice").unwrap();
    let dave = system.token("dave").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    system.fake.push_failure(Failure::Hang);
    let (status, _) = start_run(&system, &dave, project, "Do something").await;
    assert!(status == 403 || status == 404, "{status}");
    let (_, created) = start_run(&system, &alice, project, "Look around").await;
    let workflow = created["id"].as_i64().unwrap();
    for (method, path) in [
        (
            reqwest::Method::GET,
            format!("/ai/duo_workflows/workflows/{workflow}"),
        ),
        (
            reqwest::Method::POST,
            format!("/ai/duo_workflows/workflows/{workflow}/events"),
        ),
    ] {
        let (status, _) = system
            .rest(
                &dave,
                method,
                &path,
                Some(json!({"event_type": "stop", "message": ""})),
            )
            .await
            .unwrap();
        assert!(status == 403 || status == 404, "{path}: {status}");
    }
    // Stopped before its executor even started: the start cannot undo it.
    assert_eq!(event(&system, &alice, workflow, "stop", "").await, 201);
    wait_legs_ended(&system, workflow, Duration::from_secs(10)).await;
    assert_eq!(status_of(&system, workflow).await, STOPPED);
    assert_nothing_left_running();
}

#[tokio::test]
async fn a_paused_run_continues_where_it_was_on_resume() {
    let system = system().await;
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    // The first leg's model call hangs until the pause ends it; after the
    // resume the context builder reports and the planner plans.
    system.fake.push_failure(Failure::Hang);
    system.fake.push_text("README.md has a title.");
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "plan",
            "create_plan",
            json!({"steps": ["Rename the title"]}),
        )],
    );
    let (status, created) = start_run(&system, &alice, project, "Rename the title").await;
    assert_eq!(status, 201, "{created}");
    let workflow = created["id"].as_i64().unwrap();
    wait_for(&system, workflow, &[1], Duration::from_secs(30)).await;
    assert_eq!(event(&system, &alice, workflow, "pause", "").await, 201);
    wait_legs_ended(&system, workflow, Duration::from_secs(10)).await;
    const PAUSED: i16 = 2;
    assert_eq!(status_of(&system, workflow).await, PAUSED);
    assert_eq!(legs(&system, workflow).await[0].0, "cancelled");
    // A resume that is not an answer to anything: the run continues.
    assert_eq!(event(&system, &alice, workflow, "resume", "").await, 201);
    wait_for(
        &system,
        workflow,
        &[PLAN_APPROVAL_REQUIRED],
        Duration::from_secs(60),
    )
    .await;
    wait_legs_ended(&system, workflow, Duration::from_secs(30)).await;
    let states: Vec<String> = legs(&system, workflow)
        .await
        .into_iter()
        .map(|l| l.0)
        .collect();
    assert_eq!(states, ["cancelled", "paused"]);
    // Answering a run that does not wait for an answer is refused.
    assert_eq!(event(&system, &alice, workflow, "pause", "").await, 400);
    assert_nothing_left_running();
}
