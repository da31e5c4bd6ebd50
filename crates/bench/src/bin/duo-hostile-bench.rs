//! `./dev bench hostile`: what the most expensive requests the limits still
//! allow cost, measured on real processes (release builds).
//!
//! - Monolith: anonymous GraphQL documents at the edge of the limits (the
//!   standard introspection query, three nested introspection lists, a
//!   fragment bomb that must be refused): largest answer, latency, the web
//!   process's memory growth.
//! - Monolith: the largest allowed batch (10 documents whose complexity adds up
//!   to the signed-in limit).
//! - Gateway: the largest agent request the schema allows (199 turns, 50
//!   scratchpad steps, ~2.5 MB), answered by the fake provider at once: CPU time
//!   and peak memory of the gateway per request.
//!
//! - Monolith: a flood of the largest allowed requests ([`FLOOD`] of them,
//!   [`FLOOD_CLIENTS`] at a time: standard introspection, the largest batch,
//!   a JSON body at the 4 MB limit): the web process's RSS before, right
//!   after, and once it settled.
//!
//! Goals (issue "Hostile input"): no anonymous answer above 1 MB nor 50 MB of
//! added memory; the largest agent request under 50 ms of gateway CPU; RSS back
//! within 20% of where it started; after the flood, the web process's RSS
//! within 2x of its start.

use std::time::{Duration, Instant};

use anyhow::Context;
use bench::{Latencies, cpu_time, mb, ms, peak_rss_kib, read_status_kib};
use e2e_tests::{Options, System};
use serde_json::{Value, json};

const ROUNDS: usize = 30;
/// Requests of the flood, and how many are in flight at once.
const FLOOD: usize = 2000;
const FLOOD_CLIENTS: usize = 8;
/// How long the web process is watched handing memory back after the flood.
const SETTLE: Duration = Duration::from_secs(20);
/// The JSON body limit of the monolith's REST API.
const JSON_LIMIT_BYTES: usize = 4 * 1024 * 1024;

fn rss_kib(pid: u32) -> u64 {
    read_status_kib(&format!("/proc/{pid}/status"), "VmRSS:").unwrap_or(0)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "MISSED" }
}

/// One fragment chain on `__Type`, each level spreading the next `fanout` times.
fn fragment_bomb(levels: usize, fanout: usize) -> String {
    let mut doc = String::from("query { __schema { types { ...F0 } } }");
    for level in 0..levels {
        let spreads = format!("...F{} ", level + 1).repeat(fanout);
        doc.push_str(&format!(" fragment F{level} on __Type {{ name {spreads}}}"));
    }
    doc.push_str(&format!(
        " fragment F{levels} on __Type {{ name kind description }}"
    ));
    doc
}

const INTROSPECTION: &str = "query IntrospectionQuery { __schema { queryType { name } mutationType { name } subscriptionType { name }
  types { ...FullType } directives { name description locations args { ...InputValue } } } }
fragment FullType on __Type { kind name description
  fields(includeDeprecated: true) { name description args { ...InputValue } type { ...TypeRef } isDeprecated deprecationReason }
  inputFields { ...InputValue } interfaces { ...TypeRef }
  enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason } possibleTypes { ...TypeRef } }
fragment InputValue on __InputValue { name description type { ...TypeRef } defaultValue }
fragment TypeRef on __Type { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } } }";

const NESTED_INTROSPECTION: &str = "{ __schema { types { name fields { name type { name fields { name type { name fields { name } } } } } } } }";

