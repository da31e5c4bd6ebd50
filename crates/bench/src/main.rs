//! `duo-bench`: how much latency and memory the gateway adds on top of its
//! model provider.
//!
//! Starts the fake provider (the `fake-provider` crate) in-process on its own
//! thread and `duo-gateway` as a child process (so its peak RSS can be read),
//! both on loopback. For each target it sends requests at a fixed rate
//! straight to the provider and, interleaved with them at the same rate,
//! through the gateway, and reports the difference. Rates step up until a request
//! fails; the best rate is the highest whose added p99 stayed under 1 ms with
//! no errors. The whole run stays well under 3 minutes (with the default
//! 3 s steps; `--step-secs N` for longer ones). A byte-copying relay
//! ([`bench::tcp_relay`]) measured the same way is the floor under any
//! proxy on the machine.
//!
//! `--instructions` counts instead of timing: the instructions the gateway
//! runs per request of each target under valgrind's callgrind.

use anyhow::{Context, bail};
use bench::{load_average, mb, ms, percentile, read_status_kib};
use fake_provider::{FakeProvider, FakeProviderOptions};
use futures::StreamExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const RATES: &[u32] = &[250, 500, 1000, 2000];
/// Seconds per rate step; `--step-secs N` measures longer (the p99 of a
/// 3 s step rests on ~30 samples at 1000 req/s, so it moves between runs).
const DEFAULT_STEP_SECS: u64 = 3;

fn step_duration() -> anyhow::Result<Duration> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--step-secs" {
            let value = args.next().context("--step-secs needs a number")?;
            let secs: u64 = value
                .parse()
                .ok()
                .filter(|s| (1..=120).contains(s))
                .with_context(|| format!("--step-secs: 1 to 120, not {value:?}"))?;
            return Ok(Duration::from_secs(secs));
        }
    }
    Ok(Duration::from_secs(DEFAULT_STEP_SECS))
}
const TTFB_RATE: u32 = 100;
const ADDED_P99_BUDGET: Duration = Duration::from_millis(1);

struct Target {
    name: &'static str,
    gateway_path: &'static str,
    direct_path: &'static str,
    direct_body: serde_json::Value,
    gateway_body: serde_json::Value,
    unit_primitive: &'static str,
    /// The gateway has an Anthropic key (its proxy needs one; without it the
    /// other targets keep their default model route).
    anthropic_key: bool,
    /// Requests carry an RS256 token the gateway checks, as in production,
    /// instead of the development bypass. One token for the whole run, as the
    /// monolith reuses a user's token for minutes.
    signed: bool,
}

fn targets() -> Vec<Target> {
    let chat = serde_json::json!({"model": "smollm2-135m-instruct", "stream": true, "messages": [{"role": "user", "content": "explain"}]});
    let claude = serde_json::json!({"model": "claude-3-5-sonnet-20241022", "max_tokens": 64, "stream": true, "messages": [{"role": "user", "content": "explain"}]});
    vec![
        Target {
            name: "vertex-ai proxy (predict)",
            gateway_path: "/v1/proxy/vertex-ai/v1/projects/p/locations/l/publishers/google/models/text-embedding-005:predict",
            direct_path: "/v1/projects/local/locations/us-central1/publishers/google/models/text-embedding-005:predict",
            direct_body: serde_json::json!({"instances": [{"content": "fn main() {}"}]}),
            gateway_body: serde_json::json!({"instances": [{"content": "fn main() {}"}]}),
            unit_primitive: "generate_embeddings_codebase",
            anthropic_key: false,
            signed: false,
        },
        Target {
            name: "anthropic proxy (messages, stream)",
            gateway_path: "/v1/proxy/anthropic/v1/messages",
            direct_path: "/v1/messages",
            direct_body: claude.clone(),
            gateway_body: claude,
            unit_primitive: "duo_chat",
            anthropic_key: true,
            signed: false,
        },
        Target {
            name: "/v1/prompts/chat/explain_code",
            gateway_path: "/v1/prompts/chat/explain_code",
            direct_path: "/v1/chat/completions",
            direct_body: chat.clone(),
            gateway_body: serde_json::json!({"inputs": {"selected_text": "fn main() {}", "file_content": "fn main() {}", "language_info": "The code is written in Rust.", "input": ""}, "stream": true}),
            unit_primitive: "explain_code",
            anthropic_key: false,
            signed: false,
        },
        Target {
            name: "/v2/chat/agent",
            gateway_path: "/v2/chat/agent",
            direct_path: "/v1/chat/completions",
            direct_body: chat.clone(),
            gateway_body: serde_json::json!({"messages": [{"role": "user", "content": "What does this do?"}]}),
            unit_primitive: "duo_chat",
            anthropic_key: false,
            signed: false,
        },
        Target {
            name: "/v2/chat/agent, signed token",
            gateway_path: "/v2/chat/agent",
            direct_path: "/v1/chat/completions",
            direct_body: chat,
            gateway_body: serde_json::json!({"messages": [{"role": "user", "content": "What does this do?"}]}),
            unit_primitive: "duo_chat",
            anthropic_key: false,
            signed: true,
        },
    ]
}

