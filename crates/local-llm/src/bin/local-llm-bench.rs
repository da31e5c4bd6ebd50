//! `local-llm-bench`: our server against llama.cpp's own `llama-server` on
//! the same GGUF, with the same thread count and the same HTTP client:
//! greedy decode speed on free text and on an answer that quotes its
//! context (where prompt-lookup speculation pays), time to first token of a
//! fresh 300-token prompt, and of an agent's second step served from the
//! prompt-prefix cache (against ours without it, goal 5x, and against
//! llama-server with its own cache). Also: decode under a JSON-schema
//! grammar against unconstrained (goal 0.8x), embeddings per second, peak
//! RSS, and with `--python` the llama-cpp-python figures of earlier runs.
//!
//! `llama-server` is taken from `DUO_BENCH_LLAMA_SERVER` when set, else
//! built once into `.bench/llama.cpp` from the llama.cpp sources that the
//! pinned llama-cpp-python release vendors, for this machine's CPU
//! (`GGML_NATIVE`): the reference is llama.cpp at its best here.
//!
//! Both sides run as their own processes (ours is the `duo-local-llm` built
//! beside this bench) and use the same thread count: 2 unless `--threads N`
//! or `DUO_BENCH_THREADS` says otherwise. The figures set against each other
//! (ours, ours without speculation, llama-server) come from servers running
//! side by side and asked in turn, round after round, so a machine whose
//! speed drifts during the run slows every side alike.
//! The exit status is non-zero when the llama-server reference could not be
//! measured, so a missing reference is never mistaken for a passing run.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use local_llm::chat_template::{ChatMessage, render_chatml};
use local_llm::config::Config;
use local_llm::fetch::fetch_models;
use serde_json::{Value, json};

const PROMPT_TARGET_TOKENS: u64 = 300;
const DECODE_TOKENS: u32 = 128;
const EMBED_BATCH: usize = 16;
const EMBED_BATCHES: usize = 8;
const DEFAULT_THREADS: i32 = 2;
/// Measured runs per side; the median is reported, which tames a noisy machine.
const RUNS: usize = 5;
/// Decode speed against llama-server: free text, and an answer quoting its
/// context.
const FREE_TEXT_GOAL: f64 = 1.0;
const QUOTING_GOAL: f64 = 1.5;
/// Time to first token of a fresh prompt against llama-server (its TTFT over ours).
const TTFT_GOAL: f64 = 1.0;
/// Decode speed under a grammar, against unconstrained.
const GRAMMAR_GOAL: f64 = 0.8;
/// Time to first token of a second agent step: without the cache / with it.
const CACHE_GOAL: f64 = 5.0;
/// Its vendored llama.cpp (ggml 0.25.3) is the release closest to the one
/// `llama-cpp-sys-2` 0.1.161 builds (ggml 0.26.0); `llama-server` is built
/// from the same sources.
const LLAMA_CPP_PYTHON: &str = "0.3.36";

/// Free text: little of the answer is in the prompt.
const FREE_TEXT_PROMPT: &str =
    "Write a short story about a lighthouse keeper who finds a message in a bottle.";
/// A grounded question whose answer copies job names, file names and error
/// lines from the context, as the gateway's grounded answers do.
const QUOTING_SYSTEM: &str = "Answer from this context only.\n\
Pipeline #4182 failed on branch fix/login-timeout.\n\
Failed jobs:\n\
- rspec spec/models/user_spec.rb: NoMethodError: undefined method `session_timeout' for nil:NilClass\n\
- rubocop app/controllers/sessions_controller.rb: Layout/LineLength: Line is too long. [131/120]\n\
- jest spec/frontend/login/form_spec.js: TypeError: Cannot read properties of undefined (reading 'focus')\n\
- build-image Dockerfile: failed to solve: process \"/bin/sh -c bundle install\" did not complete successfully: exit code: 5\n";
const QUOTING_QUESTION: &str = "List every failed job with its file and its exact error line.";

