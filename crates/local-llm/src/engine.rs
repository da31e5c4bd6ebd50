//! The chat engine seam. `LlamaEngine` runs GGUF models through llama.cpp;
//! anything else (candle, a test double) can implement `ChatEngine`.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::OnceLock;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;

use crate::grammar::Grammar;
use crate::speculation::{DraftStats, Drafter};
use crate::tools::Constraint;

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
    #[error("the output grammar failed: {0}")]
    Grammar(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy decoding.
    pub temperature: f32,
    pub top_p: f32,
    pub max_tokens: u32,
    pub seed: u32,
    /// A grammar the output must follow.
    pub constraint: Option<Constraint>,
    pub repetition: Repetition,
}

/// Penalties against repeating what the answer already said (all 0: none).
/// They see only generated tokens, never the prompt, so an answer may still
/// quote its context.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Repetition {
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub dry_multiplier: f32,
}

impl Repetition {
    fn is_off(&self) -> bool {
        self.frequency_penalty == 0.0 && self.presence_penalty == 0.0 && self.dry_multiplier == 0.0
    }
}

/// llama.cpp server's defaults for the DRY sampler: base, and the length a
/// repeat may have before it is penalized.
const DRY_BASE: f32 = 1.75;
const DRY_ALLOWED_LENGTH: i32 = 2;
/// No sequence breakers (llama.cpp's default ends a sequence at newlines,
/// colons, quotes and asterisks): a small model's loops are whole Markdown
/// lines such as "- **What can you do.**", which those breakers cut into
/// pieces too short to be penalized.
const DRY_SEQUENCE_BREAKERS: [&str; 0] = [];

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.7,
            top_p: 1.0,
            max_tokens: 256,
            seed: 0x5eed,
            constraint: None,
            repetition: Repetition::default(),
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
    /// Prompt tokens whose KV cache was kept from the previous request.
    pub cached_tokens: usize,
    /// How prompt-lookup drafts fared (all 0 when none were tried).
    pub drafts: DraftStats,
}

/// What the model file says about how to talk to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInfo {
    /// `tokenizer.chat_template` (Jinja), when the file has one.
    pub chat_template: Option<String>,
    pub bos_token: String,
    pub eos_token: String,
    /// Texts of the end-of-generation tokens, stopped at should the model
    /// spell one out of ordinary tokens.
    pub end_of_turn_texts: Vec<String>,
    /// Tokens the context holds (prompt and answer together): what the
    /// server reports to clients so they can size their prompts.
    pub context_tokens: u32,
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
    fn model_info(&self) -> ModelInfo;
    /// Generates after `prompt`, handing each token's bytes to `on_piece`.
    fn generate(
        &mut self,
        prompt: &[i32],
        params: &SamplingParams,
        on_piece: &mut dyn FnMut(&[u8]) -> Flow,
    ) -> Result<EngineRun, EngineError>;
}

/// llama.cpp may be initialised once per process; its CPU code for this
/// machine's instruction level is loaded first (see `cpu_variant`).
pub(crate) fn backend() -> Result<&'static LlamaBackend, EngineError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default());
            cpu_variant().map_err(|e| e.to_string())?;
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EngineError::Inference(format!("llama.cpp backend: {e}")))
}

/// The llama.cpp CPU variant this process loaded (at most once, by
/// `DUO_LOCAL_LLM_CPU_VARIANT` / `DUO_LOCAL_LLM_BACKENDS_DIR` or the best one
/// the machine runs).
pub fn cpu_variant()
-> Result<&'static crate::cpu_variant::Loaded, &'static crate::cpu_variant::CpuVariantError> {
    use crate::cpu_variant::{CpuVariantError, Loaded, Settings, load};
    static LOADED: OnceLock<Result<Loaded, CpuVariantError>> = OnceLock::new();
    LOADED.get_or_init(|| load(&Settings::from_env())).as_ref()
}

