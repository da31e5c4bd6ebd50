//! The prompt registry: loading, schema errors, resolution, rendering, and
//! snapshots of every shipped prompt rendered for both families.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test on bad fixtures"
)]

use contracts::{ModelMetadata, PromptRequest};
use gateway::Config;
use gateway::auth::GatewayUser;
use gateway::prompts::{
    ModelClassProvider, PromptError, PromptInvocation, PromptLoadError, PromptRegistry,
    TemplateRole, choose_families, prepare,
};
use gateway::providers::EndpointGuard;
use gateway::providers::ProviderKind;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn shipped_prompts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../prompts")
}

fn shipped() -> PromptRegistry {
    PromptRegistry::load(&shipped_prompts_dir()).expect("shipped prompts load")
}

/// A fresh directory under the system temp dir, filled with `files`.
fn prompt_dir(files: &[(&str, &str)]) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gw-prompts-test-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, content) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    dir
}

const MINIMAL: &str = r#"
name: test prompt
model:
  name: claude-test
  params:
    model_class_provider: anthropic
unit_primitives: [duo_chat]
prompt_template:
  system: "You help."
  user: "Say hi to {{ name }}."
"#;

fn minimal_with(version_note: &str) -> String {
    MINIMAL.replace("You help.", &format!("You help ({version_note})."))
}

const EXPECTED: &[(&str, &[&str], f64)] = &[
    ("chat/issue_reader", &["ask_issue"], 60.0),
    ("chat/epic_reader", &["ask_epic"], 60.0),
    ("chat/merge_request_reader", &["ask_merge_request"], 60.0),
    ("chat/commit_reader", &["duo_chat"], 60.0),
    ("chat/build_reader", &["ask_build"], 60.0),
    ("chat/explain_code", &["explain_code"], 60.0),
    ("chat/write_tests", &["write_tests"], 60.0),
    ("chat/refactor_code", &["refactor_code"], 60.0),
    ("chat/fix_code", &["fix_code"], 60.0),
    (
        "chat/explain_vulnerability",
        &["explain_vulnerability"],
        60.0,
    ),
    ("chat/troubleshoot_job", &["troubleshoot_job"], 60.0),
    ("chat/summarize_comments", &["summarize_comments"], 60.0),
    ("chat/documentation_search", &["documentation_search"], 60.0),
    ("categorize_question", &["duo_chat"], 5.0),
    ("review_merge_request", &["review_merge_request"], 120.0),
];

#[test]
fn shipped_prompts_match_the_reference_table() {
    let registry = shipped();
    for (id, unit_primitives, timeout) in EXPECTED {
        for (family, provider, model) in [
            (
                "base",
                ModelClassProvider::Anthropic,
                "claude-3-5-sonnet-20241022",
            ),
            (
                "openai",
                ModelClassProvider::Litellm,
                "smollm2-135m-instruct",
            ),
        ] {
            let def = registry
                .resolve(id, family, None)
                .unwrap_or_else(|e| panic!("{id}/{family}: {e}"));
            // GitLab's table holds for every family, except that the small
            // models' readers (1.0.1) get a budget fit for their one-line
            // JSON answer: a looping model stops in seconds.
            let small_reader = family == "openai" && id.ends_with("_reader");
            let small_docs = family == "openai" && *id == "chat/documentation_search";
            let (timeout, max_tokens, latest) = if small_reader {
                (&20.0, 96, "1.0.1")
            } else if small_docs {
                (timeout, 512, "1.0.1")
            } else if *id == "review_merge_request" {
                (timeout, 2048, "1.1.0")
            } else {
                (timeout, 2048, "1.0.0")
            };
            assert_eq!(def.unit_primitives, *unit_primitives, "{id}/{family}");
            assert_eq!(def.params.timeout, Some(*timeout), "{id}/{family}");
            assert_eq!(
                def.model.params.model_class_provider, provider,
                "{id}/{family}"
            );
            assert_eq!(def.model.name, model, "{id}/{family}");
            assert_eq!(
                def.model.params.max_tokens,
                Some(max_tokens),
                "{id}/{family}"
            );
            // The review prompt's 1.1.0 added related code and feedback.
            assert_eq!(def.version.to_string(), latest, "{id}/{family}");
            let params = def.model_params();
            // Only the small models' documentation answers ask for the
            // penalty on repeating themselves.
            assert_eq!(
                params.dry_multiplier,
                small_docs.then_some(0.8),
                "{id}/{family}"
            );
            assert_eq!(params.timeout, Duration::from_secs_f64(*timeout));
            assert!(params.first_token_timeout <= params.timeout);
        }
    }
}