#[derive(Debug, Clone, Copy)]
struct ChatFigures {
    ttft: Duration,
    decode_tokens: u64,
    decode_time: Duration,
}

impl ChatFigures {
    fn tokens_per_second(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Clone, Copy)]
struct Reference {
    ttft: Duration,
    decode_tokens: u64,
    tokens_per_second: f64,
    prompt_tokens: u64,
    peak_rss_mb: f64,
}

fn main() -> ExitCode {
    match actix_web::rt::System::new().block_on(run()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("local-llm-bench failed: {err:#}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    threads: i32,
    /// Also measure llama-cpp-python (installs and compiles it on first use).
    python: bool,
}

/// `--threads N` beats `DUO_BENCH_THREADS`, which beats the default of 2.
fn options() -> anyhow::Result<Options> {
    let mut args = std::env::args().skip(1);
    let mut from_flag = None;
    let mut python = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--threads" => from_flag = Some(args.next().context("--threads needs a number")?),
            "--python" => python = true,
            other => match other.strip_prefix("--threads=") {
                Some(n) => from_flag = Some(n.to_owned()),
                None => bail!(
                    "unknown argument {other:?}; usage: local-llm-bench [--threads N] [--python]"
                ),
            },
        }
    }
    let raw = from_flag.or_else(|| std::env::var("DUO_BENCH_THREADS").ok());
    let threads = match raw {
        None => DEFAULT_THREADS,
        Some(raw) => match raw.trim().parse::<i32>() {
            Ok(n) if n > 0 => n,
            _ => bail!("thread count must be a positive number, got {raw:?}"),
        },
    };
    Ok(Options { threads, python })
}

/// Starts one of our servers as its own process, as llama-server runs: the
/// `duo-local-llm` built beside this bench, configured by its environment
/// variables, so neither side shares its CPUs with the bench's client.
fn start_ours(
    threads: i32,
    prompt_cache: bool,
    speculation: bool,
) -> anyhow::Result<ServerProcess> {
    let binary = std::env::current_exe()?.with_file_name("duo-local-llm");
    let port = free_port()?;
    let mut command = Command::new(&binary);
    command
        .env("DUO_LOCAL_LLM_ADDR", format!("127.0.0.1:{port}"))
        .env("DUO_LOCAL_LLM_THREADS", threads.to_string())
        .env("DUO_LOCAL_LLM_PROMPT_CACHE", prompt_cache.to_string())
        .env("DUO_LOCAL_LLM_SPECULATION", speculation.to_string());
    spawn_server(command, "duo-local-llm", port)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn messages(system: Option<&str>, user: &str) -> Value {
    match system {
        Some(system) => json!([
            {"role": "system", "content": system},
            {"role": "user", "content": user}
        ]),
        None => json!([{"role": "user", "content": user}]),
    }
}

/// The median of `RUNS` streamed greedy answers, after a short warm-up.
async fn median_chat(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    messages: &Value,
    extra: &Value,
) -> anyhow::Result<ChatFigures> {
    chat_run(client, base, model, messages, 8, extra).await?;
    let mut runs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        runs.push(chat_run(client, base, model, messages, DECODE_TOKENS, extra).await?);
    }
    median_run(runs).context("no measured runs")
}

/// Pause between two sides' requests, so the threads of the side that just
/// answered (OpenMP spins a while after each parallel region) have gone to
/// sleep before the next side starts.
const SIDE_PAUSE: Duration = Duration::from_millis(100);

