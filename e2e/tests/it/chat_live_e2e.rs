//! Duo Chat end to end, second part: answers streamed over WebSocket (also
//! across two web replicas), the error paths, the slash commands that need a
//! resource, and the real local model. Real processes, public interfaces only.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a failed fixture fails the test"
)]

use e2e_tests::{ANSWER_TIMEOUT, Options, System};
use fake_provider::{Failure, Scripted};
use serde_json::{Value, json};
use std::time::Duration;

fn chunks_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .map(|c| c["content"].as_str().unwrap())
        .collect()
}

fn assert_chunk_ids_count_up(chunks: &[Value]) {
    let ids: Vec<u64> = chunks
        .iter()
        .map(|c| c["chunkId"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = (1..=chunks.len() as u64).collect();
    assert_eq!(ids, expected, "chunk ids must count up from 1 without gaps");
}

fn request_id(accepted: &Value) -> String {
    accepted["requestId"]
        .as_str()
        .unwrap_or_else(|| panic!("aiAction refused: {accepted}"))
        .to_owned()
}

fn error_text(answer: &Value) -> String {
    answer["errors"].to_string()
}

#[tokio::test]
async fn a_direct_answer_streams_chunks_in_order_then_is_stored_once() {
    let system = System::start().await.unwrap();
    let alice = system.token("alice").unwrap();
    let mut subscriptions = system
        .subscribe_everywhere(&alice, "tab-1", &[&system.web_url])
        .await
        .unwrap();
    // The model streams the answer's start, then holds the stream open:
    // the start reaches the tab while the model is still answering.
    system.fake.push(Scripted::Held {
        before: ["Thought: I know this.\nFinal Answer: ", "Pipelines "]
            .map(String::from)
            .to_vec(),
        after: ["run ", "jobs ", "in stages."].map(String::from).to_vec(),
    });
    let accepted = system
        .ask_with_subscription(
            &alice,
            json!({ "content": "What do pipelines do?" }),
            "tab-1",
        )
        .await
        .unwrap();
    let id = request_id(&accepted);
    let first = subscriptions[0].next_message(ANSWER_TIMEOUT).await.unwrap();
    assert_eq!(first["requestId"], id.as_str(), "{first}");
    assert_eq!(first["chunkId"], 1, "{first}");
    assert!(
        first["content"]
            .as_str()
            .is_some_and(|text| text.starts_with("Pipelines")),
        "{first}"
    );
    system.fake.release();
    let (rest, answer) = subscriptions[0]
        .collect_answer(&id, ANSWER_TIMEOUT)
        .await
        .unwrap();
    let chunks: Vec<Value> = std::iter::once(first).chain(rest).collect();
    assert!(chunks.len() >= 2, "the answer was not streamed: {chunks:?}");
    assert_chunk_ids_count_up(&chunks);
    assert_eq!(chunks_text(&chunks), "Pipelines run jobs in stages.");
    assert_eq!(answer["content"], "Pipelines run jobs in stages.");

    let stored: Vec<Value> = system
        .messages(&alice)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m["requestId"] == id.as_str() && m["role"] == "ASSISTANT")
        .collect();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["content"], "Pipelines run jobs in stages.");
}

#[tokio::test]
async fn two_tabs_on_two_web_replicas_receive_every_chunk_in_order() {
    let system = System::start_with(Options {
        extra_web_replicas: 1,
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = system.token("alice").unwrap();
    let replica_url = system.replicas[0].1.clone();
    let mut tabs = system
        .subscribe_everywhere(&alice, "shared-tab", &[&system.web_url, &replica_url])
        .await
        .unwrap();
    system.fake.push(Scripted::Chunks(
        [
            "Thought: simple.\nFinal Answer: ",
            "One, ",
            "two, ",
            "three, ",
            "four.",
        ]
        .map(String::from)
        .to_vec(),
    ));
    let accepted = system
        .ask_with_subscription(&alice, json!({ "content": "Count to four" }), "shared-tab")
        .await
        .unwrap();
    let id = request_id(&accepted);
    let mut seen = Vec::new();
    for tab in &mut tabs {
        let (chunks, answer) = tab.collect_answer(&id, ANSWER_TIMEOUT).await.unwrap();
        assert_chunk_ids_count_up(&chunks);
        assert_eq!(chunks_text(&chunks), "One, two, three, four.");
        assert_eq!(answer["content"], "One, two, three, four.");
        seen.push(chunks);
    }
    assert_eq!(seen[0], seen[1], "both replicas delivered the same chunks");
}

#[tokio::test]
async fn an_overloaded_provider_is_retried_and_the_answer_arrives() {
    let system = System::start().await.unwrap();
    system.fake.push_failure(Failure::Overloaded);
    system
        .fake
        .push_text("Thought: fine.\nFinal Answer: Recovered after a retry.");
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "Are you there?" }))
        .await
        .unwrap();
    assert_eq!(answer["content"], "Recovered after a retry.", "{answer}");
    assert_eq!(answer["errors"], json!([]));
    assert_eq!(
        system.fake.requests().len(),
        2,
        "one failed call, one retry"
    );
}

