//! The repository browser and the workflow pages in a real browser against
//! real processes (monolith, gateway with its workflow service, the fake
//! provider): browsing the demo repository, "Ask Duo about this file" with the
//! file reaching the model, and a workflow started from its page that pauses
//! for approval of a GitLab tool call, runs it once approved (a note appears
//! on the issue) and finishes; a rejection's message reaching the model.
//! Screenshots go to target/screenshots/.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::web_support::{ask, chat_is_live, signed_in};
use e2e_tests::System;
use e2e_tests::browser::Browser;
use fake_provider::{Failure, ToolCall};
use serde_json::json;

/// A line only `src/rate_limit.rs` of the demo `acme/platform/api` holds.
const RATE_LIMIT_LINE: &str = "refill_per_sec: requests_per_minute as f64 / 60.0";
const NOTE_BODY: &str = "Summary from Duo: sessions expire after 30 days.";

async fn page_path(browser: &Browser) -> String {
    browser
        .client
        .current_url()
        .await
        .unwrap()
        .path()
        .to_owned()
}

#[tokio::test]
async fn browsing_the_repository_and_asking_duo_about_a_file() {
    let system = System::start().await.unwrap();
    system
        .fake
        .set_default_text("Thought: ok.\nFinal Answer: It is a token bucket per client.");
    let browser = signed_in(&system, "alice").await;
    browser
        .goto(&format!("{}/acme/platform/api", system.web_url))
        .await
        .unwrap();
    browser
        .click("a[href='/acme/platform/api/-/tree']")
        .await
        .unwrap();
    browser
        .until(
            "the file list",
            "return document.querySelector('table.files a.dir[href$=\"/src\"]')",
        )
        .await
        .unwrap();
    browser.screenshot("repository-tree").await.unwrap();
    browser
        .click("table.files a.dir[href$='/src']")
        .await
        .unwrap();
    browser
        .until(
            "the src directory",
            "return location.pathname.endsWith('/-/tree/main/src') && document.querySelector('a.file[href$=\"/rate_limit.rs\"]')",
        )
        .await
        .unwrap();
    let crumbs = browser.text("nav.breadcrumbs").await.unwrap();
    assert!(
        crumbs.contains("main") && crumbs.contains("src"),
        "{crumbs}"
    );
    browser
        .click("a.file[href$='/rate_limit.rs']")
        .await
        .unwrap();
    browser
        .until(
            "the file",
            "return document.querySelector('pre.numbered .line')",
        )
        .await
        .unwrap();
    assert_eq!(
        page_path(&browser).await,
        "/acme/platform/api/-/blob/main/src/rate_limit.rs"
    );
    let code = browser.text("pre.numbered").await.unwrap();
    assert!(code.contains(RATE_LIMIT_LINE), "{code}");
    browser.screenshot("repository-file").await.unwrap();

    browser.click("a.ask-file").await.unwrap();
    chat_is_live(&browser).await;
    let attached = browser.text("#attached").await.unwrap();
    assert!(attached.contains("src/rate_limit.rs"), "{attached}");
    ask(&browser, "What does this file do?").await;
    browser
        .until(
            "the answer",
            "return document.querySelector('.message.assistant .body:not(.streaming)')?.textContent.includes('token bucket')",
        )
        .await
        .unwrap();
    browser
        .until(
            "the stop button to go away",
            "return document.getElementById('stop').hidden",
        )
        .await
        .unwrap();
    browser.screenshot("chat-about-a-file").await.unwrap();
    // The file went to the model as additional context, read by the monolith.
    let bodies = system.provider_bodies();
    assert!(
        bodies.iter().any(|b| b.contains(RATE_LIMIT_LINE)),
        "the file never reached the model: {bodies:?}"
    );
}