#[test]
fn unknown_keys_fail_naming_the_file_and_the_key() {
    let cases = [
        (
            "model:\n  name: claude-test",
            "model:\n  name: claude-test\n  colour: blue",
            "colour",
        ),
        (
            "model_class_provider: anthropic",
            "model_class_provider: anthropic\n    temprature: 0.3",
            "temprature",
        ),
        (
            "unit_primitives:",
            "surprise: 1\nunit_primitives:",
            "surprise",
        ),
        (
            "prompt_template:",
            "params:\n  max_retries: 2\nprompt_template:",
            "max_retries",
        ),
    ];
    for (from, to, key) in cases {
        let dir = prompt_dir(&[("x/base/1.0.0.yml", &MINIMAL.replacen(from, to, 1))]);
        let err = PromptRegistry::load(&dir).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, PromptLoadError::Invalid { .. }), "{text}");
        assert!(text.contains("x/base/1.0.0.yml"), "names the file: {text}");
        assert!(text.contains(key), "names the key {key}: {text}");
    }
}

#[test]
fn provider_specific_keys_are_checked_against_the_discriminator() {
    let litellm_with_headers = MINIMAL.replace(
        "model_class_provider: anthropic",
        "model_class_provider: litellm\n    default_headers: {a: b}",
    );
    let anthropic_with_litellm_key = MINIMAL.replace(
        "model_class_provider: anthropic",
        "model_class_provider: anthropic\n    custom_llm_provider: vertex_ai",
    );
    let unknown_class = MINIMAL.replace(
        "model_class_provider: anthropic",
        "model_class_provider: bedrock",
    );
    for (yaml, needle) in [
        (litellm_with_headers, "default_headers"),
        (anthropic_with_litellm_key, "custom_llm_provider"),
        (unknown_class, "bedrock"),
    ] {
        let dir = prompt_dir(&[("x/base/1.0.0.yml", &yaml)]);
        let text = PromptRegistry::load(&dir).unwrap_err().to_string();
        assert!(text.contains(needle), "{text}");
    }

    let dir = prompt_dir(&[(
        "x/base/1.0.0.yml",
        &MINIMAL.replace(
            "model_class_provider: anthropic",
            "model_class_provider: litellm\n    custom_llm_provider: vertex_ai\n    temperature: 0.5",
        ),
    )]);
    let def = PromptRegistry::load(&dir)
        .unwrap()
        .resolve("x", "base", None)
        .unwrap();
    assert_eq!(
        def.model.params.model_class_provider,
        ModelClassProvider::Litellm
    );
    assert_eq!(
        def.model.params.custom_llm_provider.as_deref(),
        Some("vertex_ai")
    );
    assert_eq!(def.model.params.temperature, Some(0.5));
    assert_eq!(def.model.params.max_retries, 1);
}

#[test]
fn bad_layout_and_templates_fail_at_load() {
    for (path, content, needle) in [
        ("x/base/latest.yml", MINIMAL.to_owned(), "latest"),
        (
            "base/1.0.0.yml",
            MINIMAL.to_owned(),
            "<prompt id>/<family>/<version>.yml",
        ),
        (
            "x/base/1.0.0.yml",
            MINIMAL.replace("Say hi", "{% if %}"),
            "prompt_template.user",
        ),
        (
            "x/base/1.0.0.yml",
            MINIMAL.replace("system:", "narrator:"),
            "narrator",
        ),
        (
            "x/base/1.0.0.yml",
            MINIMAL.replace("  user: \"Say hi to {{ name }}.\"", "  system: again"),
            "duplicate",
        ),
    ] {
        let dir = prompt_dir(&[(path, &content)]);
        let text = PromptRegistry::load(&dir).unwrap_err().to_string();
        assert!(text.contains(needle), "{path}: {text}");
    }
}