impl Target {
    /// The target's call straight to the provider at `base`.
    fn direct_call(&self, base: &str) -> Call {
        Call {
            url: format!("{base}{}", self.direct_path),
            body: self.direct_body.to_string().into(),
            unit_primitive: self.unit_primitive,
            headers: Arc::default(),
        }
    }

    /// The target's call through the gateway at `base`, with the signed
    /// token's headers when the target is signed.
    fn gateway_call(&self, base: &str, signed_headers: &Arc<reqwest::header::HeaderMap>) -> Call {
        Call {
            url: format!("{base}{}", self.gateway_path),
            body: self.gateway_body.to_string().into(),
            unit_primitive: self.unit_primitive,
            headers: if self.signed {
                signed_headers.clone()
            } else {
                Arc::default()
            },
        }
    }
}

/// The Anthropic target: the relay's floor is measured on its call.
fn anthropic_target() -> anyhow::Result<Target> {
    targets()
        .into_iter()
        .find(|t| t.anthropic_key)
        .context("no Anthropic target")
}

/// The streaming vertex call, for time to first byte.
const STREAM_GATEWAY: &str = "/v1/proxy/vertex-ai/v1/projects/p/locations/l/publishers/google/models/code-gecko@002:serverStreamingPredict";
const STREAM_DIRECT: &str = "/v1/projects/local/locations/us-central1/publishers/google/models/code-gecko@002:serverStreamingPredict";

#[derive(Clone)]
struct Call {
    url: String,
    body: bytes::Bytes,
    unit_primitive: &'static str,
    /// Headers besides the body's type and the unit primitive (a token).
    headers: Arc<reqwest::header::HeaderMap>,
}

#[derive(Default)]
struct Sample {
    total: Vec<Duration>,
    first_byte: Vec<Duration>,
    /// The gateway's own account of its work (`x-gateway-overhead-time`:
    /// time to the response head minus time waiting on the provider). Less
    /// sensitive to machine noise than the difference of two latencies.
    overhead: Vec<Duration>,
    errors: usize,
}

impl Sample {
    fn merge(&mut self, other: Sample) {
        self.total.extend(other.total);
        self.first_byte.extend(other.first_byte);
        self.overhead.extend(other.overhead);
        self.errors += other.errors;
    }
    fn p(&self, p: f64) -> Duration {
        let mut v = self.total.clone();
        v.sort();
        percentile(&v, p)
    }
    fn ttfb(&self, p: f64) -> Duration {
        let mut v = self.first_byte.clone();
        v.sort();
        percentile(&v, p)
    }
    fn overhead(&self, p: f64) -> Duration {
        let mut v = self.overhead.clone();
        v.sort();
        percentile(&v, p)
    }
}

/// Times of one request.
struct Timing {
    first_byte: Duration,
    total: Duration,
    overhead: Option<Duration>,
}

/// One request, timed from the moment it is sent. (Not from its slot in the
/// schedule: tokio's timer wakes on whole milliseconds, so a request slotted
/// at +0.5 ms leaves at +1 ms, and timing from the slot added up to a
/// millisecond that depended on the slot's phase, not on the path: the
/// gateway's and the provider's requests alternate slots, so that lag
/// favoured one of them by about 0.5 ms.)
async fn one(client: reqwest::Client, call: Call) -> Option<Timing> {
    let sent = Instant::now();
    let resp = client
        .post(&call.url)
        .header("content-type", "application/json")
        .header("x-gitlab-unit-primitive", call.unit_primitive)
        .headers((*call.headers).clone())
        .body(call.body)
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let overhead = resp
        .headers()
        .get("x-gateway-overhead-time")
        .and_then(|v| v.to_str().ok()?.parse::<f64>().ok())
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok());
    let mut body = resp.bytes_stream();
    let mut first = None;
    while let Some(chunk) = body.next().await {
        chunk.ok()?;
        first.get_or_insert_with(|| sent.elapsed());
    }
    let total = sent.elapsed();
    Some(Timing {
        first_byte: first.unwrap_or(total),
        total,
        overhead,
    })
}

/// Open-loop load on both paths at once: `rate` requests per second to the
/// provider directly and `rate` through the gateway, alternating, for
/// `duration`. Interleaving makes both samples see the same background noise
/// (other processes on the machine), so their difference is the gateway's.
async fn run_pair(
    client: &reqwest::Client,
    direct: &Call,
    via: &Call,
    rate: u32,
    duration: Duration,
) -> (Sample, Sample) {
    let count = (u64::from(rate) * duration.as_millis() as u64 / 1000).max(1);
    let period = Duration::from_secs(1) / (rate * 2);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(2 * count as usize);
    for i in 0..2 * count {
        let scheduled = start + period * i as u32;
        tokio::time::sleep_until(scheduled.into()).await;
        let call = if i % 2 == 0 { direct } else { via };
        tasks.push(tokio::spawn(one(client.clone(), call.clone())));
    }
    let (mut d, mut g) = (Sample::default(), Sample::default());
    for (i, task) in tasks.into_iter().enumerate() {
        let sample = if i % 2 == 0 { &mut d } else { &mut g };
        match task.await {
            Ok(Some(timing)) => {
                sample.first_byte.push(timing.first_byte);
                sample.total.push(timing.total);
                sample.overhead.extend(timing.overhead);
            }
            _ => sample.errors += 1,
        }
    }
    (d, g)
}