/// Starts a workflow run by the page itself (not by the product's runner)
/// from the project's workflows page with `goal`; returns when the run page
/// is open.
async fn start_workflow(browser: &Browser, system: &System, goal: &str) {
    browser
        .goto(&format!("{}/acme/platform/api/-/workflows", system.web_url))
        .await
        .unwrap();
    browser.type_into("#goal", goal).await.unwrap();
    browser.click("#run-in-page").await.unwrap();
    browser
        .click("form[action$='/-/workflows'] button[type=submit]")
        .await
        .unwrap();
    browser
        .until(
            "the run page",
            "return /\\/-\\/workflows\\/\\d+$/.test(location.pathname) && document.body.dataset.live === 'true'",
        )
        .await
        .unwrap();
}

async fn wait_for_approval(browser: &Browser) -> String {
    let call = browser
        .until(
            "the pending tool call",
            "return document.body.dataset.status === 'tool_call_approval_required' \
               && document.body.dataset.running !== 'true' \
               && !document.getElementById('approval').hidden \
               && document.getElementById('pending-call').textContent",
        )
        .await
        .unwrap();
    call.as_str().unwrap().to_owned()
}

async fn wait_for_status(browser: &Browser, status: &str) {
    browser
        .until(
            &format!("the run to be {status}"),
            &format!(
                "return document.body.dataset.status === '{status}' && document.body.dataset.running !== 'true'"
            ),
        )
        .await
        .unwrap();
}

async fn notes_with(system: &System, text: &str) -> i64 {
    let db = system.db.client().await.unwrap();
    db.query_one(
        "SELECT count(*) FROM notes WHERE body LIKE '%' || $1 || '%'",
        &[&text],
    )
    .await
    .unwrap()
    .get(0)
}

fn note_call() -> ToolCall {
    ToolCall::new(
        "call-note",
        "create_issue_note",
        json!({"issue_iid": 1, "body": NOTE_BODY}),
    )
}

#[tokio::test]
async fn a_workflow_started_on_its_page_waits_for_approval_then_comments_and_finishes() {
    let system = System::start().await.unwrap();
    system
        .fake
        .push_tool_calls("I will leave the summary as a comment.", vec![note_call()]);
    system.fake.push_text("I left the summary on issue #1.");
    let browser = signed_in(&system, "alice").await;
    start_workflow(&browser, &system, "Summarize issue #1 in a comment on it").await;

    let call = wait_for_approval(&browser).await;
    assert!(call.contains("create_issue_note"), "{call}");
    assert!(call.contains(NOTE_BODY), "{call}");
    browser.screenshot("workflow-approval").await.unwrap();
    // Nothing happened before the approval.
    assert_eq!(notes_with(&system, NOTE_BODY).await, 0);

    // A second tab on the same run follows it live (it does not run it).
    let run_url = browser.client.current_url().await.unwrap().to_string();
    let first = browser.client.window().await.unwrap();
    let second = browser.client.new_window(true).await.unwrap().handle;
    browser
        .client
        .switch_to_window(second.clone())
        .await
        .unwrap();
    browser.goto(&run_url).await.unwrap();
    browser
        .until(
            "the second tab's subscription",
            "return document.body.dataset.live === 'true'",
        )
        .await
        .unwrap();
    browser
        .client
        .switch_to_window(first.clone())
        .await
        .unwrap();

    browser.click("#approve").await.unwrap();
    wait_for_status(&browser, "finished").await;
    assert_eq!(notes_with(&system, NOTE_BODY).await, 1, "commented once");
    browser.client.switch_to_window(second).await.unwrap();
    browser
        .until(
            "the finished run in the second tab",
            "return document.body.dataset.status === 'finished' \
               && document.getElementById('log').textContent.includes('I left the summary')",
        )
        .await
        .unwrap();
    assert!(
        browser
            .js("return document.getElementById('approval').hidden", vec![])
            .await
            .unwrap()
            .as_bool()
            .unwrap()
    );
    browser.client.close_window().await.unwrap();
    browser.client.switch_to_window(first).await.unwrap();
    let log = browser.text("#log").await.unwrap();
    assert!(log.contains("I left the summary on issue #1."), "{log}");
    // The call ran once, successfully, and the log says so.
    let ran = browser
        .js(
            "return [...document.querySelectorAll('#log .entry.tool')] \
               .map(e => [e.dataset.status, e.textContent])",
            vec![],
        )
        .await
        .unwrap();
    let ran = ran.as_array().unwrap();
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert_eq!(ran[0][0], "success", "{ran:?}");
    assert!(ran[0][1].as_str().unwrap().contains("create_issue_note"));
    assert!(
        browser
            .js("return !document.getElementById('stop-form')", vec![])
            .await
            .unwrap()
            .as_bool()
            .unwrap(),
        "no stop button once finished"
    );
    browser.screenshot("workflow-finished").await.unwrap();

    // The list shows the run with its status.
    browser
        .goto(&format!("{}/acme/platform/api/-/workflows", system.web_url))
        .await
        .unwrap();
    let runs = browser.text("#runs").await.unwrap();
    assert!(
        runs.contains("Summarize issue #1") && runs.contains("finished"),
        "{runs}"
    );
}

