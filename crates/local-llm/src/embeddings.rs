//! Sentence embeddings with a BERT-family model (all-MiniLM-L6-v2 by
//! default): mean pooling over real tokens, then L2 normalisation.
//!
//! Two engines behind one [`Embedder`], both fed the `tokenizers` crate's
//! word pieces:
//! - llama.cpp ([`LlamaBert`], the default): the weights converted to a
//!   GGUF (dense layers in f16, or int8 on request), a lane of its own for
//!   single questions. Vectors within cosine 0.999 of the f32 ones.
//! - candle ([`PackedBert`], f32): the fallback when the conversion or
//!   llama.cpp's load fails, and the reference the fast path is held to.
//!   Inputs are not padded to a common length: a batch runs packed end to
//!   end, in slices of at most [`TOKENS_PER_FORWARD`] tokens.
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config as BertConfig;
use tokenizers::{Tokenizer, TruncationParams};

use crate::bert_gguf::DenseWeights;
use crate::llama_bert::{Lane, LlamaBert};
use crate::packed_bert::PackedBert;

/// sentence-transformers truncates all-MiniLM-L6-v2 inputs at 256 word pieces.
pub const MAX_SEQUENCE_TOKENS: usize = 256;

/// Most tokens in one forward pass (32 inputs at the sequence limit): bounds
/// the activations to a few tens of megabytes.
pub const TOKENS_PER_FORWARD: usize = 32 * MAX_SEQUENCE_TOKENS;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("could not load the embedding model from {dir}: {reason}")]
    Load { dir: String, reason: String },
    #[error("embedding failed: {0}")]
    Inference(String),
}

/// The vectors for one batch, with what the model saw of each input.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// One unit-length vector per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Word pieces per input, `[CLS]`/`[SEP]` included, after truncation.
    pub token_counts: Vec<usize>,
    /// Whether each input was cut at `MAX_SEQUENCE_TOKENS`.
    pub truncated: Vec<bool>,
}

impl Embedded {
    pub fn total_tokens(&self) -> usize {
        self.token_counts.iter().sum()
    }
}

/// The embedding seam: `Embedder` is the real model; tests plug in doubles.
/// Calls are CPU-bound and blocking: the server runs them off its async threads.
pub trait EmbedModel: Send + Sync {
    fn embed(&self, texts: &[String]) -> Result<Embedded, EmbedError>;
}

fn inference(e: impl std::fmt::Display) -> EmbedError {
    EmbedError::Inference(e.to_string())
}

fn load_error(dir: &Path, reason: String) -> EmbedError {
    EmbedError::Load {
        dir: dir.display().to_string(),
        reason,
    }
}

/// The tokenizer of `dir`, truncating to [`MAX_SEQUENCE_TOKENS`], padding
/// as asked.
fn load_tokenizer(
    dir: &Path,
    padding: Option<tokenizers::PaddingParams>,
) -> Result<Tokenizer, EmbedError> {
    let load_err = |reason: String| load_error(dir, reason);
    let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
        .map_err(|e| load_err(format!("tokenizer.json: {e}")))?;
    tokenizer.with_padding(padding);
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: MAX_SEQUENCE_TOKENS,
            ..TruncationParams::default()
        }))
        .map_err(|e| load_err(format!("tokenizer truncation: {e}")))?;
    Ok(tokenizer)
}

/// The model's configuration, its tokenizer and its f32 weights, from `dir`.
fn load_parts(
    dir: &Path,
    padding: Option<tokenizers::PaddingParams>,
) -> Result<(BertConfig, Tokenizer, VarBuilder<'static>), EmbedError> {
    let load_err = |reason: String| load_error(dir, reason);
    let config_text = std::fs::read_to_string(dir.join("config.json"))
        .map_err(|e| load_err(format!("config.json: {e}")))?;
    let config: BertConfig =
        serde_json::from_str(&config_text).map_err(|e| load_err(format!("config.json: {e}")))?;
    let tokenizer = load_tokenizer(dir, padding)?;
    let weights = std::fs::read(dir.join("model.safetensors"))
        .map_err(|e| load_err(format!("model.safetensors: {e}")))?;
    let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
        .map_err(|e| load_err(e.to_string()))?;
    Ok((config, tokenizer, vb))
}

/// Which engine computes the vectors.
enum Engine {
    Llama(LlamaBert),
    Candle(PackedBert),
}

pub struct Embedder {
    engine: Engine,
    tokenizer: Tokenizer,
    dimensions: usize,
}

impl Embedder {
    /// The fast engine (llama.cpp) on `threads` threads, or candle's
    /// f32 model when the fast one cannot be loaded (logged).
    pub fn load(dir: &Path, threads: usize, dense: DenseWeights) -> Result<Self, EmbedError> {
        match Self::load_llama(dir, threads, dense) {
            Ok(embedder) => {
                tracing::info!(weights = dense.name(), threads, "embedding with llama.cpp");
                Ok(embedder)
            }
            Err(e) => {
                tracing::warn!(error = %e, "embedding with candle (f32): llama.cpp could not load the model");
                Self::load_candle(dir)
            }
        }
    }

    /// llama.cpp on the GGUF conversion of `dir`'s weights.
    pub fn load_llama(dir: &Path, threads: usize, dense: DenseWeights) -> Result<Self, EmbedError> {
        let tokenizer = load_tokenizer(dir, None)?;
        let model =
            LlamaBert::load(dir, threads, dense).map_err(|e| load_error(dir, e.to_string()))?;
        Ok(Self {
            dimensions: model.dimensions(),
            engine: Engine::Llama(model),
            tokenizer,
        })
    }

