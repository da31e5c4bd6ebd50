//! Runtime configuration, read from the environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::bert_gguf::DenseWeights;

pub const DEFAULT_ADDR: &str = "127.0.0.1:5053";
pub const DEFAULT_CHAT_MODEL_ID: &str = "smollm2-135m-instruct";
pub const DEFAULT_EMBED_MODEL_ID: &str = "all-minilm-l6-v2";
pub const CHAT_GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const EMBED_DIR: &str = "all-MiniLM-L6-v2";
/// See [`Config::pieces_every`].
pub const DEFAULT_PIECES_MS: u64 = 20;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} is not valid: {reason}")]
    Invalid { name: &'static str, reason: String },
}

/// Which engine computes embeddings (`DUO_LOCAL_LLM_EMBED_ENGINE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedEngine {
    /// llama.cpp on f16 (or int8) weights, or candle if that cannot load.
    Fast,
    /// candle's f32 BERT only (exact vectors, several times slower).
    Candle,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub addr: SocketAddr,
    pub models_dir: PathBuf,
    /// GGUF file of a llama-family chat model.
    pub chat_model_path: PathBuf,
    pub chat_model_id: String,
    /// Directory with `config.json`, `tokenizer.json`, `model.safetensors` of a BERT-family model.
    pub embed_model_dir: PathBuf,
    pub embed_model_id: String,
    pub embed_engine: EmbedEngine,
    /// The fast engine's dense weights (`DUO_LOCAL_LLM_EMBED_WEIGHTS`); `None`
    /// (`auto`): the best for the CPU code loaded ([`DenseWeights::for_this_cpu`]).
    pub embed_weights: Option<DenseWeights>,
    /// Threads of the fast engine's bulk lane (`DUO_LOCAL_LLM_EMBED_THREADS`).
    /// One by default: llama.cpp's threads wait for each other in OpenMP
    /// barriers that spin, and on a busy machine (or beside the question
    /// lane's thread) a spinning thread held the cores: a bulk request took
    /// 48 s with two threads against 5.7 s with one.
    pub embed_threads: usize,
    pub threads: i32,
    /// Context window for one generation (prompt plus output), in tokens.
    pub context_tokens: u32,
    /// Requests waiting for the generator beyond the one running.
    pub queue_capacity: usize,
    /// Longest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Most inputs in one embeddings request.
    pub max_embedding_inputs: usize,
    /// Embedding requests computed at once (each uses every core already).
    pub embed_concurrency: usize,
    /// Embedding requests that may wait beyond those running.
    pub embed_queue_capacity: usize,
    /// A Jinja chat template file used instead of the model's own.
    pub chat_template_path: Option<PathBuf>,
    /// Reuse the previous request's KV cache for a shared prompt prefix.
    pub prompt_cache: bool,
    /// Decode greedy requests speculatively (prompt-lookup drafts checked in
    /// batches); the output is the same either way.
    pub speculation: bool,
    /// Decoded text is streamed in pieces at most this often after the first
    /// (`DUO_LOCAL_LLM_STREAM_PIECES_MS`; 0 sends every token's piece).
    pub pieces_every: Duration,
    /// After SIGTERM, keep serving this long while `/ready` answers 503.
    pub shutdown_drain: Duration,
    /// Then stop accepting and give requests in flight this long to finish;
    /// generations still running after it are cancelled.
    pub shutdown_grace: Duration,
}