#[tokio::test]
async fn a_rejected_tool_call_never_runs_and_its_message_reaches_the_model() {
    let system = System::start().await.unwrap();
    system.fake.push_tool_calls("", vec![note_call()]);
    system.fake.push_text("Understood, no comment then.");
    let browser = signed_in(&system, "alice").await;
    start_workflow(&browser, &system, "Comment on issue #1").await;
    wait_for_approval(&browser).await;
    browser
        .type_into("#reject-message", "Do not comment, just tell me")
        .await
        .unwrap();
    browser.click("#reject").await.unwrap();
    wait_for_status(&browser, "finished").await;
    assert_eq!(notes_with(&system, NOTE_BODY).await, 0);
    let last = system.provider_bodies().pop().unwrap();
    assert!(last.contains("Do not comment, just tell me"), "{last}");
    let log = browser.text("#log").await.unwrap();
    assert!(log.contains("Understood, no comment then."), "{log}");
}

#[tokio::test]
async fn a_run_left_by_its_page_resumes_from_its_last_checkpoint() {
    let system = System::start().await.unwrap();
    // The first model call never answers: the step is under way when the
    // page goes away.
    system.fake.push_failure(Failure::Hang);
    system.fake.push_text("All done after the interruption.");
    let browser = signed_in(&system, "alice").await;
    start_workflow(&browser, &system, "Tell me about issue #1").await;
    browser
        .until(
            "the run to be under way",
            "return document.body.dataset.status === 'running' && document.body.dataset.running === 'true'",
        )
        .await
        .unwrap();
    for _ in 0..500 {
        if !system.provider_bodies().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(system.provider_bodies().len(), 1);

    // Reloading closes the socket; the run stays `running`, without a client.
    let url = browser.client.current_url().await.unwrap().to_string();
    browser.goto(&url).await.unwrap();
    browser
        .until(
            "the resume button",
            "return document.body.dataset.live === 'true' && !document.getElementById('resume').hidden",
        )
        .await
        .unwrap();
    // The service may still hold the old stream for a moment: a refused
    // attempt says so and the button stays.
    let mut finished = false;
    for _ in 0..20 {
        browser.click("#resume").await.unwrap();
        let outcome = browser
            .until(
                "the resumed stream to end",
                "return document.body.dataset.running === 'false' && document.body.dataset.status",
            )
            .await
            .unwrap();
        if outcome == "finished" {
            finished = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(finished, "the run never resumed");
    let log = browser.text("#log").await.unwrap();
    assert!(log.contains("All done after the interruption."), "{log}");
    assert!(
        browser
            .js("return document.getElementById('resume').hidden", vec![])
            .await
            .unwrap()
            .as_bool()
            .unwrap()
    );
}
