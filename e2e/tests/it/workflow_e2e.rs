//! Duo Workflow end to end with real processes: the monolith (workflows,
//! `direct_access`, checkpoints in PostgreSQL), the gateway's workflow service
//! (gRPC), the `duo-workflow-executor` binary in a temporary checkout, and the
//! fake provider scripting Anthropic tool calls.
//! The last test clones a demo repository from the monolith over git's smart
//! HTTP, lets the agent edit, commit and push, and reads the pushed file back
//! through the monolith's REST API.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::fixtures::{git, project_id};
use e2e_tests::{System, binary};
use fake_provider::{Failure, ToolCall};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

/// A checkout the executor works in, removed when dropped.
struct Checkout(PathBuf);

impl Checkout {
    fn new(readme: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "workflow-e2e-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("README.md"), readme).unwrap();
        Self(dir)
    }

    fn readme(&self) -> String {
        std::fs::read_to_string(self.0.join("README.md")).unwrap()
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn create_workflow(system: &System, token: &str, project: i64, pre_approved: &[i64]) -> i64 {
    create_workflow_with(system, token, project, &[1, 2], pre_approved).await
}

async fn create_workflow_with(
    system: &System,
    token: &str,
    project: i64,
    privileges: &[i64],
    pre_approved: &[i64],
) -> i64 {
    let (status, created) = system
        .rest(
            token,
            reqwest::Method::POST,
            "/ai/duo_workflows/workflows",
            Some(json!({
                "project_id": project,
                "goal": "Add a greeting to the README",
                "workflow_definition": "chat",
                "agent_privileges": privileges,
                "pre_approved_agent_privileges": pre_approved,
            })),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "{created}");
    created["id"].as_i64().unwrap()
}

fn executor(
    system: &System,
    token: &str,
    workflow: i64,
    checkout: &Path,
    extra: &[&str],
) -> Command {
    let mut command = Command::new(binary("duo-workflow-executor").unwrap());
    command
        .args(["--gitlab-url", &system.web_url, "--token", token])
        .args(["--workflow-id", &workflow.to_string()])
        .arg("--workspace")
        .arg(checkout)
        .args(["--definition", "chat"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn run_executor(
    system: &System,
    token: &str,
    workflow: i64,
    checkout: &Path,
    extra: &[&str],
) -> (i32, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        executor(system, token, workflow, checkout, extra).output(),
    )
    .await
    .expect("the executor finished in time")
    .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Status and checkpoints straight from the monolith's database.
async fn stored(system: &System, workflow: i64) -> (i16, Vec<(String, Option<String>, Value)>) {
    let db = system.db.client().await.unwrap();
    let status: i16 = db
        .query_one(
            "SELECT status FROM duo_workflows_workflows WHERE id = $1",
            &[&workflow],
        )
        .await
        .unwrap()
        .get(0);
    let rows = db
        .query(
            "SELECT thread_ts, parent_ts, checkpoint::jsonb FROM duo_workflows_checkpoints WHERE workflow_id = $1 ORDER BY id",
            &[&workflow],
        )
        .await
        .unwrap();
    (
        status,
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
    )
}

const FINISHED: i16 = 3;
const TOOL_CALL_APPROVAL_REQUIRED: i16 = 8;

fn assert_chained(checkpoints: &[(String, Option<String>, Value)]) {
    assert!(checkpoints.len() >= 3, "{}", checkpoints.len());
    assert_eq!(checkpoints[0].1, None);
    for pair in checkpoints.windows(2) {
        assert_eq!(
            pair[1].1.as_deref(),
            Some(pair[0].0.as_str()),
            "parent_ts chains"
        );
    }
}

fn edit_call() -> ToolCall {
    ToolCall::new(
        "call-edit",
        "edit_file",
        json!({"file_path": "README.md", "old_str": "Hello", "new_str": "Hello, world"}),
    )
}

#[tokio::test]
async fn a_workflow_pauses_for_approval_then_edits_once_and_finishes() {
    let system = System::start().await.unwrap();
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    let checkout = Checkout::new("Hello\n");
    let workflow = create_workflow(&system, &alice, project, &[2]).await;
    system.fake.push_tool_calls(
        "Reading it first.",
        vec![ToolCall::new(
            "call-read",
            "read_file",
            json!({"file_path": "README.md"}),
        )],
    );
    system.fake.push_tool_calls("", vec![edit_call()]);

    // No terminal and no rule: the run stays paused, nothing edited.
    let (code, log) = run_executor(&system, &alice, workflow, &checkout.0, &[]).await;
    assert_eq!(code, 3, "{log}");
    assert_eq!(checkout.readme(), "Hello\n");
    let (status, _) = stored(&system, workflow).await;
    assert_eq!(status, TOOL_CALL_APPROVAL_REQUIRED);

    system.fake.push_text("I added the greeting.");
    let (code, log) = run_executor(
        &system,
        &alice,
        workflow,
        &checkout.0,
        &["--approve", "edit_file"],
    )
    .await;
    assert_eq!(code, 0, "{log}");
    assert_eq!(checkout.readme(), "Hello, world\n", "edited exactly once");
    let (status, checkpoints) = stored(&system, workflow).await;
    assert_eq!(status, FINISHED);
    assert_chained(&checkpoints);
    let log = &checkpoints.last().unwrap().2["channel_values"]["ui_chat_log"];
    assert!(
        log.as_array()
            .unwrap()
            .iter()
            .any(|e| e["message_type"] == "request")
    );
    // The model read the file through the executor before editing it.
    let bodies = system.provider_bodies();
    assert!(
        bodies
            .iter()
            .any(|b| b.contains("tool_result") && b.contains("Hello\\n"))
    );
}

#[tokio::test]
async fn a_rejection_reaches_the_model_and_nothing_changes() {
    let system = System::start().await.unwrap();
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    let checkout = Checkout::new("Hello\n");
    let workflow = create_workflow(&system, &alice, project, &[2]).await;
    system.fake.push_tool_calls("", vec![edit_call()]);
    system.fake.push_text("Fine, leaving it.");
    let (code, log) = run_executor(
        &system,
        &alice,
        workflow,
        &checkout.0,
        &[
            "--reject-unmatched",
            "--reject-message",
            "keep the README as it is",
        ],
    )
    .await;
    assert_eq!(code, 0, "{log}");
    assert_eq!(checkout.readme(), "Hello\n");
    assert_eq!(stored(&system, workflow).await.0, FINISHED);
    assert!(
        system
            .provider_bodies()
            .last()
            .unwrap()
            .contains("keep the README as it is")
    );
}

#[tokio::test]
async fn a_killed_executor_resumes_and_a_second_one_is_refused() {
    let system = System::start().await.unwrap();
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    let checkout = Checkout::new("Hello\n");
    let workflow = create_workflow(&system, &alice, project, &[1, 2]).await;
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "call-read",
            "read_file",
            json!({"file_path": "README.md"}),
        )],
    );
    // The second model call hangs while the executor runs.
    system.fake.push_failure(Failure::Hang);
    let mut first = executor(&system, &alice, workflow, &checkout.0, &[])
        .spawn()
        .unwrap();
    for _ in 0..1000 {
        if system.provider_bodies().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(system.provider_bodies().len(), 2);

    // A second executor on the same workflow is refused while the first runs.
    let (code, log) = run_executor(&system, &alice, workflow, &checkout.0, &[]).await;
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("already running"), "{log}");

    first.kill().await.unwrap();
    let (_, before) = stored(&system, workflow).await;
    system.fake.push_text("The README says Hello.");
    // The service notices the hang-up and releases the workflow; the next
    // executor resumes from the newest checkpoint (retries are bounded).
    let mut outcome = (1, String::new());
    for _ in 0..20 {
        outcome = run_executor(&system, &alice, workflow, &checkout.0, &[]).await;
        if !outcome.1.contains("already running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(outcome.0, 0, "{}", outcome.1);
    let (status, after) = stored(&system, workflow).await;
    assert_eq!(status, FINISHED);
    assert!(after.len() > before.len());
    assert_chained(&after);
}

#[tokio::test]
async fn bad_tokens_and_missing_seats_are_refused() {
    let system = System::start().await.unwrap();
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    let checkout = Checkout::new("Hello\n");
    let workflow = create_workflow(&system, &alice, project, &[2]).await;
    // A forged service token: the service answers UNAUTHENTICATED.
    let service_url = system.workflow_url.clone();
    let (code, log) = run_executor(
        &system,
        &alice,
        workflow,
        &checkout.0,
        &[
            "--service-url",
            &service_url,
            "--service-token",
            "eyJhbGciOiJSUzI1NiJ9.e30.bad",
        ],
    )
    .await;
    assert_eq!(code, 1, "{log}");
    assert!(log.contains("Unauthenticated"), "{log}");
    // carol has no seat: no duo_agent_platform, no workflow token.
    let carol = system.token("carol").unwrap();
    let (status, body) = system
        .rest(
            &carol,
            reqwest::Method::POST,
            "/ai/duo_workflows/direct_access",
            Some(json!({"workflow_definition": "chat"})),
        )
        .await
        .unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(system.provider_bodies().is_empty());
}

/// Runs `git` in `dir`, failing the test on a non-zero exit.
#[tokio::test]
async fn an_approved_edit_is_committed_and_pushed_to_the_monolith() {
    let system = System::start().await.unwrap();
    let alice = system.token("alice").unwrap();
    let project = project_id(&system, &alice, "acme/platform/api").await;
    let scratch = Checkout::new("");
    let url = system
        .web_url
        .replacen("://", &format!("://alice:{alice}@"), 1);
    git(
        &scratch.0,
        &[
            "clone",
            "-q",
            &format!("{url}/acme/platform/api.git"),
            "api",
        ],
    );
    let checkout = scratch.0.join("api");
    git(&checkout, &["config", "user.name", "Alice Owner"]);
    git(&checkout, &["config", "user.email", "alice@example.com"]);
    let readme = std::fs::read_to_string(checkout.join("README.md")).unwrap();
    assert!(readme.starts_with("# API\n"), "{readme}");

    // Files, GitLab reads and git; only GitLab reads are pre-approved.
    let workflow = create_workflow_with(&system, &alice, project, &[1, 2, 5], &[2]).await;
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "call-edit",
            "edit_file",
            json!({"file_path": "README.md", "old_str": "# API\n", "new_str": "# API\n\nHello from Duo.\n"}),
        )],
    );
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "call-commit",
            "run_git_command",
            json!({"command": "commit", "args": ["-q", "-a", "-m", "Greet readers of the README"]}),
        )],
    );
    system.fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "call-push",
            "run_git_command",
            json!({"command": "push", "args": ["-q", "origin", "HEAD:main"]}),
        )],
    );
    system.fake.push_text("Committed and pushed.");
    let (code, log) = run_executor(
        &system,
        &alice,
        workflow,
        &checkout,
        &["--approve", "edit_file", "--approve", "run_git_command"],
    )
    .await;
    assert_eq!(code, 0, "{log}");
    let (status, checkpoints) = stored(&system, workflow).await;
    assert_eq!(status, FINISHED);
    assert_chained(&checkpoints);
    // Every git step succeeded as far as the model was told.
    let bodies = system.provider_bodies();
    assert!(
        !bodies.last().unwrap().contains("error:"),
        "{}",
        bodies.last().unwrap()
    );

    // The monolith has the commit on main, exactly once, by alice.
    let (status, content) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/repository/files/README.md/raw?ref=main"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{content}");
    let content = content.as_str().unwrap();
    assert_eq!(content.matches("Hello from Duo.").count(), 1, "{content}");
    let (status, commits) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/projects/{project}/repository/commits?ref_name=main&per_page=1"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{commits}");
    assert_eq!(commits[0]["title"], "Greet readers of the README");
    assert_eq!(commits[0]["author_email"], "alice@example.com");
    assert_eq!(
        commits[0]["id"].as_str().unwrap(),
        git(&checkout, &["rev-parse", "HEAD"]).trim()
    );
}
