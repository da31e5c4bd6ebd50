//! The Duo Workflow service end to end on loopback: the real tonic server,
//! the real executor library in a temporary workspace, a test double of the
//! monolith's workflow REST API, and the fake provider scripting native tool
//! calls on the Anthropic and OpenAI wires.

#![expect(clippy::unwrap_used, reason = "tests fail loudly by design")]

use crate::workflow_support::{
    self as support, CHAT_SCOPES, Recorder, ScriptedApprover, TempWorkspace,
};
use contracts::duo_workflow::{
    ClientEvent, GenerateTokenRequest, ListCapabilitiesRequest, ListToolsRequest,
    StopWorkflowRequest, client_event,
};
use fake_provider::{FakeProvider, ToolCall};
use serde_json::{Value, json};
use tonic::Code;
use workflow_executor::session::{Decision, SessionEnd};

/// The goal of most runs here.
const GOAL: &str = "add a greeting to the README";

fn edit_call() -> ToolCall {
    ToolCall::new(
        "call-edit",
        "edit_file",
        json!({"file_path": "README.md", "old_str": "Hello", "new_str": "Hello, world"}),
    )
}

fn read_call() -> ToolCall {
    ToolCall::new("call-read", "read_file", json!({"file_path": "README.md"}))
}

/// Checkpoints chain: each parent is the one stored before it.
fn assert_chained(checkpoints: &[Value]) {
    assert!(!checkpoints.is_empty());
    assert_eq!(checkpoints[0]["parent_ts"], Value::Null);
    for pair in checkpoints.windows(2) {
        assert_eq!(pair[1]["parent_ts"], pair[0]["thread_ts"]);
        assert!(
            pair[0]["thread_ts"].as_str().unwrap() < pair[1]["thread_ts"].as_str().unwrap(),
            "thread_ts sort in creation order"
        );
    }
}

fn request_bodies(fake: &FakeProvider) -> Vec<String> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.body.to_string())
        .collect()
}

#[actix_web::test]
async fn an_edit_waits_for_approval_and_runs_exactly_once() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_tool_calls("Let me look.", vec![read_call()]);
    fake.push_tool_calls("", vec![edit_call()]);
    fake.push_text("I added the greeting.");

    let readme = workspace.path.join("README.md");
    let mut approver = ScriptedApprover::new(vec![Decision::Approve]);
    approver.check = Some(Box::new(move || {
        // Paused for approval: nothing edited yet.
        assert_eq!(std::fs::read_to_string(&readme).unwrap(), "Hello\n");
    }));
    let mut recorder = Recorder::default();
    let end = service
        .session(&monolith, &workspace, id, "chat", GOAL)
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();

    assert_eq!(end, SessionEnd::Finished);
    assert_eq!(
        workspace.read("README.md"),
        "Hello, world\n",
        "edited exactly once"
    );
    assert_eq!(approver.asked.len(), 1);
    assert_eq!(approver.asked[0].0, "TOOL_CALL_APPROVAL_REQUIRED");
    assert_eq!(approver.asked[0].1.tool_calls[0].0, "edit_file");
    let stored = monolith.workflow(id);
    assert_eq!(stored.status, "finished");
    assert_eq!(
        stored.events,
        ["start", "require_tool_call_approval", "resume", "finish"]
    );
    assert_chained(&stored.checkpoints);
    let last = &stored.checkpoints.last().unwrap()["checkpoint"]["channel_values"];
    let log = last["ui_chat_log"].as_array().unwrap();
    assert!(
        log.iter()
            .any(|e| e["message_type"] == "request" && e["tool_info"]["name"] == "edit_file")
    );
    assert!(log.iter().any(|e| e["message_type"] == "tool"
        && e["tool_info"]["name"] == "edit_file"
        && e["status"] == "success"));
    // The first action is reading the workflow; the edit comes after approval.
    assert_eq!(
        recorder.actions[0],
        format!("GET /api/v4/ai/duo_workflows/workflows/{id}")
    );
    let edits = recorder
        .actions
        .iter()
        .filter(|a| a.starts_with("edit "))
        .count();
    assert_eq!(edits, 1);
    assert!(
        recorder
            .statuses
            .contains(&"TOOL_CALL_APPROVAL_REQUIRED".to_owned())
    );
    assert_eq!(recorder.statuses.last().unwrap(), "FINISHED");
    // The model saw the file it read and the edit's result.
    let bodies = request_bodies(&fake);
    assert_eq!(bodies.len(), 3);
    assert!(bodies[1].contains("tool_result") && bodies[1].contains("Hello\\n"));
    assert!(bodies[2].contains("edited README.md"));
    assert!(bodies[0].contains("\"tools\""), "native tool calling");
}