/// The same request on every side in turn, one warm-up and then [`RUNS`]
/// rounds, each round asking every side once: a machine whose speed drifts
/// (other work, clocks) slows every side alike instead of the one measured
/// at the time. The median per side, in the order given.
async fn paired_medians(
    client: &reqwest::Client,
    sides: &[(String, Value)],
    model: &str,
    messages: &Value,
) -> anyhow::Result<Vec<ChatFigures>> {
    for (base, extra) in sides {
        chat_run(client, base, model, messages, 8, extra).await?;
        tokio::time::sleep(SIDE_PAUSE).await;
    }
    let mut runs: Vec<Vec<ChatFigures>> = vec![Vec::with_capacity(RUNS); sides.len()];
    // Each round starts with the next side: whichever goes first in a round
    // runs right after the client's own work, and no side should always be
    // the one that does.
    for round in 0..RUNS {
        for turn in 0..sides.len() {
            let index = (round + turn) % sides.len();
            let (base, extra) = &sides[index];
            runs[index].push(chat_run(client, base, model, messages, DECODE_TOKENS, extra).await?);
            tokio::time::sleep(SIDE_PAUSE).await;
        }
    }
    runs.into_iter()
        .map(|side| median_run(side).context("no measured runs"))
        .collect()
}

fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "NOT MET" }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What llama-server measured, next to ours.
struct ServerReference {
    fresh: ChatFigures,
    free_text: ChatFigures,
    quoting: ChatFigures,
    second_step: Duration,
}

