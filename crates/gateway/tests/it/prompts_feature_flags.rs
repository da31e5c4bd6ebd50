//! A prompt version behind a feature flag (`feature_flag:` in its file): the
//! registry leaves it out unless the request announces the flag, the agent
//! renders it for requests that do, and `/v1/prompts` never picks it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use contracts::{AgentRequest, PromptRequest};
use gateway::auth::GatewayUser;
use gateway::chat::agent::{ClientInfo, prepare};
use gateway::prompts::{PromptInvocation, PromptRegistry};

use crate::scripted_support::config;

const FLAG: &str = "ai_react_prompt_next";
const MARKER: &str = "NEXT_REACT_PROMPT_MARKER";

fn temp_dir() -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gw-flagged-prompts-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The shipped prompts plus `chat/react/base/1.1.0.yml` behind [`FLAG`]: the
/// shipped 1.0.0 with a marker at the start of its system prompt.
fn prompts_with_flagged_react() -> PromptRegistry {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../prompts");
    let dir = temp_dir();
    copy_dir(&shipped, &dir);
    let base = dir.join("chat/react/base");
    let current = std::fs::read_to_string(base.join("1.0.0.yml")).unwrap();
    let next = current.replacen("  system: |\n", &format!("  system: |\n    {MARKER}\n"), 1);
    assert_ne!(next, current, "the fixture found the system template");
    std::fs::write(
        base.join("1.1.0.yml"),
        format!("{next}feature_flag: {FLAG}\n"),
    )
    .unwrap();
    let registry = PromptRegistry::load(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    registry
}

#[test]
fn a_flagged_version_is_chosen_only_with_its_flag() {
    let registry = prompts_with_flagged_react();
    let plain = registry.resolve("chat/react", "base", None).unwrap();
    assert_eq!(plain.version.to_string(), "1.0.0");
    let other = registry
        .resolve_with_flags("chat/react", "base", None, &["some_other_flag"])
        .unwrap();
    assert_eq!(other.version.to_string(), "1.0.0");
    let next = registry
        .resolve_with_flags("chat/react", "base", None, &["x", FLAG])
        .unwrap();
    assert_eq!(next.version.to_string(), "1.1.0");
    assert_eq!(next.feature_flag.as_deref(), Some(FLAG));
    // An exact pin of the flagged version still needs the flag.
    assert!(
        registry
            .resolve("chat/react", "base", Some("1.1.0"))
            .is_err()
    );
}

#[test]
fn the_agent_renders_the_flagged_version_for_requests_announcing_the_flag() {
    let registry = prompts_with_flagged_react();
    let request: AgentRequest =
        serde_json::from_str(r#"{"messages":[{"role":"user","content":"What is a rebase?"}]}"#)
            .unwrap();
    let user = GatewayUser::with_scopes(["duo_chat"]);
    let system = |flags: Option<&str>| {
        let client = ClientInfo {
            gitlab_version: Some("17.6.0"),
            feature_flags: flags,
        };
        prepare(&registry, &config(&[]), &user, client, &request)
            .unwrap()
            .call
            .system
            .unwrap_or_default()
    };
    assert!(!system(None).contains(MARKER));
    assert!(!system(Some("ai_commit_reader_for_chat")).contains(MARKER));
    assert!(system(Some(&format!("ai_commit_reader_for_chat,{FLAG}"))).contains(MARKER));
}

#[test]
fn prompts_invoked_by_name_never_pick_a_flagged_version() {
    let dir = temp_dir();
    let minimal = |flag: &str| {
        format!(
            "name: test prompt\nmodel:\n  name: claude-test\n  params:\n    model_class_provider: anthropic\n\
             unit_primitives: [explain_code]\nprompt_template:\n  user: \"Say hi.\"\n{flag}"
        )
    };
    std::fs::create_dir_all(dir.join("chat/hello/base")).unwrap();
    std::fs::write(dir.join("chat/hello/base/1.0.0.yml"), minimal("")).unwrap();
    std::fs::write(
        dir.join("chat/hello/base/1.1.0.yml"),
        minimal(&format!("feature_flag: {FLAG}\n")),
    )
    .unwrap();
    let registry = PromptRegistry::load(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let request: PromptRequest = serde_json::from_str(r#"{"inputs": {}}"#).unwrap();
    let prepared = gateway::prompts::prepare(
        &registry,
        &config(&[]),
        PromptInvocation {
            prompt_id: "chat/hello",
            request: &request,
            user: &GatewayUser::with_scopes(["explain_code"]),
        },
    )
    .unwrap();
    assert_eq!(prepared.definition.version.to_string(), "1.0.0");
}
