//! `./dev bench agent-tools`: how well the bundled model takes the chat
//! agent's first step. Labelled questions over the demo data go through a
//! real gateway to a real bundled model server, once with native tool
//! calling (the local default) and once with the ReAct text format; the
//! bench prints the share of well-formed first steps and of correct tool
//! choices for each.
//!
//! With `--grounding` it measures whole answers instead
//! ([`bench::grounding`]): held-out questions naming issues, merge requests,
//! epics, jobs, commits, files and a directory (and a few naming nothing) go
//! through GraphQL `aiAction`, the monolith, the gateway and the bundled
//! model; printed are the share with the right context or tool, the share of
//! grounded answers (holding the resource's facts), latency p50/p99 and the
//! load average. `--all` runs the first-step modes and then the grounding.
//!
//! Options: `--limit N` asks only the first N questions; `--only native` or
//! `--only react` runs one mode; `--timeout SECS` bounds one grounded answer
//! (600 s); `DUO_BENCH_VERBOSE=1` prints every step or answer. The model
//! server inherits the environment (`DUO_LOCAL_LLM_THREADS`, ...).

use anyhow::{Context, bail};
use bench::{Latencies, load_average, ms};
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The first step a question should lead to.
#[derive(Debug, Clone, Copy)]
enum Expected {
    /// This tool, with an input naming this identifier (its digits or text).
    Tool(&'static str, &'static str),
    /// An answer without a tool.
    Direct,
}

use Expected::{Direct, Tool};

/// Questions over the demo seed data (`crates/monolith/src/seed`): issues
/// acme/platform/api#1 and #2, acme/website#1, hobby/notes#1, merge request
/// acme/platform/api!1, epic &1 of acme, the api pipeline's builds.
const QUESTIONS: &[(&str, Expected)] = &[
    (
        "Summarize issue #1 in acme/platform/api",
        Tool("issue_reader", "1"),
    ),
    (
        "What is issue acme/website#1 about?",
        Tool("issue_reader", "1"),
    ),
    (
        "Summarize issue acme/platform/api#2",
        Tool("issue_reader", "2"),
    ),
    (
        "Who should fix issue #2 of the api project?",
        Tool("issue_reader", "2"),
    ),
    (
        "List the steps to reproduce in issue #1",
        Tool("issue_reader", "1"),
    ),
    (
        "Is issue hobby/notes#1 a feature request or a bug?",
        Tool("issue_reader", "1"),
    ),
    ("What labels does issue #2 have?", Tool("issue_reader", "2")),
    (
        "Explain the problem described in issue #1",
        Tool("issue_reader", "1"),
    ),
    (
        "Write a short reply to issue acme/website#1",
        Tool("issue_reader", "1"),
    ),
    (
        "How severe is the security issue #2?",
        Tool("issue_reader", "2"),
    ),
    ("Suggest a fix for issue #1", Tool("issue_reader", "1")),
    (
        "Read issue 2 and tell me what leaks",
        Tool("issue_reader", "2"),
    ),
    (
        "What does merge request !1 change?",
        Tool("merge_request_reader", "1"),
    ),
    (
        "Summarize merge request acme/platform/api!1",
        Tool("merge_request_reader", "1"),
    ),
    (
        "Review the diff of merge request !1",
        Tool("merge_request_reader", "1"),
    ),
    (
        "Which issue does merge request !1 fix?",
        Tool("merge_request_reader", "1"),
    ),
    (
        "Is merge request !1 ready to merge?",
        Tool("merge_request_reader", "1"),
    ),
    (
        "Explain the code change in MR !1",
        Tool("merge_request_reader", "1"),
    ),
    (
        "Write a description for merge request !1",
        Tool("merge_request_reader", "1"),
    ),
    ("What is epic &1 about?", Tool("epic_reader", "1")),
    ("Summarize epic acme&1", Tool("epic_reader", "1")),
    (
        "Which sign-in methods does epic &1 plan?",
        Tool("epic_reader", "1"),
    ),
    ("What is left to do in epic &1?", Tool("epic_reader", "1")),
    (
        "Describe the goal of epic &1 in one sentence",
        Tool("epic_reader", "1"),
    ),
    ("Who created epic &1?", Tool("epic_reader", "1")),
    ("Why did build 2 fail?", Tool("build_reader", "2")),
    ("Summarize the log of build 1", Tool("build_reader", "1")),
    ("Which test failed in build 2?", Tool("build_reader", "2")),
    ("How long did build 1 take?", Tool("build_reader", "1")),
    ("Explain the error in job 2", Tool("build_reader", "2")),
    (
        "How do I fix the failure in build 2?",
        Tool("build_reader", "2"),
    ),
    (
        "How do I protect a branch in GitLab?",
        Tool("gitlab_documentation", ""),
    ),
    (
        "How do I configure a CI/CD cache in GitLab?",
        Tool("gitlab_documentation", ""),
    ),
    (
        "What are GitLab merge request approval rules?",
        Tool("gitlab_documentation", ""),
    ),
    (
        "How do I add a member to a GitLab group?",
        Tool("gitlab_documentation", ""),
    ),
    (
        "How can I schedule a pipeline in GitLab?",
        Tool("gitlab_documentation", ""),
    ),
    (
        "What is a GitLab runner and how do I register one?",
        Tool("gitlab_documentation", ""),
    ),
    (
        "How do I enable two-factor authentication in GitLab?",
        Tool("gitlab_documentation", ""),
    ),
    (
        "How do I create a GitLab personal access token?",
        Tool("gitlab_documentation", ""),
    ),
    ("Hello!", Direct),
    ("Write a Python function that reverses a string", Direct),
    (
        "What is the difference between a list and a tuple in Python?",
        Direct,
    ),
    ("Translate 'good morning' into French", Direct),
    ("Explain what a hash map is", Direct),
    ("Thank you, that helped", Direct),
    ("Write a haiku about code review", Direct),
    ("What does HTTP status 404 mean?", Direct),
];