    /// candle's packed f32 BERT: `config.json`, `tokenizer.json` and
    /// `model.safetensors` from `dir`.
    pub fn load_candle(dir: &Path) -> Result<Self, EmbedError> {
        // No padding: every input keeps its own length.
        let (config, tokenizer, vb) = load_parts(dir, None)?;
        let model = PackedBert::load(vb, &config).map_err(|e| load_error(dir, e.to_string()))?;
        Ok(Self {
            engine: Engine::Candle(model),
            tokenizer,
            dimensions: config.hidden_size,
        })
    }

    /// Whether the fast (llama.cpp) engine runs.
    pub fn is_llama(&self) -> bool {
        matches!(self.engine, Engine::Llama(_))
    }

    /// Passes the fast engine's bulk lane has finished (0 on candle).
    pub fn bulk_passes(&self) -> u64 {
        match &self.engine {
            Engine::Llama(model) => model.bulk_passes(),
            Engine::Candle(_) => 0,
        }
    }

    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    /// Token ids (with `[CLS]`/`[SEP]`) for one text, as the model will see it.
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let encoding = self.tokenizer.encode(text, true).map_err(inference)?;
        Ok(encoding.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, EmbedError> {
        self.tokenizer.decode(ids, true).map_err(inference)
    }

    /// Returns one unit-length vector per input, in order, with token counts.
    /// A small request (a question: see [`crate::admission::is_small`]) runs
    /// in the fast engine's express lane, beside any bulk batch.
    pub fn embed(&self, texts: &[String]) -> Result<Embedded, EmbedError> {
        if texts.is_empty() {
            return Ok(Embedded {
                vectors: Vec::new(),
                token_counts: Vec::new(),
                truncated: Vec::new(),
            });
        }
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(inference)?;
        let token_counts: Vec<usize> = encodings.iter().map(|e| e.get_ids().len()).collect();
        let truncated = encodings
            .iter()
            .map(|e| !e.get_overflowing().is_empty())
            .collect();
        let ids: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
        let vectors = match &self.engine {
            Engine::Llama(model) => {
                let lane = if crate::admission::is_small(texts) {
                    Lane::Express
                } else {
                    Lane::Bulk
                };
                model.embed(&ids, lane).map_err(inference)?
            }
            Engine::Candle(model) => embed_candle(model, &ids, &token_counts)?,
        };
        Ok(Embedded {
            vectors,
            token_counts,
            truncated,
        })
    }
}

/// Packed candle passes of at most [`TOKENS_PER_FORWARD`] tokens.
fn embed_candle(
    model: &PackedBert,
    ids: &[&[u32]],
    token_counts: &[usize],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let mut vectors = Vec::with_capacity(ids.len());
    let mut start = 0;
    while start < ids.len() {
        // At least one input per pass; then as many as fit the budget.
        let mut end = start + 1;
        let mut tokens = token_counts[start];
        while end < ids.len() && tokens + token_counts[end] <= TOKENS_PER_FORWARD {
            tokens += token_counts[end];
            end += 1;
        }
        let pooled = model.forward_pooled(&ids[start..end]).map_err(inference)?;
        let normalised = l2_normalise(&pooled).map_err(inference)?;
        vectors.extend(normalised.to_vec2::<f32>().map_err(inference)?);
        start = end;
    }
    Ok(vectors)
}

impl EmbedModel for Embedder {
    fn embed(&self, texts: &[String]) -> Result<Embedded, EmbedError> {
        Embedder::embed(self, texts)
    }
}

fn l2_normalise(vectors: &Tensor) -> candle_core::Result<Tensor> {
    let norms = vectors
        .sqr()?
        .sum_keepdim(1)?
        .sqrt()?
        .clamp(1e-12f32, f32::MAX)?;
    vectors.broadcast_div(&norms)
}

/// The embedder as it was before inputs were packed: the whole batch padded
/// to its longest input and run through candle's `BertModel` with an
/// attention mask. Kept as the reference the packed path is checked against
/// (tests and the throughput example); not used to serve.
pub struct PaddedReference {
    model: candle_transformers::models::bert::BertModel,
    tokenizer: Tokenizer,
    device: Device,
}

impl PaddedReference {
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        let padding = tokenizers::PaddingParams {
            strategy: tokenizers::PaddingStrategy::BatchLongest,
            ..tokenizers::PaddingParams::default()
        };
        let (config, tokenizer, vb) = load_parts(dir, Some(padding))?;
        let device = vb.device().clone();
        let model = candle_transformers::models::bert::BertModel::load(vb, &config)
            .map_err(|e| load_error(dir, e.to_string()))?;
        Ok(Self {
            model,
            tokenizer,
            device,
        })
    }

    /// Unit-length vectors, in order.
    pub fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(inference)?;
        let rows = encodings.len();
        let cols = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut ids = Vec::with_capacity(rows * cols);
        let mut mask = Vec::with_capacity(rows * cols);
        for encoding in &encodings {
            ids.extend_from_slice(encoding.get_ids());
            mask.extend_from_slice(encoding.get_attention_mask());
        }
        let ids = Tensor::from_vec(ids, (rows, cols), &self.device).map_err(inference)?;
        let mask = Tensor::from_vec(mask, (rows, cols), &self.device).map_err(inference)?;
        let type_ids = ids.zeros_like().map_err(inference)?;
        let hidden = self
            .model
            .forward(&ids, &type_ids, Some(&mask))
            .map_err(inference)?;
        let pooled = mean_pool(&hidden, &mask).map_err(inference)?;
        l2_normalise(&pooled)
            .map_err(inference)?
            .to_vec2::<f32>()
            .map_err(inference)
    }
}

/// Average of the token vectors whose attention mask is 1.
fn mean_pool(hidden: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
    let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
    let counts = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
    summed.broadcast_div(&counts)
}