#[tokio::test]
async fn an_error_in_the_middle_of_the_stream_ends_with_a_coded_error() {
    let system = System::start().await.unwrap();
    system.fake.push_failure(Failure::ErrorMidStream {
        text: "Thought: sure.\nFinal Answer: Half an ans".into(),
    });
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "Tell me everything" }))
        .await
        .unwrap();
    assert!(error_text(&answer).contains("A1003"), "{answer}");
}

#[tokio::test]
async fn a_model_that_hangs_ends_with_the_timeout_code() {
    let system = System::start_with(Options {
        monolith_env: vec![("DUO_AI_GATEWAY_TIMEOUT_SECS".into(), "2".into())],
        ..Options::default()
    })
    .await
    .unwrap();
    system.fake.push_failure(Failure::Hang);
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "Hello?" }))
        .await
        .unwrap();
    assert!(error_text(&answer).contains("A1000"), "{answer}");
}

#[tokio::test]
async fn a_model_that_never_finishes_hits_the_step_limit() {
    let system = System::start().await.unwrap();
    // Every step asks for a tool again; the loop must stop at its limit.
    system.fake.set_default_text(
        "Thought: I need more.\nAction: issue_reader\nAction Input: Summarise acme/platform/api#1",
    );
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(
            &alice,
            json!({ "content": "Summarise acme/platform/api#1" }),
        )
        .await
        .unwrap();
    assert!(error_text(&answer).contains("A1006"), "{answer}");
    let calls = system.fake.requests().len();
    assert!(
        (10..=20).contains(&calls),
        "{calls} model calls for a 10-step limit"
    );
}

#[tokio::test]
async fn a_gateway_that_is_down_ends_with_the_connection_code() {
    let mut system = System::start().await.unwrap();
    system.gateway.kill().await.unwrap();
    let alice = system.token("alice").unwrap();
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "Anyone home?" }))
        .await
        .unwrap();
    assert!(error_text(&answer).contains("A1001"), "{answer}");
    assert!(system.fake.requests().is_empty());
}

#[tokio::test]
async fn code_commands_send_the_selection_to_their_own_prompt() {
    let system = System::start().await.unwrap();
    system.fake.set_default_text("Done.");
    let alice = system.token("alice").unwrap();
    let selection = "fn div(a: i32, b: i32) -> i32 { a / b }";
    let commands = [
        ("/tests", "Write unit tests for the selected code"),
        ("/refactor", "Refactor the selected code"),
        ("/fix", "Find the bugs in the selected code"),
    ];
    for (n, (command, instruction)) in commands.iter().enumerate() {
        let answer = system
            .ask_and_wait(
                &alice,
                json!({
                    "content": command,
                    "currentFile": { "fileName": "math.rs", "selectedText": selection }
                }),
            )
            .await
            .unwrap();
        assert_eq!(answer["content"], "Done.", "{command}: {answer}");
        let bodies = system.provider_bodies();
        assert_eq!(bodies.len(), n + 1, "{command} made one model call");
        let body = &bodies[n];
        assert!(body.contains("fn div(a: i32, b: i32)"), "{command}: {body}");
        assert!(body.contains(instruction), "{command} used another prompt");
    }
}

/// The project id and the global id of one of its issues, through the REST API.
async fn project_and_issue(system: &System, token: &str, iid: u32) -> (u64, u64) {
    let (status, project) = system
        .rest(
            token,
            reqwest::Method::GET,
            "/projects/acme%2Fplatform%2Fapi",
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{project}");
    let project_id = project["id"].as_u64().unwrap();
    let (status, issue) = system
        .rest(
            token,
            reqwest::Method::GET,
            &format!("/projects/{project_id}/issues/{iid}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{issue}");
    (project_id, issue["id"].as_u64().unwrap())
}

#[tokio::test]
async fn troubleshoot_sends_the_end_of_a_long_failed_job_log() {
    let system = System::start().await.unwrap();
    system.fake.set_default_text("The tests failed.");
    let alice = system.token("alice").unwrap();
    let (project_id, _) = project_and_issue(&system, &alice, 1).await;
    // Longer than the 100,000 characters `/troubleshoot` sends: the front goes.
    let log = format!(
        "FIRST-LINE-MARKER\n{}\nerror: test login_expires failed LAST-LINE-MARKER\n",
        "compiling crate ...\n".repeat(6000)
    );
    let (status, job) = system
        .rest(
            &alice,
            reqwest::Method::POST,
            &format!("/projects/{project_id}/jobs/import"),
            Some(json!({ "name": "rspec", "stage": "test", "status": "failed", "log": log })),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "{job}");
    let build_gid = format!("gid://gitlab/Ci::Build/{}", job["id"].as_u64().unwrap());
    let answer = system
        .ask_and_wait(
            &alice,
            json!({ "content": "/troubleshoot", "resourceId": build_gid }),
        )
        .await
        .unwrap();
    assert_eq!(answer["content"], "The tests failed.", "{answer}");
    let bodies = system.provider_bodies();
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].contains("LAST-LINE-MARKER"));
    assert!(
        !bodies[0].contains("FIRST-LINE-MARKER"),
        "the log was not truncated from the front"
    );
}