/// What the first step came out as.
#[derive(Debug)]
enum Step {
    Action {
        tool: String,
        input: String,
    },
    Answer,
    /// Neither format (`unknown`), an error, or nothing.
    Malformed(String),
}

fn sibling(name: &str) -> anyhow::Result<std::path::PathBuf> {
    Ok(std::env::current_exe()?
        .parent()
        .context("no directory for the bench")?
        .join(name))
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_ok(client: &reqwest::Client, url: &str, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{what} did not become ready")
}

fn start_model_server() -> anyhow::Result<(Process, String)> {
    let port = e2e_tests::free_port()?;
    let mut command = Command::new(sibling("duo-local-llm")?);
    command
        .env("DUO_LOCAL_LLM_ADDR", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null());
    let child = command.spawn().context("starting duo-local-llm")?;
    Ok((Process(child), format!("http://127.0.0.1:{port}")))
}

fn start_gateway(model_server: &str, react: bool) -> anyhow::Result<(Process, String)> {
    let port = e2e_tests::free_port()?;
    let mut command = Command::new(sibling("duo-gateway")?);
    command
        .env_clear()
        .env("AIGW_FASTAPI__API_PORT", port.to_string())
        .env("AIGW_WORKFLOW_SERVICE__LISTEN", "")
        .env("AIGW_AUTH__BYPASS_EXTERNAL", "true")
        .env("AIGW_LOCAL_LLM__URL", format!("{model_server}/v1"))
        .env("AIGW_LOGGING__LEVEL", "error")
        .stdout(Stdio::null());
    if react {
        command.env("AIGW_DEFAULT_PROMPTS", r#"{"chat/react": "openai"}"#);
    }
    let child = command.spawn().context("starting duo-gateway")?;
    Ok((Process(child), format!("http://127.0.0.1:{port}")))
}

async fn first_step(client: &reqwest::Client, gateway: &str, question: &str) -> Step {
    let response = client
        .post(format!("{gateway}/v2/chat/agent"))
        .header("x-gitlab-version", "18.0.0")
        .json(&json!({"messages": [{"role": "user", "content": question}]}))
        .send()
        .await;
    let body = match response {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => return Step::Malformed(format!("request failed: {e}")),
    };
    let mut answered = false;
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        let event: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        match event["type"].as_str() {
            Some("action") => {
                return Step::Action {
                    tool: event["data"]["tool"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    input: event["data"]["tool_input"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                };
            }
            Some("final_answer_delta") => {
                answered |= event["data"]["text"]
                    .as_str()
                    .is_some_and(|t| !t.trim().is_empty());
            }
            Some(other) => return Step::Malformed(format!("{other}: {}", event["data"])),
            None => return Step::Malformed(format!("not an event: {line}")),
        }
    }
    if answered {
        Step::Answer
    } else {
        Step::Malformed("no answer".into())
    }
}

fn correct(step: &Step, expected: Expected) -> bool {
    match (step, expected) {
        (Step::Action { tool, input }, Tool(name, id)) => tool == name && input.contains(id),
        (Step::Answer, Direct) => true,
        _ => false,
    }
}

struct Tally {
    asked: usize,
    well_formed: usize,
    correct: usize,
    latencies: Latencies,
    /// Why the malformed first steps were malformed.
    malformed: Vec<String>,
}

async fn run_mode(
    client: &reqwest::Client,
    gateway: &str,
    questions: &[(&str, Expected)],
    label: &str,
) -> Tally {
    let mut tally = Tally {
        asked: 0,
        well_formed: 0,
        correct: 0,
        latencies: Latencies::default(),
        malformed: Vec::new(),
    };
    for (question, expected) in questions {
        let started = Instant::now();
        let step = first_step(client, gateway, question).await;
        tally.latencies.push(started.elapsed());
        tally.asked += 1;
        tally.well_formed += usize::from(!matches!(step, Step::Malformed(_)));
        if let Step::Malformed(reason) = &step {
            tally.malformed.push(reason.clone());
        }
        let right = correct(&step, *expected);
        tally.correct += usize::from(right);
        if std::env::var_os("DUO_BENCH_VERBOSE").is_some() {
            println!(
                "  [{label}] {} {question:?} -> {step:?}",
                if right { "ok " } else { "BAD" }
            );
        }
    }
    tally
}

fn percent(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// What a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Measure {
    FirstStep,
    Grounding,
    Both,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bench::run_until_stopped(run_bench()).await
}

async fn run_bench() -> anyhow::Result<()> {
    let mut limit: Option<usize> = None;
    let mut only: Option<String> = None;
    let mut measure = Measure::FirstStep;
    let mut timeout = Duration::from_secs(600);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--grounding" => measure = Measure::Grounding,
            "--all" => measure = Measure::Both,
            "--timeout" => {
                timeout = Duration::from_secs(
                    args.next()
                        .context("--timeout needs seconds")?
                        .parse()
                        .context("--timeout needs seconds")?,
                );
            }
            "--only" => {
                let mode = args.next().context("--only needs native or react")?;
                if mode != "native" && mode != "react" {
                    bail!("--only needs native or react");
                }
                only = Some(mode);
            }
            "--limit" => {
                limit = Some(
                    args.next()
                        .context("--limit needs a number")?
                        .parse()
                        .context("--limit needs a number")?,
                );
            }
            other => bail!(
                "unknown option {other}; use --grounding, --all, --limit N, --only native|react or --timeout SECS"
            ),
        }
    }
    let verbose = std::env::var_os("DUO_BENCH_VERBOSE").is_some();
    if measure != Measure::Grounding {
        first_steps(limit.unwrap_or(QUESTIONS.len()), only.as_deref()).await?;
    }
    if measure != Measure::FirstStep {
        let summary = bench::grounding::run(&bench::grounding::RunOptions {
            limit: limit.unwrap_or(bench::grounding::CASES.len()),
            timeout,
            verbose,
        })
        .await?;
        summary.print();
    }
    Ok(())
}

/// The first step of each labelled question, natively and in ReAct text.
async fn first_steps(limit: usize, only: Option<&str>) -> anyhow::Result<()> {
    let questions = &QUESTIONS[..limit.min(QUESTIONS.len())];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let (_model, model_url) = start_model_server()?;
    wait_ok(&client, &format!("{model_url}/health"), "duo-local-llm").await?;
    let (_native_gw, native_url) = start_gateway(&model_url, false)?;
    let (_react_gw, react_url) = start_gateway(&model_url, true)?;
    for url in [&native_url, &react_url] {
        wait_ok(&client, &format!("{url}/monitoring/healthz"), "duo-gateway").await?;
    }
    println!(
        "agent-tools: {} labelled questions, first step only, through duo-gateway to the bundled model (duo-local-llm); load average {}",
        questions.len(),
        load_average()
    );
    let wanted = |mode: &str| only.is_none_or(|o| o == mode);
    let none: &[(&str, Expected)] = &[];
    let native = run_mode(
        &client,
        &native_url,
        if wanted("native") { questions } else { none },
        "native",
    )
    .await;
    let react = run_mode(
        &client,
        &react_url,
        if wanted("react") { questions } else { none },
        "react",
    )
    .await;
    println!(
        "{:<28} {:>12} {:>16} {:>10} {:>10}",
        "mode", "well-formed", "correct choice", "p50", "p90"
    );
    for (name, tally) in [
        ("native tool calls (default)", &native),
        ("ReAct text", &react),
    ] {
        if tally.asked == 0 {
            continue;
        }
        println!(
            "{:<28} {:>11.1}% {:>15.1}% {:>10} {:>10}",
            name,
            percent(tally.well_formed, tally.asked),
            percent(tally.correct, tally.asked),
            ms(tally.latencies.quantile(0.5)),
            ms(tally.latencies.quantile(0.9)),
        );
    }
    for (name, tally) in [("native", &native), ("react", &react)] {
        for reason in tally.malformed.iter().take(3) {
            println!(
                "  {name} malformed: {}",
                reason.chars().take(160).collect::<String>()
            );
        }
    }
    println!("goals: well-formed 100%, correct choice >= 80% with native tool calls");
    Ok(())
}
