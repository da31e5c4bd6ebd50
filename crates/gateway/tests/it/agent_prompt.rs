//! Snapshots of the rendered ReAct model call.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::scripted_support;

use contracts::AgentRequest;
use gateway::auth::GatewayUser;
use gateway::chat::agent::{ClientInfo, prepare};
use gateway::providers::{ChatRole, ModelCall};
use scripted_support::{config, registry};
use std::time::Duration;

fn render(call: &ModelCall) -> String {
    let mut out = format!("=== system\n{}\n", call.system.clone().unwrap_or_default());
    for m in &call.messages {
        let role = match m.role {
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
        };
        out.push_str(&format!("=== {role}\n{}\n", m.content));
    }
    out
}

fn prepared(user: &GatewayUser, body: &str, extra: &[(&str, &str)]) -> ModelCall {
    let request: AgentRequest = serde_json::from_str(body).unwrap();
    let client = ClientInfo {
        gitlab_version: Some("17.6.0"),
        feature_flags: Some("ai_commit_reader_for_chat"),
    };
    prepare(&registry(), &config(extra), user, client, &request)
        .unwrap()
        .call
}

#[test]
fn no_tools() {
    let call = prepared(
        &GatewayUser::with_scopes(["duo_chat"]),
        r#"{"messages":[{"role":"user","content":"What is a rebase?"}]}"#,
        &[],
    );
    assert_eq!(call.params.stop, vec!["Observation:".to_owned()]);
    assert_eq!(call.params.temperature, Some(0.1));
    assert_eq!(call.params.timeout, Duration::from_secs(30));
    assert_eq!(call.params.max_tokens, 8192);
    assert!(
        !call
            .system
            .as_deref()
            .unwrap_or_default()
            .contains("<tools_list>")
    );
    assert_eq!(
        call.messages.last().map(|m| m.content.as_str()),
        Some("Thought:")
    );
    insta::assert_snapshot!(render(&call));
}

#[test]
fn all_tools() {
    let call = prepared(
        &GatewayUser::debug(),
        r#"{"messages":[{"role":"user","content":"Summarize issue #4"}],
            "unavailable_resources":["Pipelines","Vulnerabilities"]}"#,
        &[],
    );
    let system = call.system.clone().unwrap_or_default();
    assert!(system.contains("Pipelines, Vulnerabilities"));
    assert!(!system.contains("['"), "no Python list repr");
    insta::assert_snapshot!(render(&call));
}

#[test]
fn history_with_contexts() {
    let call = prepared(
        &GatewayUser::with_scopes(["duo_chat", "ask_issue", "include_file_context"]),
        r#"{"messages":[
            {"role":"user","content":"What is this issue about?",
             "context":{"type":"issue","content":"Login fails on Safari"}},
            {"role":"assistant","content":"It is about a login bug in Safari."},
            {"role":"user","content":"Which file should I change?",
             "current_file":{"file_path":"app/login.rs","data":"fn login() {}","selected_code":true},
             "additional_context":[{"category":"file","id":"src/auth.rs","content":"pub fn auth() {}"}]}
        ]}"#,
        &[],
    );
    assert_eq!(call.messages.len(), 4);
    insta::assert_snapshot!(render(&call));
}

#[test]
fn scratchpad_steps_then_thought() {
    let call = prepared(
        &GatewayUser::with_scopes(["duo_chat", "ask_issue"]),
        r##"{"messages":[{"role":"user","content":"Summarize issue #4"}],
            "options":{"agent_scratchpad":{"agent_type":"react","steps":[
              {"thought":"I need issue #4","tool":"issue\\_reader","tool_input":"Summarize issue #4","observation":"Issue #4: crash on start"},
              {"thought":"I need more","tool":"issue_reader","tool_input":"#5","observation":"Issue #5: duplicate"}]}}}"##,
        &[],
    );
    let prefill = &call.messages.last().unwrap().content;
    assert!(prefill.contains("Observation: Issue #4: crash on start\nThought: I need more"));
    assert!(prefill.contains("Action: issue_reader\n"));
    assert!(prefill.ends_with("Thought:"));
    insta::assert_snapshot!(render(&call));
}

