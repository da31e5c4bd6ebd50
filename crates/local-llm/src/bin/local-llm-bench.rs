//! `local-llm-bench`: decode speed and time to first token for a 300-token
//! prompt on our server and on llama.cpp itself (llama-cpp-python, installed
//! into `.bench/`), embeddings per second, peak RSS, and the ratios.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use local_llm::chat_template::{ChatMessage, render_chatml};
use local_llm::config::Config;
use local_llm::fetch::fetch_models;
use local_llm::server::{AppState, bind};
use serde_json::{Value, json};

const PROMPT_TARGET_TOKENS: u64 = 300;
const DECODE_TOKENS: u32 = 128;
const EMBED_BATCH: usize = 16;
const EMBED_BATCHES: usize = 8;

#[derive(Debug, Clone, Copy)]
struct ChatFigures {
    ttft: Duration,
    decode_tokens: usize,
    decode_time: Duration,
}

impl ChatFigures {
    fn tokens_per_second(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    let mut config = Config::from_env()?;
    config.addr = "127.0.0.1:0".parse()?;
    fetch_models(&config.models_dir).context("fetching weights")?;
    let threads = config.threads;
    let gguf = config.chat_model_path.clone();
    let chat_model = config.chat_model_id.clone();
    let embed_model = config.embed_model_id.clone();
    let state = AppState::load(config)?;
    let (server, addr) = bind(state, "127.0.0.1:0".parse()?)?;
    actix_web::rt::spawn(server);
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();

    let user_text = prompt_of_about(&client, &base, &chat_model).await?;
    let prompt_messages = vec![ChatMessage {
        role: "user".into(),
        content: user_text.clone(),
    }];
    // Warm-up, then the measured run.
    chat_run(&client, &base, &chat_model, &user_text, 8).await?;
    let ours = chat_run(&client, &base, &chat_model, &user_text, DECODE_TOKENS).await?;
    let (embeds_per_sec, embed_tokens) = embeddings_rate(&client, &base, &embed_model).await?;
    let our_rss_mb = peak_rss_kb().unwrap_or(0) as f64 / 1024.0;

    println!("duo-local-llm bench ({threads} threads)");
    println!(
        "  ours       TTFT {:>7.1} ms  decode {:>6.1} tok/s  ({} tokens)",
        ours.ttft.as_secs_f64() * 1000.0,
        ours.tokens_per_second(),
        ours.decode_tokens
    );
    match llama_cpp_reference(&gguf, &render_chatml(&prompt_messages), threads) {
        Ok(reference) => {
            let ref_ttft = reference["ttft_s"].as_f64().unwrap_or(f64::NAN);
            let ref_tps = reference["decode_tokens_per_s"]
                .as_f64()
                .unwrap_or(f64::NAN);
            println!(
                "  llama.cpp  TTFT {:>7.1} ms  decode {:>6.1} tok/s  ({} tokens, prompt {} tokens, peak RSS {:.0} MB)",
                ref_ttft * 1000.0,
                ref_tps,
                reference["decode_tokens"],
                reference["prompt_tokens"],
                reference["peak_rss_mb"].as_f64().unwrap_or(f64::NAN)
            );
            println!(
                "  ratio ours/llama.cpp: decode {:.2}x, TTFT {:.2}x (lower TTFT is better)",
                ours.tokens_per_second() / ref_tps,
                ours.ttft.as_secs_f64() / ref_ttft
            );
        }
        Err(err) => println!("  llama.cpp  reference unavailable: {err:#}"),
    }
    println!(
        "  embeddings {embeds_per_sec:>7.1} chunks/s ({embed_tokens} word pieces per chunk, batches of {EMBED_BATCH})"
    );
    println!("  peak RSS (server and bench client in one process) {our_rss_mb:.0} MB");
    Ok(())
}

/// Filler text whose chat prompt is close to 300 tokens, measured on the server.
async fn prompt_of_about(
    client: &reqwest::Client,
    base: &str,
    model: &str,
) -> anyhow::Result<String> {
    let sentence =
        "The build pipeline compiles every crate, runs the tests and publishes a report. ";
    let mut repeats = 20usize;
    for _ in 0..4 {
        let text = format!("Summarise this log.\n{}", sentence.repeat(repeats));
        let body = json!({ "model": model, "messages": [{ "role": "user", "content": text }], "max_tokens": 1, "temperature": 0 });
        let reply: Value = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        let tokens = reply["usage"]["prompt_tokens"]
            .as_u64()
            .context("usage.prompt_tokens")?;
        if tokens.abs_diff(PROMPT_TARGET_TOKENS) <= 10 {
            return Ok(text);
        }
        let per_repeat = (tokens as f64 / repeats as f64).max(1.0);
        repeats = ((PROMPT_TARGET_TOKENS as f64 - 15.0) / per_repeat)
            .round()
            .max(1.0) as usize;
    }
    Ok(format!("Summarise this log.\n{}", sentence.repeat(repeats)))
}

async fn chat_run(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    user_text: &str,
    max_tokens: u32,
) -> anyhow::Result<ChatFigures> {
    let body = json!({
        "model": model,
        "messages": [{ "role": "user", "content": user_text }],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
    });
    let started = Instant::now();
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("chat request failed: {}", resp.status());
    }
    let mut stream = resp.bytes_stream();
    let mut first: Option<Instant> = None;
    let mut deltas = 0usize;
    let mut buffer = String::new();
    while let Some(chunk) = stream.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data = event.trim().trim_start_matches("data: ");
            if data == "[DONE]" {
                break;
            }
            let value: Value = serde_json::from_str(data)?;
            if value["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
            {
                deltas += 1;
                first.get_or_insert_with(Instant::now);
            }
        }
    }
    let finished = Instant::now();
    let first = first.context("no tokens were generated")?;
    Ok(ChatFigures {
        ttft: first - started,
        decode_tokens: deltas.saturating_sub(1),
        decode_time: finished - first,
    })
}

