//! The BERT encoder run by llama.cpp: the bundled safetensors converted once
//! to a GGUF ([`crate::bert_gguf`]) with f16 (or int8) dense weights, so the
//! dense layers (nearly all of the work) run on ggml's tuned kernels.
//!
//! Two lanes, each a thread owning its own llama.cpp context: bulk batches
//! (an index) take one, single questions the other (one thread), so a
//! question never waits for a bulk batch to finish.
//!
//! Inputs arrive as token ids (the `tokenizers` crate's, as on the candle
//! path) and are packed, longest first, into passes of at most
//! [`PASS_TOKENS`] tokens: llama.cpp attends within each input only (one
//! sequence id per input) and mean-pools per input.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use llama_cpp_2::context::params::{LlamaContextParams, LlamaPoolingType};
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;

use crate::bert_gguf::{self, DenseWeights};

/// Most tokens in one llama.cpp pass. Attention is computed over the whole
/// pass (masked per input), so its cost per token grows with this: one input
/// at the sequence limit (256) fills a pass with no waste, and shorter ones
/// are packed together. (At 512, attention took a sixth of the time.)
pub const PASS_TOKENS: usize = crate::embeddings::MAX_SEQUENCE_TOKENS;
/// Most inputs in one pass (llama.cpp allows at most 256 sequences).
const PASS_INPUTS: usize = 128;
/// llama.cpp's `LLAMA_FLASH_ATTN_TYPE_ENABLED`.
const FLASH_ATTENTION_ENABLED: i32 = 1;
/// Bump when the converted file's contents change: old caches are ignored.
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum LlamaBertError {
    #[error("{0}")]
    Load(String),
    #[error("{0}")]
    Inference(String),
}

type Reply = mpsc::Sender<Result<Vec<Vec<f32>>, LlamaBertError>>;

struct Job {
    inputs: Vec<Vec<u32>>,
    reply: Reply,
}

/// Which thread runs a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Bulk,
    Express,
}

pub struct LlamaBert {
    bulk: mpsc::Sender<Job>,
    express: mpsc::Sender<Job>,
    /// Passes the bulk lane has finished since it started.
    bulk_passes: Arc<AtomicU64>,
    vocab: u32,
    max_positions: usize,
    dimensions: usize,
}

impl LlamaBert {
    /// Converts the model in `dir` (once; the GGUF is cached next to it, or
    /// in the temporary directory when `dir` is read-only), loads it and
    /// starts both lanes with `threads` threads each.
    pub fn load(dir: &Path, threads: usize, dense: DenseWeights) -> Result<Self, LlamaBertError> {
        let gguf = converted_gguf(dir, dense)?;
        let backend = crate::engine::backend().map_err(|e| LlamaBertError::Load(e.to_string()))?;
        let model = LlamaModel::load_from_file(backend, &gguf, &LlamaModelParams::default())
            .map_err(|e| LlamaBertError::Load(format!("{}: {e}", gguf.display())))?;
        // Contexts borrow the model, and each lives on its own thread for the
        // rest of the process; safe Rust needs the model to outlive them all.
        let model: &'static LlamaModel = Box::leak(Box::new(model));
        let vocab = u32::try_from(model.n_vocab()).unwrap_or(0);
        let max_positions = usize::try_from(model.n_ctx_train()).unwrap_or(0);
        let dimensions = usize::try_from(model.n_embd()).unwrap_or(0);
        let threads = i32::try_from(threads.max(1)).unwrap_or(1);
        let bulk_passes = Arc::new(AtomicU64::new(0));
        Ok(Self {
            bulk: start_lane(model, threads, "bulk", bulk_passes.clone())?,
            // One thread: a question is a few dozen tokens, and threads
            // beyond the cores' count would spin in ggml's barriers against
            // the bulk lane's.
            express: start_lane(model, 1, "express", Arc::new(AtomicU64::new(0)))?,
            bulk_passes,
            vocab,
            max_positions,
            dimensions,
        })
    }

    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Passes (of up to [`PASS_TOKENS`] tokens) the bulk lane has finished:
    /// lets a test see a bulk request under way.
    pub fn bulk_passes(&self) -> u64 {
        self.bulk_passes.load(Ordering::SeqCst)
    }