#[actix_web::test]
async fn a_rejection_reaches_the_model_and_nothing_is_edited() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_tool_calls("", vec![edit_call()]);
    fake.push_text("Understood, I will leave it.");

    let mut approver = ScriptedApprover::new(vec![Decision::Reject(Some(
        "do not touch the README, write NOTES.md instead".into(),
    ))]);
    let mut recorder = Recorder::default();
    let end = service
        .session(&monolith, &workspace, id, "chat", GOAL)
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();

    assert_eq!(end, SessionEnd::Finished);
    assert_eq!(workspace.read("README.md"), "Hello\n");
    assert!(!recorder.actions.iter().any(|a| a.starts_with("edit ")));
    let stored = monolith.workflow(id);
    assert_eq!(
        stored.events,
        ["start", "require_tool_call_approval", "resume", "finish"]
    );
    let bodies = request_bodies(&fake);
    assert!(bodies[1].contains("write NOTES.md instead"));
    assert!(bodies[1].contains("rejected this tool call"));
}

#[actix_web::test]
async fn invalid_tool_calls_are_sent_back_on_the_openai_wire() {
    let (fake, monolith, service) = support::harness(support::openai).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    // Everything pre-approved: no pause.
    let id = monolith.create_workflow("chat", &[1, 2], &[1, 2]);
    fake.push_tool_calls(
        "",
        vec![
            ToolCall {
                id: "bad-json".into(),
                name: "read_file".into(),
                arguments: "{not json".into(),
            },
            ToolCall::new("no-such", "delete_everything", json!({})),
            ToolCall::new("missing", "edit_file", json!({"file_path": "README.md"})),
        ],
    );
    fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "wrong-old",
            "edit_file",
            json!({"file_path": "README.md", "old_str": "Goodbye", "new_str": "x"}),
        )],
    );
    fake.push_text("Giving up politely.");
    let mut approver = ScriptedApprover::new(vec![]);
    let mut recorder = Recorder::default();
    let end = service
        .session(&monolith, &workspace, id, "chat", GOAL)
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    let requests: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .collect();
    assert_eq!(requests.len(), 3);
    let second = requests[1].body.to_string();
    assert_eq!(second.matches("Invalid tool call").count(), 3, "{second}");
    assert!(second.contains("there is no tool named delete_everything"));
    assert!(second.contains("missing required argument `old_str`"));
    // A mismatched oldString is the executor's error, told to the model.
    let third = requests[2].body.to_string();
    assert!(
        third.contains("does not contain the text to replace"),
        "{third}"
    );
    assert_eq!(workspace.read("README.md"), "Hello\n");
    assert_eq!(monolith.workflow(id).status, "finished");
}

/// Counts checkpoint notifications and opens the monolith's checkpoint gate
/// once `open_after` of them have arrived.
struct OpenGateAfter {
    gate: std::sync::Arc<tokio::sync::Semaphore>,
    open_after: usize,
    notifications: usize,
}