async fn embeddings_rate(
    client: &reqwest::Client,
    base: &str,
    model: &str,
) -> anyhow::Result<(f64, u64)> {
    // About 62 word pieces plus [CLS]/[SEP]: a 64-token chunk.
    let chunk = "fn parse_config(path: &Path) -> Result<Config> reads the file, validates every field and returns defaults for missing keys so callers never see partial state, then logs one warning per unknown key found in the configuration file during startup";
    let inputs: Vec<String> = (0..EMBED_BATCH).map(|i| format!("{i} {chunk}")).collect();
    let body = json!({ "model": model, "input": inputs });
    let warm: Value = client
        .post(format!("{base}/v1/embeddings"))
        .json(&body)
        .send()
        .await?
        .json()
        .await?;
    let tokens = warm["usage"]["prompt_tokens"].as_u64().unwrap_or(0) / EMBED_BATCH as u64;
    let started = Instant::now();
    for _ in 0..EMBED_BATCHES {
        let resp = client
            .post(format!("{base}/v1/embeddings"))
            .json(&body)
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("embeddings request failed: {}", resp.status());
        }
        resp.bytes().await?;
    }
    let rate = (EMBED_BATCH * EMBED_BATCHES) as f64 / started.elapsed().as_secs_f64();
    Ok((rate, tokens))
}

fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

const REFERENCE_SCRIPT: &str = r#"
import json, resource, sys, time
from llama_cpp import Llama
path, threads, prompt, max_tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512, verbose=False)
prompt_tokens = len(llm.tokenize(prompt.encode(), add_bos=False, special=True))
list(llm.create_completion(prompt, max_tokens=8, temperature=0, stream=True))
llm.reset()
start = time.perf_counter(); first = None; n = 0
for part in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0, stream=True):
    if part["choices"][0]["text"]:
        n += 1
        if first is None:
            first = time.perf_counter()
end = time.perf_counter()
print(json.dumps({"ttft_s": first - start, "decode_tokens": n - 1, "decode_tokens_per_s": (n - 1) / (end - first),
                  "prompt_tokens": prompt_tokens, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"#;

fn bench_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.bench")
}

/// Runs llama.cpp (via llama-cpp-python in `.bench/venv`, installed on first use).
fn llama_cpp_reference(gguf: &Path, prompt: &str, threads: i32) -> anyhow::Result<Value> {
    let dir = bench_dir();
    let python = dir.join("venv/bin/python");
    if !python.exists() {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(dir.join("venv"))
            .status()?;
        if !status.success() {
            bail!("could not create {}", dir.join("venv").display());
        }
    }
    let has_module = Command::new(&python)
        .args(["-c", "import llama_cpp"])
        .output()?
        .status
        .success();
    if !has_module {
        eprintln!(
            "installing llama-cpp-python into {} (builds llama.cpp; takes minutes)",
            dir.display()
        );
        let status = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "llama-cpp-python"])
            .status()?;
        if !status.success() {
            bail!("pip install llama-cpp-python failed");
        }
    }
    let output = Command::new(&python)
        .args(["-c", REFERENCE_SCRIPT])
        .arg(gguf)
        .arg(threads.to_string())
        .arg(prompt)
        .arg(DECODE_TOKENS.to_string())
        .output()?;
    if !output.status.success() {
        bail!(
            "llama-cpp-python run failed: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .last()
        .context("no output from the reference run")?;
    Ok(serde_json::from_str(line)?)
}