/// What the fake model answers: a finished ReAct step, so `/v2/chat/agent`
/// streams a final answer, in a few SSE events as a real provider would.
const MODEL_ANSWER: &str = "Thought: I know this.\nFinal Answer: It prints hello.";

/// Starts the fake provider on its own thread and actix system, so that its
/// work never shares a scheduler with the load generator. Returns its URL
/// and a handle to switch its request recording.
fn start_provider() -> anyhow::Result<(String, Arc<FakeProvider>)> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("fake-provider".into())
        .spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                match FakeProvider::start_with(FakeProviderOptions::default()).await {
                    Ok(provider) => {
                        // The bench sends hundreds of thousands of requests:
                        // recording them would only cost time and memory.
                        provider.set_recording(false);
                        provider.set_default_text(MODEL_ANSWER);
                        provider.set_chunk_size(24);
                        let provider = Arc::new(provider);
                        let _ = ready_tx.send(Ok((provider.url(), provider.clone())));
                        // Serve until the process exits.
                        std::future::pending::<()>().await;
                        drop(provider);
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                    }
                }
            });
        })?;
    let started = ready_rx
        .recv_timeout(Duration::from_secs(10))
        .context("the fake provider did not start")??;
    Ok(started)
}

/// Waits until the gateway at `url` answers its health check.
async fn wait_until_healthy(
    child: &mut Child,
    url: &str,
    client: &reqwest::Client,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("duo-gateway exited early: {status}");
        }
        let probe = client.get(format!("{url}/monitoring/healthz")).send().await;
        if probe.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "duo-gateway did not become healthy within {} s",
        limit.as_secs()
    )
}

/// The gateway binary measured: `DUO_BENCH_GATEWAY`, by default the one
/// built next to this bench.
fn default_gateway_binary() -> anyhow::Result<std::path::PathBuf> {
    Ok(match std::env::var_os("DUO_BENCH_GATEWAY") {
        Some(path) => std::path::PathBuf::from(path),
        None => std::env::current_exe()?
            .parent()
            .context("no directory for duo-bench")?
            .join("duo-gateway"),
    })
}

/// The gateway `binary`'s command line on `provider` and `port`; with
/// `validation_key` (a private key's PEM) it checks tokens signed with that
/// key instead of letting every request through.
fn gateway_command(
    binary: &std::path::Path,
    provider: &str,
    anthropic_key: bool,
    validation_key: Option<&str>,
    port: u16,
) -> anyhow::Result<Command> {
    let mut command = Command::new(binary);
    command.env_clear();
    if anthropic_key {
        command
            .env("ANTHROPIC_API_KEY", "bench-anthropic-key")
            .env("ANTHROPIC_BASE_URL", provider);
    }
    match validation_key {
        Some(pem) => command.env("AIGW_SELF_SIGNED_JWT__VALIDATION_KEY", pem),
        None => command.env("AIGW_AUTH__BYPASS_EXTERNAL", "true"),
    };
    // An instrumented build (`./dev pgo`) writes its profile where this says.
    if let Some(profile_file) = std::env::var_os(TRAIN_PROFILE_FILE_VAR) {
        command.env("LLVM_PROFILE_FILE", profile_file);
    }
    command
        .env("AIGW_FASTAPI__API_PORT", port.to_string())
        // Not measured here; off so a running development stack keeps its port.
        .env("AIGW_WORKFLOW_SERVICE__LISTEN", "")
        .env("AIGW_LOCAL_LLM__URL", format!("{provider}/v1"))
        .env("AIGW_VERTEX_TEXT_MODEL__ENDPOINT", provider)
        .env("AIGW_LOGGING__LEVEL", "error");
    Ok(command)
}

struct Gateway {
    child: Child,
    url: String,
}

impl Gateway {
    /// A gateway on `provider`; with `validation_key` (a private key's PEM)
    /// it checks tokens signed with that key instead of letting every
    /// request through.
    fn start(
        provider: &str,
        anthropic_key: bool,
        validation_key: Option<&str>,
    ) -> anyhow::Result<Self> {
        Self::start_binary(
            &default_gateway_binary()?,
            provider,
            anthropic_key,
            validation_key,
        )
    }