/// One model and one context. The KV cache keeps the tokens of the previous
/// request (prompt and answer); the next request reuses its longest common
/// prefix and computes only the rest: the agent loop resends the same system
/// prompt and a growing scratchpad at every step. The cache is the context's
/// own fixed-size buffer, so it costs no memory beyond the context window.
/// Requests run one at a time on the generator thread, so there is one
/// cached sequence and no sharing to get wrong.
pub struct LlamaEngine {
    model: &'static LlamaModel,
    ctx: LlamaContext<'static>,
    context_tokens: u32,
    /// Tokens whose keys and values sit in the cache, positions 0.., in order.
    cached: Vec<i32>,
    prefix_cache: bool,
    /// Greedy requests check prompt-lookup drafts in batches.
    speculation: bool,
    info: ModelInfo,
}

const PROMPT_CHUNK: usize = 512;
/// Candidates checked against the grammar before falling back to the whole
/// vocabulary, when the unconstrained choice is refused.
const GRAMMAR_SHORTLIST: usize = 64;

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
            .with_n_threads_batch(threads)
            // Keys as q8_0 and values as f16: with two different types,
            // llama.cpp's CPU flash attention computes every query row the
            // same way whether it is decoded alone or in a batch of drafts
            // (its split-over-threads path for one token past 512 cached
            // positions, and its tiled path for long batches, both need one
            // f16 type for both), so a verified draft is bit for bit what
            // one-token decoding gives. f16 values cost less than q8_0 ones
            // (no dequantising of every value row for every query): first
            // token 0.93x llama-server's f16 cache, against 0.77-0.82x with
            // q8_0 for both.
            .with_type_k(KvCacheType::Q8_0)
            .with_type_v(KvCacheType::F16);
        let ctx = model
            .new_context(backend, ctx_params)
            .map_err(|e| load_error(format!("creating the context: {e}")))?;
        let info = ModelInfo {
            context_tokens,
            ..read_model_info(model)
        };
        Ok(Self {
            model,
            ctx,
            context_tokens,
            cached: Vec::new(),
            prefix_cache: true,
            speculation: true,
            info,
        })
    }

    /// Turns the prompt-prefix cache on or off (off: every request starts
    /// from an empty cache).
    #[must_use]
    pub fn with_prefix_cache(mut self, enabled: bool) -> Self {
        self.prefix_cache = enabled;
        self
    }

    /// Turns speculative decoding of greedy requests on or off; either way
    /// the output is the same (see `generate_inner`).
    #[must_use]
    pub fn with_speculation(mut self, enabled: bool) -> Self {
        self.speculation = enabled;
        self
    }

    fn sampler(&self, params: &SamplingParams) -> LlamaSampler {
        let repetition = params.repetition;
        // The penalties look at every token of the context (this llama.cpp
        // reads 0 and negative windows as "off").
        let window = i32::try_from(self.context_tokens).unwrap_or(i32::MAX);
        let mut chain = Vec::new();
        if !repetition.is_off() {
            chain.push(LlamaSampler::penalties(
                self.model.n_vocab(),
                window,
                1.0,
                repetition.frequency_penalty,
                repetition.presence_penalty,
            ));
            if repetition.dry_multiplier > 0.0 {
                chain.push(LlamaSampler::dry(
                    self.model,
                    repetition.dry_multiplier,
                    DRY_BASE,
                    DRY_ALLOWED_LENGTH,
                    window,
                    DRY_SEQUENCE_BREAKERS,
                ));
            }
        }
        if params.temperature <= 0.0 {
            if chain.is_empty() {
                return LlamaSampler::greedy();
            }
            chain.push(LlamaSampler::greedy());
            return LlamaSampler::chain_simple(chain);
        }
        if params.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(params.top_p, 1));
        }
        chain.push(LlamaSampler::temp(params.temperature));
        chain.push(LlamaSampler::dist(params.seed));
        LlamaSampler::chain_simple(chain)
    }

    /// Forgets everything after `keep` cached tokens; `false` when the
    /// cache cannot cut there (then it is emptied).
    fn truncate_cache(&mut self, keep: usize) -> Result<(), EngineError> {
        if !self.cut_cache(keep)? {
            self.ctx.clear_kv_cache();
            self.cached.clear();
        }
        Ok(())
    }

    /// Removes the cached tokens from `keep` on; `false` when the KV cache
    /// could not cut there (nothing was changed then).
    fn cut_cache(&mut self, keep: usize) -> Result<bool, EngineError> {
        if keep >= self.cached.len() {
            return Ok(true);
        }
        let cut = u32::try_from(keep).map_err(inference)?;
        let removed = self
            .ctx
            .clear_kv_cache_seq(Some(0), Some(cut), None)
            .map_err(inference)?;
        if removed {
            self.cached.truncate(keep);
        }
        Ok(removed)
    }

    fn reset_cache(&mut self) {
        self.ctx.clear_kv_cache();
        self.cached.clear();
    }

    /// Puts `prompt` in the cache, reusing the cached prefix; returns how
    /// many tokens were reused. The last prompt token is always computed
    /// afresh: sampling needs its logits.
    fn load_prompt(
        &mut self,
        prompt: &[i32],
        batch: &mut LlamaBatch,
    ) -> Result<usize, EngineError> {
        let reuse = if self.prefix_cache {
            common_prefix(&self.cached, prompt).min(prompt.len() - 1)
        } else {
            0
        };
        if reuse == 0 {
            self.reset_cache();
        } else {
            self.truncate_cache(reuse)?;
        }
        let reused = self.cached.len();
        let rest = &prompt[reused..];
        let mut position = reused;
        for chunk in rest.chunks(PROMPT_CHUNK) {
            batch.clear();
            for (i, token) in chunk.iter().enumerate() {
                let last = position + i + 1 == prompt.len();
                batch
                    .add(LlamaToken(*token), to_pos(position + i)?, &[0], last)
                    .map_err(inference)?;
            }
            self.ctx.decode(batch).map_err(inference)?;
            self.cached.extend_from_slice(chunk);
            position += chunk.len();
        }
        Ok(reused)
    }

    /// Drops the cached tokens from `keep` on, mid-generation: rejected
    /// draft tokens must leave the KV cache before the next decode.
    fn drop_unverified(&mut self, keep: usize) -> Result<(), EngineError> {
        if !self.cut_cache(keep)? {
            return Err(EngineError::Inference(
                "the KV cache could not drop rejected draft tokens".to_owned(),
            ));
        }
        Ok(())
    }

    /// Greedy requests are decoded speculatively when speculation is on:
    /// after each token, the tokens that followed the same few tokens
    /// earlier in the context (the drafter's guess) are decoded with it in
    /// one batch, which yields the model's logits after each of them. The
    /// sampler then picks, row by row, exactly the token it would have
    /// picked decoding one token at a time (same sampler, same grammar, same
    /// order of calls), and the guess is kept only as long as it agrees; the
    /// first disagreement is the next token itself, and the rows after it
    /// are dropped from the KV cache. So the output is the one plain greedy
    /// decoding gives; only the number of decodes changes.
    fn generate_inner(
        &mut self,
        prompt: &[i32],
        params: &SamplingParams,
        on_piece: &mut dyn FnMut(&[u8]) -> Flow,
    ) -> Result<EngineRun, EngineError> {
        let context = self.context_tokens as usize;
        let mut batch = LlamaBatch::new(PROMPT_CHUNK, 1);
        let cached_tokens = self.load_prompt(prompt, &mut batch)?;
        let mut sampler = self.sampler(params);
        let mut gate = match &params.constraint {
            Some(constraint) => Some(GrammarGate::new(self.model, constraint)?),
            None => None,
        };
        let budget = (params.max_tokens as usize).min(context - prompt.len());
        let mut drafter = Drafter::new(self.speculation && params.temperature <= 0.0, prompt.len());
        let mut produced = 0;
        let mut piece = Vec::new();
        // The batch just decoded: its first row to sample from, and the
        // draft tokens that follow that row in the batch (and in `cached`).
        let mut first_row = batch.n_tokens() - 1;
        let mut draft: Vec<i32> = Vec::new();
        loop {
            // `cached` ends with the draft; the tokens before it are verified.
            let verified = self.cached.len() - draft.len();
            let mut next = None;
            let mut finish = None;
            let mut accepted = 0;
            for row in 0..=draft.len() {
                if produced >= budget {
                    finish = Some(EngineFinish::Length);
                    break;
                }
                let index = first_row + i32::try_from(row).map_err(inference)?;
                let token = match gate.as_mut() {
                    Some(gate) => gate.sample(&self.ctx, index, &mut sampler)?,
                    None => sampler.sample(&self.ctx, index),
                };
                produced += 1;
                let vocab = self.model.vocab();
                if vocab.is_eog(token) {
                    finish = Some(EngineFinish::EndOfTurn);
                    break;
                }
                piece.clear();
                vocab.token_to_piece_into(token, &mut piece, false, None);
                if let Some(active) = gate.as_mut()
                    && active.accept(token, &piece)
                {
                    gate = None;
                }
                let agrees = draft.get(row) == Some(&token.0);
                if agrees {
                    accepted += 1;
                }
                if on_piece(&piece) == Flow::Halt {
                    finish = Some(EngineFinish::Halted);
                    break;
                }
                if !agrees {
                    next = Some(token);
                    break;
                }
            }
            drafter.record(draft.len(), accepted);
            // The KV cache keeps the verified tokens and the accepted draft.
            self.drop_unverified(verified + accepted)?;
            let run = |finish| EngineRun {
                completion_tokens: produced,
                finish,
                cached_tokens,
                drafts: drafter.stats(),
            };
            if let Some(finish) = finish {
                return Ok(run(finish));
            }
            let Some(token) = next else {
                // Every row agreed with its draft token and the last row's
                // sample is the token after the draft: the loop above always
                // ends with `next` or `finish` set.
                return Err(EngineError::Inference(
                    "speculative verification ended without a token".to_owned(),
                ));
            };
            // The last allowed token needs no decode: nothing samples after it.
            if produced >= budget {
                return Ok(run(EngineFinish::Length));
            }
            let position = self.cached.len();
            self.cached.push(token.0);
            // Each draft token yields one more sampled token if accepted;
            // none may go past the answer's budget.
            let room = budget - produced - 1;
            draft.clear();
            draft.extend_from_slice(drafter.draft(&self.cached, room));
            batch.clear();
            batch
                .add(token, to_pos(position)?, &[0], true)
                .map_err(inference)?;
            for (i, drafted) in draft.iter().enumerate() {
                batch
                    .add(LlamaToken(*drafted), to_pos(position + 1 + i)?, &[0], true)
                    .map_err(inference)?;
            }
            self.ctx.decode(&mut batch).map_err(inference)?;
            self.cached.extend_from_slice(&draft);
            first_row = 0;
        }
    }
}