#[test]
fn the_local_default_asks_natively_and_the_openai_family_keeps_react() {
    let request: AgentRequest =
        serde_json::from_str(r#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
    let prepared = |cfg: &gateway::Config| {
        prepare(
            &registry(),
            cfg,
            &GatewayUser::debug(),
            ClientInfo::default(),
            &request,
        )
        .unwrap()
    };
    // Nothing configured: the bundled model, asked with native tool calls.
    let local = prepared(&gateway::Config::for_tests(&[]).unwrap());
    let step = local.native.expect("a native step");
    assert!(!step.tools.is_empty());
    assert!(!step.system.contains("Action Input"), "{}", step.system);
    assert_eq!(step.params.max_tokens, 1024);
    // The ReAct family stays available by name.
    let cfg =
        gateway::Config::for_tests(&[("AIGW_DEFAULT_PROMPTS", r#"{"chat/react": "openai"}"#)])
            .unwrap();
    let react = prepared(&cfg);
    assert!(react.native.is_none());
    assert_eq!(react.call.params.max_tokens, 4096);
    assert_eq!(react.call.params.stop, vec!["Observation:".to_owned()]);
}

#[test]
fn the_bundled_model_answers_from_an_attached_resource_and_others_keep_their_readers() {
    let with_issue: AgentRequest = serde_json::from_str(
        r#"{"messages":[{"role":"user","content":"What is it about?",
            "context":{"type":"issue","content":"<issue><title>Add dark mode</title></issue>"}}]}"#,
    )
    .unwrap();
    let plain: AgentRequest =
        serde_json::from_str(r#"{"messages":[{"role":"user","content":"What is it about?"}]}"#)
            .unwrap();
    let prepared = |cfg: &gateway::Config, request: &AgentRequest| {
        prepare(
            &registry(),
            cfg,
            &GatewayUser::debug(),
            ClientInfo::default(),
            request,
        )
        .unwrap()
    };
    let bundled = gateway::Config::for_tests(&[]).unwrap();
    let attached = prepared(&bundled, &with_issue);
    assert!(attached.tools.is_empty(), "no reader may be run");
    let step = attached.native.expect("a native step");
    let names: Vec<&str> = step.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["answer_directly"]);
    assert!(
        step.tools[0]
            .description
            .contains("from the GitLab resource given with it")
    );
    assert!(
        step.system.contains("from that resource only"),
        "{}",
        step.system
    );
    assert!(format!("{:?}", step.messages).contains("Add dark mode"));
    // It is not even asked to choose: it answers in plain text, its context
    // written as labelled lines.
    let free = step.free_text.expect("a plain answer");
    assert!(free.skip_choice);
    assert!(
        free.system.contains("from that resource only"),
        "{}",
        free.system
    );
    assert!(
        format!("{:?}", free.messages).contains("Title: Add dark mode"),
        "{:?}",
        free.messages
    );

    // Nothing attached: the bundled model chooses among the readers when
    // the question names something to read.
    let names_one: AgentRequest = serde_json::from_str(
        r#"{"messages":[{"role":"user","content":"What is issue #3 about?"}]}"#,
    )
    .unwrap();
    let step = prepared(&bundled, &names_one)
        .native
        .expect("a native step");
    assert!(step.tools.iter().any(|t| t.name == "issue_reader"));
    assert!(!step.system.contains("from that resource only"));
    assert!(!step.free_text.expect("a plain answer").skip_choice);
    // ...and answers a question naming nothing in plain text at once.
    let step = prepared(&bundled, &plain).native.expect("a native step");
    assert!(step.free_text.expect("a plain answer").skip_choice);

    // A hosted model keeps its readers with the resource attached.
    let hosted = prepared(&config(&[]), &with_issue);
    assert!(hosted.tools.iter().any(|t| t.name == "issue_reader"));
    assert!(
        !hosted
            .call
            .system
            .unwrap_or_default()
            .contains("from that resource only")
    );
}

/// The system prompt is rendered once per tool set and kept in the
/// registry: steps with other tools, or other unavailable resources, in
/// between get their own, and every step's prompt is what a fresh registry
/// renders for it.
#[test]
fn kept_system_prompts_follow_the_tools_and_the_unavailable_resources() {
    let shared = registry();
    let config = config(&[]);
    let client = ClientInfo {
        gitlab_version: Some("17.6.0"),
        feature_flags: Some("ai_commit_reader_for_chat"),
    };
    let readers = GatewayUser::with_scopes(["duo_chat", "ask_issue", "ask_epic"]);
    let plain = GatewayUser::with_scopes(["duo_chat"]);
    let question = r#"{"messages":[{"role":"user","content":"What is #1 about?"}]}"#;
    let narrowed = r#"{"messages":[{"role":"user","content":"And #2?"}],"unavailable_resources":["Pipelines"]}"#;
    for (user, body) in [
        (&readers, question),
        (&plain, question),
        (&readers, narrowed),
        (&readers, question),
        (&plain, narrowed),
    ] {
        let request: AgentRequest = serde_json::from_str(body).unwrap();
        let kept = prepare(&shared, &config, user, client, &request)
            .unwrap()
            .call;
        let fresh = prepare(&registry(), &config, user, client, &request)
            .unwrap()
            .call;
        assert_eq!(render(&kept), render(&fresh), "{body}");
    }
    let system = |user: &GatewayUser, body: &str| {
        let request: AgentRequest = serde_json::from_str(body).unwrap();
        prepare(&shared, &config, user, client, &request)
            .unwrap()
            .call
            .system
            .unwrap_or_default()
    };
    assert_ne!(system(&readers, question), system(&plain, question));
    assert_ne!(system(&readers, question), system(&readers, narrowed));
    assert!(system(&readers, narrowed).contains("Pipelines"));
}

#[test]
fn a_warm_render_cache_gives_what_a_fresh_render_gives() {
    // The system prompts of questions with and without an attached resource,
    // offered tools or not, asked in turn on one registry (its render cache
    // warm after the first of each kind), against a new registry each time.
    let bodies = [
        r#"{"messages":[{"role":"user","content":"What is a rebase?"}]}"#,
        r#"{"messages":[{"role":"user","content":"What is it about?",
            "context":{"type":"issue","content":"<issue><title>Add dark mode</title></issue>"}}]}"#,
        r#"{"messages":[{"role":"user","content":"What is issue #3 about?"}],
            "unavailable_resources":["Pipelines"]}"#,
        r#"{"messages":[{"role":"user","content":"Explain","additional_context":[
            {"category":"snippet","id":"s1","content":"fn main() {}"}]}]}"#,
        r#"{"messages":[{"role":"user","content":"And a merge?"}]}"#,
    ];
    let systems =
        |registry: &gateway::prompts::PromptRegistry, cfg: &gateway::Config, body: &str| {
            let request: AgentRequest = serde_json::from_str(body).unwrap();
            let prepared = prepare(
                registry,
                cfg,
                &GatewayUser::debug(),
                ClientInfo::default(),
                &request,
            )
            .unwrap();
            let native = prepared.native.as_ref();
            (
                prepared.call.system.clone(),
                native.map(|n| n.system.clone()),
                native.and_then(|n| n.free_text.as_ref().map(|f| f.system.clone())),
            )
        };
    let bundled = gateway::Config::for_tests(&[]).unwrap();
    let react =
        gateway::Config::for_tests(&[("AIGW_DEFAULT_PROMPTS", r#"{"chat/react": "openai"}"#)])
            .unwrap();
    for cfg in [&bundled, &react, &config(&[])] {
        let warm = registry();
        for _ in 0..2 {
            for body in bodies {
                assert_eq!(
                    systems(&warm, cfg, body),
                    systems(&registry(), cfg, body),
                    "{body}"
                );
            }
        }
    }
    // The attached resource's instruction reaches only its own question.
    let warm = registry();
    let plain = systems(&warm, &bundled, bodies[0]).2.unwrap();
    let attached = systems(&warm, &bundled, bodies[1]).2.unwrap();
    assert!(!plain.contains("from that resource only"), "{plain}");
    assert!(attached.contains("from that resource only"), "{attached}");
    assert!(
        !systems(&warm, &bundled, bodies[4])
            .2
            .unwrap()
            .contains("from that resource only")
    );
}
