//! The chat engine seam. `LlamaEngine` runs GGUF models through llama.cpp;
//! anything else (candle, a test double) can implement `ChatEngine`.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::OnceLock;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("could not load the chat model {path}: {reason}")]
    Load { path: String, reason: String },
    #[error("the prompt has {prompt} tokens; the context holds {context}")]
    PromptTooLong { prompt: usize, context: u32 },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("inference failed: {0}")]
    Inference(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy decoding.
    pub temperature: f32,
    pub top_p: f32,
    pub max_tokens: u32,
    pub seed: u32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.7,
            top_p: 1.0,
            max_tokens: 256,
            seed: 0x5eed,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineFinish {
    /// The model produced its end-of-turn token.
    EndOfTurn,
    /// `max_tokens` (or the context window) was reached.
    Length,
    /// The caller asked to stop (stop string found or client gone).
    Halted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineRun {
    pub completion_tokens: usize,
    pub finish: EngineFinish,
}

/// What the token sink tells the engine after each piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Halt,
}

pub trait ChatEngine {
    /// Tokenizes text, reading special markers such as `<|im_start|>` as control tokens.
    fn tokenize(&self, text: &str) -> Vec<i32>;
    fn detokenize(&self, tokens: &[i32]) -> String;
    fn context_tokens(&self) -> u32;
    /// Generates after `prompt`, handing each token's bytes to `on_piece`.
    fn generate(
        &mut self,
        prompt: &[i32],
        params: &SamplingParams,
        on_piece: &mut dyn FnMut(&[u8]) -> Flow,
    ) -> Result<EngineRun, EngineError>;
}

/// llama.cpp may be initialised once per process.
fn backend() -> Result<&'static LlamaBackend, EngineError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EngineError::Inference(format!("llama.cpp backend: {e}")))
}

/// One model and one context whose KV cache is emptied between requests:
/// creating a context allocates and clears the cache and reserves compute
/// buffers, which is worth doing once rather than per request.
pub struct LlamaEngine {
    model: &'static LlamaModel,
    ctx: LlamaContext<'static>,
    context_tokens: u32,
}

const PROMPT_CHUNK: usize = 512;

impl LlamaEngine {
    /// The model stays loaded for the rest of the process (the context
    /// borrows it, and safe Rust cannot keep both in one struct otherwise);
    /// a server loads one engine for its whole life.
    pub fn load(path: &Path, threads: i32, context_tokens: u32) -> Result<Self, EngineError> {
        let backend = backend()?;
        let load_error = |reason: String| EngineError::Load {
            path: path.display().to_string(),
            reason,
        };
        let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
            .map_err(|e| load_error(e.to_string()))?;
        let model: &'static LlamaModel = Box::leak(Box::new(model));
        let context_tokens = context_tokens.min(model.n_ctx_train().max(1));
        let ctx_params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(context_tokens))
            .with_n_batch(PROMPT_CHUNK as u32)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let ctx = model
            .new_context(backend, ctx_params)
            .map_err(|e| load_error(format!("creating the context: {e}")))?;
        Ok(Self {
            model,
            ctx,
            context_tokens,
        })
    }

    fn sampler(params: &SamplingParams) -> LlamaSampler {
        if params.temperature <= 0.0 {
            return LlamaSampler::greedy();
        }
        let mut chain = Vec::new();
        if params.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(params.top_p, 1));
        }
        chain.push(LlamaSampler::temp(params.temperature));
        chain.push(LlamaSampler::dist(params.seed));
        LlamaSampler::chain_simple(chain)
    }
}

fn inference(e: impl std::fmt::Display) -> EngineError {
    EngineError::Inference(e.to_string())
}

impl ChatEngine for LlamaEngine {
    fn tokenize(&self, text: &str) -> Vec<i32> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), false, true)
            .into_iter()
            .map(|t| t.0)
            .collect()
    }

    fn detokenize(&self, tokens: &[i32]) -> String {
        let vocab = self.model.vocab();
        let mut bytes = Vec::new();
        for token in tokens {
            bytes.extend(vocab.token_to_piece(LlamaToken(*token), true, None));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn context_tokens(&self) -> u32 {
        self.context_tokens
    }

    fn generate(
        &mut self,
        prompt: &[i32],
        params: &SamplingParams,
        on_piece: &mut dyn FnMut(&[u8]) -> Flow,
    ) -> Result<EngineRun, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let context = self.context_tokens as usize;
        if prompt.len() >= context {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                context: self.context_tokens,
            });
        }
        // Forget the previous request's tokens; only the bookkeeping is reset,
        // the cache memory is simply overwritten.
        self.ctx
            .clear_kv_cache_seq(None, None, None)
            .map_err(inference)?;
        let ctx = &mut self.ctx;
        let vocab = self.model.vocab();

        let mut batch = LlamaBatch::new(PROMPT_CHUNK, 1);
        let mut position: i32 = 0;
        for chunk in prompt.chunks(PROMPT_CHUNK) {
            batch.clear();
            for (i, token) in chunk.iter().enumerate() {
                let last = position as usize + i + 1 == prompt.len();
                batch
                    .add(LlamaToken(*token), position + i as i32, &[0], last)
                    .map_err(inference)?;
            }
            ctx.decode(&mut batch).map_err(inference)?;
            position += chunk.len() as i32;
        }

        let mut sampler = Self::sampler(params);
        let budget = (params.max_tokens as usize).min(context - prompt.len());
        let mut produced = 0;
        let mut piece = Vec::new();
        loop {
            if produced >= budget {
                return Ok(EngineRun {
                    completion_tokens: produced,
                    finish: EngineFinish::Length,
                });
            }
            let token = sampler.sample(ctx, batch.n_tokens() - 1);
            produced += 1;
            if vocab.is_eog(token) {
                return Ok(EngineRun {
                    completion_tokens: produced,
                    finish: EngineFinish::EndOfTurn,
                });
            }
            piece.clear();
            vocab.token_to_piece_into(token, &mut piece, false, None);
            if on_piece(&piece) == Flow::Halt {
                return Ok(EngineRun {
                    completion_tokens: produced,
                    finish: EngineFinish::Halted,
                });
            }
            // The last allowed token needs no decode: nothing samples after it.
            if produced >= budget {
                return Ok(EngineRun {
                    completion_tokens: produced,
                    finish: EngineFinish::Length,
                });
            }
            batch.clear();
            batch.add(token, position, &[0], true).map_err(inference)?;
            position += 1;
            ctx.decode(&mut batch).map_err(inference)?;
        }
    }
}