/// A grammar sampler used beside the ordinary chain: the chain's choice is
/// checked against the grammar first (cheap: one token), and only when the
/// grammar refuses it are the candidates filtered (a shortlist of the most
/// likely tokens first, the whole vocabulary last). Greedy decoding gives
/// exactly the grammar-constrained argmax this way.
struct GrammarGate {
    grammar: LlamaSampler,
    lift_unless_prefix: Option<String>,
    /// Output so far, while the lift condition is undecided.
    text: String,
}

impl GrammarGate {
    fn new(model: &LlamaModel, constraint: &Constraint) -> Result<Self, EngineError> {
        let grammar = LlamaSampler::grammar(model, &constraint.grammar.text, Grammar::ROOT)
            .map_err(|e| EngineError::Grammar(e.to_string()))?;
        Ok(Self {
            grammar,
            lift_unless_prefix: constraint.lift_unless_prefix.clone(),
            text: String::new(),
        })
    }

    fn allows(&mut self, token: LlamaToken) -> bool {
        let mut one = LlamaTokenDataArray::new(vec![LlamaTokenData::new(token, 0.0, 0.0)], false);
        one.apply_sampler(&mut self.grammar);
        one.data
            .first()
            .is_some_and(|d| d.logit() > f32::NEG_INFINITY)
    }