impl Config {
    /// Defaults for a models directory; used by tests and as the base for `from_env`.
    pub fn with_models_dir(models_dir: PathBuf) -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 5053)),
            chat_model_path: models_dir.join(CHAT_GGUF_FILE),
            chat_model_id: DEFAULT_CHAT_MODEL_ID.to_owned(),
            embed_model_dir: models_dir.join(EMBED_DIR),
            embed_model_id: DEFAULT_EMBED_MODEL_ID.to_owned(),
            embed_engine: EmbedEngine::Fast,
            embed_weights: None,
            embed_threads: 1,
            models_dir,
            threads: 2,
            context_tokens: 2048,
            queue_capacity: 16,
            max_body_bytes: 1024 * 1024,
            max_embedding_inputs: 256,
            embed_concurrency: 1,
            embed_queue_capacity: 16,
            chat_template_path: None,
            prompt_cache: true,
            speculation: true,
            pieces_every: Duration::from_millis(DEFAULT_PIECES_MS),
            shutdown_drain: Duration::ZERO,
            shutdown_grace: Duration::from_secs(30),
        }
    }

    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let models_dir = var("DUO_MODELS_DIR").map_or_else(default_models_dir, PathBuf::from);
        let mut config = Self::with_models_dir(models_dir);
        if let Some(addr) = var("DUO_LOCAL_LLM_ADDR") {
            config.addr = addr.parse().map_err(|e| ConfigError::Invalid {
                name: "DUO_LOCAL_LLM_ADDR",
                reason: format!("{e}"),
            })?;
        }
        if let Some(path) = var("DUO_LOCAL_LLM_CHAT_MODEL") {
            config.chat_model_path = PathBuf::from(path);
        }
        if let Some(path) = var("DUO_LOCAL_LLM_CHAT_TEMPLATE") {
            config.chat_template_path = Some(PathBuf::from(path));
        }
        if let Some(flag) = var("DUO_LOCAL_LLM_PROMPT_CACHE") {
            config.prompt_cache = parse_flag("DUO_LOCAL_LLM_PROMPT_CACHE", &flag)?;
        }
        if let Some(flag) = var("DUO_LOCAL_LLM_SPECULATION") {
            config.speculation = parse_flag("DUO_LOCAL_LLM_SPECULATION", &flag)?;
        }
        if let Some(ms) = var("DUO_LOCAL_LLM_STREAM_PIECES_MS") {
            config.pieces_every = parse_millis("DUO_LOCAL_LLM_STREAM_PIECES_MS", &ms)?;
        }
        if let Some(id) = var("DUO_LOCAL_LLM_CHAT_MODEL_ID") {
            config.chat_model_id = id;
        }
        if let Some(dir) = var("DUO_LOCAL_LLM_EMBED_MODEL") {
            config.embed_model_dir = PathBuf::from(dir);
        }
        if let Some(id) = var("DUO_LOCAL_LLM_EMBED_MODEL_ID") {
            config.embed_model_id = id;
        }
        if let Some(engine) = var("DUO_LOCAL_LLM_EMBED_ENGINE") {
            config.embed_engine = match engine.trim().to_ascii_lowercase().as_str() {
                "fast" | "llama" => EmbedEngine::Fast,
                "candle" => EmbedEngine::Candle,
                _ => {
                    return Err(ConfigError::Invalid {
                        name: "DUO_LOCAL_LLM_EMBED_ENGINE",
                        reason: format!("expected fast or candle, got {engine:?}"),
                    });
                }
            };
        }
        if let Some(weights) = var("DUO_LOCAL_LLM_EMBED_WEIGHTS") {
            config.embed_weights = match weights.trim().to_ascii_lowercase().as_str() {
                "auto" => None,
                "f16" => Some(DenseWeights::F16),
                "q8" | "int8" => Some(DenseWeights::Q8),
                "bf16" => Some(DenseWeights::Bf16),
                _ => {
                    return Err(ConfigError::Invalid {
                        name: "DUO_LOCAL_LLM_EMBED_WEIGHTS",
                        reason: format!("expected auto, f16, q8 or bf16, got {weights:?}"),
                    });
                }
            };
        }
        if let Some(n) = var("DUO_LOCAL_LLM_EMBED_THREADS") {
            config.embed_threads = parse_positive("DUO_LOCAL_LLM_EMBED_THREADS", &n)?;
        }
        if let Some(threads) = var("DUO_LOCAL_LLM_THREADS") {
            config.threads = parse_positive("DUO_LOCAL_LLM_THREADS", &threads)?;
        } else {
            config.threads = std::thread::available_parallelism()
                .map(|n| i32::try_from(n.get()).unwrap_or(2))
                .unwrap_or(2);
        }
        if let Some(n) = var("DUO_LOCAL_LLM_QUEUE") {
            config.queue_capacity = parse_positive("DUO_LOCAL_LLM_QUEUE", &n)?;
        }
        if let Some(n) = var("DUO_LOCAL_LLM_EMBED_CONCURRENCY") {
            config.embed_concurrency = parse_positive("DUO_LOCAL_LLM_EMBED_CONCURRENCY", &n)?;
        }
        if let Some(n) = var("DUO_LOCAL_LLM_EMBED_QUEUE") {
            config.embed_queue_capacity = parse_positive("DUO_LOCAL_LLM_EMBED_QUEUE", &n)?;
        }
        if let Some(n) = var("DUO_LOCAL_LLM_CONTEXT") {
            config.context_tokens = parse_positive("DUO_LOCAL_LLM_CONTEXT", &n)?;
        }
        if let Some(n) = var("DUO_SHUTDOWN_DRAIN_SECS") {
            config.shutdown_drain = parse_seconds("DUO_SHUTDOWN_DRAIN_SECS", &n)?;
        }
        if let Some(n) = var("DUO_SHUTDOWN_GRACE_SECS") {
            config.shutdown_grace = parse_seconds("DUO_SHUTDOWN_GRACE_SECS", &n)?;
        }
        Ok(config)
    }
}

/// Milliseconds from 0 to 1,000: a longer wait would read as a stalled stream.
fn parse_millis(name: &'static str, value: &str) -> Result<Duration, ConfigError> {
    match value.trim().parse::<u64>() {
        Ok(ms) if ms <= 1_000 => Ok(Duration::from_millis(ms)),
        _ => Err(ConfigError::Invalid {
            name,
            reason: format!("expected milliseconds from 0 to 1000, got {value:?}"),
        }),
    }
}

fn parse_positive<T: std::str::FromStr + PartialOrd + Default>(
    name: &'static str,
    value: &str,
) -> Result<T, ConfigError> {
    match value.trim().parse::<T>() {
        Ok(n) if n > T::default() => Ok(n),
        _ => Err(ConfigError::Invalid {
            name,
            reason: format!("expected a positive number, got {value:?}"),
        }),
    }
}

fn parse_seconds(name: &'static str, value: &str) -> Result<Duration, ConfigError> {
    value
        .trim()
        .parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| ConfigError::Invalid {
            name,
            reason: format!("expected a whole number of seconds, got {value:?}"),
        })
}

/// `.models/` at the repository root (this crate lives in `crates/local-llm`).
fn parse_flag(name: &'static str, flag: &str) -> Result<bool, ConfigError> {
    match flag.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError::Invalid {
            name,
            reason: format!("expected true or false, got {flag:?}"),
        }),
    }
}

pub fn default_models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_intervals_are_whole_milliseconds_up_to_a_second() {
        let name = "DUO_LOCAL_LLM_STREAM_PIECES_MS";
        assert_eq!(parse_millis(name, "0").ok(), Some(Duration::ZERO));
        assert_eq!(
            parse_millis(name, " 20 ").ok(),
            Some(Duration::from_millis(20))
        );
        assert_eq!(
            parse_millis(name, "1000").ok(),
            Some(Duration::from_secs(1))
        );
        for bad in ["1001", "-1", "2.5", "soon", ""] {
            let err = parse_millis(name, bad).expect_err(bad).to_string();
            assert!(err.contains(name) && err.contains("0 to 1000"), "{err}");
        }
    }
}