#[tokio::test]
async fn summarize_comments_sends_the_notes_of_the_issue_in_context() {
    let system = System::start().await.unwrap();
    system.fake.set_default_text("Everyone agrees.");
    let alice = system.token("alice").unwrap();
    let (project_id, issue_id) = project_and_issue(&system, &alice, 1).await;
    let note = "We should expire sessions after 30 days, NOTE-MARKER-7";
    let (status, created) = system
        .rest(
            &alice,
            reqwest::Method::POST,
            &format!("/projects/{project_id}/issues/1/notes"),
            Some(json!({ "body": note })),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "{created}");
    let answer = system
        .ask_and_wait(
            &alice,
            json!({
                "content": "/summarize_comments",
                "resourceId": format!("gid://gitlab/Issue/{issue_id}")
            }),
        )
        .await
        .unwrap();
    assert_eq!(answer["content"], "Everyone agrees.", "{answer}");
    let bodies = system.provider_bodies();
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].contains("NOTE-MARKER-7"));
}

#[tokio::test]
async fn clear_starts_the_history_afresh() {
    let system = System::start().await.unwrap();
    system
        .fake
        .set_default_text("Thought: ok.\nFinal Answer: Noted.");
    let alice = system.token("alice").unwrap();
    system
        .ask_and_wait(&alice, json!({ "content": "Remember MARKER-BEFORE-CLEAR" }))
        .await
        .unwrap();
    let accepted = system
        .ask(&alice, json!({ "content": "/clear" }))
        .await
        .unwrap();
    assert_eq!(accepted["errors"], json!([]), "{accepted}");
    system
        .ask_and_wait(
            &alice,
            json!({ "content": "What did I ask you to remember?" }),
        )
        .await
        .unwrap();
    let last = system.provider_bodies().pop().unwrap();
    assert!(last.contains("What did I ask you to remember?"));
    assert!(
        !last.contains("MARKER-BEFORE-CLEAR"),
        "history before /clear was sent: {last}"
    );
    // `/clear` also empties what `aiMessages` shows.
    let visible = system.messages(&alice).await.unwrap();
    assert!(
        !visible.iter().any(|m| m["content"]
            .as_str()
            .unwrap_or("")
            .contains("MARKER-BEFORE-CLEAR")),
        "{visible:?}"
    );
}

/// The real local model server (weights fetched by the project's own command)
/// behind the gateway, through the whole path. A model this small may answer
/// anything: the test asserts a well-formed answer or a coded error arrives.
#[tokio::test]
async fn the_real_local_model_answers_through_the_whole_path() {
    let root = e2e_tests::repo_root();
    let local_llm = e2e_tests::binary("duo-local-llm").unwrap();
    let fetched = tokio::process::Command::new(&local_llm)
        .arg("fetch-models")
        .current_dir(&root)
        .status()
        .await
        .unwrap();
    assert!(fetched.success(), "fetching the model weights failed");
    let port = e2e_tests::free_port().unwrap();
    let mut server = e2e_tests::Service::spawn(
        "local-llm",
        &local_llm,
        &["serve"],
        &[("DUO_LOCAL_LLM_ADDR".into(), format!("127.0.0.1:{port}"))],
    )
    .unwrap();
    let http = reqwest::Client::new();
    server
        .wait_ready(&http, &format!("http://127.0.0.1:{port}/health"))
        .await
        .unwrap();

    let system = System::start_with(Options {
        local_model_url: Some(format!("http://127.0.0.1:{port}/v1")),
        ..Options::default()
    })
    .await
    .unwrap();
    let alice = system.token("alice").unwrap();
    let accepted = system
        .ask(&alice, json!({ "content": "What is a merge request?" }))
        .await
        .unwrap();
    let answer = system
        .answer_within(&alice, &request_id(&accepted), Duration::from_secs(240))
        .await
        .unwrap();
    let content = answer["content"].as_str().unwrap_or_default();
    let errors = answer["errors"].as_array().cloned().unwrap_or_default();
    if errors.is_empty() {
        assert!(!content.trim().is_empty(), "an empty answer: {answer}");
    } else {
        let text = errors[0].as_str().unwrap_or_default();
        assert!(
            text.contains("Error code: [A") || text.contains("Error code: [M"),
            "an error without a code: {answer}"
        );
    }
    assert!(
        system.fake.requests().is_empty(),
        "the fake provider must not be used"
    );
}
