//! Workflows on the bundled small model (the gateway's local model server is
//! the fake provider here): the service reads the named file, plans, asks
//! the model only for the text, and proposes the edit for approval; goals
//! it cannot carry out are declined, and a run that changed nothing says so.
//! Also: a prompt is fitted to the model's context, or refused with why.

#![expect(clippy::unwrap_used, reason = "tests fail loudly by design")]

use crate::workflow_support::{self as support, Recorder, ScriptedApprover, TempWorkspace};
use fake_provider::FakeProvider;
use serde_json::Value;
use workflow_executor::session::{Decision, SessionEnd};

const GOAL: &str = "Add a one-line description to README.md";

/// The bundled model server at the fake provider, nothing else configured.
fn bundled(fake: &FakeProvider) -> Vec<(&'static str, String)> {
    vec![("AIGW_LOCAL_LLM__URL", fake.openai_base_url())]
}

fn model_calls(fake: &FakeProvider) -> Vec<Value> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.body)
        .collect()
}

fn last_log_entry(monolith: &support::Monolith, id: i64) -> Value {
    let stored = monolith.workflow(id);
    stored.checkpoints.last().unwrap()["checkpoint"]["channel_values"]["ui_chat_log"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone()
}

#[actix_web::test]
async fn the_software_development_flow_adds_the_models_line_after_two_approvals() {
    let (fake, monolith, service) = support::harness(bundled).await;
    let workspace = TempWorkspace::new(&[("README.md", "# Demo\n")]);
    let id = monolith.create_workflow("software_development", &[1, 2], &[2]);
    // A small model's reply: a fence, the title again, the line, a repeat.
    fake.push_text("```\n# Demo\nA tiny demo project for trying Duo.\nA tiny demo project for trying Duo.\n```");
    let mut approver = ScriptedApprover::new(vec![Decision::Approve, Decision::Approve]);
    let mut recorder = Recorder::default();
    let end = service
        .session(&monolith, &workspace, id, "software_development", GOAL)
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    assert_eq!(
        workspace.read("README.md"),
        "# Demo\n\nA tiny demo project for trying Duo.\n"
    );
    // The plan and the edit were each approved by the user first.
    assert_eq!(approver.asked[0].0, "PLAN_APPROVAL_REQUIRED");
    assert!(approver.asked[0].1.plan[1].contains("README.md"));
    assert_eq!(approver.asked[1].0, "TOOL_CALL_APPROVAL_REQUIRED");
    assert_eq!(approver.asked[1].1.tool_calls[0].0, "edit_file");
    // One model call: the text, with the file shown, no tools, the loop
    // penalty on and a one-line budget.
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert!(call.get("tools").is_none(), "{call}");
    assert_eq!(call["dry_multiplier"], 0.8);
    assert!(call["max_tokens"].as_u64().unwrap() <= 64);
    let prompt = call["messages"].to_string();
    assert_eq!(
        call["messages"].as_array().unwrap().len(),
        1,
        "no empty system turn"
    );
    assert!(
        prompt.contains("# Demo")
            && prompt.contains("It should be a one-line description of the project."),
        "{prompt}"
    );
    let stored = monolith.workflow(id);
    assert_eq!(stored.events.last().map(String::as_str), Some("finish"));
    let end_entry = last_log_entry(&monolith, id);
    assert_eq!(end_entry["content"], "Workflow completed.");
    let log = stored.checkpoints.last().unwrap()["checkpoint"].to_string();
    assert!(log.contains("Added to README.md"), "{log}");
    // Read twice (while gathering context, then before writing), edited once.
    let workspace_actions: Vec<&String> = recorder
        .actions
        .iter()
        .filter(|a| !a.contains(" /api/"))
        .collect();
    assert_eq!(
        workspace_actions,
        ["read README.md", "read README.md", "edit README.md"]
    );
}

#[actix_web::test]
async fn the_chat_flow_creates_a_missing_file_and_answers_questions_without_tools() {
    let (fake, monolith, service) = support::harness(bundled).await;
    let workspace = TempWorkspace::new(&[]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    // The first reply only talks about the task: asked once more, plainly.
    fake.push_text("Here is the note for NOTES.md:");
    fake.push_text("Run the tests with ./dev test.");
    let mut approver = ScriptedApprover::new(vec![Decision::Approve]);
    let mut recorder = Recorder::default();
    let end = service
        .session(
            &monolith,
            &workspace,
            id,
            "chat",
            "Write a short note on testing to NOTES.md",
        )
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    assert_eq!(
        workspace.read("NOTES.md"),
        "Run the tests with ./dev test.\n"
    );
    assert_eq!(
        approver.asked[0].1.tool_calls[0].0,
        "create_file_with_contents"
    );
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        calls[1]["messages"][0]["content"].as_str().unwrap().trim(),
        "Write a few short lines that are a short note on testing."
    );

    // A question: one plain call, no tools offered, the loop penalty on.
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_text("I read files and make small edits.");
    let mut approver = ScriptedApprover::new(vec![]);
    let end = service
        .session(&monolith, &workspace, id, "chat", "What can you do?")
        .run(&mut approver, &mut Recorder::default())
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    let calls = model_calls(&fake);
    let question = calls.last().unwrap();
    assert!(question.get("tools").is_none(), "{question}");
    assert_eq!(question["dry_multiplier"], 0.8);
    assert_eq!(
        last_log_entry(&monolith, id)["content"],
        "Workflow completed."
    );
}

#[actix_web::test]
async fn goals_beyond_a_small_model_are_declined_and_say_nothing_changed() {
    let (fake, monolith, service) = support::harness(bundled).await;
    let workspace = TempWorkspace::new(&[("src/main.rs", "fn main() {}\n")]);
    for (definition, goal, reason) in [
        (
            "software_development",
            "Fix the bug in src/main.rs",
            "other than adding",
        ),
        ("chat", "Add a test", "names no file"),
        ("chat", "Add a line to a.md and b.md", "2 files"),
        ("software_development", "What does main do?", "no change"),
    ] {
        let id = monolith.create_workflow(definition, &[1, 2], &[2]);
        let mut approver = ScriptedApprover::new(vec![]);
        let end = service
            .session(&monolith, &workspace, id, definition, goal)
            .run(&mut approver, &mut Recorder::default())
            .await
            .unwrap();
        let SessionEnd::FinishedWithoutChanges(message) = end else {
            panic!("{goal}: ended as {end:?}");
        };
        assert!(message.contains("without changing anything"), "{message}");
        assert!(approver.asked.is_empty(), "{goal}: nothing to approve");
        let stored = monolith.workflow(id);
        let log = stored.checkpoints.last().unwrap()["checkpoint"]["channel_values"]["ui_chat_log"]
            .to_string();
        assert!(log.contains(reason), "{goal}: {log}");
        assert!(log.contains("ANTHROPIC_API_KEY"), "{goal}: says what to do");
    }
    assert!(
        model_calls(&fake).is_empty(),
        "declined before any model call"
    );
    assert_eq!(workspace.read("src/main.rs"), "fn main() {}\n");
}

#[actix_web::test]
async fn a_rejected_edit_leaves_the_file_and_the_run_says_so() {
    let (fake, monolith, service) = support::harness(bundled).await;
    let workspace = TempWorkspace::new(&[("README.md", "# Demo\n")]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_text("A demo.");
    let mut approver = ScriptedApprover::new(vec![Decision::Reject(Some("not now".into()))]);
    let end = service
        .session(&monolith, &workspace, id, "chat", GOAL)
        .run(&mut approver, &mut Recorder::default())
        .await
        .unwrap();
    let SessionEnd::FinishedWithoutChanges(_) = end else {
        panic!("a rejected edit ended as {end:?}");
    };
    assert_eq!(workspace.read("README.md"), "# Demo\n");
    let log = monolith.workflow(id).checkpoints.last().unwrap()["checkpoint"].to_string();
    assert!(log.contains("You rejected the edit"), "{log}");
    assert_eq!(model_calls(&fake).len(), 1);
}

#[actix_web::test]
async fn a_prompt_larger_than_the_models_context_fails_with_the_sizes_and_the_remedy() {
    // A configured OpenAI-compatible model (not the bundled one) whose
    // context is far too small for the agent's system prompt.
    let (fake, monolith, service) = support::harness(|fake| {
        let mut vars = support::openai(fake);
        vars.push((
            "AIGW_MODEL_CONTEXT_TOKENS",
            r#"{"smollm2-135m-instruct": 200}"#.into(),
        ));
        vars
    })
    .await;
    let workspace = TempWorkspace::new(&[]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    let end = service
        .session(&monolith, &workspace, id, "chat", "say hi")
        .run(&mut ScriptedApprover::new(vec![]), &mut Recorder::default())
        .await;
    let message = format!("{end:?}");
    assert!(message.contains("ContextTooSmall"), "{message}");
    assert!(message.contains("holds 200"), "{message}");
    assert!(
        model_calls(&fake).is_empty(),
        "nothing sent that cannot fit"
    );
}