async fn run() -> anyhow::Result<ExitCode> {
    let Options { threads, python } = options()?;
    let config = Config::from_env()?;
    fetch_models(&config.models_dir).context("fetching weights")?;
    let gguf = config.chat_model_path.clone();
    let chat_model = config.chat_model_id.clone();
    let embed_model = config.embed_model_id.clone();
    let context_tokens = config.context_tokens;
    // The figures compared with llama.cpp are for a fresh prompt each time:
    // without the prefix cache (the same prompt would be served from it).
    // Each server is its own process.
    let client = reqwest::Client::new();
    let free_messages = messages(None, FREE_TEXT_PROMPT);
    let quoting_messages = messages(Some(QUOTING_SYSTEM), QUOTING_QUESTION);
    let plain = json!({});
    let server = start_ours(threads, false, true)?;
    let base = server.base.clone();
    let health: Value = client
        .get(format!("{base}/health"))
        .send()
        .await?
        .json()
        .await?;
    let cpu_variant = health["cpu_variant"]
        .as_str()
        .unwrap_or("unknown")
        .to_owned();
    let (user_text, prompt_tokens) = prompt_of_about(&client, &base, &chat_model).await?;
    let prompt = render_chatml(&[ChatMessage {
        role: "user".into(),
        content: user_text.clone(),
    }]);
    let fresh_messages = messages(None, &user_text);
    // The figures set against each other (ours, ours without speculation,
    // llama-server) come from servers running side by side, asked in turn.
    let plain_server = start_ours(threads, false, false)?;
    let llama = llama_server(&gguf, threads, context_tokens);
    // llama-server keeps a prompt cache of its own: off for the fresh prompt
    // and the decode runs, as ours is; on for the second step.
    let fresh_only = json!({"cache_prompt": false});
    // Ours first, ours without speculation next (decode only), llama-server
    // last when it runs.
    let mut fresh_sides = vec![(base.clone(), plain.clone())];
    let mut decode_sides = vec![
        (base.clone(), plain.clone()),
        (plain_server.base.clone(), plain.clone()),
    ];
    if let Ok(server) = &llama {
        for sides in [&mut fresh_sides, &mut decode_sides] {
            sides.push((server.base.clone(), fresh_only.clone()));
        }
    }
    let fresh = paired_medians(&client, &fresh_sides, &chat_model, &fresh_messages).await?;
    let free = paired_medians(&client, &decode_sides, &chat_model, &free_messages).await?;
    let quote = paired_medians(&client, &decode_sides, &chat_model, &quoting_messages).await?;
    let ours = fresh[0];
    let (free_text, free_text_plain) = (free[0], free[1]);
    let (quoting, quoting_plain) = (quote[0], quote[1]);
    drop(plain_server);
    // The same answer under a grammar: a JSON object with one free string.
    let constrained = json!({"response_format": {"type": "json_schema", "json_schema": {
    "name": "summary", "strict": true, "schema": {
        "type": "object",
        "properties": {"summary": {"type": "string"}},
        "required": ["summary"],
        "additionalProperties": false
    }}}});
    let grammar = median_chat(&client, &base, &chat_model, &fresh_messages, &constrained).await?;
    let no_cache = agent_step_ttft(&client, &base, &chat_model, &user_text, &plain).await?;
    let (embeds_per_sec, embed_tokens) = embeddings_rate(&client, &base, &embed_model).await?;
    let our_rss_mb = server.peak_rss_kb().unwrap_or(0) as f64 / 1024.0;
    drop(server);

    let cached_server = start_ours(threads, true, true)?;
    let cache = agent_step_ttft(
        &client,
        &cached_server.base,
        &chat_model,
        &user_text,
        &plain,
    )
    .await?;
    drop(cached_server);

    let reference = match llama {
        Ok(server) => {
            let second_step = agent_step_ttft(
                &client,
                &server.base,
                &chat_model,
                &user_text,
                &json!({"cache_prompt": true}),
            )
            .await;
            drop(server);
            second_step.map(|second_step| ServerReference {
                fresh: fresh[1],
                free_text: free[2],
                quoting: quote[2],
                second_step,
            })
        }
        Err(err) => Err(err),
    };

    println!(
        "duo-local-llm bench: {threads} threads on each side, same GGUF, same HTTP client; greedy, up to {DECODE_TOKENS} decoded tokens, median of {RUNS} runs, the compared servers asked in turn (each round starting with the next)"
    );
    println!(
        "  machine: {} CPUs, load average {} (other work on the machine skews the figures)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average().unwrap_or_else(|| "unknown".to_owned())
    );
    println!(
        "  llama.cpp CPU code: ours {} (chosen at start, DUO_LOCAL_LLM_CPU_VARIANT forces one); llama-server built for this CPU (GGML_NATIVE)",
        cpu_variant
    );
    let line = |name: &str, f: &ChatFigures| {
        println!(
            "  {name:<34} TTFT {:>7.1} ms  decode {:>6.1} tok/s  ({} tokens after the first)",
            ms(f.ttft),
            f.tokens_per_second(),
            f.decode_tokens
        );
    };
    line(&format!("ours, {prompt_tokens}-token prompt"), &ours);
    line("ours, free text", &free_text);
    line("ours, quoting answer", &quoting);
    line("ours without speculation, free text", &free_text_plain);
    line("ours without speculation, quoting", &quoting_plain);
    println!(
        "  speculation alone: free text {:.2}x, quoting answer {:.2}x (same tokens either way)",
        free_text.tokens_per_second() / free_text_plain.tokens_per_second().max(1e-9),
        quoting.tokens_per_second() / quoting_plain.tokens_per_second().max(1e-9)
    );
    let grammar_ratio = grammar.tokens_per_second() / ours.tokens_per_second().max(1e-9);
    println!(
        "  grammar    decode {:>6.1} tok/s under a json_schema grammar = {grammar_ratio:.2}x unconstrained; goal >= {GRAMMAR_GOAL}x: {}",
        grammar.tokens_per_second(),
        verdict(grammar_ratio >= GRAMMAR_GOAL)
    );
    let cache_ratio = no_cache.as_secs_f64() / cache.as_secs_f64().max(1e-9);
    println!(
        "  prefix cache: second agent step TTFT {:.1} ms with the cache, {:.1} ms without = {cache_ratio:.1}x faster; goal >= {CACHE_GOAL}x: {}",
        ms(cache),
        ms(no_cache),
        verdict(cache_ratio >= CACHE_GOAL)
    );
    let mut exit = ExitCode::SUCCESS;
    match &reference {
        Ok(server) => {
            line("llama-server, 300-token prompt", &server.fresh);
            line("llama-server, free text", &server.free_text);
            line("llama-server, quoting answer", &server.quoting);
            let free_ratio =
                free_text.tokens_per_second() / server.free_text.tokens_per_second().max(1e-9);
            let quoting_ratio =
                quoting.tokens_per_second() / server.quoting.tokens_per_second().max(1e-9);
            // The same kernels on both sides: what is left of a gap here is
            // not the drafting's.
            println!(
                "  ours without speculation vs llama-server: decode free text {:.2}x, quoting answer {:.2}x",
                free_text_plain.tokens_per_second()
                    / server.free_text.tokens_per_second().max(1e-9),
                quoting_plain.tokens_per_second() / server.quoting.tokens_per_second().max(1e-9)
            );
            let ttft_ratio = server.fresh.ttft.as_secs_f64() / ours.ttft.as_secs_f64().max(1e-9);
            let step_ratio = server.second_step.as_secs_f64() / cache.as_secs_f64().max(1e-9);
            println!(
                "  vs llama-server: decode free text {free_ratio:.2}x (goal >= {FREE_TEXT_GOAL}x: {}), quoting answer {quoting_ratio:.2}x (goal >= {QUOTING_GOAL}x: {})",
                verdict(free_ratio >= FREE_TEXT_GOAL),
                verdict(quoting_ratio >= QUOTING_GOAL)
            );
            println!(
                "  vs llama-server: first token {:.1} vs {:.1} ms = {ttft_ratio:.2}x faster (goal >= {TTFT_GOAL}x: {}); second agent step {:.1} vs {:.1} ms with each side's prefix cache = {step_ratio:.2}x",
                ms(ours.ttft),
                ms(server.fresh.ttft),
                verdict(ttft_ratio >= TTFT_GOAL),
                ms(cache),
                ms(server.second_step)
            );
        }
        Err(err) => {
            println!("  llama-server REFERENCE MISSING: {err:#}");
            println!("  goals against llama-server: UNKNOWN (no reference)");
            exit = ExitCode::FAILURE;
        }
    }
    if python {
        match llama_cpp_reference(&gguf, &prompt, threads, context_tokens) {
            Ok(reference) => {
                println!(
                    "  llama-cpp-python {LLAMA_CPP_PYTHON}: TTFT {:>7.1} ms  decode {:>6.1} tok/s  ({} tokens after the first, prompt {} tokens, peak RSS {:.0} MB); ours/it: decode {:.2}x",
                    ms(reference.ttft),
                    reference.tokens_per_second,
                    reference.decode_tokens,
                    reference.prompt_tokens,
                    reference.peak_rss_mb,
                    ours.tokens_per_second() / reference.tokens_per_second.max(1e-9)
                );
            }
            Err(err) => {
                println!("  llama-cpp-python REFERENCE MISSING: {err:#}");
                exit = ExitCode::FAILURE;
            }
        }
    }
    println!(
        "  embeddings {embeds_per_sec:>7.1} chunks/s ({embed_tokens} word pieces per chunk, batches of {EMBED_BATCH})"
    );
    println!(
        "  peak RSS of our server (chat and embedding models loaded, after the runs above) {our_rss_mb:.0} MB"
    );
    Ok(exit)
}

