//! `duo-chat-bench`: Duo Chat under load, as its users see it.
//!
//! Starts the real system on loopback (PostgreSQL from the project's own
//! bootstrap, `duo-gateway`, `duo-monolith web` replicas and `worker`s, in
//! release builds) with the fake model provider answering instantly, and
//! drives it only through its public interfaces (GraphQL over HTTP and
//! WebSocket, REST for fixtures). It reports:
//!
//! 0. scale-out: the same load (direct answers, 50 users, each user on one web
//!    replica) on 1 web × 1 worker and then on 2 web × 2 workers, each its own
//!    system on one PostgreSQL: answers/s, the ratio, p50/p99 and the CPU per
//!    answer of every process group. `--scale-only` stops after this part;
//!    the rest below runs on the 2 × 2 system;
//! 1. live delivery: PostgreSQL NOTIFY → WebSocket latency to 100 subscribers
//!    spread over both web replicas;
//! 2. answers: mutation → final message on the subscription, for a direct
//!    answer and for a one-tool answer (`issue_reader`), at 1 and at 50
//!    concurrent users: p50/p99, answers/s, and where the time went (the
//!    gateway's own request time from its metrics, PostgreSQL's statement time
//!    from `pg_stat_database`, the rest in the monolith; plus CPU seconds per
//!    process). Then the same 50 users at a human pace (think time between an answer
//!    and the next question, 2 s down to 0.25 s on average): p50/p99 as one
//!    user sees it, against the goal p99 < 40 ms;
//! 3. `aiAction` mutations: requests/s and p99 with 50 concurrent clients;
//! 4. peak RSS of every process;
//!
//! and counts every lost or duplicated message across the run (an answer
//! missing from the database or the subscription, a second copy of one).

use anyhow::{Context, bail};
use bench::{Latencies, MachineCpu, cpu_time, load_average, mb, ms, peak_rss_kib, pids_named};
use e2e_tests::live::Subscription;
use e2e_tests::{Options, System};
use futures::future::join_all;
use monolith::chat::live::{LiveMessage, publish_to_client};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Set once the measurements are over and the services may go away.
static FINISHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

const USERS: usize = 50;
const FANOUT_SUBSCRIBERS: usize = 100;
const FANOUT_MESSAGES: usize = 200;
const FANOUT_SPACING: Duration = Duration::from_millis(10);
const MUTATION_CLIENTS: usize = 50;
const MUTATION_PHASE: Duration = Duration::from_secs(5);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// The fake model's direct answer (one ReAct step ending in a final answer).
const DIRECT_ANSWER: &str = "Thought: I can answer this directly.\nFinal Answer: A pipeline runs its jobs stage by stage; jobs in one stage run in parallel.";
/// The fake model's first step in the tool scenario: read the issue.
const TOOL_ACTION: &str = "Thought: I need to read the issue first.\nAction: issue_reader\nAction Input: acme/platform/api#1";
/// Present only in the second model call of a tool answer: the title,
/// which reaches the prompt through the reader's observation.
const OBSERVATION_NEEDLE: &str = "Login fails with expired sessions";
const TOOL_ANSWER: &str = "Thought: The issue explains it.\nFinal Answer: The login breaks for sessions older than 30 days; refreshing the session fixes it.";

/// The system sizes the scale-out part compares: (web replicas, workers).
const SCALE_STEPS: [(usize, usize); 2] = [(1, 1), (2, 2)];
/// Questions per user in one scale-out step.
const SCALE_QUESTIONS_PER_USER: usize = 20;

/// Mean think times of the paced part: each of the [`USERS`] users asks,
/// waits for the whole answer, then thinks for an exponentially distributed
/// time with this mean before the next question (a human reads an answer for
/// seconds; one second is already far faster). The closed loop with no think
/// time above measures throughput: there every user always waits behind the
/// 49 others, so its latency is users ÷ answers/s (Little's law), not what one
/// user sees.
const THINK_TIMES_MS: [u64; 4] = [2000, 1000, 500, 250];
/// How long each think time is measured.
const PACED_PHASE: Duration = Duration::from_secs(8);
/// The latency goal for 50 users, checked at every think time.
const PACED_GOAL_P99: Duration = Duration::from_millis(40);

/// One benchmark user: a token, a seat, reporter access to the demo group, and
/// an open subscription whose messages arrive in `inbox`.
struct BenchUser {
    token: String,
    /// The web replica this user's browser talks to (mutations and socket).
    web_url: String,
    client_subscription_id: String,
    inbox: mpsc::UnboundedReceiver<(Instant, Value)>,
    /// Requests this user has seen answered; a later copy is a duplicate.
    answered: HashSet<String>,
}

/// What one answered request measured.
struct Answer {
    latency: Duration,
    first_chunk: Option<Duration>,
    ok: bool,
}

/// Everything that went wrong with delivery, summed over the run.
#[derive(Default)]
struct Integrity {
    requests: AtomicU64,
    missing_on_subscription: AtomicU64,
    duplicated_on_subscription: AtomicU64,
    chunks_out_of_order: AtomicU64,
    coded_errors: AtomicU64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bench::run_until_stopped(run_bench()).await
}