    /// Unit-length vectors, one per input (token ids with `[CLS]`/`[SEP]`),
    /// in order.
    pub fn embed(&self, inputs: &[&[u32]], lane: Lane) -> Result<Vec<Vec<f32>>, LlamaBertError> {
        for ids in inputs {
            if ids.is_empty() {
                return Err(LlamaBertError::Inference("an input has no tokens".into()));
            }
            if ids.len() > PASS_TOKENS.min(self.max_positions) {
                return Err(LlamaBertError::Inference(format!(
                    "an input has {} tokens, more than {}",
                    ids.len(),
                    PASS_TOKENS.min(self.max_positions)
                )));
            }
            if ids.iter().any(|&id| id >= self.vocab) {
                return Err(LlamaBertError::Inference(
                    "a token id is outside the vocabulary".into(),
                ));
            }
        }
        let (reply, answer) = mpsc::channel();
        let job = Job {
            inputs: inputs.iter().map(|ids| ids.to_vec()).collect(),
            reply,
        };
        let sender = match lane {
            Lane::Bulk => &self.bulk,
            Lane::Express => &self.express,
        };
        sender
            .send(job)
            .map_err(|_| LlamaBertError::Inference("the embedding thread has stopped".into()))?;
        answer
            .recv()
            .map_err(|_| LlamaBertError::Inference("the embedding thread has stopped".into()))?
    }
}

/// The GGUF converted from `dir`'s safetensors, written on first use. The
/// name carries the source's size and modification time, so replacing the
/// weights converts again.
fn converted_gguf(dir: &Path, dense: DenseWeights) -> Result<PathBuf, LlamaBertError> {
    let source = dir.join("model.safetensors");
    let meta = std::fs::metadata(&source)
        .map_err(|e| LlamaBertError::Load(format!("{}: {e}", source.display())))?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let name = format!(
        "model.{}.v{FORMAT_VERSION}.{:x}-{modified:x}.gguf",
        dense.name(),
        meta.len()
    );
    let beside = dir.join(&name);
    if beside.is_file() {
        return Ok(beside);
    }
    let elsewhere = std::env::temp_dir().join(format!("duo-local-llm-{name}"));
    if elsewhere.is_file() {
        return Ok(elsewhere);
    }
    let mut last_error = String::new();
    for target in [beside, elsewhere] {
        // Written under a name of its own, then renamed: a concurrent start
        // never loads a half-written file.
        let partial = target.with_extension(format!("partial-{}", std::process::id()));
        match bert_gguf::write_bert_gguf(dir, &partial, dense) {
            Ok(()) => match std::fs::rename(&partial, &target) {
                Ok(()) => {
                    remove_stale_conversions(&target);
                    return Ok(target);
                }
                Err(e) => last_error = format!("{}: {e}", target.display()),
            },
            Err(bert_gguf::GgufError::Write { path, reason }) => {
                last_error = format!("{path}: {reason}");
            }
            Err(e) => return Err(LlamaBertError::Load(e.to_string())),
        }
        let _ = std::fs::remove_file(&partial);
    }
    Err(LlamaBertError::Load(last_error))
}