    /// [`Gateway::start`] with the gateway `binary`.
    fn start_binary(
        binary: &std::path::Path,
        provider: &str,
        anthropic_key: bool,
        validation_key: Option<&str>,
    ) -> anyhow::Result<Self> {
        let port = e2e_tests::free_port()?;
        let mut command = gateway_command(binary, provider, anthropic_key, validation_key, port)?;
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {:?} (build it first)", command.get_program()))?;
        Ok(Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        })
    }

    /// SIGTERM, then its exit, which must be a clean one.
    async fn stop_cleanly(&mut self) -> anyhow::Result<()> {
        let signalled = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .context("running kill")?;
        if !signalled.success() {
            bail!("kill -TERM {} failed", self.child.id());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("the gateway exited with {status} after SIGTERM");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the gateway did not exit within 30 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_healthy(&mut self, client: &reqwest::Client) -> anyhow::Result<()> {
        wait_until_healthy(&mut self.child, &self.url, client, Duration::from_secs(15)).await
    }

    /// Peak resident set size (VmHWM) in KiB.
    fn peak_rss_kib(&self) -> Option<u64> {
        bench::peak_rss_kib(self.child.id())
    }
}

/// Reads a process's resident set size every few milliseconds and keeps the
/// highest value since the last [`RssSampler::take_peak`], so the memory
/// used at one load level can be told apart from the peak of the whole run.
struct RssSampler {
    peak_kib: Arc<AtomicU64>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let peak_kib = Arc::new(AtomicU64::new(0));
        let peak = peak_kib.clone();
        tokio::spawn(async move {
            let path = format!("/proc/{pid}/status");
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tick.tick().await;
                let Some(kib) = read_status_kib(&path, "VmRSS:") else {
                    break;
                };
                peak.fetch_max(kib, Ordering::Relaxed);
            }
        });
        Self { peak_kib }
    }

    fn take_peak(&self) -> u64 {
        self.peak_kib.swap(0, Ordering::Relaxed)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The relay's rows in the table.
const RELAY_ROW: &str = "floor: TCP relay (anthropic)";

/// One target's figures at 1000 req/s.
struct AtRate {
    /// CPU time of the process in the middle (user + system) per request.
    cpu_per_request: Option<Duration>,
    added_p50: Duration,
    added_p99: Duration,
    p99_ratio: f64,
    overhead_p50: Duration,
    overhead_p99: Duration,
}

struct Steps {
    /// The highest rate whose added p99 stayed under the budget, no errors.
    best: Option<u32>,
    at_1000: Option<AtRate>,
}

impl Steps {
    fn best_rate(&self) -> String {
        self.best
            .map_or("below the lowest step".to_owned(), |r| format!("{r} req/s"))
    }
}

/// Steps through [`RATES`] on both paths, printing a row per rate, until a
/// request fails; `after_step` runs after each rate's step.
async fn step_rates(
    client: &reqwest::Client,
    name: &str,
    direct: &Call,
    via: &Call,
    step: Duration,
    pid: u32,
    mut after_step: impl FnMut(u32),
) -> Steps {
    let mut steps = Steps {
        best: None,
        at_1000: None,
    };
    for &rate in RATES {
        let cpu_before = bench::cpu_time(pid);
        let (d, g) = run_pair(client, direct, via, rate, step).await;
        let cpu = bench::cpu_time(pid)
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before));
        after_step(rate);
        let (a50, a99) = (added(g.p(0.5), d.p(0.5)), added(g.p(0.99), d.p(0.99)));
        let cpu_per_request = cpu.map(|cpu| cpu / g.total.len().max(1) as u32);
        println!(
            "{:<32} {:>6} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>6}",
            name,
            rate,
            ms(d.p(0.5)),
            ms(d.p(0.99)),
            ms(g.p(0.5)),
            ms(g.p(0.99)),
            ms(a50),
            ms(a99),
            cpu_per_request.map_or("-".to_owned(), ms),
            d.errors + g.errors
        );
        if rate == 1000 {
            steps.at_1000 = Some(AtRate {
                cpu_per_request,
                added_p50: a50,
                added_p99: a99,
                p99_ratio: g.p(0.99).as_secs_f64() / d.p(0.99).as_secs_f64().max(1e-9),
                overhead_p50: g.overhead(0.5),
                overhead_p99: g.overhead(0.99),
            });
        }
        let failed = d.errors + g.errors > 0;
        if a99 < ADDED_P99_BUDGET && !failed {
            steps.best = Some(rate);
        }
        if failed {
            // Past saturation; higher rates only fail more.
            break;
        }
    }
    steps
}