async fn run_bench() -> anyhow::Result<()> {
    let started = Instant::now();
    let scale_only = std::env::args().any(|a| a == "--scale-only");
    println!(
        "{} CPUs, load average {} (a shared machine: other work runs beside this bench); worker concurrency {} per worker (the default)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average(),
        std::env::var("DUO_WORKER_CONCURRENCY").unwrap_or_else(|_| "4".into())
    );

    // 0. Scale-out: one system per size, the same load on each.
    let mut steps = Vec::new();
    let mut kept = None;
    for (n, (webs, workers)) in SCALE_STEPS.into_iter().enumerate() {
        println!(
            "\nstarting PostgreSQL, duo-gateway, {webs} x duo-monolith web, {workers} x duo-monolith worker (release builds) and the fake provider"
        );
        let system = start_system(webs, workers).await?;
        let result = scale_step(&system, webs, workers).await;
        if let Err(e) = &result {
            dump_diagnostics(&system).await;
            bail!("scale-out step {webs}x{workers}: {e:#}");
        }
        let (users, step) = result?;
        steps.push(step);
        // The last system carries on with the other measurements.
        if n + 1 == SCALE_STEPS.len() && !scale_only {
            kept = Some((system, users));
        } else {
            drop(users);
            drop(system);
        }
    }
    let scale_lines = scale_summary(&steps);

    let Some((system, users)) = kept else {
        println!("\nSummary");
        for line in &scale_lines {
            println!("- {line}");
        }
        return Ok(());
    };
    let result = run(&system, users, scale_lines, started).await;
    FINISHED.store(true, Ordering::Relaxed);
    if result.is_err() {
        dump_diagnostics(&system).await;
    }
    result
}

/// Starts gateway, `webs` web replicas and `workers` workers on a fresh
/// database, the fake provider streaming in 16-character chunks.
async fn start_system(webs: usize, workers: usize) -> anyhow::Result<Arc<System>> {
    let system = System::start_with(Options {
        extra_web_replicas: webs.saturating_sub(1),
        extra_workers: workers.saturating_sub(1),
        monolith_env: vec![
            ("DUO_AI_ACTION_RATE_LIMIT".into(), "100000000".into()),
            ("RUST_LOG".into(), log_level()),
            // The harness shortens leases for its crash test; use the default.
            ("DUO_JOB_LEASE_SECS".into(), "15".into()),
        ],
        gateway_env: vec![("AIGW_LOGGING__LEVEL".into(), log_level())],
        ..Options::default()
    })
    .await
    .context("starting the system")?;
    system.fake.set_recording(false);
    system.fake.set_chunk_size(16);
    Ok(Arc::new(system))
}