fn median_run(mut runs: Vec<ChatFigures>) -> Option<ChatFigures> {
    // The median by decode speed; its TTFT is reported alongside, and the
    // TTFT median is taken separately so one slow start does not pick the run.
    runs.sort_by(|a, b| a.tokens_per_second().total_cmp(&b.tokens_per_second()));
    let mut median = *runs.get(runs.len() / 2)?;
    let mut ttfts: Vec<Duration> = runs.iter().map(|r| r.ttft).collect();
    ttfts.sort();
    median.ttft = *ttfts.get(ttfts.len() / 2)?;
    Some(median)
}

fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Filler text whose chat prompt is 300 tokens (or within a token or two),
/// measured on the server: whole sentences first, then single filler words.
async fn prompt_of_about(
    client: &reqwest::Client,
    base: &str,
    model: &str,
) -> anyhow::Result<(String, u64)> {
    let sentence =
        "The build pipeline compiles every crate, runs the tests and publishes a report. ";
    let count = |text: String| async move {
        let body = json!({ "model": model, "messages": [{ "role": "user", "content": text }], "max_tokens": 1, "temperature": 0 });
        let reply: Value = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        reply["usage"]["prompt_tokens"]
            .as_u64()
            .context("usage.prompt_tokens")
    };
    let head = "Summarise this log.\n";
    let mut repeats = 20usize;
    for _ in 0..3 {
        let tokens = count(format!("{head}{}", sentence.repeat(repeats))).await?;
        let per_repeat = (tokens as f64 / repeats as f64).max(1.0);
        let next = ((PROMPT_TARGET_TOKENS as f64 - 20.0) / per_repeat)
            .floor()
            .max(1.0) as usize;
        if next == repeats {
            break;
        }
        repeats = next;
    }
    let mut padding = 0usize;
    let mut best = (String::new(), 0u64);
    for _ in 0..4 {
        let text = format!(
            "{head}{}{}",
            sentence.repeat(repeats),
            "ok ".repeat(padding)
        );
        let tokens = count(text.clone()).await?;
        if best.1.abs_diff(PROMPT_TARGET_TOKENS) > tokens.abs_diff(PROMPT_TARGET_TOKENS) {
            best = (text, tokens);
        }
        if tokens >= PROMPT_TARGET_TOKENS {
            break;
        }
        padding += (PROMPT_TARGET_TOKENS - tokens) as usize;
    }
    Ok(best)
}

