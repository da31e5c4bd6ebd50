//! `./dev bench git`: what serving repositories through the monolith costs.
//!
//! - A generated repository (5,000 files in 50 directories, 1,000 commits) is
//!   pushed to a project of a running monolith (release build).
//! - Clone through the monolith (authentication, policy, then `git
//!   http-backend`) versus `git http-backend` run directly by a bare CGI host in
//!   this program, same machine, same repository: median of 9 bare clones each, taken in turns,
//!   and the ratio (goal: within 1.1x).
//! - REST reads: tree, file and commits, p50/p99 over 200 sequential requests
//!   each (goal: p99 under 10 ms on 2 cores).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::{Context, bail};
use bench::{Latencies, load_average, ms};
use e2e_tests::System;
use futures::StreamExt as _;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const FILES: usize = 5_000;
const COMMITS: usize = 1_000;
const CLONES: usize = 9;
const REST_ROUNDS: usize = 200;

async fn git(cwd: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("git")
        .args(args)
        .current_dir(cwd)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", cwd)
        .output()
        .await?;
    if !out.status.success() {
        bail!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A `git fast-import` stream: the first commit adds every file, each later one
/// changes five of them.
fn history() -> String {
    let mut out = String::new();
    let file = |i: usize, version: usize| {
        format!(
            "// module {i}, revision {version}\npub fn value_{i}() -> usize {{\n    {}\n}}\n{}\n",
            i * 31 + version,
            "// padding line to give files a realistic size\n".repeat(20)
        )
    };
    for c in 0..COMMITS {
        let when = 1_700_000_000 + c * 600;
        out.push_str("commit refs/heads/main\n");
        out.push_str(&format!(
            "committer Bench <bench@example.com> {when} +0000\n"
        ));
        let message = format!("change {c}");
        out.push_str(&format!("data {}\n{message}\n", message.len()));
        let touched: Vec<usize> = if c == 0 {
            (0..FILES).collect()
        } else {
            (0..5).map(|k| (c * 7919 + k * 104_729) % FILES).collect()
        };
        for i in touched {
            let content = file(i, c);
            out.push_str(&format!(
                "M 100644 inline dir{:02}/file{i:04}.rs\ndata {}\n{content}\n",
                i % 50,
                content.len()
            ));
        }
    }
    out
}

async fn generate(dir: &Path) -> anyhow::Result<()> {
    git(dir, &["init", "-q", "-b", "main", "."]).await?;
    let mut child = tokio::process::Command::new("git")
        .args(["fast-import", "--quiet"])
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(history().as_bytes()).await?;
    drop(stdin);
    if !child.wait().await?.success() {
        bail!("fast-import failed");
    }
    git(dir, &["reset", "-q", "--hard", "main"]).await?;
    Ok(())
}

/// The comparison: `git http-backend` for one repository root, nothing else.
async fn direct_cgi(
    req: HttpRequest,
    root: web::Data<PathBuf>,
    mut body: web::Payload,
) -> HttpResponse {
    let path_info = req.path().to_owned();
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", root.get_ref())
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", req.method().as_str())
        .env("PATH_INFO", &path_info)
        .env("QUERY_STRING", req.query_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (header, var) in [
        ("content-type", "CONTENT_TYPE"),
        ("content-encoding", "HTTP_CONTENT_ENCODING"),
        ("git-protocol", "GIT_PROTOCOL"),
    ] {
        if let Some(v) = req.headers().get(header).and_then(|v| v.to_str().ok()) {
            command.env(var, v);
        }
    }
    let Ok(mut child) = command.spawn() else {
        return HttpResponse::InternalServerError().finish();
    };
    let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return HttpResponse::InternalServerError().finish();
    };
    while let Some(Ok(chunk)) = body.next().await {
        if stdin.write_all(&chunk).await.is_err() {
            break;
        }
    }
    drop(stdin);
    let mut head = Vec::new();
    let mut buf = [0u8; 8192];
    let split = loop {
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break (i, i + 4);
        }
        if let Some(i) = head.windows(2).position(|w| w == b"\n\n") {
            break (i, i + 2);
        }
        match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => return HttpResponse::InternalServerError().finish(),
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    };
    let mut response = HttpResponse::Ok();
    for line in String::from_utf8_lossy(&head[..split.0]).lines() {
        if let Some((name, value)) = line.split_once(':')
            && !name.eq_ignore_ascii_case("status")
        {
            response.insert_header((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    let first = bytes::Bytes::copy_from_slice(&head[split.1..]);
    let stream = async_stream::stream! {
        let _child = child;
        yield Ok::<_, std::io::Error>(first);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdout.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => yield Ok(bytes::Bytes::copy_from_slice(&buf[..n])),
                Err(e) => { yield Err(e); break; }
            }
        }
    };
    response.streaming(stream)
}

/// Waits until no background job is due or running; returns the kinds of
/// the jobs that ran meanwhile.
async fn wait_for_idle_jobs(system: &System) -> anyhow::Result<Vec<String>> {
    let db = system.db.client().await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen = std::collections::BTreeSet::new();
    loop {
        let rows = db
            .query(
                "SELECT DISTINCT kind FROM background_jobs
                 WHERE state = 'running' OR (state = 'pending' AND run_at <= now())",
                &[],
            )
            .await?;
        if rows.is_empty() {
            return Ok(seen.into_iter().collect());
        }
        seen.extend(rows.iter().map(|r| r.get::<_, String>(0)));
        anyhow::ensure!(
            Instant::now() < deadline,
            "background jobs still busy after 300 s: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Medians of `CLONES` runs of `git args… <url>` against each URL, taken in
/// turns (one against `a`, one against `b`, …) so that a slow spell of the
/// machine weighs on both sides alike.
async fn medians_in_turns(
    scratch: &Path,
    a: &str,
    b: &str,
    clone: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..CLONES {
        for (side, url) in [a, b].into_iter().enumerate() {
            let target = scratch.join(format!("clone-{}", uuid::Uuid::new_v4()));
            let target_text = target.display().to_string();
            let args: Vec<&str> = if clone {
                vec!["clone", "-q", "--bare", url, &target_text]
            } else {
                vec!["ls-remote", "-q", url]
            };
            let started = Instant::now();
            git(scratch, &args).await?;
            times[side].push(started.elapsed());
            let _ = std::fs::remove_dir_all(&target);
        }
    }
    let median = |mut list: Vec<Duration>| {
        list.sort();
        list[list.len() / 2]
    };
    let [first, second] = times;
    Ok((median(first), median(second)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bench::run_until_stopped(run_bench()).await
}

async fn run_bench() -> anyhow::Result<()> {
    println!("load average: {}", load_average());
    println!("starting PostgreSQL and the system (release builds)");
    let system = System::start().await.context("starting the system")?;
    let alice = system.token("alice")?;
    let scratch = std::env::temp_dir().join(format!("duo-git-bench-{}", std::process::id()));
    let source = scratch.join("source");
    std::fs::create_dir_all(&source)?;

    println!("generating a repository: {FILES} files, {COMMITS} commits");
    let started = Instant::now();
    generate(&source).await?;
    println!("  generated in {:.1} s", started.elapsed().as_secs_f64());

    let (status, acme) = system
        .rest(&alice, reqwest::Method::GET, "/groups/acme", None)
        .await?;
    anyhow::ensure!(status == 200, "acme: {acme}");
    let (status, project) = system
        .rest(
            &alice,
            reqwest::Method::POST,
            "/projects",
            Some(json!({ "name": "bench", "namespace_id": acme["id"], "visibility": "private" })),
        )
        .await?;
    anyhow::ensure!(status == 201, "project: {project}");
    let project_id = project["id"].as_i64().context("project id")?;
    let host = system.web_url.trim_start_matches("http://");
    let ours = format!("http://alice:{alice}@{host}/acme/bench.git");
    let started = Instant::now();
    git(&source, &["push", "-q", &ours, "main"]).await?;
    println!(
        "  pushed through the monolith in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // The push starts background work (the code index reads the new
    // files); the clones are timed once it is done, not against it.
    let started = Instant::now();
    let kinds = wait_for_idle_jobs(&system).await?;
    println!(
        "  background jobs after the push ({}) done in {:.1} s",
        if kinds.is_empty() {
            "none".to_owned()
        } else {
            kinds.join(", ")
        },
        started.elapsed().as_secs_f64()
    );

    // The direct host serves the very repository the monolith stores.
    let relative = monolith::repositories::Repositories::relative_path(project_id);
    let root = web::Data::new(system.repositories.clone());
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let direct_addr = listener.local_addr()?;
    let server = HttpServer::new(move || {
        App::new()
            .app_data(root.clone())
            .default_service(web::to(direct_cgi))
    })
    .workers(2)
    // As the monolith does, so the comparison is of git, not of Nagle.
    .on_connect(monolith::server::tcp_nodelay)
    .listen(listener)?
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    let direct = format!("http://{direct_addr}/{relative}");

    // Warm both (page cache, process start-up paths), then measure.
    medians_in_turns(&scratch, &direct, &ours, true).await?;
    let (through_direct, through_us) = medians_in_turns(&scratch, &direct, &ours, true).await?;
    // The fixed cost of a request (authentication, policy, starting git)
    // apart from the pack's transfer: ref advertisement only.
    let (ls_direct, ls_ours) = medians_in_turns(&scratch, &direct, &ours, false).await?;
    let ratio = through_us.as_secs_f64() / through_direct.as_secs_f64();
    println!(
        "\n== clone ({FILES} files, {COMMITS} commits), median of {CLONES} bare clones each, taken in turns"
    );
    println!("git http-backend directly: {} ms", ms(through_direct));
    println!("through the monolith:      {} ms", ms(through_us));
    println!(
        "(ref advertisement alone, git ls-remote, median of {}: directly {} ms, through the monolith {} ms)",
        CLONES,
        ms(ls_direct),
        ms(ls_ours)
    );
    println!(
        "ratio {ratio:.3}x: {} (goal: within 1.1x)",
        if ratio <= 1.1 { "ok" } else { "MISSED" }
    );

    println!("\n== REST reads, {REST_ROUNDS} sequential requests each");
    let http = reqwest::Client::new();
    let base = format!("{}/api/v4/projects/{project_id}/repository", system.web_url);
    let mut worst_p99 = Duration::ZERO;
    for (name, path) in [
        ("tree (root)", "/tree".to_owned()),
        ("tree (a directory)", "/tree?path=dir07".to_owned()),
        ("file", "/files/dir07%2Ffile0007.rs?ref=main".to_owned()),
        (
            "raw file",
            "/files/dir07%2Ffile0007.rs/raw?ref=main".to_owned(),
        ),
        ("commits (page 1)", "/commits?per_page=20".to_owned()),
        ("commit", "/commits/main".to_owned()),
    ] {
        let url = format!("{base}{path}");
        let mut times = Latencies::default();
        for _ in 0..REST_ROUNDS {
            let started = Instant::now();
            let res = http
                .get(&url)
                .header("PRIVATE-TOKEN", &alice)
                .send()
                .await?;
            let status = res.status();
            res.bytes().await?;
            times.push(started.elapsed());
            anyhow::ensure!(status.is_success(), "{name}: {status}");
        }
        let p99 = times.quantile(0.99);
        worst_p99 = worst_p99.max(p99);
        println!(
            "{name:<20} p50 {} ms  p99 {} ms",
            ms(times.quantile(0.5)),
            ms(p99)
        );
    }
    println!(
        "slowest p99 {} ms: {} (goal: under 10 ms)",
        ms(worst_p99),
        if worst_p99 < Duration::from_millis(10) {
            "ok"
        } else {
            "MISSED"
        }
    );
    handle.stop(true).await;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
