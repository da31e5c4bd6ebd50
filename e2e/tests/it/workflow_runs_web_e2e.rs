//! A run of the product started and steered from the web app, in a real
//! browser against real processes: alice opens an issue of
//! `acme/platform/api`, presses "Run with Duo", approves the plan and then
//! the edit on the run page (which follows each leg as the local runner runs
//! the real executor in its sandbox against the fake provider), sees the
//! merge request link once the run finished, and opens the merge request,
//! authored by the Duo service account with the edit. Screenshots go to
//! target/screenshots/.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::web_support::signed_in;
use crate::workflow_runs_e2e::{
    assert_nothing_left_running, edit_readme, legs, system, wait_legs_ended,
};
use e2e_tests::browser::Browser;
use fake_provider::ToolCall;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How long a leg may take to show on the page (a clone, the executor and a
/// push on a shared machine).
const LEG_LIMIT: Duration = Duration::from_secs(90);

/// Waits until `script` returns something truthy on the page, for longer
/// than the browser helpers' page timeout (legs take seconds).
async fn wait_on_page(browser: &Browser, what: &str, script: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        // A page in the middle of loading may not run scripts: try again.
        let value = browser.js(script, vec![]).await.unwrap_or(Value::Null);
        let truthy = match &value {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::String(s) => !s.is_empty(),
            _ => true,
        };
        if truthy {
            return value;
        }
        if Instant::now() > deadline {
            let page = browser
                .js("return document.getElementById('main')?.innerText", vec![])
                .await
                .unwrap_or(Value::Null);
            panic!("timed out waiting for {what}; the page shows: {page}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the Approve button of the run's `leg`-th leg (its leg ended
/// waiting for the user), then presses it.
async fn approve_leg(browser: &Browser, leg: usize, waits_for: &str) -> String {
    let request = wait_on_page(
        browser,
        &format!("the approval after leg {leg}"),
        &format!(
            "return document.querySelectorAll('#legs > li').length === {leg} \
               && document.body.dataset.status === '{waits_for}' \
               && document.getElementById('approve-run') \
               && (document.getElementById('pending-request')?.textContent ?? 'asked')"
        ),
        LEG_LIMIT,
    )
    .await;
    browser
        .screenshot(&format!("workflow-run-approval-{leg}"))
        .await
        .unwrap();
    browser.click("#approve-run").await.unwrap();
    request.as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn run_with_duo_on_an_issue_ends_in_a_merge_request_opened_from_the_run_page() {
    let system = system().await;
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

    let browser = signed_in(&system, "alice").await;
    browser
        .goto(&format!("{}/acme/platform/api/-/issues/1", system.web_url))
        .await
        .unwrap();
    browser.click("#run-with-duo").await.unwrap();
    let path = wait_on_page(
        &browser,
        "the run page",
        "return /\\/acme\\/platform\\/api\\/-\\/workflows\\/\\d+$/.test(location.pathname) \
           && document.body.dataset.live === 'true' && location.pathname",
        Duration::from_secs(20),
    )
    .await;
    let workflow: i64 = path
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let goal = browser.text(".goal").await.unwrap();
    assert!(
        goal.starts_with("Resolve issue #1: Login fails with expired sessions"),
        "{goal}"
    );
    browser.screenshot("workflow-run-started").await.unwrap();

    // Leg 1 plans; the page shows the plan with the buttons once the leg
    // saved its work.
    let plan = approve_leg(&browser, 1, "plan_approval_required").await;
    assert!(plan.contains("Rename the title of README.md"), "{plan}");
    // Leg 2 wants to edit README.md.
    let edit = approve_leg(&browser, 2, "tool_call_approval_required").await;
    assert!(edit.contains("edit_file"), "{edit}");
    assert!(edit.contains("Acme API"), "{edit}");

    // Leg 3 edits and finishes: the merge request appears on the page.
    let link = wait_on_page(
        &browser,
        "the merge request link",
        "return document.querySelectorAll('#legs > li').length === 3 \
           && document.getElementById('merge-request')?.getAttribute('href')",
        LEG_LIMIT,
    )
    .await;
    let link = link.as_str().unwrap().to_owned();
    assert!(
        link.starts_with("/acme/platform/api/-/merge_requests/"),
        "{link}"
    );
    assert_eq!(
        browser
            .js("return document.body.dataset.status", vec![])
            .await
            .unwrap(),
        "finished"
    );
    let states: Vec<String> = browser
        .js(
            "return [...document.querySelectorAll('#legs > li')].map(l => l.dataset.state)",
            vec![],
        )
        .await
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(states, ["paused", "paused", "finished"]);
    assert!(
        browser
            .js(
                "return !document.getElementById('stop-form') && !document.getElementById('approve-run')",
                vec![]
            )
            .await
            .unwrap()
            .as_bool()
            .unwrap(),
        "nothing to stop or approve once finished"
    );
    let branch = browser.text("#result-branch").await.unwrap();
    assert!(
        branch.contains(&format!("duo/workflow-{workflow}")),
        "{branch}"
    );
    browser.screenshot("workflow-run-finished").await.unwrap();

    // The merge request: opened by the service account, linked to the
    // issue, with the edit.
    browser.click("#merge-request").await.unwrap();
    let heading = wait_on_page(
        &browser,
        "the merge request page",
        &format!(
            "return location.pathname === '{link}' && document.querySelector('h1')?.textContent"
        ),
        Duration::from_secs(20),
    )
    .await;
    assert!(
        heading
            .as_str()
            .unwrap()
            .contains("Duo Workflow: Resolve issue #1"),
        "{heading}"
    );
    let description = browser.text(".prose").await.unwrap();
    assert!(description.contains("Related to #1"), "{description}");
    browser
        .screenshot("workflow-run-merge-request")
        .await
        .unwrap();
    let db = system.db.client().await.unwrap();
    let row = db
        .query_one(
            "SELECT u.username, m.diff, m.target_branch, w.issue_id = i.id
             FROM duo_workflows_workflows w
             JOIN merge_requests m ON m.id = w.merge_request_id
             JOIN users u ON u.id = m.author_id
             JOIN issues i ON i.iid = 1 AND i.project_id = w.project_id
             WHERE w.id = $1",
            &[&workflow],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "duo-developer");
    let diff: String = row.get(1);
    assert!(
        diff.contains("+# Acme API") && diff.contains("-# API"),
        "{diff}"
    );
    assert_eq!(row.get::<_, String>(2), "main");
    assert!(row.get::<_, bool>(3), "the workflow links the issue");
    wait_legs_ended(&system, workflow, Duration::from_secs(10)).await;
    assert_eq!(legs(&system, workflow).await.len(), 3);
    assert_nothing_left_running();
}
