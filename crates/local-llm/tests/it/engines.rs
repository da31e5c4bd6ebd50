//! Engine-level tests against the real weights.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use crate::common;

use local_llm::bert_gguf::DenseWeights;
use local_llm::chat_template::{ChatMessage, render_chatml};
use local_llm::embeddings::{Embedder, MAX_SEQUENCE_TOKENS, PaddedReference};
use local_llm::engine::{ChatEngine, EngineFinish, Flow, LlamaEngine, SamplingParams};
use serde_json::Value;

fn chat_engine() -> LlamaEngine {
    let config = common::test_config();
    LlamaEngine::load(&config.chat_model_path, 2, 1024).expect("gguf loads")
}

#[test]
fn chat_tokenizer_round_trips_text_and_chatml_markers() {
    let engine = chat_engine();
    let text = "<|im_start|>user\nHello, wörld! fn main() { println!(\"hi\"); }<|im_end|>\n";
    let tokens = engine.tokenize(text);
    assert!(tokens.len() > 5 && tokens.len() < text.len());
    assert_eq!(engine.detokenize(&tokens), text);
    // The markers are single control tokens, not spelled out.
    assert_eq!(engine.tokenize("<|im_start|>").len(), 1);
}

#[test]
fn greedy_generation_is_deterministic_and_ends_on_its_own_or_at_the_limit() {
    let mut engine = chat_engine();
    let prompt = render_chatml(&[ChatMessage {
        role: "user".into(),
        content: "Name three colours.".into(),
    }]);
    let tokens = engine.tokenize(&prompt);
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 12,
        ..SamplingParams::default()
    };
    let run = |engine: &mut LlamaEngine| {
        let mut bytes = Vec::new();
        let result = engine
            .generate(&tokens, &params, &mut |piece| {
                bytes.extend_from_slice(piece);
                Flow::Continue
            })
            .expect("generates");
        (String::from_utf8_lossy(&bytes).into_owned(), result)
    };
    let (first, first_run) = run(&mut engine);
    let (second, _) = run(&mut engine);
    assert!(!first.trim().is_empty());
    assert_eq!(first, second);
    assert!(first_run.completion_tokens <= 12);
    assert!(matches!(
        first_run.finish,
        EngineFinish::Length | EngineFinish::EndOfTurn
    ));
}

#[test]
fn embedding_tokenizer_round_trips() {
    let embedder =
        Embedder::load_candle(&common::test_config().embed_model_dir).expect("embedder loads");
    let ids = embedder
        .token_ids("Merge requests need approvals.")
        .expect("tokenizes");
    assert_eq!(ids.first(), Some(&101));
    assert_eq!(ids.last(), Some(&102));
    assert_eq!(
        embedder.decode(&ids).expect("decodes"),
        "merge requests need approvals."
    );
}

#[test]
fn embeddings_match_reference_values() {
    let embedder =
        Embedder::load_candle(&common::test_config().embed_model_dir).expect("embedder loads");
    let reference: Value = serde_json::from_str(include_str!("../data/minilm_reference.json"))
        .expect("reference json");
    let sentences = reference["sentences"].as_array().expect("sentences");
    let texts: Vec<String> = sentences
        .iter()
        .map(|s| s["text"].as_str().expect("text").to_owned())
        .collect();
    let embedded = embedder.embed(&texts).expect("embeds");
    for (sentence, vector) in sentences.iter().zip(&embedded.vectors) {
        let ids: Vec<u64> = embedder
            .token_ids(sentence["text"].as_str().expect("text"))
            .expect("ids")
            .into_iter()
            .map(u64::from)
            .collect();
        let expected_ids: Vec<u64> = sentence["token_ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id"))
            .collect();
        assert_eq!(ids, expected_ids);
        assert_eq!(vector.len(), 384);
        for (got, want) in vector
            .iter()
            .zip(sentence["first_values"].as_array().expect("values"))
        {
            let want = want.as_f64().expect("number");
            assert!(
                (f64::from(*got) - want).abs() < 1e-4,
                "{got} vs {want} for {:?}",
                sentence["text"]
            );
        }
        let sum: f64 = vector.iter().map(|v| f64::from(*v)).sum();
        assert!((sum - sentence["values_sum"].as_f64().expect("sum")).abs() < 1e-3);
    }
}

