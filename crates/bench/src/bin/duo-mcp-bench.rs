//! `./dev bench mcp`: what the MCP server costs over the REST API it wraps.
//!
//! - One issue read 300 times each way, taken in turns on one connection each:
//!   `GET /api/v4/projects/:id/issues/:iid` with an `api` token, and
//!   `tools/call get_issue` on an initialized MCP session with an `mcp`
//!   token; p50/p99 of both and the ratio of the medians (goal: MCP within
//!   1.2x of REST).
//! - Sessions held: 500 sessions initialized and left open, the web
//!   process's resident memory before and after, sessions per MB.

use std::time::Instant;

use anyhow::{Context, ensure};
use bench::{Latencies, ms, read_status_kib};
use e2e_tests::{Options, System};
use serde_json::{Value, json};

/// Rounds of the latency comparison; `MCP_BENCH_ROUNDS` sets another count
/// (a long run to profile the web process with `perf`).
const ROUNDS: usize = 300;
const SESSIONS: usize = 500;

async fn mcp_post(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    session: Option<&str>,
    body: &Value,
) -> anyhow::Result<(Option<String>, Value)> {
    let mut request = http
        .post(url)
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .json(body);
    if let Some(s) = session {
        request = request.header("mcp-session-id", s);
    }
    let response = request.send().await?;
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = response.text().await?;
    ensure!(status.is_success(), "MCP answered {status}: {text}");
    if std::env::var("MCP_BENCH_DEBUG").is_ok() {
        eprintln!("{status} {text}");
    }
    let value = serde_json::from_str(&text)
        .or_else(|_| {
            // An SSE answer (a session's): the JSON-RPC message is the
            // non-empty `data:` line after the priming event.
            let data = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .find(|d| !d.trim().is_empty())
                .unwrap_or("null");
            serde_json::from_str(data.trim())
        })
        .unwrap_or(Value::Null);
    Ok((session, value))
}

/// An initialized session's id.
async fn open_session(http: &reqwest::Client, url: &str, token: &str) -> anyhow::Result<String> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"}}});
    let (session, _) = mcp_post(http, url, token, None, &init).await?;
    let session = session.context("no session id")?;
    mcp_post(
        http,
        url,
        token,
        Some(&session),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;
    Ok(session)
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    read_status_kib(&format!("/proc/{pid}/status"), "VmRSS:").context("no VmRSS")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bench::run_until_stopped(run_bench()).await
}

async fn run_bench() -> anyhow::Result<()> {
    let rounds = std::env::var("MCP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ROUNDS);
    // A long run needs more than the default 600 requests a minute per token.
    let system = System::start_with(Options {
        monolith_env: vec![("DUO_MCP_REQUESTS_PER_MINUTE".into(), "100000".into())],
        ..Options::default()
    })
    .await?;
    println!("web process: pid {:?}", system.web.pid());
    let api = system.token("alice")?;
    let mcp = system.new_token("alice", &["mcp"]).await?;
    let http = reqwest::Client::new();
    let url = format!("{}/api/v4/mcp", system.web_url);
    let rest_url = format!(
        "{}/api/v4/projects/acme%2Fplatform%2Fapi/issues/1",
        system.web_url
    );
    let session = open_session(&http, &url, &mcp).await?;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "get_issue", "arguments": {"id": "acme/platform/api", "issue_iid": 1}}});

    println!("== get_issue: REST versus MCP tools/call, {rounds} rounds in turns");
    let (mut rest, mut tool) = (Latencies::default(), Latencies::default());
    for round in 0..rounds + 20 {
        let started = Instant::now();
        let res = http
            .get(&rest_url)
            .header("PRIVATE-TOKEN", &api)
            .send()
            .await?;
        ensure!(res.status().is_success(), "REST: {}", res.status());
        res.bytes().await?;
        let rest_time = started.elapsed();
        let started = Instant::now();
        let (_, answer) = mcp_post(&http, &url, &mcp, Some(&session), &call).await?;
        let tool_time = started.elapsed();
        ensure!(answer["result"]["isError"] == false, "tools/call: {answer}");
        // The first rounds warm both paths up.
        if round >= 20 {
            rest.push(rest_time);
            tool.push(tool_time);
        }
    }
    let ratio = tool.quantile(0.5).as_secs_f64() / rest.quantile(0.5).as_secs_f64();
    println!(
        "REST           p50 {} ms  p99 {} ms",
        ms(rest.quantile(0.5)),
        ms(rest.quantile(0.99))
    );
    println!(
        "MCP tools/call p50 {} ms  p99 {} ms",
        ms(tool.quantile(0.5)),
        ms(tool.quantile(0.99))
    );
    println!(
        "ratio of medians {ratio:.2}x: {} (goal: within 1.2x)",
        if ratio <= 1.2 { "ok" } else { "MISSED" }
    );

    println!("\n== {SESSIONS} sessions held open");
    let pid = system.web.pid().context("web process has no pid")?;
    let before = rss_kib(pid)?;
    let mut held = Vec::with_capacity(SESSIONS);
    let mut token = String::new();
    for i in 0..SESSIONS {
        // Each token has its per-minute budget (600 requests by default).
        if i % 200 == 0 {
            token = system.new_token("alice", &["mcp"]).await?;
        }
        held.push(open_session(&http, &url, &token).await?);
    }
    let after = rss_kib(pid)?;
    let grown_mb = (after.saturating_sub(before)) as f64 / 1024.0;
    println!(
        "web RSS {} MB -> {} MB: {:.0} sessions per MB",
        before / 1024,
        after / 1024,
        SESSIONS as f64 / grown_mb.max(0.001)
    );
    Ok(())
}
