//! Speculative (prompt-lookup) greedy decoding against plain greedy decoding
//! on the real weights: the same prompts give the same tokens both ways,
//! with grammars, penalties, an early halt and the prefix cache in play.

use crate::common;

use local_llm::chat_template::{ChatMessage, render_chatml};
use local_llm::engine::{ChatEngine, EngineRun, Flow, LlamaEngine, Repetition, SamplingParams};
use local_llm::tools::OutputPlan;
use serde_json::json;

/// A grounded question: the answer copies file names and error lines.
const QUOTING_CONTEXT: &str = "Pipeline #4182 failed on branch fix/login-timeout.\n\
Failed jobs:\n\
- rspec spec/models/user_spec.rb: NoMethodError: undefined method `session_timeout' for nil:NilClass\n\
- rubocop app/controllers/sessions_controller.rb: Layout/LineLength: Line is too long. [131/120]\n\
- jest spec/frontend/login/form_spec.js: TypeError: Cannot read properties of undefined (reading 'focus')\n";

fn engines() -> (LlamaEngine, LlamaEngine) {
    let path = common::test_config().chat_model_path;
    // One thread each: the two engines run side by side on a shared machine.
    let plain = LlamaEngine::load(&path, 1, 1024)
        .expect("gguf loads")
        .with_speculation(false);
    let speculative = LlamaEngine::load(&path, 1, 1024).expect("gguf loads");
    (plain, speculative)
}

fn chat(system: &str, user: &str) -> String {
    let mut messages = Vec::new();
    if !system.is_empty() {
        messages.push(ChatMessage {
            role: "system".into(),
            content: system.into(),
        });
    }
    messages.push(ChatMessage {
        role: "user".into(),
        content: user.into(),
    });
    render_chatml(&messages)
}

fn greedy(max_tokens: u32) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    }
}

/// The pieces generated (one per token) and the run; stops after
/// `halt_after` pieces when given.
fn generate(
    engine: &mut LlamaEngine,
    prompt: &str,
    params: &SamplingParams,
    halt_after: Option<usize>,
) -> (Vec<Vec<u8>>, EngineRun) {
    let tokens = engine.tokenize(prompt);
    let mut pieces = Vec::new();
    let run = engine
        .generate(&tokens, params, &mut |piece| {
            pieces.push(piece.to_vec());
            if halt_after.is_some_and(|n| pieces.len() >= n) {
                Flow::Halt
            } else {
                Flow::Continue
            }
        })
        .expect("generates");
    (pieces, run)
}

/// Runs the prompt on both engines and asserts the same pieces, count and
/// finish; returns the speculative run.
fn assert_same(
    (plain, speculative): &mut (LlamaEngine, LlamaEngine),
    prompt: &str,
    params: &SamplingParams,
    halt_after: Option<usize>,
) -> EngineRun {
    let (want, want_run) = generate(plain, prompt, params, halt_after);
    let (got, got_run) = generate(speculative, prompt, params, halt_after);
    assert_eq!(
        String::from_utf8_lossy(&got.concat()),
        String::from_utf8_lossy(&want.concat())
    );
    assert_eq!(got, want, "the same tokens, piece by piece");
    assert_eq!(got_run.completion_tokens, want_run.completion_tokens);
    assert_eq!(got_run.finish, want_run.finish);
    assert_eq!(want_run.drafts.drafted, 0, "plain decoding drafts nothing");
    got_run
}

#[test]
fn a_quoting_answer_is_the_same_and_accepts_drafts() {
    let mut engines = engines();
    let prompt = chat(
        &format!("Answer from this context only.\n{QUOTING_CONTEXT}"),
        "List every failed job with its file and its exact error line.",
    );
    let run = assert_same(&mut engines, &prompt, &greedy(160), None);
    assert!(
        run.drafts.accepted >= 10,
        "a quoting answer takes draft tokens: {:?}",
        run.drafts
    );
    // Each accepted draft token saved a decode.
    assert!(run.drafts.rounds < run.completion_tokens);
}