#[test]
fn batched_embeddings_equal_single_ones_despite_padding() {
    let embedder =
        Embedder::load_candle(&common::test_config().embed_model_dir).expect("embedder loads");
    let short = "Hi.".to_owned();
    let long =
        "A much longer sentence that forces the short one to be padded in the batch.".to_owned();
    let batch = embedder.embed(&[short.clone(), long]).expect("batch");
    let single = embedder.embed(&[short]).expect("single");
    for (a, b) in batch.vectors[0].iter().zip(&single.vectors[0]) {
        assert!((a - b).abs() < 1e-4);
    }
    // Padding is not counted: the short input keeps its own length.
    assert_eq!(batch.token_counts[0], single.token_counts[0]);
    assert!(batch.token_counts[1] > batch.token_counts[0]);
}

#[test]
fn long_inputs_are_cut_at_the_sequence_limit_and_flagged() {
    let embedder =
        Embedder::load_candle(&common::test_config().embed_model_dir).expect("embedder loads");
    let long = "merge request review ".repeat(200);
    let embedded = embedder
        .embed(&[long, "short one".to_owned()])
        .expect("embeds");
    assert_eq!(embedded.token_counts[0], MAX_SEQUENCE_TOKENS);
    assert_eq!(embedded.truncated, vec![true, false]);
    assert_eq!(embedded.token_counts[1], 4);
    assert_eq!(embedded.total_tokens(), MAX_SEQUENCE_TOKENS + 4);
}

/// The packed path (no padding, per-input attention) gives today's vectors:
/// cosine ≥ 0.999 against the padded candle `BertModel` for every input,
/// in order, whatever the mix of lengths in the batch.
#[test]
fn packed_embeddings_match_the_padded_model() {
    let dir = common::test_config().embed_model_dir;
    let embedder = Embedder::load_candle(&dir).expect("embedder loads");
    let reference = PaddedReference::load(&dir).expect("reference loads");
    let texts: Vec<String> = vec![
        String::new(),
        "Hi.".into(),
        "How do I configure merge request approvals?".into(),
        "fn main() {\n    let client = reqwest::Client::new();\n    println!(\"{:?}\", client);\n}"
            .into(),
        "Ünïcödé, emoji 🚀 and CJK 漢字 in one line.".into(),
        "def handle(request):\n    return Response(status=204)\n".repeat(12),
        "merge request review ".repeat(200),
        "class Client:\n    \"\"\"An HTTP client with connection pooling.\"\"\"\n".repeat(3),
    ];
    let packed = embedder.embed(&texts).expect("packed");
    let padded = reference.embed(&texts).expect("padded");
    assert_eq!(packed.vectors.len(), texts.len());
    for ((text, a), b) in texts.iter().zip(&packed.vectors).zip(&padded) {
        let cosine: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        assert!(cosine >= 0.999, "cosine {cosine} for {text:?}");
    }
    // One input at a time gives the same vectors as the batch.
    for (text, batched) in texts.iter().zip(&packed.vectors) {
        let single = embedder.embed(std::slice::from_ref(text)).expect("single");
        let cosine: f32 = single.vectors[0]
            .iter()
            .zip(batched)
            .map(|(x, y)| x * y)
            .sum();
        assert!(cosine >= 0.99999, "cosine {cosine} alone for {text:?}");
    }
}