    fn sample(
        &mut self,
        ctx: &LlamaContext<'_>,
        index: i32,
        chain: &mut LlamaSampler,
    ) -> Result<LlamaToken, EngineError> {
        let mut candidates = ctx.token_data_array_ith(index);
        let mut trial = candidates.clone();
        trial.apply_sampler(chain);
        if let Some(token) = trial.selected_token()
            && self.allows(token)
        {
            return Ok(token);
        }
        // The most likely tokens first: usually the grammar's next token is among them.
        let shortlist_len = GRAMMAR_SHORTLIST.min(candidates.data.len());
        if shortlist_len > 0 {
            candidates
                .data
                .select_nth_unstable_by(shortlist_len - 1, |a, b| b.logit().total_cmp(&a.logit()));
            let mut shortlist: Vec<LlamaTokenData> = candidates.data[..shortlist_len].to_vec();
            shortlist.sort_by(|a, b| b.logit().total_cmp(&a.logit()));
            let mut shortlist = LlamaTokenDataArray::new(shortlist, true);
            shortlist.apply_sampler(&mut self.grammar);
            if shortlist.data.iter().any(|d| d.logit() > f32::NEG_INFINITY) {
                shortlist.sorted = false;
                shortlist.apply_sampler(chain);
                if let Some(token) = shortlist.selected_token()
                    && self.allows(token)
                {
                    return Ok(token);
                }
            }
        }
        candidates.sorted = false;
        candidates.apply_sampler(&mut self.grammar);
        candidates.apply_sampler(chain);
        match candidates.selected_token() {
            Some(token) if self.allows(token) => Ok(token),
            _ => Err(EngineError::Grammar(
                "the grammar allows no token here".to_owned(),
            )),
        }
    }