impl workflow_executor::session::Reporter for OpenGateAfter {
    fn checkpoint(&mut self, _: &contracts::duo_workflow::NewCheckpoint) {
        self.notifications += 1;
        if self.notifications == self.open_after {
            self.gate.add_permits(1000);
        }
    }

    fn action(&mut self, _: &contracts::duo_workflow::action::Action) {}
}

#[actix_web::test]
async fn read_only_steps_go_on_while_checkpoints_are_stored_behind_them() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    // The first checkpoint (the run's start, stored before anything else
    // happens) goes through; every later one waits at the gate.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
    monolith.state.lock().unwrap().checkpoint_gate = Some(gate.clone());
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    let id = monolith.create_workflow("chat", &[1, 2], &[1, 2]);
    const READS: usize = 4;
    for _ in 0..READS {
        fake.push_tool_calls("", vec![read_call()]);
    }
    fake.push_text("The README says Hello.");
    // Start, then a model step and a tools step per read: if any of these
    // waited for its checkpoint to be stored, the run would stop at the
    // gate and never get there.
    let open_after = 1 + 2 * READS;
    let mut reporter = OpenGateAfter {
        gate,
        open_after,
        notifications: 0,
    };
    let mut approver = ScriptedApprover::new(vec![]);
    let end = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        service
            .session(&monolith, &workspace, id, "chat", "read the README")
            .run(&mut approver, &mut reporter),
    )
    .await
    .expect("the run went on without waiting for held checkpoints")
    .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    assert!(reporter.notifications > open_after);

    let stored = monolith.workflow(id);
    assert_eq!(stored.events, ["start", "finish"]);
    assert_chained(&stored.checkpoints);
    // Checkpoints that waited behind a held write were replaced by newer
    // ones: fewer are stored than steps were taken, and the newest stored
    // one is the finished run, written before the run said "finish".
    assert!(
        stored.checkpoints.len() < reporter.notifications,
        "{} stored for {} steps",
        stored.checkpoints.len(),
        reporter.notifications
    );
    let newest = stored.checkpoints.last().unwrap();
    assert_eq!(
        newest["checkpoint"]["channel_values"]["status"], "Completed",
        "{newest}"
    );
}

#[actix_web::test]
async fn a_crashed_executor_resumes_from_the_newest_checkpoint() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    let id = monolith.create_workflow("chat", &[1, 2], &[1, 2]);
    // A pre-approved edit: a tool with side effects, whose result the run
    // stores before it goes on (read-only steps are stored behind the run
    // and may be taken again after a crash).
    fake.push_tool_calls("", vec![edit_call()]);
    // The second model call hangs: the executor "crashes" meanwhile.
    fake.push_failure(fake_provider::Failure::Hang);
    let crashed = {
        let session = service.session(&monolith, &workspace, id, "chat", "read the README");
        tokio::spawn(async move {
            let mut approver = ScriptedApprover::new(vec![]);
            let mut recorder = Recorder::default();
            let _ = session.run(&mut approver, &mut recorder).await;
        })
    };
    support::wait_for_requests(&fake, 2).await;
    assert_eq!(
        fake.requests().len(),
        2,
        "the second model call is in flight"
    );
    crashed.abort();
    let _ = crashed.await;
    service.wait_idle().await;
    let before = monolith.workflow(id);
    assert_eq!(before.status, "running");
    let checkpoints_before = before.checkpoints.len();

    fake.push_text("The README says Hello.");
    let mut approver = ScriptedApprover::new(vec![]);
    let mut recorder = Recorder::default();
    let end = service
        .session(&monolith, &workspace, id, "chat", GOAL)
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    let stored = monolith.workflow(id);
    assert_eq!(stored.events, ["start", "retry", "finish"]);
    assert!(stored.checkpoints.len() > checkpoints_before);
    assert_chained(&stored.checkpoints);
    // The resumed run did not edit the file again: it went on from the
    // checkpoint stored after the edit.
    assert!(!recorder.actions.iter().any(|a| a.starts_with("edit ")));
    assert_eq!(workspace.read("README.md"), "Hello, world\n");
    let last_request = request_bodies(&fake).pop().unwrap();
    assert!(last_request.contains("tool_result"), "{last_request}");
}

