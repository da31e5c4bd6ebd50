//! Embedding throughput of the bundled model on this machine, packed (what
//! the server runs) against the padded reference it replaced:
//! `cargo run --release -p local-llm --example embed_throughput [models_dir]`.
//! Embeds batches of code-like inputs of mixed lengths (as the indexer sends)
//! and prints tokens/s, inputs/s and the lowest cosine between the two.
//! `BATCH`, `ROUNDS` and `ONLY=packed|padded` tune it.

use std::path::PathBuf;
use std::time::Instant;

use local_llm::embeddings::{Embedder, PaddedReference};

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
    let batch = env("BATCH", 32);
    let rounds = env("ROUNDS", 4);
    let only = std::env::var("ONLY").unwrap_or_default();
    let words = [
        "fn", "request", "merge", "let", "client", "response", "self", "return", "async", "await",
        "error", "handler", "config", "timeout", "headers", "json", "parse", "value", "index",
    ];
    // Lengths from 10 to ~240 words, like code chunks of varying size.
    let texts: Vec<String> = (0..batch)
        .map(|i| {
            let n = 10 + (i * 37) % 230;
            (0..n)
                .map(|j| words[(i + j * 7) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let embedder = Embedder::load(&dir)?;
    let tokens_per_round = embedder.embed(&texts)?.total_tokens();
    let mut packed_vectors = Vec::new();
    if only != "padded" {
        let start = Instant::now();
        for _ in 0..rounds {
            packed_vectors = embedder.embed(&texts)?.vectors;
        }
        report("packed", start, rounds, batch, tokens_per_round);
    }
    if only != "packed" {
        let reference = PaddedReference::load(&dir)?;
        reference.embed(&texts[..2])?;
        let start = Instant::now();
        let mut padded_vectors = Vec::new();
        for _ in 0..rounds {
            padded_vectors = reference.embed(&texts)?;
        }
        report("padded", start, rounds, batch, tokens_per_round);
        if !packed_vectors.is_empty() {
            let lowest = packed_vectors
                .iter()
                .zip(&padded_vectors)
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>())
                .fold(f32::INFINITY, f32::min);
            println!("lowest cosine packed vs padded: {lowest:.6}");
        }
    }
    Ok(())
}

fn report(name: &str, start: Instant, rounds: usize, batch: usize, tokens: usize) {
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{name}: {rounds} x {batch} inputs ({tokens} tokens each round) in {secs:.2}s: {:.0} tokens/s, {:.1} inputs/s",
        (rounds * tokens) as f64 / secs,
        (rounds * batch) as f64 / secs
    );
}
