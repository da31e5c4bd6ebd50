//! `POST /v2/chat/agent` through the HTTP handler: scopes, validation,
//! tool filtering and the streamed events.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::app_support::{TEST_SCOPES, test_identity};
use crate::scripted_support::{ScriptedModel, config, registry};

use actix_web::middleware::from_fn;
use actix_web::{App, test, web};
use contracts::AgentEvent;
use contracts::events::parse_event_line;
use gateway::providers::{ChatModel, ProviderError};
use serde_json::{Value, json};
use std::sync::Arc;

struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

impl Reply {
    fn events(&self) -> Vec<AgentEvent> {
        self.body
            .lines()
            .filter_map(parse_event_line)
            .map(Result::unwrap)
            .collect()
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// `POST /v2/chat/agent` from a caller with these scopes (`*`: a debug user).
async fn call(
    model: Arc<ScriptedModel>,
    scopes: &str,
    body: Value,
    headers: &[(&str, &str)],
    env: &[(&str, &str)],
) -> Reply {
    call_as(model, Some(scopes), body, headers, env).await
}

/// [`call`]; `None` is a request nobody authenticated.
async fn call_as(
    model: Arc<ScriptedModel>,
    scopes: Option<&str>,
    body: Value,
    headers: &[(&str, &str)],
    env: &[(&str, &str)],
) -> Reply {
    let chat_model: Arc<dyn ChatModel> = model;
    let app = test::init_service(
        App::new()
            .app_data(web::Data::new(config(env)))
            .app_data(web::Data::new(registry()))
            .app_data(web::Data::from(chat_model))
            .wrap(from_fn(test_identity))
            .configure(gateway::api::agent::configure),
    )
    .await;
    let mut req = test::TestRequest::post()
        .uri("/v2/chat/agent")
        .set_payload(body.to_string());
    if let Some(scopes) = scopes {
        req = req.insert_header((TEST_SCOPES, scopes));
    }
    for (k, v) in headers {
        req = req.insert_header((*k, *v));
    }
    let resp = test::call_service(&app, req.to_request()).await;
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = String::from_utf8(test::read_body(resp).await.to_vec()).unwrap();
    Reply {
        status,
        content_type,
        body,
    }
}

fn question(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

fn model(chunks: &[&str]) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::answering(chunks))
}

#[actix_web::test]
async fn scope_matrix() {
    let body = json!({"messages": [
        {"role": "user", "content": "earlier", "additional_context": [{"category": "snippet", "id": "s", "content": "x"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "now", "additional_context": [{"category": "file", "id": "f", "content": "y"}]}
    ]});
    let scopes = [
        "duo_chat",
        "include_snippet_context",
        "include_file_context",
    ];
    for mask in 0..8u8 {
        let granted: Vec<&str> = scopes
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, s)| *s)
            .collect();
        let expected = if mask & 1 == 0 {
            Some("Unauthorized to access duo chat")
        } else if mask & 2 == 0 {
            Some("Unauthorized to access include_snippet_context")
        } else if mask & 4 == 0 {
            Some("Unauthorized to access include_file_context")
        } else {
            None
        };
        let reply = call(
            model(&["Final Answer: hi"]),
            &granted.join(","),
            body.clone(),
            &[],
            &[],
        )
        .await;
        match expected {
            Some(detail) => {
                assert_eq!(reply.status, 403, "{granted:?}");
                assert_eq!(reply.json(), json!({"detail": detail}), "{granted:?}");
            }
            None => {
                assert_eq!(reply.status, 200, "{granted:?}");
                assert_eq!(reply.events(), vec![AgentEvent::delta("hi")]);
            }
        }
    }
}

#[actix_web::test]
async fn final_answer_streams_live_deltas() {
    let scripted = model(&[
        "I know.\nAction: DirectAnswer\nFinal Ans",
        "wer: Re",
        "base moves ",
        "commits.\n",
    ]);
    let reply = call(scripted.clone(), "duo_chat", question("rebase?"), &[], &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.content_type, "application/x-ndjson; charset=utf-8");
    assert_eq!(
        reply.body,
        "{\"type\": \"final_answer_delta\", \"data\": {\"text\": \"Re\"}}\n\
         {\"type\": \"final_answer_delta\", \"data\": {\"text\": \"base moves\"}}\n\
         {\"type\": \"final_answer_delta\", \"data\": {\"text\": \" commits.\"}}\n"
    );
    let calls = scripted.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].params.stop, vec!["Observation:".to_owned()]);
}