/// Inputs of every kind the index and chat send: short, long (cut at the
/// sequence limit), code, unicode.
fn mixed_inputs() -> Vec<String> {
    vec![
        "Hi.".into(),
        "How do I configure merge request approvals?".into(),
        "fn main() {\n    let client = reqwest::Client::new();\n    println!(\"{:?}\", client);\n}"
            .into(),
        "Ünïcödé, emoji 🚀 and CJK 漢字 in one line.".into(),
        "def handle(request):\n    return Response(status=204)\n".repeat(12),
        "merge request review ".repeat(200),
        "class Client:\n    \"\"\"An HTTP client with connection pooling.\"\"\"\n".repeat(3),
        "SELECT id, title FROM merge_requests WHERE project_id = $1 ORDER BY id DESC;".into(),
        "x".into(),
        "impl Drop for Guard { fn drop(&mut self) { self.0.fetch_sub(1, Ordering::SeqCst); } }"
            .repeat(8),
    ]
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The llama.cpp path gives today's (candle f32) vectors: cosine ≥ 0.999
/// for every input, alone or in a batch, with the same word pieces, with f16
/// dense weights (the default), int8 and bfloat16 ones.
#[test]
fn llama_embeddings_match_the_candle_vectors() {
    let dir = common::test_config().embed_model_dir;
    let candle = Embedder::load_candle(&dir).expect("candle embedder loads");
    let texts = mixed_inputs();
    let want = candle.embed(&texts).expect("candle embeds");
    for weights in [DenseWeights::F16, DenseWeights::Q8, DenseWeights::Bf16] {
        let fast = Embedder::load_llama(&dir, 1, weights).expect("llama.cpp embedder loads");
        assert!(fast.is_llama());
        assert_eq!(fast.dimensions(), 384);
        let got = fast.embed(&texts).expect("fast embeds");
        assert_eq!(got.token_counts, want.token_counts);
        assert_eq!(got.truncated, want.truncated);
        assert_eq!(got.vectors.len(), texts.len());
        for ((text, a), b) in texts.iter().zip(&got.vectors).zip(&want.vectors) {
            let c = cosine(a, b);
            assert!(c >= 0.999, "{weights:?}: cosine {c} for {text:?}");
        }
        // One at a time (the express lane) gives the batch's vectors. With
        // int8 weights the AVX-512 VNNI code quantises a lone input's
        // activations along another path than a batch's (0.99990 seen).
        let same = match weights {
            DenseWeights::F16 => 0.9999,
            DenseWeights::Q8 | DenseWeights::Bf16 => 0.9995,
        };
        for (text, batched) in texts.iter().zip(&got.vectors) {
            let single = fast.embed(std::slice::from_ref(text)).expect("single");
            let c = cosine(&single.vectors[0], batched);
            assert!(c >= same, "{weights:?}: cosine {c} alone for {text:?}");
        }
    }
}

/// A question runs in its own lane: it is answered while a large bulk
/// request is part-way through, not after it.
#[test]
fn a_question_embeds_while_a_bulk_request_is_in_progress() {
    let dir = common::test_config().embed_model_dir;
    let embedder =
        std::sync::Arc::new(Embedder::load_llama(&dir, 1, DenseWeights::F16).expect("loads"));
    // One input at the sequence limit per pass: 24 passes of bulk work,
    // each far longer than a question takes.
    let bulk: Vec<String> = (0..24)
        .map(|i| {
            format!(
                "chunk {i}: {}",
                "fn handle(request) -> Response ".repeat(60)
            )
        })
        .collect();
    let before = embedder.bulk_passes();
    let worker = {
        let embedder = embedder.clone();
        std::thread::spawn(move || embedder.embed(&bulk).expect("bulk embeds"))
    };
    // Wait (synchronise, no sleep) until the bulk request has really started.
    while embedder.bulk_passes() == before {
        std::thread::yield_now();
    }
    let question = embedder
        .embed(&["Where are merge request fees computed?".to_owned()])
        .expect("question embeds");
    let passes_when_answered = embedder.bulk_passes() - before;
    assert_eq!(question.vectors.len(), 1);
    assert!(
        passes_when_answered < 24,
        "the question waited for the whole bulk request ({passes_when_answered} passes)"
    );
    let embedded = worker.join().expect("bulk thread");
    assert_eq!(embedded.vectors.len(), 24);
    assert_eq!(embedder.bulk_passes() - before, 24);
}