/// Time to the first token of an agent's second step (the first step's
/// prompt, its answer and an observation, then a new turn), after the first
/// step ran on the same server; median of three.
async fn agent_step_ttft(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    context: &str,
    extra: &Value,
) -> anyhow::Result<Duration> {
    let system = format!("You are a helpful agent. Use the context below.\n{context}");
    let mut first = json!({"model": model, "max_tokens": 1, "temperature": 0, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": "What does the pipeline publish?"}
    ]});
    let mut second = json!({"model": model, "max_tokens": 1, "temperature": 0, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": "What does the pipeline publish?"},
        {"role": "assistant", "content": "Thought: read the log.\nAction: build_reader"},
        {"role": "user", "content": "Observation: the report was published."}
    ]});
    merge(&mut first, extra);
    merge(&mut second, extra);
    let mut times = Vec::with_capacity(3);
    for _ in 0..3 {
        for (body, timed) in [(&first, false), (&second, true)] {
            let started = Instant::now();
            let resp = client
                .post(format!("{base}/v1/chat/completions"))
                .json(body)
                .send()
                .await?;
            if !resp.status().is_success() {
                bail!("agent step failed: {}", resp.status());
            }
            resp.bytes().await?;
            if timed {
                times.push(started.elapsed());
            }
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

fn merge(body: &mut Value, extra: &Value) {
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            body.insert(key.clone(), value.clone());
        }
    }
}