/// The last jobs and every service's last log lines: usually why a run failed.
async fn dump_diagnostics(system: &System) {
    if let Ok(db) = system.db.client().await
        && let Ok(rows) = db
            .query(
                "SELECT kind, state, attempts, coalesce(last_error, ''), payload::text FROM background_jobs ORDER BY id DESC LIMIT 5",
                &[],
            )
            .await
    {
        for row in rows {
            let (kind, state, attempts, error, payload): (String, String, i32, String, String) =
                (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            println!("job {kind} {state} attempts={attempts} error={error:?} {payload:.300}");
        }
    }
    let services = std::iter::once(&system.gateway)
        .chain(std::iter::once(&system.web))
        .chain(system.worker.as_ref())
        .chain(system.replicas.iter().map(|(s, _)| s))
        .chain(system.extra_workers.iter());
    for (n, service) in services.enumerate() {
        let path = std::env::temp_dir().join(format!("duo-chat-bench-{}-{n}.log", service.name));
        let _ = std::fs::write(&path, service.log_tail(usize::MAX));
        println!(
            "--- {} (last lines; whole log in {}) ---\n{}",
            service.name,
            path.display(),
            service.log_tail(20)
        );
    }
}

/// What one scale-out step measured.
struct ScaleStep {
    webs: usize,
    workers: usize,
    measured: Measured,
}

/// Creates the users (spread over the web replicas) and runs the scale-out
/// load: [`USERS`] users asking direct questions, then checks that every
/// question has exactly one stored answer.
async fn scale_step(
    system: &Arc<System>,
    webs: usize,
    workers: usize,
) -> anyhow::Result<(Vec<BenchUser>, ScaleStep)> {
    let web_urls = web_urls(system);
    let users = create_users(system, &web_urls).await?;
    let integrity = Arc::new(Integrity::default());
    print_answer_header();
    // A short warm-up (connections, prepared statements, caches).
    let (users, _) = answers(system, users, &integrity, Kind::Direct, USERS, 2).await?;
    println!(
        "measuring {webs} x {workers}: {USERS} users x {SCALE_QUESTIONS_PER_USER} questions (a profiler may attach now)"
    );
    let (users, measured) = answers(
        system,
        users,
        &integrity,
        Kind::Direct,
        USERS,
        SCALE_QUESTIONS_PER_USER,
    )
    .await?;
    let (not_stored, stored_twice) = stored_answer_counts(system).await?;
    let lost = not_stored + integrity.missing_on_subscription.load(Ordering::Relaxed);
    let duplicated = stored_twice + integrity.duplicated_on_subscription.load(Ordering::Relaxed);
    if lost + duplicated > 0 {
        bail!("{lost} answers lost, {duplicated} duplicated");
    }
    Ok((
        users,
        ScaleStep {
            webs,
            workers,
            measured,
        },
    ))
}

/// The scale-out comparison, one line per step and the throughput ratio.
fn scale_summary(steps: &[ScaleStep]) -> Vec<String> {
    let mut lines: Vec<String> = steps
        .iter()
        .map(|s| {
            let m = &s.measured;
            format!(
                "scale-out {} web x {} worker(s), {USERS} users, direct answers: {:.1} answers/s, mutation -> final answer p50 {} ms, p99 {} ms; CPU per answer {} (load average {})",
                s.webs,
                s.workers,
                m.answers_per_sec,
                ms(m.p50),
                ms(m.p99),
                m.cpu_per_answer,
                m.load_average
            )
        })
        .collect();
    if let (Some(first), Some(last)) = (steps.first(), steps.last())
        && first.measured.answers_per_sec > 0.0
    {
        lines.push(format!(
            "scale-out ratio ({} x {} over {} x {}): {:.2}x answers/s",
            last.webs,
            last.workers,
            first.webs,
            first.workers,
            last.measured.answers_per_sec / first.measured.answers_per_sec
        ));
    }
    for line in &lines {
        println!("{line}");
    }
    lines
}

fn web_urls(system: &System) -> Vec<String> {
    std::iter::once(system.web_url.clone())
        .chain(system.replicas.iter().map(|(_, url)| url.clone()))
        .collect()
}

fn print_answer_header() {
    println!(
        "\n{:<12} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>10} {:>10}",
        "answer",
        "users",
        "answers",
        "p50 ms",
        "p99 ms",
        "1st p50",
        "1st p99",
        "ans/s",
        "gateway",
        "postgres",
        "monolith"
    );
}

/// The services' log level: `DUO_BENCH_LOG` (e.g. `debug` to see why a run
/// failed), `warn` by default so logging costs nothing measurable.
fn log_level() -> String {
    std::env::var("DUO_BENCH_LOG").unwrap_or_else(|_| "warn".into())
}

async fn run(
    system: &Arc<System>,
    users: Vec<BenchUser>,
    scale_lines: Vec<String>,
    started: Instant,
) -> anyhow::Result<()> {
    let web_urls = web_urls(system);
    let mut users = users;
    let integrity = Arc::new(Integrity::default());
    let mut summary = scale_lines;

    // 1. NOTIFY -> WebSocket fan-out.
    summary.push(fanout(system, &web_urls).await?);

    // 2. Whole answers.
    print_answer_header();
    for (kind, concurrency, per_user) in [
        (Kind::Direct, 1, 100),
        (Kind::Direct, USERS, 10),
        (Kind::OneTool, 1, 50),
        (Kind::OneTool, USERS, 6),
    ] {
        let measured;
        (users, measured) = answers(system, users, &integrity, kind, concurrency, per_user).await?;
        summary.push(measured.line);
    }
    println!(
        "  (gateway, postgres, monolith: share of the summed answer latency; monolith = the rest, queueing included)"
    );

    // 2b. Users at a human pace: latency as one user sees it.
    println!(
        "\n{USERS} users with think time (each asks, waits for the answer, thinks, asks again; direct answers, {:.0} s each):",
        PACED_PHASE.as_secs_f64()
    );
    for think_ms in THINK_TIMES_MS {
        let line;
        (users, line) =
            paced_answers(system, users, &integrity, Duration::from_millis(think_ms)).await?;
        println!("  {line}");
        summary.push(line);
    }

    // 3. Mutations alone.
    summary.push(mutations(system, &users).await?);

    // 4. Memory.
    let mut rss = vec![
        ("gateway", system.gateway.pid()),
        ("web", system.web.pid()),
        ("worker", system.worker.as_ref().and_then(|w| w.pid())),
    ];
    rss.extend(
        system
            .replicas
            .iter()
            .map(|(replica, _)| ("web replica", replica.pid())),
    );
    rss.extend(
        system
            .extra_workers
            .iter()
            .map(|worker| ("worker replica", worker.pid())),
    );
    let rss: Vec<String> = rss
        .into_iter()
        .map(|(name, pid)| {
            let peak = pid.and_then(peak_rss_kib).map_or("?".to_owned(), mb);
            format!("{name} {peak}")
        })
        .collect();
    summary.push(format!("peak RSS (VmHWM): {}", rss.join(", ")));

    // Integrity: the database must hold exactly one answer per request.
    let (stored_missing, stored_duplicated) = stored_answer_counts(system).await?;
    let i = &integrity;
    let lost = stored_missing + i.missing_on_subscription.load(Ordering::Relaxed);
    let duplicated = stored_duplicated + i.duplicated_on_subscription.load(Ordering::Relaxed);
    summary.push(format!(
        "integrity over {} chat requests: lost {lost} (not stored {stored_missing}, never delivered {}), duplicated {duplicated} (stored twice {stored_duplicated}, delivered twice {}), chunks out of order {}, coded errors {}",
        i.requests.load(Ordering::Relaxed),
        i.missing_on_subscription.load(Ordering::Relaxed),
        i.duplicated_on_subscription.load(Ordering::Relaxed),
        i.chunks_out_of_order.load(Ordering::Relaxed),
        i.coded_errors.load(Ordering::Relaxed),
    ));

    println!("\nSummary");
    for line in &summary {
        println!("- {line}");
    }
    println!(
        "- whole run: {:.0} s; load average at the end {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    drop(users);
    if lost + duplicated > 0 {
        bail!("messages were lost or duplicated");
    }
    Ok(())
}

/// Creates [`USERS`] users through the REST API (as the seeded admin), each
/// with a token, a Duo Enterprise seat and reporter access to the demo group
/// `acme`, and opens one live subscription per user (alternating replicas).
async fn create_users(system: &Arc<System>, web_urls: &[String]) -> anyhow::Result<Vec<BenchUser>> {
    let root = system.token("root")?;
    // Room for every bench user on the seeded instance-wide purchase.
    system
        .db
        .client()
        .await?
        .execute(
            "UPDATE add_on_purchases SET quantity = quantity + $1 WHERE add_on = 'duo_enterprise'",
            &[&(USERS as i32)],
        )
        .await?;
    let (status, group) = system
        .rest(&root, reqwest::Method::GET, "/groups/acme", None)
        .await?;
    let group_id = group["id"].as_i64().filter(|_| status == 200);
    let group_id = group_id.with_context(|| format!("no demo group acme: {status} {group}"))?;

    let mut users = Vec::with_capacity(USERS);
    for n in 0..USERS {
        let username = format!("bench{n:02}");
        let post = |path: String, body: Value| {
            let root = root.clone();
            async move {
                let (status, body) = system
                    .rest(&root, reqwest::Method::POST, &path, Some(body))
                    .await?;
                if !(200..300).contains(&status) {
                    bail!("POST {path}: {status} {body}");
                }
                Ok::<Value, anyhow::Error>(body)
            }
        };
        let user = post(
            "/users".into(),
            json!({"username": username, "name": username, "email": format!("{username}@example.com")}),
        )
        .await?;
        let id = user["id"].as_i64().context("user without id")?;
        let token = post(
            format!("/users/{id}/personal_access_tokens"),
            json!({"name": "bench", "scopes": ["api", "ai_features"]}),
        )
        .await?["token"]
            .as_str()
            .context("token missing")?
            .to_owned();
        post(
            format!("/groups/{group_id}/members"),
            json!({"user_id": id, "access_level": 20}),
        )
        .await?;
        post(
            "/add_on_purchases/duo_enterprise/assignments".into(),
            json!({"user_id": id}),
        )
        .await?;

        let client_subscription_id = format!("bench-tab-{n}");
        let url = &web_urls[n % web_urls.len()];
        let subscriptions = system
            .subscribe_everywhere(&token, &client_subscription_id, &[url])
            .await?;
        let web_url = url.clone();
        let (tx, inbox) = mpsc::unbounded_channel();
        for subscription in subscriptions {
            spawn_reader(subscription, tx.clone(), |_| true);
        }
        users.push(BenchUser {
            token,
            web_url,
            client_subscription_id,
            inbox,
            answered: HashSet::new(),
        });
    }
    println!("created {USERS} users with seats and open subscriptions");
    Ok(users)
}

/// Forwards every message a subscription receives, with its arrival time.
fn spawn_reader(
    mut subscription: Subscription,
    tx: mpsc::UnboundedSender<(Instant, Value)>,
    keep: impl Fn(&Value) -> bool + Send + 'static,
) {
    tokio::spawn(async move {
        loop {
            match subscription.next_message(Duration::from_secs(3600)).await {
                Ok(message) => {
                    if keep(&message) && tx.send((Instant::now(), message)).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    // Sockets close when the services stop at the end, or
                    // after a scale-out step, once its users are gone.
                    if !FINISHED.load(Ordering::Relaxed) && !tx.is_closed() {
                        eprintln!("a subscription ended: {e}");
                    }
                    break;
                }
            }
        }
    });
}

/// Publishes [`FANOUT_MESSAGES`] chunks through PostgreSQL NOTIFY, exactly as
/// the worker does, to one client subscription held open [`FANOUT_SUBSCRIBERS`]
/// times (browser tabs) over both web replicas; measures publish → arrival.
async fn fanout(system: &Arc<System>, web_urls: &[String]) -> anyhow::Result<String> {
    let token = system.token("alice")?;
    let gid = system.user_gid(&token).await?;
    let user_id: i64 = gid
        .rsplit('/')
        .next()
        .and_then(|id| id.parse().ok())
        .context("user id")?;
    let urls: Vec<&str> = (0..FANOUT_SUBSCRIBERS)
        .map(|i| web_urls[i % web_urls.len()].as_str())
        .collect();
    let subscriptions = system.subscribe_everywhere(&token, "fanout", &urls).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    for subscription in subscriptions {
        // Only the probes: `/help` answers from the readiness check may trail.
        spawn_reader(subscription, tx.clone(), |m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("probe-"))
        });
    }
    drop(tx);

    let db = system.db.client().await?;
    let request = uuid::Uuid::new_v4();
    let mut sent_at = Vec::with_capacity(FANOUT_MESSAGES);
    let mut tick = tokio::time::interval(FANOUT_SPACING);
    for n in 0..FANOUT_MESSAGES {
        tick.tick().await;
        let message = LiveMessage::chunk(0, request, n as i32 + 1, format!("probe-{n}"));
        sent_at.push(Instant::now());
        publish_to_client(&db, user_id, "fanout", &message).await?;
    }
    let expected = FANOUT_MESSAGES * FANOUT_SUBSCRIBERS;
    let mut latencies = Latencies::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while latencies.len() < expected {
        let Ok(Some((at, message))) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            break;
        };
        let n: usize = message["content"]
            .as_str()
            .and_then(|c| c.strip_prefix("probe-")?.parse().ok())
            .context("probe number")?;
        latencies.push(at.saturating_duration_since(sent_at[n]));
    }
    let missing = expected - latencies.len();
    let line = format!(
        "NOTIFY -> WebSocket, {FANOUT_MESSAGES} messages to {FANOUT_SUBSCRIBERS} subscribers on {} web replicas: p50 {} ms, p99 {} ms, max {} ms; {} deliveries, missing {missing}",
        web_urls.len(),
        ms(latencies.quantile(0.5)),
        ms(latencies.quantile(0.99)),
        ms(latencies.quantile(1.0)),
        latencies.len()
    );
    println!("{line}");
    if missing > 0 {
        bail!("{missing} live deliveries never arrived");
    }
    Ok(line)
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Direct,
    OneTool,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Direct => "direct",
            Kind::OneTool => "issue_reader",
        }
    }

    fn question(self) -> &'static str {
        match self {
            Kind::Direct => "How do pipelines run their jobs?",
            Kind::OneTool => "Summarise acme/platform/api#1 for me",
        }
    }

    fn script(self, system: &System) {
        system.fake.reset();
        match self {
            Kind::Direct => system.fake.set_default_text(DIRECT_ANSWER),
            Kind::OneTool => {
                system.fake.reply_when(OBSERVATION_NEEDLE, TOOL_ANSWER);
                system.fake.set_default_text(TOOL_ACTION);
            }
        }
    }

    fn expected(self) -> &'static str {
        let full = match self {
            Kind::Direct => DIRECT_ANSWER,
            Kind::OneTool => TOOL_ANSWER,
        };
        full.split_once("Final Answer: ").map_or(full, |(_, a)| a)
    }
}