async fn graphql_round(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    body: &Value,
) -> anyhow::Result<(Duration, usize, String)> {
    let started = Instant::now();
    let mut req = http.post(url).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let text = req.send().await?.text().await?;
    let elapsed = started.elapsed();
    let code = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| {
            let first = if v.is_array() { v[0].clone() } else { v };
            first["errors"][0]["extensions"]["code"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "none".into());
    Ok((elapsed, text.len(), code))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bench::run_until_stopped(run_bench()).await
}

async fn run_bench() -> anyhow::Result<()> {
    println!(
        "starting PostgreSQL, duo-gateway, duo-monolith web and worker (release builds) and the fake provider"
    );
    let system = System::start_with(Options {
        gateway_env: vec![
            // The bench sends agent requests straight to the gateway, as a debug caller.
            (
                "AIGW_AUTH__BYPASS_EXTERNAL_WITH_HEADER".into(),
                "true".into(),
            ),
            ("AIGW_LOGGING__LEVEL".into(), "warn".into()),
        ],
        monolith_env: vec![("RUST_LOG".into(), "warn".into())],
        ..Options::default()
    })
    .await
    .context("starting the system")?;
    system.fake.set_recording(false);
    system
        .fake
        .set_default_text("Thought: fine.\nFinal Answer: done.");
    let http = reqwest::Client::new();
    let web_pid = system.web.pid().context("web pid")?;
    let gateway_pid = system.gateway.pid().context("gateway pid")?;
    let graphql = format!("{}/api/graphql", system.web_url);
    let alice = system.token("alice")?;

    // ---- monolith: anonymous GraphQL at the limits ------------------------
    println!("\n== monolith: anonymous GraphQL at the limits ({ROUNDS} rounds each)");
    let web_start = rss_kib(web_pid);
    let mut largest_answer = 0usize;
    for (name, doc) in [
        ("standard introspection", INTROSPECTION.to_owned()),
        (
            "3 nested introspection lists",
            NESTED_INTROSPECTION.to_owned(),
        ),
        ("fragment bomb 6x6 (refused)", fragment_bomb(6, 6)),
        ("fragment bomb 8x8 (refused)", fragment_bomb(8, 8)),
    ] {
        let mut times = Latencies::default();
        let mut size = 0;
        let mut code = String::new();
        for _ in 0..ROUNDS {
            let (elapsed, bytes, c) =
                graphql_round(&http, &graphql, None, &json!({ "query": doc })).await?;
            times.push(elapsed);
            size = bytes;
            code = c;
        }
        largest_answer = largest_answer.max(size);
        println!(
            "{name:<32} answer {size:>7} bytes, error code {code:<18} p50 {} ms, p99 {} ms",
            ms(times.quantile(0.5)),
            ms(times.quantile(0.99))
        );
    }
    let web_peak = peak_rss_kib(web_pid).unwrap_or(0);
    let web_added = web_peak.saturating_sub(web_start);
    println!(
        "web RSS at start {}, peak {} (added {}), largest anonymous answer {} bytes: {} (goal: <= 1 MB answer, <= 50 MB added)",
        mb(web_start),
        mb(web_peak),
        mb(web_added),
        largest_answer,
        verdict(largest_answer <= 1024 * 1024 && web_added <= 50 * 1024)
    );

    // ---- monolith: the largest allowed batch -------------------------------
    let per_document = format!("query {{ currentUser {{ {} }} }}", "username ".repeat(24));
    let batch = Value::Array(vec![json!({ "query": per_document }); 10]);
    let mut times = Latencies::default();
    let mut codes = String::new();
    for _ in 0..ROUNDS {
        let (elapsed, _, code) = graphql_round(&http, &graphql, Some(&alice), &batch).await?;
        times.push(elapsed);
        codes = code;
    }
    println!(
        "\n== monolith: largest allowed batch (10 documents, complexity 250 in all): p50 {} ms, p99 {} ms, error code {codes}",
        ms(times.quantile(0.5)),
        ms(times.quantile(0.99))
    );
    let too_big = Value::Array(vec![
        json!({ "query": "{ currentUser { username } }" });
        500
    ]);
    let (elapsed, _, code) = graphql_round(&http, &graphql, Some(&alice), &too_big).await?;
    println!("a batch of 500: refused with {code} in {} ms", ms(elapsed));

    // ---- monolith: a flood of the largest allowed requests -----------------
    flood_web(&http, &system.web_url, &alice, &batch, web_pid, web_start).await?;

    // ---- gateway: the largest allowed agent request ------------------------
    let text = "w".repeat(9_000);
    let turns: Vec<Value> = (0..199)
        .map(|i| {
            let role = if (199 - i) % 2 == 1 {
                "user"
            } else {
                "assistant"
            };
            json!({ "role": role, "content": text })
        })
        .collect();
    let steps: Vec<Value> = (0..50)
        .map(|i| json!({ "thought": "thinking", "tool": "issue_reader", "tool_input": i.to_string(), "observation": "o".repeat(10_000) }))
        .collect();
    let agent_body = json!({
        "messages": turns,
        "options": { "agent_scratchpad": { "agent_type": "react", "steps": steps } },
    })
    .to_string();
    let agent_url = format!("{}/v2/chat/agent", system.gateway_url);
    let send = || {
        http.post(&agent_url)
            .header("Bypass-Auth", "true")
            .header("content-type", "application/json")
            .body(agent_body.clone())
            .send()
    };
    // Warm-up: prompt templates compiled, connections open.
    let status = send().await?.status();
    anyhow::ensure!(status.is_success(), "the agent request failed: {status}");
    let gw_start = rss_kib(gateway_pid);
    let mut cpu = Latencies::default();
    let mut times = Latencies::default();
    for _ in 0..ROUNDS {
        let before = cpu_time(gateway_pid).unwrap_or_default();
        let started = Instant::now();
        let response = send().await?;
        let _ = response.bytes().await?;
        times.push(started.elapsed());
        cpu.push(
            cpu_time(gateway_pid)
                .unwrap_or_default()
                .saturating_sub(before),
        );
    }
    let gw_peak = peak_rss_kib(gateway_pid).unwrap_or(0);
    // Allocators give memory back with a delay (jemalloc: about 10 s): read
    // RSS until it settles, at most 20 s.
    let settle_until = Instant::now() + Duration::from_secs(20);
    let mut gw_end = rss_kib(gateway_pid);
    while gw_end as f64 > gw_start as f64 * 1.2 && Instant::now() < settle_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        gw_end = rss_kib(gateway_pid);
    }
    println!(
        "\n== gateway: largest allowed agent request ({} bytes, 199 turns, 50 steps), {ROUNDS} rounds",
        agent_body.len()
    );
    // /proc counts CPU in 10 ms ticks: the mean over all rounds is the figure.
    let mean_cpu = cpu.sum() / ROUNDS as u32;
    println!(
        "gateway CPU per request: mean {} ms over {ROUNDS} rounds (ticks of 10 ms; max {} ms) (goal < 50 ms: {}); wall p50 {} ms, p99 {} ms",
        ms(mean_cpu),
        ms(cpu.quantile(1.0)),
        verdict(mean_cpu < Duration::from_millis(50)),
        ms(times.quantile(0.5)),
        ms(times.quantile(0.99))
    );
    let back = gw_end as f64 <= gw_start as f64 * 1.2;
    println!(
        "gateway RSS at start {}, peak {}, after {}: {} (goal: back within 20% of the start)",
        mb(gw_start),
        mb(gw_peak),
        mb(gw_end),
        verdict(back)
    );
    let web_end = rss_kib(web_pid);
    println!(
        "web RSS after the bench {} (start {}): {}",
        mb(web_end),
        mb(web_start),
        verdict(web_end as f64 <= web_start as f64 * 1.2)
    );
    Ok(())
}