#[test]
fn broken_partials_duplicates_and_missing_dirs_fail_at_load() {
    let dir = prompt_dir(&[
        ("x/base/1.0.0.yml", MINIMAL),
        ("x/partials/broken.jinja", "{% for %}"),
    ]);
    let text = PromptRegistry::load(&dir).unwrap_err().to_string();
    assert!(text.contains("x/partials/broken.jinja"), "{text}");

    let dir = prompt_dir(&[
        ("x/base/1.0.0.yml", MINIMAL),
        ("x/base/1.0.0.yaml", MINIMAL),
    ]);
    let text = PromptRegistry::load(&dir).unwrap_err().to_string();
    assert!(text.contains("defined twice"), "{text}");

    let missing = std::env::temp_dir().join("gw-prompts-test-does-not-exist");
    let err = PromptRegistry::load(&missing).unwrap_err();
    assert!(matches!(err, PromptLoadError::Io { .. }));
    assert!(err.to_string().contains("gw-prompts-test-does-not-exist"));
}

#[test]
fn the_registry_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PromptRegistry>();
    assert_send_sync::<gateway::prompts::PromptDefinition>();
}

#[test]
fn template_key_order_is_message_order() {
    let yaml = MINIMAL.replace(
        "prompt_template:\n  system: \"You help.\"\n  user: \"Say hi to {{ name }}.\"",
        "prompt_template:\n  user: \"first\"\n  assistant: \"second\"\n  system: \"third\"",
    );
    let dir = prompt_dir(&[("x/base/1.0.0.yml", &yaml)]);
    let registry = PromptRegistry::load(&dir).unwrap();
    let def = registry.resolve("x", "base", None).unwrap();
    let roles: Vec<TemplateRole> = def.prompt_template.iter().map(|(r, _)| *r).collect();
    assert_eq!(
        roles,
        [
            TemplateRole::User,
            TemplateRole::Assistant,
            TemplateRole::System
        ]
    );
    let messages = def.render(&registry, &json!({})).unwrap();
    let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(contents, ["first", "second", "third"]);
}

#[test]
fn version_resolution_picks_the_highest_match() {
    let dir = prompt_dir(&[
        ("x/base/1.0.0.yml", &minimal_with("1.0.0")),
        ("x/base/1.0.1.yml", &minimal_with("1.0.1")),
        ("x/base/1.1.0.yml", &minimal_with("1.1.0")),
        ("x/base/1.2.0-dev.yml", &minimal_with("1.2.0-dev")),
        ("x/base/2.0.0.yml", &minimal_with("2.0.0")),
    ]);
    let registry = PromptRegistry::load(&dir).unwrap();
    let table: &[(Option<&str>, Result<&str, PromptError>)] = &[
        (None, Ok("1.1.0")),
        (Some("^1.0.0"), Ok("1.1.0")),
        (Some("~1.0"), Ok("1.0.1")),
        (Some(">=1.0.0"), Ok("2.0.0")),
        (Some("1.0.0"), Ok("1.0.0")),
        (Some("=1.0.1"), Ok("1.0.1")),
        (Some("=1.2.0-dev"), Ok("1.2.0-dev")),
        (Some("^3.0.0"), Err(PromptError::NoMatchingVersion)),
        (
            Some("not a version"),
            Err(PromptError::InvalidVersionConstraint),
        ),
        (Some(""), Err(PromptError::InvalidVersionConstraint)),
    ];
    for (constraint, expected) in table {
        let got = registry
            .resolve("x", "base", *constraint)
            .map(|d| d.version.to_string());
        assert_eq!(
            got.as_deref().map_err(Clone::clone),
            expected.clone(),
            "{constraint:?}"
        );
    }
    let def = registry.resolve("x", "base", Some("=1.0.1")).unwrap();
    let messages = def.render(&registry, &json!({"name": "Ada"})).unwrap();
    assert_eq!(messages[0].content, "You help (1.0.1).");
}

#[test]
fn missing_inputs_are_named() {
    let registry = shipped();
    let def = registry.resolve("chat/explain_code", "base", None).unwrap();
    let err = def
        .render(
            &registry,
            &json!({"input": "", "language_info": "", "selected_text": "x"}),
        )
        .unwrap_err();
    assert_eq!(err, PromptError::MissingInput("file_content".into()));

    let def = registry
        .resolve("chat/issue_reader", "openai", None)
        .unwrap();
    let err = def
        .render(&registry, &json!({"input": "what?"}))
        .unwrap_err();
    assert_eq!(err, PromptError::MissingInput("suggestions".into()));
    assert_eq!(
        gateway::ApiError::from(err).to_string(),
        "Missing prompt input: suggestions"
    );
}