#[test]
fn free_text_and_other_prompts_are_the_same() {
    let mut engines = engines();
    for (system, user) in [
        ("", "Write a short poem about the sea."),
        ("", "Explain what a merge request is, in three sentences."),
        (
            "You are GitLab Duo Chat.",
            "Repeat after me exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog.",
        ),
        (
            "",
            "Count from one to twenty in words, separated by commas.",
        ),
    ] {
        assert_same(&mut engines, &chat(system, user), &greedy(128), None);
    }
}

#[test]
fn penalties_and_grammars_give_the_same_tokens() {
    let mut engines = engines();
    let prompt = chat(
        &format!("Answer from this context only.\n{QUOTING_CONTEXT}"),
        "Which files failed? Quote each error.",
    );
    let penalized = SamplingParams {
        repetition: Repetition {
            frequency_penalty: 0.5,
            presence_penalty: 0.2,
            dry_multiplier: 0.8,
        },
        ..greedy(128)
    };
    assert_same(&mut engines, &prompt, &penalized, None);

    let tool = json!({"type": "function", "function": {
        "name": "read_file",
        "description": "Reads a file of the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    }});
    for choice in ["required", "auto"] {
        let plan = OutputPlan::from_request(
            Some(std::slice::from_ref(&tool)),
            Some(&json!(choice)),
            None,
        )
        .expect("a tool plan");
        let params = SamplingParams {
            constraint: plan.constraint.clone(),
            ..greedy(96)
        };
        assert!(params.constraint.is_some());
        assert_same(&mut engines, &prompt, &params, None);
    }
    let schema = json!({"type": "json_schema", "json_schema": {"name": "errors", "strict": true, "schema": {
        "type": "object",
        "properties": {"files": {"type": "array", "items": {"type": "string"}}},
        "required": ["files"], "additionalProperties": false
    }}});
    let plan = OutputPlan::from_request(None, None, Some(&schema)).expect("a schema plan");
    let params = SamplingParams {
        constraint: plan.constraint,
        ..greedy(96)
    };
    assert_same(&mut engines, &prompt, &params, None);
}

/// A halt (a stop string found, a client gone) in the middle of an accepted
/// draft leaves a KV cache that the next request, reusing its prefix, can
/// trust: its answer is still the plain one.
#[test]
fn halting_mid_draft_leaves_a_consistent_cache_for_the_next_request() {
    let mut engines = engines();
    let system = format!("Answer from this context only.\n{QUOTING_CONTEXT}");
    let first = chat(
        &system,
        "List every failed job with its file and its exact error line.",
    );
    for halt_after in [7, 23] {
        assert_same(&mut engines, &first, &greedy(160), Some(halt_after));
        // Shares the system prompt with the first: served from the cache.
        let second = chat(&system, "Which job failed on a TypeError? Quote its error.");
        assert_same(&mut engines, &second, &greedy(96), None);
        let (_, rerun) = generate(&mut engines.1, &first, &greedy(160), None);
        assert!(rerun.cached_tokens > 0, "the prefix cache was used");
    }
    // Budgets that end inside a draft.
    for max_tokens in [1, 2, 5, 33] {
        assert_same(&mut engines, &first, &greedy(max_tokens), None);
    }
}

/// Past 512 cached positions llama.cpp splits one token's attention across
/// threads (and sums the parts in another order than a batch does) when
/// keys and values share an f16 type; the cache's types keep every decode
/// on one path, so speculative and plain decoding still agree there. Two
/// threads, since one thread's split is a single part.
#[test]
fn past_512_positions_with_two_threads_the_tokens_are_the_same() {
    let path = common::test_config().chat_model_path;
    let plain = LlamaEngine::load(&path, 2, 2048)
        .expect("gguf loads")
        .with_speculation(false);
    let speculative = LlamaEngine::load(&path, 2, 2048).expect("gguf loads");
    let mut engines = (plain, speculative);
    let context: String = (1..=6)
        .map(|n| format!("Run {n}:\n{QUOTING_CONTEXT}"))
        .collect();
    let prompt = chat(
        &format!("Answer from this context only.\n{context}"),
        "List every failed job of run 6 with its file and its exact error line.",
    );
    let prompt_tokens = engines.0.tokenize(&prompt).len();
    assert!(prompt_tokens > 512, "{prompt_tokens} prompt tokens");
    let run = assert_same(&mut engines, &prompt, &greedy(160), None);
    assert!(run.drafts.accepted > 0, "{:?}", run.drafts);
}