#[actix_web::test]
async fn a_second_executor_on_the_same_workflow_is_refused() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_failure(fake_provider::Failure::Hang);
    let token = support::monolith_token(CHAT_SCOPES);
    let first = support::open_stream(&service, &token, support::start_event(id, "chat", "hi"))
        .await
        .unwrap();
    let runner = support::runner(&workspace.path, &monolith);
    let serving = tokio::spawn(async move { first.serve(&runner).await });
    support::wait_for_requests(&fake, 1).await;
    let status = support::refused(
        &service,
        &token,
        &[],
        support::start_event(id, "chat", "hi"),
    )
    .await;
    assert_eq!(status.code(), Code::Aborted);
    assert!(status.message().contains("already running"));
    serving.abort();
}

#[actix_web::test]
async fn stop_workflow_ends_the_run_as_stopped() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_failure(fake_provider::Failure::Hang);
    let token = support::monolith_token(CHAT_SCOPES);
    let stream = support::open_stream(&service, &token, support::start_event(id, "chat", "hi"))
        .await
        .unwrap();
    let events = stream.events.clone();
    let runner = support::runner(&workspace.path, &monolith);
    let serving = tokio::spawn(async move { stream.serve(&runner).await });
    support::wait_for_requests(&fake, 1).await;
    // Heartbeats are ignored; stopWorkflow ends the run.
    events
        .send(ClientEvent {
            response: Some(client_event::Response::Heartbeat(Default::default())),
        })
        .await
        .unwrap();
    events
        .send(ClientEvent {
            response: Some(client_event::Response::StopWorkflow(StopWorkflowRequest {
                reason: "ABORTED".into(),
            })),
        })
        .await
        .unwrap();
    let (status, _) = serving.await.unwrap();
    assert_eq!(status.code(), Code::Ok);
    let stored = monolith.workflow(id);
    assert_eq!(stored.events, ["start", "stop"]);
    assert_eq!(stored.status, "stopped");
}

#[actix_web::test]
async fn callers_are_authenticated_and_authorized() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    let start = || support::start_event(id, "chat", "hi");

    let bad = support::refused(&service, "not-a-jwt", &[], start()).await;
    assert_eq!(bad.code(), Code::Unauthenticated);
    // A token signed by a key nobody published.
    let forged = {
        let mut token = support::monolith_token(CHAT_SCOPES);
        token.push('x');
        token
    };
    let bad = support::refused(&service, &forged, &[], start()).await;
    assert_eq!(bad.code(), Code::Unauthenticated);

    let no_chat = support::monolith_token(&["duo_agent_platform"]);
    let denied = support::refused(&service, &no_chat, &[], start()).await;
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert_eq!(denied.message(), "Unauthorized to execute chat");
    let no_platform = support::monolith_token(&["duo_chat"]);
    let denied = support::refused(
        &service,
        &no_platform,
        &[],
        support::start_event(id, "software_development", "hi"),
    )
    .await;
    assert_eq!(denied.code(), Code::PermissionDenied);

    let token = support::monolith_token(CHAT_SCOPES);
    let unknown = support::refused(
        &service,
        &token,
        &[],
        support::start_event(id, "nope", "hi"),
    )
    .await;
    assert_eq!(unknown.code(), Code::InvalidArgument);
    let not_start = ClientEvent {
        response: Some(client_event::Response::Heartbeat(Default::default())),
    };
    let refused = support::refused(&service, &token, &[], not_start).await;
    assert_eq!(refused.code(), Code::InvalidArgument);

    // A bad workflow id ends the stream with INVALID_ARGUMENT.
    let workspace = TempWorkspace::new(&[]);
    let stream = support::open_stream(&service, &token, support::start_event(999, "chat", "x"))
        .await
        .unwrap();
    let (status, _) = stream
        .serve(&support::runner(&workspace.path, &monolith))
        .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(fake.requests().is_empty(), "no model call for refused runs");
}