fn added(gateway: Duration, direct: Duration) -> Duration {
    gateway.saturating_sub(direct)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(bench::tcp_relay::RELAY_ARG) {
        let (Some(port), Some(upstream)) = (args.get(1), args.get(2)) else {
            bail!("usage: duo-bench --tcp-relay <port> <upstream host:port>");
        };
        bench::tcp_relay::serve(port.parse()?, upstream.parse()?)?;
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.iter().any(|a| a == INSTRUCTIONS_ARG) {
        return runtime.block_on(bench::run_until_stopped(count_instructions()));
    }
    if args.iter().any(|a| a == TRAIN_PROFILE_ARG) {
        return runtime.block_on(bench::run_until_stopped(train_profile()));
    }
    if let Some(at) = args.iter().position(|a| a == COMPARE_ARG) {
        let other = args
            .get(at + 1)
            .filter(|path| !path.starts_with("--"))
            .context("usage: duo-bench --compare <other duo-gateway binary>")?;
        let other = std::path::PathBuf::from(other);
        return runtime.block_on(bench::run_until_stopped(compare_builds(other)));
    }
    runtime.block_on(bench::run_until_stopped(bench_gateway()))
}

/// `--compare <binary>`: this gateway (A) against another build of it (B),
/// both running at once on the same provider with their requests
/// interleaved at the same rate, so the host's drift (tens of percent within
/// an hour here) falls on both alike and what differs is the builds.
const COMPARE_ARG: &str = "--compare";
/// Requests per second to each of the two gateways.
const COMPARE_RATE: u32 = 1000;
/// Rounds per target; each one a step long, the two gateways taking turns
/// at being asked first within a slot.
const COMPARE_ROUNDS: usize = 6;

async fn compare_builds(other: std::path::PathBuf) -> anyhow::Result<()> {
    let started = Instant::now();
    let step = step_duration()?;
    let this = default_gateway_binary()?;
    let (provider, _recorder) = start_provider()?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(10))
        .build()?;
    let signing = bench::gateway_token::SigningKey::generate()?;
    let signed_headers = Arc::new(signing.request_headers()?);
    println!("A: {}\nB: {}", this.display(), other.display());
    println!(
        "{COMPARE_RATE} req/s to each, interleaved; {COMPARE_ROUNDS} rounds of {} s per target; {} CPUs, load average {}\n",
        step.as_secs(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!(
        "{:<36} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7}  B - A p50 per round (ms)",
        "target", "A p50", "B p50", "A p99", "B p99", "A cpu/req", "B cpu/req", "errors"
    );
    let mut summary = Vec::new();
    for target in targets() {
        let validation_key = target.signed.then_some(signing.private_pem.as_str());
        let mut a = Gateway::start_binary(&this, &provider, target.anthropic_key, validation_key)?;
        let mut b = Gateway::start_binary(&other, &provider, target.anthropic_key, validation_key)?;
        a.wait_healthy(&client).await?;
        b.wait_healthy(&client).await?;
        let calls = [
            target.gateway_call(&a.url, &signed_headers),
            target.gateway_call(&b.url, &signed_headers),
        ];
        let mut answered = true;
        for call in &calls {
            let probe = one(client.clone(), call.clone()).await;
            answered &= probe.is_some();
        }
        if !answered {
            println!("{:<36} skipped: a gateway did not answer", target.name);
            continue;
        }
        run_pair(
            &client,
            &calls[0],
            &calls[1],
            200,
            Duration::from_millis(500),
        )
        .await;
        let pids = [a.child.id(), b.child.id()];
        let mut samples = [Sample::default(), Sample::default()];
        let mut cpu = [Duration::ZERO; 2];
        let mut round_diffs = Vec::with_capacity(COMPARE_ROUNDS);
        for round in 0..COMPARE_ROUNDS {
            let before = pids.map(bench::cpu_time);
            // Each build is asked first in every other round.
            let (first, second) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
            let (s_first, s_second) =
                run_pair(&client, &calls[first], &calls[second], COMPARE_RATE, step).await;
            let mut round_samples = [Sample::default(), Sample::default()];
            round_samples[first] = s_first;
            round_samples[second] = s_second;
            for (i, pid) in pids.into_iter().enumerate() {
                if let (Some(after), Some(before)) = (bench::cpu_time(pid), before[i]) {
                    cpu[i] += after.saturating_sub(before);
                }
            }
            round_diffs.push(
                round_samples[1].p(0.5).as_secs_f64() - round_samples[0].p(0.5).as_secs_f64(),
            );
            for (all, round) in samples.iter_mut().zip(round_samples) {
                all.merge(round);
            }
        }
        let per_request = |i: usize| cpu[i] / samples[i].total.len().max(1) as u32;
        let diffs: Vec<String> = round_diffs
            .iter()
            .map(|d| format!("{:+.3}", d * 1000.0))
            .collect();
        println!(
            "{:<36} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7}  {}",
            target.name,
            ms(samples[0].p(0.5)),
            ms(samples[1].p(0.5)),
            ms(samples[0].p(0.99)),
            ms(samples[1].p(0.99)),
            ms(per_request(0)),
            ms(per_request(1)),
            samples[0].errors + samples[1].errors,
            diffs.join(" ")
        );
        let cpu_ratio = per_request(1).as_secs_f64() / per_request(0).as_secs_f64().max(1e-9);
        let same_sign =
            round_diffs.iter().all(|d| *d < 0.0) || round_diffs.iter().all(|d| *d > 0.0);
        summary.push(format!(
            "{}: B/A CPU per request {cpu_ratio:.2}; B - A p50 {}",
            target.name,
            if same_sign {
                "of the same sign in every round"
            } else {
                "of both signs over the rounds"
            }
        ));
    }
    print_summary(
        "Summary (a binary against a copy of itself reads 0.95-1.05 in CPU)",
        &summary,
        started,
    );
    Ok(())
}

/// The summary's lines, then the run's length and the load average.
fn print_summary(heading: &str, lines: &[String], started: Instant) {
    println!("\n{heading}");
    for line in lines {
        println!("- {line}");
    }
    println!(
        "- whole run: {:.0} s; load average at the end {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
}

/// `--instructions`: instead of timing, count the instructions the gateway
/// runs per request of each target (and the relay per relayed call), under
/// valgrind's callgrind: a figure the machine's load does not move, to
/// compare two builds (`DUO_BENCH_GATEWAY`) on a noisy host.
const INSTRUCTIONS_ARG: &str = "--instructions";
/// Requests counted per target, one at a time, after as many warm-up ones.
const COUNTED_REQUESTS: usize = 400;
/// With `--instructions`: keep the callgrind profiles for `callgrind_annotate`.
const KEEP_PROFILES_ARG: &str = "--keep-profiles";
const WARM_UP_REQUESTS: usize = 50;

async fn count_instructions() -> anyhow::Result<()> {
    if !bench::callgrind::available() {
        bail!(
            "--instructions needs valgrind (callgrind_control, callgrind_annotate): apt-get install valgrind"
        );
    }
    let started = Instant::now();
    let binary = default_gateway_binary()?;
    let (provider, _recorder) = start_provider()?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let signing = bench::gateway_token::SigningKey::generate()?;
    let signed_headers = Arc::new(signing.request_headers()?);
    let scratch = std::env::temp_dir().join(format!("duo-bench-callgrind-{}", std::process::id()));
    println!(
        "instructions per request under valgrind's callgrind ({COUNTED_REQUESTS} requests one at a time after {WARM_UP_REQUESTS} warm-up ones; the same for any load on the machine)\n"
    );
    println!(
        "{:<36} {:>14} {:>22}",
        "target", "instructions", "without libc memset"
    );
    let mut rows = Vec::new();
    for (i, target) in targets().into_iter().enumerate() {
        let port = e2e_tests::free_port()?;
        let command = gateway_command(
            &binary,
            &provider,
            target.anthropic_key,
            target.signed.then_some(signing.private_pem.as_str()),
            port,
        )?;
        let url = format!("http://127.0.0.1:{port}");
        let mut counted = bench::callgrind::Counted::start(&command, &scratch.join(i.to_string()))?;
        wait_until_healthy(&mut counted.child, &url, &client, Duration::from_secs(120)).await?;
        let call = target.gateway_call(&url, &signed_headers);
        rows.push((
            target.name,
            count_calls(&client, &call, &mut counted).await?,
        ));
    }
    // The relay, on the Anthropic call: what copying the bytes alone costs.
    let port = e2e_tests::free_port()?;
    let relay_command = relay_command(&provider, port)?;
    let mut relay = bench::callgrind::Counted::start(&relay_command, &scratch.join("relay"))?;
    let relay_address = format!("127.0.0.1:{port}");
    wait_listening(&mut relay.child, &relay_address, Duration::from_secs(60)).await?;
    let call = anthropic_target()?.direct_call(&format!("http://{relay_address}"));
    rows.push((RELAY_ROW, count_calls(&client, &call, &mut relay).await?));
    drop(relay);
    let keep = std::env::args().any(|a| a == KEEP_PROFILES_ARG);
    if !keep {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    for (name, counts) in &rows {
        let per = |n: u64| n / COUNTED_REQUESTS as u64;
        println!(
            "{:<36} {:>14} {:>22}",
            name,
            per(counts.total),
            per(counts.total.saturating_sub(counts.memset))
        );
    }
    println!(
        "\nwhole run: {:.0} s; libc memset is shown apart because valgrind counts its `rep stosb` per byte",
        started.elapsed().as_secs_f64()
    );
    if keep {
        println!(
            "profiles kept in {} (one directory per target, in the order above; `callgrind_annotate <file>`)",
            scratch.display()
        );
    }
    Ok(())
}

/// `--train-profile`: the load an instrumented gateway (`DUO_BENCH_GATEWAY`,
/// built with `-Cprofile-generate`) runs to record the profile that
/// optimises the release build (`./dev pgo`, docs/performance.md). Each
/// target's calls as the timed bench sends them, some at once, then a
/// SIGTERM: the profile is written when the gateway exits normally.
const TRAIN_PROFILE_ARG: &str = "--train-profile";
/// Where the gateways write their counts (their `LLVM_PROFILE_FILE`; the
/// bench's own, when it is instrumented too, stays apart).
const TRAIN_PROFILE_FILE_VAR: &str = "DUO_TRAIN_PROFILE_FILE";
/// Calls per target (`--calls N` to change), and how many are in flight at
/// once. Many calls per gateway: its start (the certificates' PEM, the docs
/// index) runs once per process, and a profile in which start-up weighs as
/// much as the requests optimises the requests less. Two at a time, as the
/// timed bench mostly has them (one per worker thread).
const TRAIN_CALLS: usize = 20_000;
const TRAIN_IN_FLIGHT: usize = 2;

fn train_calls() -> anyhow::Result<usize> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--calls" {
            let value = args.next().context("--calls needs a number")?;
            return value
                .parse()
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .with_context(|| format!("--calls: 1 to 1000000, not {value:?}"));
        }
    }
    Ok(TRAIN_CALLS)
}

async fn train_profile() -> anyhow::Result<()> {
    if std::env::var_os(TRAIN_PROFILE_FILE_VAR).is_none() {
        bail!(
            "--train-profile: set {TRAIN_PROFILE_FILE_VAR} to where the gateways' profiles go (./dev pgo does)"
        );
    }
    let calls = train_calls()?;
    let started = Instant::now();
    let binary = default_gateway_binary()?;
    let (provider, _recorder) = start_provider()?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let signing = bench::gateway_token::SigningKey::generate()?;
    let signed_headers = Arc::new(signing.request_headers()?);
    for target in targets() {
        let mut gateway = Gateway::start_binary(
            &binary,
            &provider,
            target.anthropic_key,
            target.signed.then_some(signing.private_pem.as_str()),
        )?;
        gateway.wait_healthy(&client).await?;
        let call = target.gateway_call(&gateway.url, &signed_headers);
        let answered = futures::stream::iter(0..calls)
            .map(|_| one(client.clone(), call.clone()))
            .buffer_unordered(TRAIN_IN_FLIGHT)
            .filter(|timing| std::future::ready(timing.is_some()))
            .count()
            .await;
        if answered != calls {
            bail!(
                "{}: {} of {calls} calls failed",
                target.name,
                calls - answered
            );
        }
        gateway.stop_cleanly().await?;
        println!("{:<36} {calls} calls", target.name);
    }
    println!(
        "\nwhole run: {:.0} s; each gateway exited cleanly (its profile is written)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Warms `call` up, then counts [`COUNTED_REQUESTS`] of it one at a time.
async fn count_calls(
    client: &reqwest::Client,
    call: &Call,
    counted: &mut bench::callgrind::Counted,
) -> anyhow::Result<bench::callgrind::Counts> {
    for _ in 0..WARM_UP_REQUESTS {
        one(client.clone(), call.clone())
            .await
            .with_context(|| format!("a warm-up call to {} failed", call.url))?;
    }
    counted.zero()?;
    for _ in 0..COUNTED_REQUESTS {
        one(client.clone(), call.clone())
            .await
            .with_context(|| format!("a counted call to {} failed", call.url))?;
    }
    counted.dump()
}

/// The relay of [`bench::tcp_relay`] as a child process in front of `provider`.
struct Relay {
    child: Child,
    url: String,
}

impl Relay {
    fn start(provider: &str) -> anyhow::Result<Self> {
        let port = e2e_tests::free_port()?;
        let child = relay_command(provider, port)?
            .stdout(Stdio::null())
            .spawn()
            .context("starting the TCP relay")?;
        Ok(Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        })
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let address = self.url.trim_start_matches("http://").to_owned();
        wait_listening(&mut self.child, &address, Duration::from_secs(10)).await
    }
}

/// The bench binary as a relay on `port` in front of `provider`.
fn relay_command(provider: &str, port: u16) -> anyhow::Result<Command> {
    let upstream = provider
        .strip_prefix("http://")
        .context("the provider's URL is not plain http")?;
    let mut command = Command::new(std::env::current_exe()?);
    command.args([bench::tcp_relay::RELAY_ARG, &port.to_string(), upstream]);
    Ok(command)
}

/// Waits until the relay `child` accepts connections at `address`.
async fn wait_listening(child: &mut Child, address: &str, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("the TCP relay exited early: {status}");
        }
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the TCP relay did not listen within {} s", limit.as_secs())
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn bench_gateway() -> anyhow::Result<()> {
    let started = Instant::now();
    let step = step_duration()?;
    let (provider, recorder) = start_provider()?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut gateway = Gateway::start(&provider, false, None)?;
    let signing = bench::gateway_token::SigningKey::generate()?;
    let signed_headers = Arc::new(signing.request_headers()?);
    gateway.wait_healthy(&client).await?;
    println!(
        "provider {provider}, gateway {} (pid {})",
        gateway.url,
        gateway.child.id()
    );
    println!(
        "auth: development bypass (AIGW_AUTH__BYPASS_EXTERNAL) except targets marked 'signed token' (an RS256 token checked against the gateway's validation key); step {} s per rate; {} CPUs, load average {} (other processes add noise)\n",
        step.as_secs(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    let rss = RssSampler::start(gateway.child.id());
    // Highest RSS seen while the offered load was at most 1000 req/s per path.
    // Each target gets a fresh gateway: memory taken during an overload step
    // is not given back to the system, and would hide the next target's figure.
    let mut rss_upto_1000 = 0;
    let mut rss_whole_run = 0;
    println!(
        "{:<32} {:>6} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>6}",
        "target",
        "req/s",
        "direct p50",
        "direct p99",
        "gw p50",
        "gw p99",
        "added p50",
        "added p99",
        "cpu/req",
        "errors"
    );

    let mut summary = Vec::new();
    // Each target's added p50 at 1000 req/s, to set against the relay's.
    let mut added_at_1000 = Vec::new();
    for target in targets() {
        let mut target_gateway = Gateway::start(
            &provider,
            target.anthropic_key,
            target.signed.then_some(signing.private_pem.as_str()),
        )?;
        target_gateway.wait_healthy(&client).await?;
        let rss = RssSampler::start(target_gateway.child.id());
        let mut direct = target.direct_call(&provider);
        let via = target.gateway_call(&target_gateway.url, &signed_headers);
        // Probe once: endpoints not built into this gateway are reported, not
        // timed. The probe's own call upstream is recorded: the direct path
        // then sends the provider that very request (a rendered prompt is
        // larger than a bare question, and costs the provider more to read).
        recorder.reset();
        recorder.set_recording(true);
        let probe = client
            .post(&via.url)
            .header("content-type", "application/json")
            .header("x-gitlab-unit-primitive", via.unit_primitive)
            .headers((*via.headers).clone())
            .body(via.body.clone())
            .send()
            .await?;
        if !probe.status().is_success() {
            println!(
                "{:<32} skipped: gateway answered {}",
                target.name,
                probe.status()
            );
            summary.push(format!(
                "{}: not measured (gateway answered {})",
                target.name,
                probe.status()
            ));
            continue;
        }
        // Read to the end, so the upstream call is complete and recorded.
        let _ = probe.bytes().await;
        recorder.set_recording(false);
        // The model call is the last POST (the gateway may first ask the
        // provider for its models' context sizes).
        let recorded = recorder.requests();
        if let Some(upstream) = recorded.iter().rev().find(|r| r.method == "POST") {
            direct.url = format!("{provider}{}", upstream.path);
            direct.body = upstream.body.to_string().into();
        } else {
            println!(
                "{:<32} the gateway's upstream call was not recorded: direct path as configured",
                target.name
            );
        }
        recorder.reset();
        // Warm connection pools on both paths.
        run_pair(&client, &direct, &via, 200, Duration::from_millis(500)).await;
        rss_upto_1000 = rss_upto_1000.max(rss.take_peak());
        let gateway_pid = target_gateway.child.id();
        let steps = step_rates(
            &client,
            target.name,
            &direct,
            &via,
            step,
            gateway_pid,
            |rate| {
                let step_rss = rss.take_peak();
                if rate <= 1000 {
                    rss_upto_1000 = rss_upto_1000.max(step_rss);
                }
            },
        )
        .await;
        if let Some(at) = &steps.at_1000 {
            added_at_1000.push((target.name, at.added_p50));
        }
        let best = steps.best_rate();
        let at_1000 = steps.at_1000.map_or("not reached".to_owned(), |at| {
            format!(
                "added p50 {} ms, p99 {} ms, gateway/direct p99 ratio {:.2}; gateway's own overhead (x-gateway-overhead-time) p50 {} ms, p99 {} ms; gateway CPU per request {} ms",
                ms(at.added_p50),
                ms(at.added_p99),
                at.p99_ratio,
                ms(at.overhead_p50),
                ms(at.overhead_p99),
                at.cpu_per_request.map_or("-".to_owned(), ms)
            )
        });
        summary.push(format!(
            "{}: max rate with added p99 < 1 ms and no errors: {best}; at 1000 req/s: {at_1000}",
            target.name
        ));
        rss_whole_run = rss_whole_run.max(target_gateway.peak_rss_kib().unwrap_or(0));
    }

    // The floor: a process that only copies bytes, on the Anthropic target's
    // exact call. What a target adds beyond it is the gateway's own work.
    let mut relay = Relay::start(&provider)?;
    relay.wait_ready().await?;
    let claude = anthropic_target()?;
    let direct = claude.direct_call(&provider);
    let via = claude.direct_call(&relay.url);
    run_pair(&client, &direct, &via, 200, Duration::from_millis(500)).await;
    let floor = step_rates(
        &client,
        RELAY_ROW,
        &direct,
        &via,
        step,
        relay.child.id(),
        |_| {},
    )
    .await;
    drop(relay);
    summary.push(match floor.at_1000 {
        Some(at) => {
            let beyond: Vec<String> = added_at_1000
                .iter()
                .map(|(name, a50)| {
                    format!("{name} {}", ms(added(*a50, at.added_p50)))
                })
                .collect();
            format!(
                "floor (a process that only copies bytes, on the anthropic call): at 1000 req/s added p50 {} ms, p99 {} ms, its CPU per request {} ms; each target's added p50 beyond it: {} ms",
                ms(at.added_p50),
                ms(at.added_p99),
                at.cpu_per_request.map_or("-".to_owned(), ms),
                beyond.join(", ")
            )
        }
        None => "floor (TCP relay): not reached 1000 req/s".to_owned(),
    });

    let direct = Call {
        url: format!("{provider}{STREAM_DIRECT}"),
        body: bytes::Bytes::from_static(b"{\"instances\":[{\"prefix\":\"fn \"}]}"),
        unit_primitive: "complete_code",
        headers: Arc::default(),
    };
    let via = Call {
        url: format!("{}{STREAM_GATEWAY}", gateway.url),
        ..direct.clone()
    };
    let (d, g) = run_pair(&client, &direct, &via, TTFB_RATE, step).await;
    rss_upto_1000 = rss_upto_1000.max(rss.take_peak());
    summary.push(format!(
        "time to first streamed byte (vertex-ai serverStreamingPredict, {TTFB_RATE} req/s): direct p50 {} / p99 {} ms, gateway p50 {} / p99 {} ms, added p50 {} / p99 {} ms, errors {}",
        ms(d.ttfb(0.5)), ms(d.ttfb(0.99)), ms(g.ttfb(0.5)), ms(g.ttfb(0.99)),
        ms(added(g.ttfb(0.5), d.ttfb(0.5))), ms(added(g.ttfb(0.99), d.ttfb(0.99))), d.errors + g.errors
    ));
    match gateway.peak_rss_kib() {
        Some(kib) => summary.push(format!(
            "gateway peak RSS: {} at up to 1000 req/s (goal < 50 MB); {} over the whole run (VmHWM, includes the 2000 req/s overload steps)",
            mb(rss_upto_1000),
            mb(kib.max(rss_whole_run))
        )),
        None => summary.push("gateway peak RSS: unavailable (no /proc)".to_owned()),
    }

    print_summary("Summary", &summary, started);
    Ok(())
}
