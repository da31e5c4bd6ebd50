//! Embedding throughput of the bundled model on this machine, per engine:
//! `cargo run --release -p local-llm --example embed_throughput [models_dir]`.
//!
//! Embeds code chunks (the code-search bench's Larkspur fixture cut into
//! ~1,000-byte pieces, as the indexer sends them) in requests of `BATCH`
//! inputs, and prints per engine the time spent tokenizing and in the model,
//! tokens/s, inputs/s, and the lowest cosine of the fast (llama.cpp, int8)
//! vectors against candle's f32 ones. `ROUNDS`, `THREADS`,
//! `WEIGHTS=auto|bf16|f16|q8` and `ONLY=fast|candle` tune it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use local_llm::bert_gguf::DenseWeights;
use local_llm::embeddings::Embedder;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from(".models/all-MiniLM-L6-v2"), PathBuf::from);
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|b| b.parse().ok())
            .unwrap_or(default)
    };
    let batch = env("BATCH", 64);
    let rounds = env("ROUNDS", 2);
    let threads = env("THREADS", 2);
    let only = std::env::var("ONLY").unwrap_or_default();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/fixtures/code-search");
    let mut texts = Vec::new();
    collect_chunks(&fixture, &mut texts)?;
    texts.truncate(env("CHUNKS", 256));
    println!("{} chunks from {}", texts.len(), fixture.display());
    let mut fast_vectors = Vec::new();
    if only != "candle" {
        let start = Instant::now();
        let weights = match std::env::var("WEIGHTS").as_deref() {
            Ok("q8") => DenseWeights::Q8,
            Ok("f16") => DenseWeights::F16,
            Ok("bf16") => DenseWeights::Bf16,
            _ => DenseWeights::for_this_cpu(),
        };
        println!("dense weights: {}", weights.name());
        let embedder = Embedder::load(&dir, threads, weights)?;
        println!(
            "fast engine loaded in {:.2}s (llama.cpp: {})",
            start.elapsed().as_secs_f64(),
            embedder.is_llama()
        );
        fast_vectors = run("fast", &embedder, &texts, batch, rounds)?;
    }
    if only != "fast" {
        let embedder = Embedder::load_candle(&dir)?;
        let candle_vectors = run("candle", &embedder, &texts, batch, rounds)?;
        if !fast_vectors.is_empty() {
            let lowest = fast_vectors
                .iter()
                .zip(&candle_vectors)
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>())
                .fold(f32::INFINITY, f32::min);
            println!("lowest cosine fast vs candle: {lowest:.6}");
        }
    }
    Ok(())
}

fn collect_chunks(dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            collect_chunks(&path, out)?;
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            let mut chunk = String::new();
            for line in text.lines() {
                chunk.push_str(line);
                chunk.push('\n');
                if chunk.len() >= 1000 {
                    out.push(std::mem::take(&mut chunk));
                }
            }
            if !chunk.trim().is_empty() {
                out.push(chunk);
            }
        }
    }
    Ok(())
}

fn run(
    name: &str,
    embedder: &Embedder,
    texts: &[String],
    batch: usize,
    rounds: usize,
) -> anyhow::Result<Vec<Vec<f32>>> {
    // Warm-up.
    embedder.embed(&texts[..texts.len().min(4)])?;
    let mut tokenizing = Duration::ZERO;
    let start = Instant::now();
    let mut vectors = Vec::new();
    let mut tokens = 0;
    for _ in 0..rounds {
        vectors.clear();
        for request in texts.chunks(batch) {
            let t = Instant::now();
            for text in request {
                embedder.token_ids(text)?;
            }
            tokenizing += t.elapsed();
            let embedded = embedder.embed(request)?;
            tokens += embedded.total_tokens();
            vectors.extend(embedded.vectors);
        }
    }
    let total = start.elapsed();
    let model = total.saturating_sub(tokenizing).as_secs_f64();
    println!(
        "{name}: {rounds} x {} inputs, {tokens} tokens: tokenizing {:.3}s, embedding {model:.2}s (tokenizing again included): {:.0} tokens/s, {:.1} inputs/s",
        texts.len(),
        tokenizing.as_secs_f64(),
        tokens as f64 / model,
        (rounds * texts.len()) as f64 / model
    );
    // A question alone, as chat asks it.
    let question = ["Where are the late fees of an invoice computed?".to_owned()];
    let mut latencies: Vec<f64> = (0..20)
        .map(|_| {
            let t = Instant::now();
            embedder
                .embed(&question)
                .map(|_| t.elapsed().as_secs_f64() * 1000.0)
        })
        .collect::<Result<_, _>>()?;
    latencies.sort_by(f64::total_cmp);
    println!("{name}: a question alone: p50 {:.1} ms", latencies[10]);
    Ok(vectors)
}