#[actix_web::test]
async fn permitted_action_is_sent_once_at_the_end() {
    let reply = call(
        model(&[
            "Need it.\nAction: Issue",
            "Reader\nAction Input: ",
            "#7 status?",
        ]),
        "duo_chat,ask_issue",
        question("#7 status?"),
        &[],
        &[],
    )
    .await;
    assert_eq!(
        reply.events(),
        vec![AgentEvent::Action {
            tool: "issue_reader".into(),
            tool_input: "#7 status?".into(),
            thought: "Need it.".into(),
        }]
    );
}

#[actix_web::test]
async fn action_for_a_tool_the_caller_lacks_is_refused() {
    let output = ["Need it.\nAction: issue_reader\nAction Input: #7"];
    let reply = call(model(&output), "duo_chat", question("#7?"), &[], &[]).await;
    assert_eq!(
        reply.events(),
        vec![AgentEvent::Error {
            message: "tool not available".into(),
            retryable: false
        }]
    );
    // Version-gated: merge_request_reader needs X-Gitlab-Version >= 17.5.0-pre.
    let output = ["MR.\nAction: merge_request_reader\nAction Input: !3"];
    let scopes = "duo_chat,ask_merge_request";
    let reply = call(model(&output), scopes, question("!3?"), &[], &[]).await;
    assert!(
        matches!(&reply.events()[..], [AgentEvent::Error { message, .. }] if message == "tool not available")
    );
    let reply = call(
        model(&output),
        scopes,
        question("!3?"),
        &[("x-gitlab-version", "17.5.0-pre")],
        &[],
    )
    .await;
    assert!(
        matches!(&reply.events()[..], [AgentEvent::Action { tool, .. }] if tool == "merge_request_reader")
    );
    // Flag-gated: commit_reader.
    let output = ["C.\nAction: commit_reader\nAction Input: abc"];
    let scopes = "duo_chat,ask_commit";
    let v = ("x-gitlab-version", "17.6.0");
    let reply = call(model(&output), scopes, question("abc?"), &[v], &[]).await;
    assert!(matches!(&reply.events()[..], [AgentEvent::Error { .. }]));
    let flags = (
        "x-gitlab-enabled-feature-flags",
        "ai_commit_reader_for_chat",
    );
    let reply = call(model(&output), scopes, question("abc?"), &[v, flags], &[]).await;
    assert!(
        matches!(&reply.events()[..], [AgentEvent::Action { tool, .. }] if tool == "commit_reader")
    );
}

#[actix_web::test]
async fn prompt_lists_only_permitted_tools() {
    let scripted = model(&["Final Answer: ok"]);
    call(
        scripted.clone(),
        "duo_chat,ask_epic",
        question("q"),
        &[],
        &[],
    )
    .await;
    let system = scripted.calls()[0].system.clone().unwrap_or_default();
    assert!(system.contains("<name>epic_reader</name>"));
    assert!(!system.contains("<name>issue_reader</name>"));
}

#[actix_web::test]
async fn unparsed_output_is_unknown() {
    let reply = call(
        model(&["  just ", "chatting  "]),
        "duo_chat",
        question("q"),
        &[],
        &[],
    )
    .await;
    assert_eq!(
        reply.events(),
        vec![AgentEvent::Unknown {
            text: "just chatting".into()
        }]
    );
}

#[actix_web::test]
async fn model_errors_become_error_events() {
    let overloaded = ProviderError::Overloaded {
        message: "overloaded_error: try later".into(),
    };
    let failing = Arc::new(ScriptedModel {
        start_error: Some(overloaded),
        ..ScriptedModel::default()
    });
    let reply = call(failing, "duo_chat", question("q"), &[], &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.events(),
        vec![AgentEvent::Error {
            message: "overloaded_error: try later".into(),
            retryable: true
        }]
    );
    // Mid-stream: deltas so far, then the error, then nothing more.
    let mid_stream = Arc::new(ScriptedModel {
        chunks: vec![
            Ok("Final Answer: par".into()),
            Ok("tial ".into()),
            Err(ProviderError::Malformed("bad chunk".into())),
            Ok("never".into()),
        ],
        ..ScriptedModel::default()
    });
    let reply = call(mid_stream, "duo_chat", question("q"), &[], &[]).await;
    assert_eq!(
        reply.events(),
        vec![
            AgentEvent::delta("par"),
            AgentEvent::delta("tial"),
            AgentEvent::Error {
                message: "malformed response from the model provider: bad chunk".into(),
                retryable: false
            }
        ]
    );
}