/// One chat run whose caller holds `scopes`, with the model calling
/// `semantic_code_search` once and then answering: the model's request
/// bodies and the monolith double's requests.
async fn run_calling_codebase_search(scopes: &[&str]) -> (Vec<String>, Vec<String>) {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    // Reading GitLab is one of the workflow's privileges, pre-approved.
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_tool_calls(
        "Let me search the code.",
        vec![ToolCall::new(
            "call-search",
            "semantic_code_search",
            json!({"semantic_query": "where is the greeting?"}),
        )],
    );
    fake.push_text("The greeting is in README.md.");
    let mut session = service.session(&monolith, &workspace, id, "chat", GOAL);
    session.target = service.target(&support::monolith_token(scopes));
    let end = session
        .run(
            &mut ScriptedApprover::new(Vec::new()),
            &mut Recorder::default(),
        )
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    let requests = monolith.state.lock().unwrap().requests.clone();
    (request_bodies(&fake), requests)
}

#[actix_web::test]
async fn codebase_search_needs_its_unit_primitive() {
    // Without codebase_search: never offered, and the call is refused with a
    // tool error naming the missing unit primitive; the code index is never
    // asked.
    let (bodies, requests) = run_calling_codebase_search(CHAT_SCOPES).await;
    assert_eq!(bodies.len(), 2);
    assert!(
        bodies[0].contains("\"read_file\""),
        "the other tools are offered"
    );
    assert!(!bodies[0].contains("semantic_code_search"));
    assert!(bodies[1].contains("needs the unit primitive codebase_search"));
    assert!(!bodies[1].contains("Hello (indexed)"));
    assert!(!requests.iter().any(|r| r.contains("semantic_code_search")));

    // With it: offered, run against the monolith, its result sent back.
    let (bodies, requests) =
        run_calling_codebase_search(&["duo_chat", "duo_agent_platform", "codebase_search"]).await;
    assert_eq!(bodies.len(), 2);
    assert!(bodies[0].contains("\"semantic_code_search\""));
    assert!(bodies[1].contains("Hello (indexed)"));
    assert!(!bodies[1].contains("needs the unit primitive"));
    assert!(requests.iter().any(|r| r.starts_with(
        "GET /api/v4/projects/1/semantic_code_search?semantic_query=where%20is%20the%20greeting%3F"
    )));
}

#[actix_web::test]
async fn minted_tokens_keep_codebase_search_only_for_callers_who_hold_it() {
    let (_fake, _monolith, service) = support::harness(support::anthropic).await;
    let mut client = service.client().await;
    for (scopes, listed) in [
        (&["duo_chat", "duo_agent_platform"][..], false),
        (
            &["duo_chat", "duo_agent_platform", "codebase_search"][..],
            true,
        ),
    ] {
        let minted = client
            .generate_token(support::request(
                GenerateTokenRequest::default(),
                &support::monolith_token(scopes),
            ))
            .await
            .unwrap()
            .into_inner();
        // The minted token decides the tools of the runs made with it.
        let tools = client
            .list_tools(support::request(ListToolsRequest {}, &minted.token))
            .await
            .unwrap()
            .into_inner();
        let names = format!("{:?}", tools.tools);
        assert!(names.contains("read_file"));
        assert_eq!(names.contains("semantic_code_search"), listed, "{scopes:?}");
    }
}