/// One request of the flood: the `i`th of a cycle of the largest requests
/// the limits let through; its status.
async fn flood_request(
    http: &reqwest::Client,
    web_url: &str,
    token: &str,
    batch: &Value,
    big_body: &str,
    i: usize,
) -> anyhow::Result<u16> {
    let graphql = format!("{web_url}/api/graphql");
    let request = match i % 3 {
        0 => http.post(&graphql).json(&json!({ "query": INTROSPECTION })),
        1 => http.post(&graphql).bearer_auth(token).json(batch),
        // A body at the JSON limit, parsed whole, for a project that does
        // not exist: nothing is stored, everything is read.
        _ => http
            .post(format!("{web_url}/api/v4/projects/999999/issues"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(big_body.to_owned()),
    };
    let response = request.send().await?;
    let status = response.status().as_u16();
    let _ = response.bytes().await?;
    Ok(status)
}

async fn flood_web(
    http: &reqwest::Client,
    web_url: &str,
    token: &str,
    batch: &Value,
    web_pid: u32,
    web_start: u64,
) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    // The largest JSON body accepted, minus room for the envelope.
    let description = "d".repeat(JSON_LIMIT_BYTES - 1024);
    let big_body = json!({ "title": "flood", "description": description }).to_string();
    let before = rss_kib(web_pid);
    let started = Instant::now();
    let statuses: Vec<anyhow::Result<u16>> = futures::stream::iter(0..FLOOD)
        .map(|i| flood_request(http, web_url, token, batch, &big_body, i))
        .buffer_unordered(FLOOD_CLIENTS)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let mut by_status = std::collections::BTreeMap::new();
    for status in statuses {
        *by_status.entry(status?).or_insert(0usize) += 1;
    }
    let after = rss_kib(web_pid);
    let peak = peak_rss_kib(web_pid).unwrap_or(0);
    // The allocator hands freed pages back on its own schedule (its decay
    // time): watch RSS for SETTLE, note when it was first within the goal.
    let settle_started = Instant::now();
    let mut within_goal_after = (after <= web_start * 2).then_some(Duration::ZERO);
    let mut settled = after;
    while settle_started.elapsed() < SETTLE {
        tokio::time::sleep(Duration::from_millis(250)).await;
        settled = rss_kib(web_pid);
        if within_goal_after.is_none() && settled <= web_start * 2 {
            within_goal_after = Some(settle_started.elapsed());
        }
    }
    let ratio = |kib: u64| kib as f64 / web_start.max(1) as f64;
    println!(
        "\n== monolith: a flood of {FLOOD} of the largest allowed requests ({FLOOD_CLIENTS} at a time: introspection, largest batch, {} MB JSON body) in {:.1} s; statuses {by_status:?}",
        JSON_LIMIT_BYTES / (1024 * 1024),
        elapsed.as_secs_f64()
    );
    let first_within = within_goal_after.map_or_else(
        || "never".to_owned(),
        |d| format!("after {:.1} s", d.as_secs_f64()),
    );
    println!(
        "web RSS at start {}, before the flood {}, peak {}, right after {} ({:.2}x the start), {} s later {} ({:.2}x; within 2x {first_within}): {} (goal: within 2x of the start)",
        mb(web_start),
        mb(before),
        mb(peak),
        mb(after),
        ratio(after),
        SETTLE.as_secs(),
        mb(settled),
        ratio(settled),
        verdict(settled <= web_start * 2)
    );
    Ok(())
}