#[actix_web::test]
async fn mock_mode_answers_unknown_mock() {
    let scripted = model(&["Final Answer: real"]);
    let env = [("AIGW_MOCK_MODEL_RESPONSES", "true")];
    let reply = call(scripted.clone(), "duo_chat", question("q"), &[], &env).await;
    assert_eq!(
        reply.body,
        "{\"type\": \"unknown\", \"data\": {\"text\": \"mock\"}}\n"
    );
    assert!(scripted.calls().is_empty());
}

#[actix_web::test]
async fn unprocessable_requests() {
    let metadata =
        json!({"name": "mistral", "provider": "openai", "endpoint": "http://127.0.0.1:1/v1"});
    let cases = [
        json!({"messages": "nope"}),
        json!({"messages": [{"role": "robot", "content": "q"}]}),
        json!({"messages": []}),
        json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
        // model_metadata while custom models are disabled.
        json!({"messages": [{"role": "user", "content": "q"}], "model_metadata": metadata}),
    ];
    for body in cases {
        let reply = call(model(&[]), "duo_chat", body.clone(), &[], &[]).await;
        assert_eq!(reply.status, 422, "{body}");
        assert!(reply.json().get("detail").is_some(), "{body}");
    }
    // Too long a field, even with custom models enabled.
    let mut long = metadata.clone();
    long["identifier"] = json!("x".repeat(256));
    let body = json!({"messages": [{"role": "user", "content": "q"}], "model_metadata": long});
    let env = [("AIGW_CUSTOM_MODELS__ENABLED", "true")];
    let reply = call(model(&[]), "duo_chat", body, &[], &env).await;
    assert_eq!(reply.status, 422);
    // Accepted when enabled and within limits.
    let body = json!({"messages": [{"role": "user", "content": "q"}], "model_metadata": metadata});
    // (A development caller: the endpoint needs no token vouching for it,
    // see model_endpoints.rs for the rule with real tokens.)
    let scripted = model(&["Final Answer: ok"]);
    let reply = call(scripted.clone(), "*", body, &[], &env).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        scripted.calls()[0]
            .target
            .endpoint
            .as_ref()
            .map(|e| e.base_url()),
        Some("http://127.0.0.1:1/v1")
    );
}

#[actix_web::test]
async fn missing_user_is_401() {
    let reply = call_as(model(&[]), None, question("q"), &[], &[]).await;
    assert_eq!(reply.status, 401);
}

#[actix_web::test]
async fn the_body_is_validated_before_any_scope_check() {
    let long_metadata = json!({
        "name": "mistral",
        "provider": "openai",
        "endpoint": "http://127.0.0.1:1/v1",
        "identifier": "x".repeat(256),
    });
    let invalid = [
        (
            json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
            "messages",
        ),
        (
            json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}),
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": "q"}], "model_metadata": long_metadata}),
            "model_metadata",
        ),
    ];
    // No scope at all, and a context item the caller may not include either:
    // the body is still what is reported, in FastAPI's list shape.
    for (mut body, field) in invalid {
        body["messages"][0]["additional_context"] = json!([{"category": "file", "id": "f"}]);
        let reply = call(model(&[]), "", body.clone(), &[], &[]).await;
        assert_eq!(reply.status, 422, "{body}");
        let detail = &reply.json()["detail"];
        assert_eq!(detail[0]["loc"], json!(["body", field]), "{body}");
        assert_eq!(detail[0]["type"], "value_error", "{body}");
    }
    // A valid body from the same caller is refused on scope.
    let reply = call(model(&[]), "", question("q"), &[], &[]).await;
    assert_eq!(reply.status, 403);
    assert_eq!(
        reply.json(),
        json!({"detail": "Unauthorized to access duo chat"})
    );
}

#[actix_web::test]
async fn a_missing_caller_is_401_before_the_body_is_validated() {
    let reply = call_as(model(&[]), None, json!({"messages": []}), &[], &[]).await;
    assert_eq!(reply.status, 401);
}