#[actix_web::test]
async fn generated_tokens_work_and_cannot_mint_more() {
    // The monolith double serves the keys the tokens are checked with.
    let (_fake, _monolith, service) = support::harness(support::anthropic).await;
    let mut client = service.client().await;
    let token = support::monolith_token(&["duo_chat", "duo_agent_platform", "code_suggestions"]);
    let minted = client
        .generate_token(support::request(GenerateTokenRequest::default(), &token))
        .await
        .unwrap()
        .into_inner();
    assert!(minted.expires_at > 0);
    assert!(
        minted
            .server_capabilities
            .contains(&"tool_call_approval".to_owned())
    );
    let tools = client
        .list_tools(support::request(ListToolsRequest {}, &minted.token))
        .await
        .unwrap()
        .into_inner();
    assert!(format!("{:?}", tools.tools).contains("edit_file"));
    let capabilities = client
        .list_capabilities(support::request(ListCapabilitiesRequest {}, &minted.token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capabilities.capabilities[0].name, "tool_call_approval");
    let again = client
        .generate_token(support::request(
            GenerateTokenRequest::default(),
            &minted.token,
        ))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::PermissionDenied);
    let unauthenticated = client
        .list_tools(tonic::Request::new(ListToolsRequest {}))
        .await
        .unwrap_err();
    assert_eq!(unauthenticated.code(), Code::Unauthenticated);
}

#[actix_web::test]
async fn software_development_plans_asks_and_executes() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    let id = monolith.create_workflow("software_development", &[1, 2], &[2]);
    // Context builder reads, then reports.
    fake.push_tool_calls("", vec![read_call()]);
    fake.push_text("README.md holds one line: Hello.");
    // The planner records a plan.
    fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "plan",
            "create_plan",
            json!({"steps": ["Add the greeting to README.md"]}),
        )],
    );
    // The executor edits (asks) and finishes.
    fake.push_tool_calls("", vec![edit_call()]);
    fake.push_text("Done.");
    let mut approver = ScriptedApprover::new(vec![Decision::Approve, Decision::Approve]);
    let mut recorder = Recorder::default();
    let end = service
        .session(&monolith, &workspace, id, "software_development", GOAL)
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    assert_eq!(approver.asked[0].0, "PLAN_APPROVAL_REQUIRED");
    assert_eq!(approver.asked[0].1.plan, ["Add the greeting to README.md"]);
    assert_eq!(approver.asked[1].0, "TOOL_CALL_APPROVAL_REQUIRED");
    assert_eq!(workspace.read("README.md"), "Hello, world\n");
    let stored = monolith.workflow(id);
    assert_eq!(
        stored.events,
        [
            "start",
            "require_plan_approval",
            "resume",
            "require_tool_call_approval",
            "resume",
            "finish"
        ]
    );
    assert_chained(&stored.checkpoints);
    // The executor agent was given the approved plan and the context.
    let bodies = request_bodies(&fake);
    assert!(bodies[3].contains("Add the greeting to README.md"));
    assert!(bodies[3].contains("README.md holds one line"));
}

#[actix_web::test]
async fn a_software_development_run_that_edits_nothing_says_so() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    let id = monolith.create_workflow("software_development", &[1, 2], &[2]);
    // Context builder reads, then reports; the planner plans; the executor
    // (a small model) only talks about the edit.
    fake.push_tool_calls("", vec![read_call()]);
    fake.push_text("README.md holds one line: Hello.");
    fake.push_tool_calls(
        "",
        vec![ToolCall::new(
            "plan",
            "create_plan",
            json!({"steps": ["Add the greeting to README.md"]}),
        )],
    );
    fake.push_text("Add a greeting to README.md. Add a greeting to README.md.");
    let mut approver = ScriptedApprover::new(vec![Decision::Approve]);
    let mut recorder = Recorder::default();
    let end = service
        .session(&monolith, &workspace, id, "software_development", GOAL)
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();
    let SessionEnd::FinishedWithoutChanges(message) = end else {
        panic!("a run without an edit ended as {end:?}");
    };
    assert!(
        message.starts_with("Workflow completed without changing anything"),
        "{message}"
    );
    assert!(message.contains("larger model"), "{message}");
    assert_eq!(workspace.read("README.md"), "Hello\n");
    let stored = monolith.workflow(id);
    assert_eq!(stored.events.last().map(String::as_str), Some("finish"));
    let last = &stored.checkpoints.last().unwrap()["checkpoint"]["channel_values"];
    let end_entry = last["ui_chat_log"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(end_entry["message_type"], "workflow_end");
    assert_eq!(end_entry["message_sub_type"], "no_changes");
    assert_eq!(end_entry["status"], "failure");
}