    /// Advances the grammar past `token`; `true` when the grammar no longer
    /// applies (the output can no longer become a tool call).
    fn accept(&mut self, token: LlamaToken, piece: &[u8]) -> bool {
        self.grammar.accept(token);
        let Some(marker) = &self.lift_unless_prefix else {
            return false;
        };
        self.text.push_str(&String::from_utf8_lossy(piece));
        !(self.text.starts_with(marker.as_str()) || marker.starts_with(self.text.as_str()))
    }
}

fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn to_pos(position: usize) -> Result<i32, EngineError> {
    i32::try_from(position).map_err(inference)
}

fn token_text(model: &LlamaModel, token: LlamaToken) -> String {
    if token.0 < 0 || token.0 >= model.n_vocab() {
        return String::new();
    }
    String::from_utf8_lossy(&model.vocab().token_to_piece(token, true, None)).into_owned()
}

fn read_model_info(model: &LlamaModel) -> ModelInfo {
    let vocab = model.vocab();
    let chat_template = model
        .chat_template(None)
        .ok()
        .and_then(|t| t.to_string().ok())
        .filter(|t| !t.trim().is_empty());
    let mut end_of_turn_texts = Vec::new();
    for token in [vocab.eos(), vocab.eot()] {
        let text = token_text(model, token);
        if !text.is_empty() && !end_of_turn_texts.contains(&text) {
            end_of_turn_texts.push(text);
        }
    }
    ModelInfo {
        chat_template,
        bos_token: token_text(model, vocab.bos()),
        eos_token: token_text(model, vocab.eos()),
        end_of_turn_texts,
        context_tokens: 0,
    }
}

fn inference(e: impl std::fmt::Display) -> EngineError {
    EngineError::Inference(e.to_string())
}

impl ChatEngine for LlamaEngine {
    /// Adds the model's BOS token when its tokenizer wants one and the
    /// rendered prompt does not already start with it.
    fn tokenize(&self, text: &str) -> Vec<i32> {
        let vocab = self.model.vocab();
        let mut tokens: Vec<i32> = vocab
            .tokenize(text.as_bytes(), false, true)
            .into_iter()
            .map(|t| t.0)
            .collect();
        let bos = vocab.bos();
        if vocab.should_add_bos() && tokens.first() != Some(&bos.0) {
            tokens.insert(0, bos.0);
        }
        tokens
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

    fn model_info(&self) -> ModelInfo {
        self.info.clone()
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
        if prompt.len() >= self.context_tokens as usize {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                context: self.context_tokens,
            });
        }
        let result = self.generate_inner(prompt, params, on_piece);
        if let Ok(run) = &result
            && run.drafts.rounds > 0
        {
            tracing::debug!(
                tokens = run.completion_tokens,
                drafted = run.drafts.drafted,
                accepted = run.drafts.accepted,
                rounds = run.drafts.rounds,
                "speculative decoding"
            );
        }
        if result.is_err() {
            // The cache may hold a half-decoded batch: trust none of it.
            self.reset_cache();
        }
        result
    }
}