#[test]
fn partials_are_included_by_their_path() {
    let yaml = MINIMAL.replace(
        "user: \"Say hi to {{ name }}.\"",
        "user: |\n    {% include \"shared/partials/greeting.jinja\" %}\n    {% import \"shared/partials/macros.jinja\" as m %}\n    {{ m.shout(name) }}",
    );
    let dir = prompt_dir(&[
        ("x/base/1.0.0.yml", &yaml),
        ("shared/partials/greeting.jinja", "Hello {{ name }}!\n"),
        (
            "shared/partials/macros.jinja",
            "{% macro shout(who) %}{{ who | upper }}!{% endmacro %}",
        ),
    ]);
    let registry = PromptRegistry::load(&dir).unwrap();
    let def = registry.resolve("x", "base", None).unwrap();
    let messages = def.render(&registry, &json!({"name": "Ada"})).unwrap();
    assert_eq!(messages[1].content, "Hello Ada!\nADA!");

    let err = def.render(&registry, &json!({})).unwrap_err();
    assert!(
        matches!(err, PromptError::MissingInput(ref m) if m == "name"),
        "{err:?}"
    );
}

#[test]
fn inputs_are_not_html_escaped() {
    let dir = prompt_dir(&[("x/base/1.0.0.yml", MINIMAL)]);
    let registry = PromptRegistry::load(&dir).unwrap();
    let def = registry.resolve("x", "base", None).unwrap();
    let messages = def.render(&registry, &json!({"name": "<b>&\"'"})).unwrap();
    assert_eq!(messages[1].content, "Say hi to <b>&\"'.");
}

#[test]
fn path_traversal_in_prompt_ids_is_not_found() {
    let registry = shipped();
    for id in [
        "../prompts/chat/explain_code",
        "chat/../chat/explain_code",
        "/chat/explain_code",
        "chat\\explain_code",
        "chat/./explain_code",
        "chat//explain_code",
        "",
    ] {
        let err = registry.resolve(id, "base", None).unwrap_err();
        assert_eq!(err, PromptError::NotFound(id.to_owned()), "{id:?}");
    }
    assert!(registry.resolve("chat/explain_code", "base", None).is_ok());
    assert_eq!(
        registry
            .resolve("chat/explain_code", "mistral", None)
            .unwrap_err(),
        PromptError::NotFound("chat/explain_code".into())
    );
}

fn metadata(name: &str) -> ModelMetadata {
    ModelMetadata {
        name: name.into(),
        provider: "openai".into(),
        endpoint: "http://127.0.0.1:11434/v1/".into(),
        api_key: Some("secret".into()),
        identifier: None,
    }
}