#[actix_web::test]
async fn a_chat_run_without_tools_is_a_plain_finish() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_text("Hello.");
    let mut approver = ScriptedApprover::new(vec![]);
    let mut recorder = Recorder::default();
    let end = service
        .session(&monolith, &workspace, id, "chat", "say hi")
        .run(&mut approver, &mut recorder)
        .await
        .unwrap();
    assert_eq!(end, SessionEnd::Finished);
}

#[actix_web::test]
async fn a_self_hosted_model_is_used_and_stored_without_its_key() {
    let (fake, monolith, service) = support::harness(|fake| {
        let mut vars = support::anthropic(fake);
        vars.push(("AIGW_CUSTOM_MODELS__ENABLED", "true".into()));
        vars
    })
    .await;
    let workspace = TempWorkspace::new(&[]);
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    fake.push_text("Hi from the self-hosted model.");
    let metadata = json!({
        "provider": "openai",
        "name": "my-model",
        "endpoint": fake.openai_base_url(),
        "api_key": "sk-self-hosted-secret",
        "identifier": "openai/my-model",
    });
    // The monolith vouches for the endpoint its admin configured.
    let endpoint = fake.openai_base_url();
    let mut session = service.session(&monolith, &workspace, id, "chat", "say hi");
    session.target = service.target(&support::monolith_token_vouching(
        CHAT_SCOPES,
        &[endpoint.as_str()],
    ));
    session.target.headers.push((
        "x-gitlab-agent-platform-model-metadata".into(),
        metadata.to_string(),
    ));
    let mut approver = ScriptedApprover::new(vec![]);
    let mut recorder = Recorder::default();
    let end = session.run(&mut approver, &mut recorder).await.unwrap();
    assert_eq!(end, SessionEnd::Finished);
    let call = fake
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap();
    assert_eq!(call.path, "/v1/chat/completions");
    assert_eq!(call.body["model"], "my-model");
    assert_eq!(
        call.header("authorization"),
        Some("Bearer sk-self-hosted-secret")
    );
    let stored = monolith.workflow(id).model_metadata_json.unwrap();
    assert!(stored.contains("my-model"));
    assert!(!stored.contains("sk-self-hosted-secret"));
}

#[actix_web::test]
async fn a_model_call_that_fails_on_the_way_is_made_again_and_the_run_finishes() {
    let (fake, monolith, service) = support::harness(support::anthropic).await;
    let workspace = TempWorkspace::new(&[("README.md", "Hello\n")]);
    let id = monolith.create_workflow("chat", &[1, 2], &[1, 2]);
    // The provider stays overloaded longer than the model client's own
    // immediate retries, then answers: the node is retried after a pause,
    // the run is not failed.
    const FAILURES: usize = 4;
    for _ in 0..FAILURES {
        fake.push_failure(fake_provider::Failure::Overloaded);
    }
    fake.push_text("The README says Hello.");
    let mut approver = ScriptedApprover::new(vec![]);
    let mut reporter = Recorder::default();
    let end = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        service
            .session(&monolith, &workspace, id, "chat", "read the README")
            .run(&mut approver, &mut reporter),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(end, SessionEnd::Finished);
    assert_eq!(monolith.workflow(id).events, ["start", "finish"]);
    assert_eq!(
        fake.requests().len(),
        FAILURES + 1,
        "asked again after each failure"
    );
}