/// Earlier conversions beside `kept` of the same kind (older format or
/// weights) are dead weight: removed, best effort.
fn remove_stale_conversions(kept: &Path) {
    let (Some(dir), Some(kept_name)) = (kept.parent(), kept.file_name()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let kept_text = kept_name.to_string_lossy();
    // `model.<weights>.v` or `duo-local-llm-model.<weights>.v`.
    let Some(kind) = kept_text.split_inclusive(".v").next() else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let text = name.to_string_lossy();
        if text.starts_with(kind) && text.ends_with(".gguf") && name != kept_name {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Starts a thread owning one context and returns its job queue, once the
/// context exists.
fn start_lane(
    model: &'static LlamaModel,
    threads: i32,
    name: &str,
    passes: Arc<AtomicU64>,
) -> Result<mpsc::Sender<Job>, LlamaBertError> {
    let (jobs, queue) = mpsc::channel::<Job>();
    let (ready, started) = mpsc::channel::<Result<(), LlamaBertError>>();
    std::thread::Builder::new()
        .name(format!("embed-{name}"))
        .spawn(move || run_lane(model, threads, &queue, &ready, &passes))
        .map_err(|e| LlamaBertError::Load(format!("starting the {name} lane: {e}")))?;
    started
        .recv()
        .map_err(|_| LlamaBertError::Load(format!("the {name} lane stopped while starting")))??;
    Ok(jobs)
}

fn run_lane(
    model: &'static LlamaModel,
    threads: i32,
    queue: &mpsc::Receiver<Job>,
    ready: &mpsc::Sender<Result<(), LlamaBertError>>,
    passes: &AtomicU64,
) {
    let backend = match crate::engine::backend() {
        Ok(backend) => backend,
        Err(e) => {
            let _ = ready.send(Err(LlamaBertError::Load(e.to_string())));
            return;
        }
    };
    let pass = PASS_TOKENS as u32;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(pass))
        .with_n_batch(pass)
        .with_n_ubatch(pass)
        .with_n_seq_max(PASS_INPUTS as u32)
        .with_embeddings(true)
        .with_pooling_type(LlamaPoolingType::Mean)
        // ggml's fused attention: faster on the CPU than the separate
        // products and softmax (measured), same vectors within the test's bound.
        .with_flash_attention_policy(FLASH_ATTENTION_ENABLED)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = match model.new_context(backend, params) {
        Ok(ctx) => ctx,
        Err(e) => {
            let _ = ready.send(Err(LlamaBertError::Load(format!(
                "creating an embedding context: {e}"
            ))));
            return;
        }
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    let mut batch = LlamaBatch::new(PASS_TOKENS, 1);
    for job in queue {
        let result = embed_packed(&mut ctx, &mut batch, &job.inputs, passes);
        // The caller may have gone; nothing else to do then.
        let _ = job.reply.send(result);
    }
}

/// Passes of inputs: indices into `lengths`, longest first, each pass at
/// most [`PASS_TOKENS`] tokens and [`PASS_INPUTS`] inputs.
pub fn plan_passes(lengths: &[usize]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut passes: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut tokens = 0;
    for i in order {
        if !current.is_empty()
            && (tokens + lengths[i] > PASS_TOKENS || current.len() == PASS_INPUTS)
        {
            passes.push(std::mem::take(&mut current));
            tokens = 0;
        }
        tokens += lengths[i];
        current.push(i);
    }
    if !current.is_empty() {
        passes.push(current);
    }
    passes
}

fn embed_packed(
    ctx: &mut llama_cpp_2::context::LlamaContext<'static>,
    batch: &mut LlamaBatch,
    inputs: &[Vec<u32>],
    passes: &AtomicU64,
) -> Result<Vec<Vec<f32>>, LlamaBertError> {
    let failed = |e: &dyn std::fmt::Display| LlamaBertError::Inference(e.to_string());
    let lengths: Vec<usize> = inputs.iter().map(Vec::len).collect();
    let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); inputs.len()];
    let mut tokens: Vec<LlamaToken> = Vec::with_capacity(PASS_TOKENS);
    for pass in plan_passes(&lengths) {
        batch.clear();
        for (seq, &input) in pass.iter().enumerate() {
            tokens.clear();
            tokens.extend(
                inputs[input]
                    .iter()
                    .map(|&id| LlamaToken(i32::try_from(id).unwrap_or(0))),
            );
            let seq = i32::try_from(seq).map_err(|e| failed(&e))?;
            batch
                .add_sequence(&tokens, seq, true)
                .map_err(|e| failed(&e))?;
        }
        ctx.encode(batch).map_err(|e| failed(&e))?;
        for (seq, &input) in pass.iter().enumerate() {
            let seq = i32::try_from(seq).map_err(|e| failed(&e))?;
            let pooled = ctx.embeddings_seq_ith(seq).map_err(|e| failed(&e))?;
            vectors[input] = normalised(pooled);
        }
        passes.fetch_add(1, Ordering::SeqCst);
    }
    Ok(vectors)
}

fn normalised(vector: &[f32]) -> Vec<f32> {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    vector.iter().map(|v| v / norm).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_hold_every_input_once_within_the_budget_longest_first() {
        let lengths = [256, 3, 200, 256, 40, 255, 1, 90];
        let passes = plan_passes(&lengths);
        let mut seen: Vec<usize> = passes.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for pass in &passes {
            assert!(pass.iter().map(|&i| lengths[i]).sum::<usize>() <= PASS_TOKENS);
        }
        assert_eq!(passes[0], vec![0]);
        let many = vec![2; 1000];
        let passes = plan_passes(&many);
        assert!(passes.iter().all(|p| p.len() <= PASS_INPUTS));
        assert_eq!(passes.iter().map(Vec::len).sum::<usize>(), 1000);
    }
}