#[test]
fn family_choice_and_fallback() {
    let local = Config::for_tests(&[]).unwrap();
    assert_eq!(
        choose_families("chat/explain_code", None, &local),
        ["openai", "base"]
    );

    let anthropic = Config::for_tests(&[("ANTHROPIC_API_KEY", "k")]).unwrap();
    assert_eq!(
        choose_families("chat/explain_code", None, &anthropic),
        ["base"]
    );

    let mapped = Config::for_tests(&[
        ("ANTHROPIC_API_KEY", "k"),
        ("AIGW_DEFAULT_PROMPTS", r#"{"chat/explain_code": "openai"}"#),
    ])
    .unwrap();
    assert_eq!(
        choose_families("chat/explain_code", None, &mapped),
        ["openai", "base"]
    );
    assert_eq!(choose_families("chat/fix_code", None, &mapped), ["base"]);

    let custom = Config::for_tests(&[("AIGW_CUSTOM_MODELS__ENABLED", "true")]).unwrap();
    let mistral = metadata("mistral");
    assert_eq!(
        choose_families("chat/explain_code", Some(&mistral), &custom),
        ["mistral", "openai"]
    );
    // Without custom models the metadata does not choose the family.
    assert_eq!(
        choose_families("chat/explain_code", Some(&mistral), &local),
        ["openai", "base"]
    );

    // A prompt defined only for `base` is still found on the local default.
    let dir = prompt_dir(&[("only/base/1.0.0.yml", MINIMAL)]);
    let registry = PromptRegistry::load(&dir).unwrap();
    let request = PromptRequest {
        inputs: json!({"name": "Ada"}).as_object().unwrap().clone(),
        prompt_version: None,
        stream: false,
        model_metadata: None,
    };
    let prepared = prepare(
        &registry,
        &local,
        PromptInvocation {
            prompt_id: "only",
            request: &request,
            user: &GatewayUser::debug(),
        },
    )
    .unwrap();
    assert_eq!(prepared.definition.family, "base");
}

#[test]
fn model_targets() {
    // A development caller: any endpoint is vouched for (the rule with real
    // tokens is in model_endpoints.rs).
    let guard = EndpointGuard {
        debug: true,
        ..EndpointGuard::NOTHING
    };
    let registry = shipped();
    let base = registry.resolve("chat/explain_code", "base", None).unwrap();
    let openai = registry
        .resolve("chat/explain_code", "openai", None)
        .unwrap();

    let cfg = Config::for_tests(&[("ANTHROPIC_API_KEY", "k")]).unwrap();
    let target = base.model_target(&cfg.providers, None, &guard).unwrap();
    assert_eq!(target.kind, ProviderKind::Anthropic);
    assert_eq!(target.model, "claude-3-5-sonnet-20241022");
    let target = openai.model_target(&cfg.providers, None, &guard).unwrap();
    assert_eq!(target.kind, ProviderKind::OpenAiCompatible);
    assert_eq!(target.model, "smollm2-135m-instruct");

    assert_eq!(
        base.model_target(&cfg.providers, Some(&metadata("mistral")), &guard)
            .unwrap_err(),
        PromptError::CustomModelsDisabled
    );

    let custom = Config::for_tests(&[("AIGW_CUSTOM_MODELS__ENABLED", "true")]).unwrap();
    let target = openai
        .model_target(&custom.providers, Some(&metadata("mistral")), &guard)
        .unwrap();
    assert_eq!(target.kind, ProviderKind::OpenAiCompatible);
    assert_eq!(target.model, "mistral");
    let endpoint = target.endpoint.as_ref().unwrap();
    assert_eq!(endpoint.base_url(), "http://127.0.0.1:11434/v1");
    assert_eq!(endpoint.api_key(), Some("secret"));

    let mut with_identifier = metadata("mistral");
    with_identifier.identifier = Some("custom_openai/mistral-7b-instruct".into());
    let target = openai
        .model_target(&custom.providers, Some(&with_identifier), &guard)
        .unwrap();
    assert_eq!(target.model, "mistral-7b-instruct");

    let mut oversized = metadata("mistral");
    oversized.endpoint = "x".repeat(300);
    assert!(matches!(
        openai.model_target(&custom.providers, Some(&oversized), &guard),
        Err(PromptError::InvalidModelMetadata(m)) if m.contains("endpoint")
    ));

    let mock = Config::for_tests(&[("AIGW_MOCK_MODEL_RESPONSES", "true")]).unwrap();
    assert_eq!(
        base.model_target(&mock.providers, None, &guard)
            .unwrap()
            .kind,
        ProviderKind::Mock
    );
}

#[test]
fn model_call_puts_system_apart_and_keeps_order() {
    let registry = shipped();
    let def = registry
        .resolve("categorize_question", "base", None)
        .unwrap();
    let messages = def
        .render(
            &registry,
            &json!({"question": "How do I rebase?", "previous_answer": ""}),
        )
        .unwrap();
    let cfg = Config::for_tests(&[("ANTHROPIC_API_KEY", "k")]).unwrap();
    let target = def
        .model_target(&cfg.providers, None, &EndpointGuard::NOTHING)
        .unwrap();
    let call = def.model_call(messages.clone(), target);
    assert_eq!(call.system.as_deref(), Some(messages[0].content.as_str()));
    assert_eq!(call.messages.len(), 1);
    assert!(call.messages[0].content.contains("How do I rebase?"));
    assert_eq!(call.params.timeout, Duration::from_secs(5));
    assert_eq!(call.params.max_tokens, 2048);
}

// ---------------------------------------------------------------- snapshots

const CODE: &str = "def average(values):\n    return sum(values) / len(values)\n";

fn realistic_inputs(id: &str) -> serde_json::Value {
    let code_inputs = json!({
        "file_content": format!("Here is the whole file for context:\n<file>\nimport statistics\n\n{CODE}</file>"),
        "input": "Keep it short.",
        "language_info": "The code is written in Python and stored as `stats.py`.",
        "selected_text": CODE,
        "libraries": "The project uses these libraries: pytest, numpy.",
        "file_content_reuse": "Reuse helpers from the file where that makes sense.",
    });
    match id {
        "chat/issue_reader"
        | "chat/epic_reader"
        | "chat/merge_request_reader"
        | "chat/commit_reader"
        | "chat/build_reader" => json!({
            "input": "Summarize the discussion in gitlab-org/gitlab#4521",
            "suggestions": "The question mentions a full reference.",
        }),
        "chat/explain_vulnerability" => json!({
            "identifiers": "CWE-89, A1:2017 - Injection",
            "language_info": "The code is written in Ruby and stored as `app/models/user.rb`.",
            "title": "SQL injection in user search",
            "vulnerability_info": "The `search` method builds a query by string interpolation:\n```ruby\nUser.where(\"name LIKE '%#{params[:q]}%'\")\n```",
        }),
        "chat/troubleshoot_job" => json!({
            "language_info": "The repository is mostly written in Rust.",
            "selected_text": "error[E0425]: cannot find value `conf` in this scope\n --> src/main.rs:4:5\nerror: could not compile `app` due to previous error\nERROR: Job failed: exit code 101",
        }),
        "chat/summarize_comments" => json!({
            "notes_content": "<comment>alice: The login page times out behind the proxy.</comment>\n<comment>bob: Raising the proxy timeout to 60s fixed it for me.</comment>\n<comment>alice: Agreed, let's ship that and document it.</comment>",
        }),
        "chat/documentation_search" => json!({
            "question": "How do I make a CI job run only on the default branch?",
            "passages": [
                {
                    "title": "Specify when jobs run with rules",
                    "url": "https://docs.gitlab.com/ci/jobs/job_rules/",
                    "content": "Use `rules:if` with `$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH` to add a job to pipelines for the default branch only.",
                },
                {
                    "title": "Predefined CI/CD variables",
                    "url": null,
                    "content": "`CI_DEFAULT_BRANCH` holds the name of the project's default branch.",
                },
            ],
        }),
        "review_merge_request" => json!({
            "mr_title": "Average of an empty list",
            "mr_description": "Return 0 for empty input.",
            "instructions": "Prefer explicit checks over exceptions.",
            "earlier_threads": "",
            "file_path": "stats.py",
            "diff_lines": "<line type=\"context\" old_line=\"1\" new_line=\"1\">def average(values):</line>\n<line type=\"added\" old_line=\"\" new_line=\"2\">    if len(values) == 1: return 0</line>",
            "file_content": "",
            "related_code": "<code path=\"stats/empty.py\" lines=\"1-2\">\ndef is_empty(values):\n    return len(values) == 0\n</code>",
            "feedback": "- On `stats.py` you commented: \"Prefer a guard clause.\"\n  A developer replied: \"We don't do guard clauses here.\"",
        }),
        "categorize_question" => json!({
            "question": "Why does my pipeline skip the deploy job?",
            "previous_answer": "Pipelines run jobs according to their rules.",
        }),
        _ => code_inputs,
    }
}

fn render_for_snapshot(registry: &PromptRegistry, id: &str, family: &str) -> String {
    let def = registry.resolve(id, family, None).unwrap();
    let messages = def.render(registry, &realistic_inputs(id)).unwrap();
    let mut out = String::new();
    for message in messages {
        out.push_str(&format!(
            "===== {} =====\n{}\n",
            message.role.as_str(),
            message.content
        ));
    }
    out
}

#[test]
fn every_shipped_prompt_renders_as_expected() {
    let registry = shipped();
    let ids: Vec<&str> = registry
        .prompt_ids()
        // Workflow prompts have their own test (workflow_prompts).
        .filter(|id| !id.starts_with("chat/react") && !id.starts_with("workflow/"))
        .collect();
    for (id, _, _) in EXPECTED {
        assert!(ids.contains(id), "{id} is shipped");
    }
    for id in ids {
        let families: Vec<&str> = registry.families(id).collect();
        assert!(
            families.contains(&"base") && families.contains(&"openai"),
            "{id}: {families:?}"
        );
        for family in families {
            let rendered = render_for_snapshot(&registry, id, family);
            assert!(
                !rendered.contains("{{"),
                "{id}/{family} left a tag unrendered"
            );
            let name = format!("{}__{family}", id.replace('/', "__"));
            insta::assert_snapshot!(name, rendered);
        }
    }
}

#[test]
fn optional_parts_disappear_cleanly_when_empty() {
    let registry = shipped();
    let def = registry.resolve("chat/explain_code", "base", None).unwrap();
    let mut inputs = realistic_inputs("chat/explain_code");
    inputs["input"] = json!("");
    let messages = def.render(&registry, &inputs).unwrap();
    let user = &messages[1].content;
    assert!(!user.contains("Also take this request"), "{user}");
    assert!(!user.contains("\n\n\n"), "no blank-line runs: {user}");
}