/// Time spent in each process group, read before and after a scenario.
struct Accounts {
    gateway_request_secs: f64,
    postgres_active_ms: f64,
    cpu: Vec<(&'static str, Duration)>,
    /// CPU time of each PostgreSQL backend connected to this system's
    /// database (the machine's other databases excluded).
    postgres_backends: HashMap<u32, Duration>,
    /// The whole machine, read beside the processes' times.
    machine: Option<MachineCpu>,
}

impl Accounts {
    /// CPU this system's PostgreSQL backends used since `before` (a backend
    /// that connected in between counts from zero).
    fn postgres_backends_since(&self, before: &Accounts) -> Duration {
        self.postgres_backends
            .iter()
            .map(|(pid, now)| {
                now.saturating_sub(
                    before
                        .postgres_backends
                        .get(pid)
                        .copied()
                        .unwrap_or_default(),
                )
            })
            .sum()
    }
}

async fn accounts(system: &System) -> anyhow::Result<Accounts> {
    let metrics = system
        .http
        .get(format!("{}/metrics", system.gateway_url))
        .send()
        .await?
        .text()
        .await?;
    let postgres_active_ms = settled_postgres_active_ms(system).await?;
    let web: Vec<u32> = std::iter::once(&system.web)
        .chain(system.replicas.iter().map(|(s, _)| s))
        .filter_map(|s| s.pid())
        .collect();
    let workers: Vec<u32> = system
        .worker
        .iter()
        .chain(system.extra_workers.iter())
        .filter_map(|s| s.pid())
        .collect();
    let sum = |pids: &[u32]| pids.iter().filter_map(|p| cpu_time(*p)).sum::<Duration>();
    let backends = system
        .db
        .client()
        .await?
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await?;
    let postgres_backends = backends
        .iter()
        .filter_map(|row| {
            let pid = u32::try_from(row.get::<_, i32>(0)).ok()?;
            Some((pid, cpu_time(pid)?))
        })
        .collect();
    Ok(Accounts {
        postgres_backends,
        gateway_request_secs: gateway_request_seconds(&metrics),
        postgres_active_ms,
        machine: MachineCpu::now(),
        cpu: vec![
            ("monolith web", sum(&web)),
            ("monolith worker", sum(&workers)),
            (
                "gateway",
                sum(&system.gateway.pid().into_iter().collect::<Vec<_>>()),
            ),
            // Every PostgreSQL process of the machine: on a shared machine
            // this includes other databases' work (not in the total).
            ("all postgres on the machine", sum(&pids_named("postgres"))),
            ("bench+fake provider", sum(&[std::process::id()])),
        ],
    })
}

/// Total seconds the gateway spent answering API requests (its
/// `http_request_duration_seconds` sums, health and metrics excluded).
fn gateway_request_seconds(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("http_request_duration_seconds_sum{"))
        .filter(|l| !l.contains("/metrics") && !l.contains("/monitoring"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// PostgreSQL's `active_time` (statement execution) summed over databases.
/// Backends report it when they next go idle and at most every second, so
/// the value is read until it stops moving.
async fn settled_postgres_active_ms(system: &System) -> anyhow::Result<f64> {
    let db = system.db.client().await?;
    let read = || async {
        let row = db
            .query_one(
                "SELECT pg_stat_clear_snapshot(), coalesce(sum(active_time), 0)::float8 FROM pg_stat_database",
                &[],
            )
            .await?;
        Ok::<f64, anyhow::Error>(row.get(1))
    };
    let mut last = read().await?;
    let deadline = Instant::now() + Duration::from_secs(12);
    let mut stable_since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = read().await?;
        if (now - last).abs() > 0.01 {
            stable_since = Instant::now();
            last = now;
        } else if stable_since.elapsed() >= Duration::from_millis(1500) {
            break;
        }
    }
    Ok(last)
}

/// What one run of [`answers`] measured.
struct Measured {
    line: String,
    answers_per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// "web 1.00 ms, worker 1.60 ms, …, total 5.90 ms": monolith, gateway and
    /// this database's PostgreSQL backends make the total.
    cpu_per_answer: String,
    load_average: String,
}

/// `per_user` questions from each of `concurrency` users, each user asking
/// its next question once the previous answer arrived on its subscription.
async fn answers(
    system: &Arc<System>,
    users: Vec<BenchUser>,
    integrity: &Arc<Integrity>,
    kind: Kind,
    concurrency: usize,
    per_user: usize,
) -> anyhow::Result<(Vec<BenchUser>, Measured)> {
    kind.script(system);
    let mut users = users;
    let idle = users.split_off(concurrency);
    let before = accounts(system).await?;
    let wall = Instant::now();
    let tasks = users.into_iter().map(|mut user| {
        let system = system.clone();
        let integrity = integrity.clone();
        tokio::spawn(async move {
            let mut results = Vec::with_capacity(per_user);
            for _ in 0..per_user {
                results.push(ask(&system, &mut user, &integrity, kind).await?);
            }
            // A `/help` sentinel (no model) flushes the subscription: anything
            // still published for earlier requests arrives before its answer.
            ask_raw(&system, &mut user, &integrity, "/help", None).await?;
            Ok::<_, anyhow::Error>((user, results))
        })
    });
    let mut users = Vec::new();
    let mut results = Vec::new();
    for joined in join_all(tasks).await {
        let (user, answered) = joined??;
        users.push(user);
        results.extend(answered);
    }
    let elapsed = wall.elapsed();
    let after = accounts(system).await?;
    users.extend(idle);

    let mut latency = Latencies::default();
    let mut first = Latencies::default();
    for r in &results {
        latency.push(r.latency);
        if let Some(f) = r.first_chunk {
            first.push(f);
        }
    }
    let answers = results.len();
    let failed = results.iter().filter(|r| !r.ok).count();
    let summed = latency.sum().as_secs_f64().max(1e-9);
    let gateway = after.gateway_request_secs - before.gateway_request_secs;
    let postgres = (after.postgres_active_ms - before.postgres_active_ms) / 1000.0;
    let monolith = (summed - gateway - postgres).max(0.0);
    let share = |s: f64| format!("{:.0}%", 100.0 * s / summed);
    println!(
        "{:<12} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8.1} {:>10} {:>10} {:>10}",
        kind.name(),
        concurrency,
        answers,
        ms(latency.quantile(0.5)),
        ms(latency.quantile(0.99)),
        ms(first.quantile(0.5)),
        ms(first.quantile(0.99)),
        answers as f64 / elapsed.as_secs_f64(),
        share(gateway),
        share(postgres),
        share(monolith)
    );
    let per = |d: Duration| d.as_secs_f64() * 1000.0 / answers.max(1) as f64;
    let mut per_answer: Vec<(&str, f64)> = after
        .cpu
        .iter()
        .zip(&before.cpu)
        .map(|((name, a), (_, b))| (*name, per(a.saturating_sub(*b))))
        .collect();
    // Every process above is in the machine's busy time; what is left over
    // ran beside the bench and slowed it (a build, a stray server).
    if let (Some(after_machine), Some(before_machine)) = (after.machine, before.machine) {
        let machine = after_machine.since(&before_machine);
        let accounted: f64 = per_answer.iter().map(|(_, ms)| ms).sum();
        per_answer.push((
            "other work on the machine",
            (per(machine.busy) - accounted).max(0.0),
        ));
        per_answer.push(("stolen by the hypervisor", per(machine.stolen)));
    }
    per_answer.insert(
        2,
        (
            "postgres (this database's backends)",
            per(after.postgres_backends_since(&before)),
        ),
    );
    let system_total: f64 = per_answer
        .iter()
        .filter(|(name, _)| {
            name.starts_with("monolith") || *name == "gateway" || name.starts_with("postgres (")
        })
        .map(|(_, ms)| ms)
        .sum();
    let mut cpu: Vec<String> = per_answer
        .iter()
        .map(|(name, ms)| format!("{name} {ms:.2} ms"))
        .collect();
    cpu.push(format!(
        "total without the bench {system_total:.2} ms (goal <= 3 ms)"
    ));
    let line = format!(
        "{} answer, {concurrency} user(s): {answers} answers ({failed} with a coded error) in {:.1} s = {:.1} answers/s; mutation -> final message p50 {} ms, p99 {} ms; first chunk p50 {} ms; per answer: gateway {:.2} ms, PostgreSQL {:.2} ms, monolith (rest) {:.2} ms; CPU per answer: {}",
        kind.name(),
        elapsed.as_secs_f64(),
        answers as f64 / elapsed.as_secs_f64(),
        ms(latency.quantile(0.5)),
        ms(latency.quantile(0.99)),
        ms(first.quantile(0.5)),
        gateway * 1000.0 / answers.max(1) as f64,
        postgres * 1000.0 / answers.max(1) as f64,
        monolith * 1000.0 / answers.max(1) as f64,
        cpu.join(", ")
    );
    let answers_per_sec = answers as f64 / elapsed.as_secs_f64();
    Ok((
        users,
        Measured {
            line,
            answers_per_sec,
            p50: latency.quantile(0.5),
            p99: latency.quantile(0.99),
            cpu_per_answer: cpu.join(", "),
            load_average: load_average(),
        },
    ))
}

/// [`USERS`] users asking direct questions for [`PACED_PHASE`], each
/// thinking between its answer and its next question for an exponentially
/// distributed time of mean `think` (a fixed seed per user, so runs compare).
async fn paced_answers(
    system: &Arc<System>,
    users: Vec<BenchUser>,
    integrity: &Arc<Integrity>,
    think: Duration,
) -> anyhow::Result<(Vec<BenchUser>, String)> {
    Kind::Direct.script(system);
    let wall = Instant::now();
    let ends = tokio::time::Instant::now() + PACED_PHASE;
    let tasks = users.into_iter().enumerate().map(|(n, mut user)| {
        let system = system.clone();
        let integrity = integrity.clone();
        tokio::spawn(async move {
            let mut pause = ThinkTime::new(n as u64, think);
            // Users start spread over one think time, not all at once.
            tokio::time::sleep(pause.next()).await;
            let mut results = Vec::new();
            while tokio::time::Instant::now() < ends {
                results.push(ask(&system, &mut user, &integrity, Kind::Direct).await?);
                tokio::time::sleep(pause.next()).await;
            }
            ask_raw(&system, &mut user, &integrity, "/help", None).await?;
            Ok::<_, anyhow::Error>((user, results))
        })
    });
    let mut users = Vec::new();
    let mut latency = Latencies::default();
    let mut failed = 0;
    for joined in join_all(tasks).await {
        let (user, answered) = joined??;
        users.push(user);
        for answer in answered {
            failed += usize::from(!answer.ok);
            latency.push(answer.latency);
        }
    }
    let elapsed = wall.elapsed().as_secs_f64();
    let p99 = latency.quantile(0.99);
    let verdict = if p99 < PACED_GOAL_P99 {
        "met"
    } else {
        "NOT MET"
    };
    let line = format!(
        "{USERS} users thinking {:.2} s on average: {} answers ({failed} with a coded error) = {:.1} answers/s; mutation -> final answer p50 {} ms, p90 {} ms, p99 {} ms, max {} ms (goal p99 < {} ms: {verdict})",
        think.as_secs_f64(),
        latency.len(),
        latency.len() as f64 / elapsed,
        ms(latency.quantile(0.5)),
        ms(latency.quantile(0.9)),
        ms(p99),
        ms(latency.quantile(1.0)),
        PACED_GOAL_P99.as_millis(),
    );
    Ok((users, line))
}

/// Exponentially distributed pauses from a small deterministic generator
/// (splitmix64): no dependency, and the same sequence every run.
struct ThinkTime {
    state: u64,
    mean: Duration,
}

impl ThinkTime {
    fn new(seed: u64, mean: Duration) -> Self {
        Self {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03,
            mean,
        }
    }

    fn next(&mut self) -> Duration {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // A uniform in (0, 1], then the inverse of the exponential's CDF.
        let uniform = ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        self.mean.mul_f64(-uniform.ln())
    }
}

/// Asks one question of `kind` and checks the answer's text.
async fn ask(
    system: &System,
    user: &mut BenchUser,
    integrity: &Integrity,
    kind: Kind,
) -> anyhow::Result<Answer> {
    ask_raw(
        system,
        user,
        integrity,
        kind.question(),
        Some(kind.expected()),
    )
    .await
}

/// Sends `content` with the user's `clientSubscriptionId` and reads the
/// subscription until the full answer arrives, checking chunk order and
/// noticing copies of earlier answers.
async fn ask_raw(
    system: &System,
    user: &mut BenchUser,
    integrity: &Integrity,
    content: &str,
    expected: Option<&str>,
) -> anyhow::Result<Answer> {
    let sent = Instant::now();
    let accepted = system
        .ask_with_subscription_at(
            &user.web_url,
            &user.token,
            json!({ "content": content }),
            &user.client_subscription_id,
        )
        .await?;
    let request_id = accepted["requestId"]
        .as_str()
        .with_context(|| format!("aiAction refused: {accepted}"))?
        .to_owned();
    if expected.is_some() {
        integrity.requests.fetch_add(1, Ordering::Relaxed);
    }
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    let mut next_chunk = 1;
    let mut first_chunk = None;
    loop {
        let Ok(Some((at, message))) = tokio::time::timeout_at(deadline, user.inbox.recv()).await
        else {
            integrity
                .missing_on_subscription
                .fetch_add(1, Ordering::Relaxed);
            bail!("no answer to {request_id} within {ANSWER_TIMEOUT:?}");
        };
        if message["role"] != "ASSISTANT" {
            continue;
        }
        let id = message["requestId"].as_str().unwrap_or_default();
        if id != request_id {
            if user.answered.contains(id) && message["chunkId"].is_null() {
                integrity
                    .duplicated_on_subscription
                    .fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        match message["chunkId"].as_i64() {
            Some(chunk) => {
                first_chunk.get_or_insert(at.saturating_duration_since(sent));
                if chunk != next_chunk {
                    integrity
                        .chunks_out_of_order
                        .fetch_add(1, Ordering::Relaxed);
                }
                next_chunk = chunk + 1;
            }
            None => {
                user.answered.insert(request_id.clone());
                let errors = message["errors"].as_array().is_some_and(|e| !e.is_empty());
                let content_ok = expected.is_none_or(|e| message["content"] == e);
                if errors {
                    integrity.coded_errors.fetch_add(1, Ordering::Relaxed);
                } else if !content_ok {
                    bail!("unexpected answer to {content:?}: {message}");
                }
                return Ok(Answer {
                    latency: at.saturating_duration_since(sent),
                    first_chunk,
                    ok: !errors,
                });
            }
        }
    }
}

/// `MUTATION_CLIENTS` clients each sending `aiAction` as fast as it is
/// answered for [`MUTATION_PHASE`]; then waits until the worker has answered
/// every question (each one stored once).
async fn mutations(system: &Arc<System>, users: &[BenchUser]) -> anyhow::Result<String> {
    Kind::Direct.script(system);
    let deadline = Instant::now() + MUTATION_PHASE;
    let wall = Instant::now();
    let tasks = users.iter().take(MUTATION_CLIENTS).map(|user| {
        let system = system.clone();
        let token = user.token.clone();
        tokio::spawn(async move {
            let mut latency = Latencies::default();
            let mut ids = Vec::new();
            let mut refused = 0u64;
            while Instant::now() < deadline {
                let sent = Instant::now();
                let accepted = system
                    .ask(&token, json!({ "content": "What is a merge train?" }))
                    .await?;
                latency.push(sent.elapsed());
                match accepted["requestId"].as_str() {
                    Some(id) => ids.push(id.to_owned()),
                    None => refused += 1,
                }
            }
            Ok::<_, anyhow::Error>((latency, ids, refused))
        })
    });
    let mut latency = Latencies::default();
    let mut ids = Vec::new();
    let mut refused = 0;
    for joined in join_all(tasks).await {
        let (l, i, r) = joined??;
        latency.extend(&l);
        ids.extend(i);
        refused += r;
    }
    let elapsed = wall.elapsed();
    let accepted = ids.len();

    // Every accepted question must get exactly one stored answer.
    let drain_started = Instant::now();
    let db = system.db.client().await?;
    let uuids: Vec<uuid::Uuid> = ids.iter().filter_map(|i| i.parse().ok()).collect();
    let mut answered = 0i64;
    while drain_started.elapsed() < Duration::from_secs(300) {
        answered = db
            .query_one(
                "SELECT count(DISTINCT request_xid) FROM ai_conversation_messages WHERE role = 2 AND request_xid = ANY($1)",
                &[&uuids],
            )
            .await?
            .get(0);
        if answered as usize >= accepted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained = drain_started.elapsed();
    let line = format!(
        "aiAction mutation, {MUTATION_CLIENTS} concurrent clients for {:.1} s: {} accepted = {:.0} req/s, p50 {} ms, p99 {} ms, refused {refused}; the worker then answered all {} of them {:.1} s after the last mutation ({} unanswered)",
        elapsed.as_secs_f64(),
        accepted,
        accepted as f64 / elapsed.as_secs_f64(),
        ms(latency.quantile(0.5)),
        ms(latency.quantile(0.99)),
        answered,
        drained.as_secs_f64(),
        accepted.saturating_sub(answered as usize)
    );
    println!("\n{line}");
    Ok(line)
}

/// Requests whose question has no stored answer, and answers stored more than
/// once, over the whole database (the fan-out probes are never stored).
async fn stored_answer_counts(system: &System) -> anyhow::Result<(u64, u64)> {
    let db = system.db.client().await?;
    let row = db
        .query_one(
            "SELECT
               (SELECT count(*) FROM ai_conversation_messages q
                 WHERE q.role = 1 AND q.content NOT IN ('/reset', '/clear')
                   AND NOT EXISTS (SELECT 1 FROM ai_conversation_messages a
                                    WHERE a.role = 2 AND a.request_xid = q.request_xid)),
               (SELECT count(*) FROM (SELECT request_xid FROM ai_conversation_messages
                                       WHERE role = 2 GROUP BY request_xid HAVING count(*) > 1) d)",
            &[],
        )
        .await?;
    let missing: i64 = row.get(0);
    let duplicated: i64 = row.get(1);
    Ok((missing as u64, duplicated as u64))
}