/// One streamed greedy answer. The token count comes from the server's own
/// `usage` (asked for with `stream_options.include_usage`), or llama-server's
/// `timings`: SSE deltas are not tokens, since the stop scanner may merge or
/// hold back pieces.
async fn chat_run(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    messages: &Value,
    max_tokens: u32,
    extra: &Value,
) -> anyhow::Result<ChatFigures> {
    let mut body = json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    merge(&mut body, extra);
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
    let mut completion_tokens = None;
    let mut buffer = String::new();
    'read: while let Some(chunk) = stream.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data = event.trim().trim_start_matches("data: ");
            if data.is_empty() {
                continue;
            }
            if data == "[DONE]" {
                break 'read;
            }
            let value: Value = serde_json::from_str(data)?;
            if value["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
            {
                first.get_or_insert_with(Instant::now);
            }
            if let Some(n) = value["usage"]["completion_tokens"].as_u64() {
                completion_tokens = Some(n);
            } else if let Some(n) = value["timings"]["predicted_n"].as_u64() {
                completion_tokens = Some(n);
            }
        }
    }
    let finished = Instant::now();
    let first = first.context("no tokens were generated")?;
    let completion_tokens = completion_tokens.context("the stream carried no usage chunk")?;
    Ok(ChatFigures {
        ttft: first - started,
        // The first token is in the TTFT; the rest is decode.
        decode_tokens: completion_tokens.saturating_sub(1),
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

fn peak_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Token-level timing through `Llama.generate`, so counts are exact tokens, as
/// ours are. `reset()` before each run keeps llama-cpp-python from reusing the
/// cached prompt, which our server does not do either.
const REFERENCE_SCRIPT: &str = r#"
import json, sys, time
import llama_cpp
from llama_cpp import Llama
path, threads, prompt, max_tokens, runs, n_ctx = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=512, verbose=False)
tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
eos = llm.token_eos()

def peak_rss_mb():
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the process that
    # spawned us (the bench itself) across exec.
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")

def once(limit):
    llm.reset()
    start = time.perf_counter(); first = None; n = 0
    for token in llm.generate(tokens, temp=0.0, reset=True):
        n += 1
        if first is None:
            first = time.perf_counter()
        if token == eos or n >= limit:
            break
    end = time.perf_counter()
    return first - start, n - 1, end - first

once(8)
results = [once(max_tokens) for _ in range(runs)]
by_speed = sorted(results, key=lambda r: r[1] / max(r[2], 1e-9))
_, decoded, decode_s = by_speed[len(by_speed) // 2]
ttft = sorted(r[0] for r in results)[len(results) // 2]
print(json.dumps({"version": llama_cpp.__version__, "ttft_s": ttft, "decode_tokens": decoded,
                  "decode_tokens_per_s": decoded / max(decode_s, 1e-9), "prompt_tokens": len(tokens),
                  "peak_rss_mb": peak_rss_mb()}))
"#;

fn bench_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.bench")
}

fn installed_version(python: &Path) -> Option<String> {
    let output = Command::new(python)
        .args(["-c", "import llama_cpp; print(llama_cpp.__version__)"])
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Runs llama.cpp through llama-cpp-python in `.bench/venv`, installing the
/// pinned version there first when it is missing or different.
fn llama_cpp_reference(
    gguf: &Path,
    prompt: &str,
    threads: i32,
    context_tokens: u32,
) -> anyhow::Result<Reference> {
    let dir = bench_dir();
    let venv = dir.join("venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("starting python3 -m venv")?;
        if !status.success() {
            bail!("could not create {}", venv.display());
        }
    }
    if installed_version(&python).as_deref() != Some(LLAMA_CPP_PYTHON) {
        eprintln!(
            "installing llama-cpp-python {LLAMA_CPP_PYTHON} into {} (compiles llama.cpp; takes minutes)",
            venv.display()
        );
        let spec = format!("llama-cpp-python=={LLAMA_CPP_PYTHON}");
        let status = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-cache-dir", &spec])
            .status()
            .context("starting pip")?;
        if !status.success() {
            bail!("pip install {spec} failed (it needs cmake and a C++ compiler)");
        }
    }
    let output = Command::new(&python)
        .args(["-c", REFERENCE_SCRIPT])
        .arg(gguf)
        .arg(threads.to_string())
        .arg(prompt)
        .arg(DECODE_TOKENS.to_string())
        .arg(RUNS.to_string())
        .arg(context_tokens.to_string())
        .output()
        .context("starting the reference run")?;
    if !output.status.success() {
        bail!(
            "llama-cpp-python run failed: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("no output")
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .last()
        .context("no output from the reference run")?;
    let value: Value = serde_json::from_str(line).context("reading the reference figures")?;
    let number = |key: &str| {
        value[key]
            .as_f64()
            .with_context(|| format!("reference figure {key} missing in {line}"))
    };
    Ok(Reference {
        ttft: Duration::from_secs_f64(number("ttft_s")?.max(0.0)),
        decode_tokens: value["decode_tokens"].as_u64().unwrap_or(0),
        tokens_per_second: number("decode_tokens_per_s")?,
        prompt_tokens: value["prompt_tokens"].as_u64().unwrap_or(0),
        peak_rss_mb: number("peak_rss_mb")?,
    })
}

/// A server process of either side, stopped when dropped.
struct ServerProcess {
    child: std::process::Child,
    base: String,
}

impl ServerProcess {
    fn peak_rss_kb(&self) -> Option<u64> {
        peak_rss_kb(self.child.id())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_step(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// `DUO_BENCH_LLAMA_SERVER`, or `.bench/llama.cpp/build/bin/llama-server`,
/// built there on first use: the sources come from the pinned
/// llama-cpp-python source release (a registry package; it vendors all of
/// llama.cpp), compiled for this CPU.
fn llama_server_binary(threads: i32) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("DUO_BENCH_LLAMA_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let dir = bench_dir().join("llama.cpp");
    let binary = dir.join("build/bin/llama-server");
    if binary.exists() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let source_dir = dir.join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON}"));
    if !source_dir.exists() {
        eprintln!(
            "fetching llama.cpp {LLAMA_CPP_PYTHON} sources into {}",
            dir.display()
        );
        let spec = format!("llama-cpp-python=={LLAMA_CPP_PYTHON}");
        run_step(
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                ])
                .arg(&spec)
                .arg("-d")
                .arg(&dir),
            "pip download",
        )?;
        let archive = dir.join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"));
        run_step(
            Command::new("tar")
                .arg("xzf")
                .arg(&archive)
                .arg("-C")
                .arg(&dir),
            "unpacking the sources",
        )?;
    }
    eprintln!("building llama-server for this CPU (takes minutes)");
    let build = dir.join("build");
    run_step(
        Command::new("cmake")
            .arg("-S")
            .arg(source_dir.join("vendor/llama.cpp"))
            .arg("-B")
            .arg(&build)
            .args([
                "-DCMAKE_BUILD_TYPE=Release",
                "-DGGML_NATIVE=ON",
                "-DBUILD_SHARED_LIBS=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_OPENSSL=OFF",
                "-DLLAMA_CURL=OFF",
            ]),
        "cmake configure",
    )?;
    run_step(
        Command::new("cmake")
            .arg("--build")
            .arg(&build)
            .args(["--target", "llama-server", "-j"])
            .arg(threads.max(1).to_string()),
        "cmake build",
    )?;
    Ok(binary)
}

/// Starts llama-server on the GGUF with our thread count and context, one
/// slot (requests run one at a time, as ours do), and waits until it loaded.
fn llama_server(gguf: &Path, threads: i32, context_tokens: u32) -> anyhow::Result<ServerProcess> {
    let binary = llama_server_binary(threads)?;
    let port = free_port()?;
    let mut command = Command::new(&binary);
    command
        .arg("-m")
        .arg(gguf)
        .args(["-t", &threads.to_string(), "-tb", &threads.to_string()])
        .args(["-c", &context_tokens.to_string(), "-b", "512", "-np", "1"])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()]);
    spawn_server(command, "llama-server", port)
}

/// Starts a server (its output in `.bench/<name>.log`) and waits until its
/// `/health` answers 200.
fn spawn_server(mut command: Command, name: &str, port: u16) -> anyhow::Result<ServerProcess> {
    std::fs::create_dir_all(bench_dir()).context("creating .bench")?;
    let log_path = bench_dir().join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let child = command
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let mut server = ServerProcess {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut stream| {
            use std::io::{Read as _, Write as _};
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let asked = stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .is_ok();
            let mut reply = String::new();
            asked && stream.read_to_string(&mut reply).is_ok() && reply.starts_with("HTTP/1.1 200")
        });
        if ready {
            return Ok(server);
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            bail!("{name} exited ({status}); see {}", log_path.display());
        }
        if Instant::now() > deadline {
            bail!(
                "{name} did not become ready in 120 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
