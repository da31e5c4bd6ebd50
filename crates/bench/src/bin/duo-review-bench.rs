//! `./dev bench review`: Duo Code Review against a labelled evaluation set
//! (`crates/bench/review-eval/`: small merge requests with one planted defect
//! each, labelled with file and line, and clean ones).
//!
//! The whole system runs (PostgreSQL, the web and worker processes, the
//! gateway); every case is a pair of branches in one project (`base-NN` with
//! the file before, `change-NN` with the change), a merge request between
//! them, the bot `GitLabDuo` assigned as its reviewer, and the bot's diff
//! notes read back from `GET …/merge_requests/:iid/discussions` once its
//! summary note is there. Printed per case and in total: planted defects
//! commented on their exact line and within ±2 lines, comments per merge
//! request, comments on clean merge requests (false ones), and the review
//! time from the assignment to the summary note (p50/p95).
//!
//! Options:
//! - `--model fake` (the default): the fake provider answers each file with
//!   the labelled line, so the figures measure the plumbing (diff line
//!   numbers, positions, posting, time), not a model; a few answers also
//!   carry deliberately wrong comments (a line outside the diff, no line, a
//!   line twice) that must all be dropped.
//! - `--model bundled`: the gateway uses the bundled model server
//!   (`duo-local-llm`, its default chat model).
//! - `--cases N`: N cases spread evenly over the set (clean ones included);
//!   `--only TEXT`: the cases whose name contains TEXT.
//! - `--timeout SECS`: how long one review may take (60 s fake, 900 s bundled).
//!   The review time is measured by polling the notes (every 20 ms with the
//!   fake model, 250 ms with the bundled one).
//! - `DUO_BENCH_VERBOSE=1` prints every comment the bot posted.
//! - The processes inherit the environment: `DUO_LOCAL_LLM_THREADS` and the
//!   like reach the model server, `DUO_AI_GATEWAY_TIMEOUT_SECS` (how long the
//!   monolith waits for one model answer, 60 s by default) the monolith.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use bench::{Latencies, load_average};
use e2e_tests::{Options, Service, System};
use serde_json::{Value, json};

/// The bot's username and the start of its summary note.
const BOT: &str = "GitLabDuo";
const SUMMARY: &str = "I reviewed this merge request.";
/// Largest change a case may make (added plus removed lines).
const MAX_CHANGED_LINES: usize = 30;

fn eval_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("review-eval")
}

/// One case of the evaluation set (`review-eval/cases/*.yaml`).
#[derive(Debug, Clone)]
struct Case {
    /// The file's name without `.yaml` (`01-py-off-by-one`).
    name: String,
    title: String,
    file: String,
    language: String,
    kind: String,
    /// The planted defect's line in the new file; `None` for a clean case.
    line: Option<u32>,
    explanation: String,
    base: String,
    change: String,
}

impl Case {
    fn clean(&self) -> bool {
        self.line.is_none()
    }
}

fn text_field(entry: &Value, key: &str, name: &str) -> anyhow::Result<String> {
    entry[key]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{name}: `{key}` is missing or not text"))
}

fn load_case(path: &Path) -> anyhow::Result<Case> {
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .context("a case file without a name")?
        .to_owned();
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let entry: Value = serde_norway::from_str(&text).with_context(|| format!("{name}: YAML"))?;
    let kind = text_field(&entry, "kind", &name)?;
    let change = text_field(&entry, "change", &name)?;
    let line = match entry["line"].as_u64() {
        Some(n) => Some(u32::try_from(n).context("line out of range")?),
        None => None,
    };
    match line {
        None => ensure!(kind == "clean", "{name}: a defect case needs `line`"),
        Some(n) => {
            ensure!(kind != "clean", "{name}: a clean case has no `line`");
            // The label names its line's text too, so a shifted number shows.
            let wanted = text_field(&entry, "line_text", &name)?;
            let actual = change
                .lines()
                .nth((n as usize).saturating_sub(1))
                .unwrap_or_default();
            ensure!(
                n > 0 && actual.contains(wanted.as_str()),
                "{name}: line {n} is {actual:?}, not the labelled {wanted:?}"
            );
        }
    }
    Ok(Case {
        title: text_field(&entry, "title", &name)?,
        file: text_field(&entry, "file", &name)?,
        language: text_field(&entry, "language", &name)?,
        explanation: entry["explanation"]
            .as_str()
            .unwrap_or("A defect.")
            .to_owned(),
        base: text_field(&entry, "base", &name)?,
        name,
        kind,
        line,
        change,
    })
}

fn load_cases(dir: &Path) -> anyhow::Result<Vec<Case>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| dir.display().to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    let cases = paths
        .iter()
        .map(|p| load_case(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (i, case) in cases.iter().enumerate() {
        // The fake provider tells the files apart by their paths.
        ensure!(
            !cases[..i].iter().any(|c| c.file == case.file),
            "{}: the file {} is another case's too",
            case.name,
            case.file
        );
    }
    Ok(cases)
}

async fn git(cwd: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("git")
        .args([
            "-c",
            "user.name=Bench",
            "-c",
            "user.email=bench@example.com",
        ])
        .args(args)
        .current_dir(cwd)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", cwd)
        .output()
        .await
        .context("running git")?;
    ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `@@ -a,b +c,d @@` → the new file's lines c..=c+d-1 (none when d is 0).
fn added_range(header: &str) -> Option<RangeInclusive<u32>> {
    let new = header.split_whitespace().nth(2)?.strip_prefix('+')?;
    let mut parts = new.split(',');
    let start: u32 = parts.next()?.parse().ok()?;
    let count: u32 = match parts.next() {
        Some(c) => c.parse().ok()?,
        None => 1,
    };
    (count > 0).then(|| start..=start + count - 1)
}

/// What the change does to its file: the added lines' ranges and how many
/// lines it adds and removes.
struct ChangeShape {
    added: Vec<RangeInclusive<u32>>,
    changed_lines: usize,
}

async fn change_shape(
    checkout: &Path,
    base: &str,
    change: &str,
    file: &str,
) -> anyhow::Result<ChangeShape> {
    let diff = git(checkout, &["diff", "-U0", base, change, "--", file]).await?;
    let mut shape = ChangeShape {
        added: Vec::new(),
        changed_lines: 0,
    };
    for line in diff.lines() {
        if line.starts_with("@@") {
            shape.added.extend(added_range(line));
        } else if (line.starts_with('+') && !line.starts_with("+++"))
            || (line.starts_with('-') && !line.starts_with("---"))
        {
            shape.changed_lines += 1;
        }
    }
    Ok(shape)
}

/// The review the fake provider gives a case's file, and how many of its
/// comments are deliberately wrong (each must be dropped). Every fourth
/// defect case and the first clean one get one wrong comment, in turns: a
/// line far outside the diff, the labelled line a second time, a comment
/// with no line, and an old line the diff does not show.
fn scripted_review(
    case: &Case,
    index: usize,
    first_clean: bool,
    lines_in_file: u32,
) -> (String, usize) {
    let comment = |line: &str, old: &str, body: &str| {
        format!(
            "<comment file=\"{}\" priority=\"3\" old_line=\"{old}\" new_line=\"{line}\">\n{body}\n</comment>\n",
            case.file
        )
    };
    let outside = (lines_in_file + 40).to_string();
    let Some(line) = case.line else {
        return if first_clean {
            (
                format!(
                    "<review>\n{}</review>",
                    comment(&outside, "", "Not a line of this diff.")
                ),
                1,
            )
        } else {
            ("<review></review>".to_owned(), 0)
        };
    };
    let right = comment(&line.to_string(), "", &case.explanation);
    let wrong = if index.is_multiple_of(4) {
        match (index / 4) % 4 {
            0 => Some(comment(&outside, "", "Not a line of this diff.")),
            1 => Some(comment(
                &line.to_string(),
                "",
                "The same line again: must not become a second thread.",
            )),
            2 => Some(comment("", "", "A comment without a line.")),
            _ => Some(comment(
                "",
                &(lines_in_file + 80).to_string(),
                "An old line that is not in the diff.",
            )),
        }
    } else {
        None
    };
    let wrong_count = usize::from(wrong.is_some());
    (
        format!("<review>\n{right}{}</review>", wrong.unwrap_or_default()),
        wrong_count,
    )
}

/// A diff note the bot posted.
#[derive(Debug)]
struct Comment {
    path: String,
    new_line: Option<u32>,
    old_line: Option<u32>,
    body: String,
}

/// What one review produced.
struct Outcome {
    comments: Vec<Comment>,
    time: Duration,
    /// The summary says the AI service failed for the file.
    model_failed: bool,
    timed_out: bool,
}

/// Polls `path` until `done` picks something out of its answer, or `limit`.
async fn wait_for<T>(
    system: &System,
    token: &str,
    path: &str,
    limit: Duration,
    poll: Duration,
    done: impl Fn(&Value) -> Option<T>,
) -> anyhow::Result<Option<T>> {
    let deadline = Instant::now() + limit;
    loop {
        let (status, answer) = system.rest(token, reqwest::Method::GET, path, None).await?;
        ensure!(status == 200, "{path}: {status} {answer}");
        if let Some(found) = done(&answer) {
            return Ok(Some(found));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(poll).await;
    }
}

fn bot_comments(discussions: &Value) -> Vec<Comment> {
    discussions
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["notes"].as_array()?.first())
        .filter(|n| n["type"] == "DiffNote" && n["author"]["username"] == BOT)
        .map(|n| {
            let line = |key: &str| {
                n["position"][key]
                    .as_u64()
                    .and_then(|v| u32::try_from(v).ok())
            };
            Comment {
                path: n["position"]["new_path"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                new_line: line("new_line"),
                old_line: line("old_line"),
                body: n["body"].as_str().unwrap_or_default().to_owned(),
            }
        })
        .collect()
}

struct Project {
    id: i64,
    bot_id: i64,
}

/// Assigns the bot to merge request `iid` and waits for its summary note.
async fn review(
    system: &System,
    token: &str,
    project: &Project,
    iid: i64,
    limit: Duration,
    poll: Duration,
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let (status, updated) = system
        .rest(
            token,
            reqwest::Method::PUT,
            &format!("/projects/{}/merge_requests/{iid}", project.id),
            Some(json!({"reviewer_ids": [project.bot_id]})),
        )
        .await?;
    ensure!(
        status == 200 && updated["reviewers"][0]["username"] == BOT,
        "assigning the bot: {status} {updated}"
    );
    let summary = wait_for(
        system,
        token,
        &format!(
            "/projects/{}/merge_requests/{iid}/notes?per_page=100",
            project.id
        ),
        limit,
        poll,
        |notes| {
            notes.as_array()?.iter().find_map(|n| {
                let body = n["body"].as_str()?;
                (n["author"]["username"] == BOT && n["type"] != "DiffNote").then(|| body.to_owned())
            })
        },
    )
    .await?;
    let time = started.elapsed();
    if let Some(body) = &summary {
        ensure!(
            body.contains(SUMMARY),
            "the bot did not review merge request !{iid}: {body}"
        );
    }
    let (status, discussions) = system
        .rest(
            token,
            reqwest::Method::GET,
            &format!(
                "/projects/{}/merge_requests/{iid}/discussions?per_page=100",
                project.id
            ),
            None,
        )
        .await?;
    ensure!(status == 200, "discussions: {status} {discussions}");
    Ok(Outcome {
        comments: bot_comments(&discussions),
        time,
        model_failed: summary
            .as_deref()
            .is_some_and(|s| s.contains("The AI service failed")),
        timed_out: summary.is_none(),
    })
}

/// A log line without its terminal colours.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    Fake,
    Bundled,
}

struct Args {
    model: Model,
    cases: Option<usize>,
    only: Option<String>,
    timeout: Option<Duration>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut parsed = Args {
        model: Model::Fake,
        cases: None,
        only: None,
        timeout: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => {
                parsed.model = match value()?.as_str() {
                    "fake" => Model::Fake,
                    "bundled" => Model::Bundled,
                    other => bail!("--model fake|bundled, not {other}"),
                }
            }
            "--cases" => parsed.cases = Some(value()?.parse().context("--cases N")?),
            "--only" => parsed.only = Some(value()?),
            "--timeout" => {
                parsed.timeout = Some(Duration::from_secs(
                    value()?.parse().context("--timeout SECS")?,
                ));
            }
            other => bail!(
                "unknown option {other}; use --model fake|bundled, --cases N, --only TEXT, --timeout SECS"
            ),
        }
    }
    Ok(parsed)
}

/// `n` cases spread evenly over `all` (the first and the last included).
fn spread(all: Vec<Case>, n: usize) -> Vec<Case> {
    if n >= all.len() || n == 0 {
        return all;
    }
    let step = (all.len() - 1) as f64 / (n.max(2) - 1) as f64;
    let mut picked: Vec<usize> = (0..n).map(|i| (i as f64 * step).round() as usize).collect();
    picked.dedup();
    picked
        .into_iter()
        .filter_map(|i| all.get(i).cloned())
        .collect()
}

fn percent(part: usize, whole: usize) -> String {
    if whole == 0 {
        "-".to_owned()
    } else {
        format!("{:.0}%", 100.0 * part as f64 / whole as f64)
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// The system, with the bundled model server in front of it when asked.
async fn start(model: Model) -> anyhow::Result<(System, Option<Service>)> {
    match model {
        Model::Fake => Ok((System::start().await.context("starting the system")?, None)),
        Model::Bundled => {
            let (local_llm, models) = e2e_tests::local_model_server().await?;
            let port = e2e_tests::free_port()?;
            // The model server inherits the environment
            // (`DUO_LOCAL_LLM_THREADS`, ...), as in `./dev bench agent-tools`.
            let env = [
                ("DUO_LOCAL_LLM_ADDR".to_owned(), format!("127.0.0.1:{port}")),
                ("DUO_MODELS_DIR".to_owned(), models.display().to_string()),
            ];
            let mut server = Service::spawn("local-llm", &local_llm, &["serve"], &env)?;
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?;
            server
                .wait_ready(&http, &format!("http://127.0.0.1:{port}/health"))
                .await?;
            let system = System::start_with(Options {
                local_model_url: Some(format!("http://127.0.0.1:{port}/v1")),
                ..Options::default()
            })
            .await
            .context("starting the system")?;
            Ok((system, Some(server)))
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bench::run_until_stopped(run_bench()).await
}

async fn run_bench() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut cases = load_cases(&eval_dir().join("cases"))?;
    if let Some(only) = &args.only {
        cases.retain(|c| c.name.contains(only.as_str()));
    }
    if let Some(n) = args.cases {
        cases = spread(cases, n);
    }
    ensure!(!cases.is_empty(), "no case selected");
    let (limit, poll) = match args.model {
        Model::Fake => (Duration::from_secs(60), Duration::from_millis(20)),
        Model::Bundled => (Duration::from_secs(900), Duration::from_millis(250)),
    };
    let limit = args.timeout.unwrap_or(limit);
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!(
        "review: {} cases ({} with a planted defect, {} clean); model {}; {profile} build; {} CPUs, load average {}",
        cases.len(),
        cases.iter().filter(|c| !c.clean()).count(),
        cases.iter().filter(|c| c.clean()).count(),
        match args.model {
            Model::Fake => "fake (scripted answers: the labelled line; measures the plumbing)",
            Model::Bundled => "bundled (duo-local-llm, its default chat model)",
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );

    let (system, _model_server) = start(args.model).await?;
    let alice = system.token("alice")?;
    system.fake.set_default_text("<review></review>");

    // One project for the whole set: base-NN and change-NN per case.
    let (status, acme) = system
        .rest(&alice, reqwest::Method::GET, "/groups/acme", None)
        .await?;
    ensure!(status == 200, "acme: {acme}");
    let (status, created) = system
        .rest(
            &alice,
            reqwest::Method::POST,
            "/projects",
            Some(json!({"name": "review-eval", "path": "review-eval",
                "namespace_id": acme["id"], "visibility": "private"})),
        )
        .await?;
    ensure!(status == 201, "project: {status} {created}");
    let (status, bot) = system
        .rest(
            &alice,
            reqwest::Method::GET,
            &format!("/users?username={BOT}"),
            None,
        )
        .await?;
    ensure!(status == 200, "the bot: {status} {bot}");
    let project = Project {
        id: created["id"].as_i64().context("project id")?,
        bot_id: bot[0]["id"].as_i64().context("no GitLabDuo user")?,
    };
    let full_path = created["path_with_namespace"]
        .as_str()
        .unwrap_or("acme/review-eval")
        .to_owned();

    let scratch = std::env::temp_dir().join(format!("duo-review-bench-{}", std::process::id()));
    let checkout = scratch.join("review-eval");
    std::fs::create_dir_all(&checkout)?;
    git(&checkout, &["init", "-q", "-b", "main", "."]).await?;
    std::fs::write(checkout.join("README.md"), "# Review evaluation\n")?;
    git(&checkout, &["add", "-A"]).await?;
    git(&checkout, &["commit", "-q", "-m", "Start"]).await?;
    for (i, case) in cases.iter().enumerate() {
        let (base, change) = (format!("base-{i:02}"), format!("change-{i:02}"));
        git(&checkout, &["checkout", "-q", "-B", &base, "main"]).await?;
        let file = checkout.join(&case.file);
        std::fs::create_dir_all(file.parent().context("a case file without a directory")?)?;
        std::fs::write(&file, &case.base)?;
        git(&checkout, &["add", "-A"]).await?;
        git(
            &checkout,
            &["commit", "-q", "-m", &format!("Before: {}", case.title)],
        )
        .await?;
        git(&checkout, &["checkout", "-q", "-b", &change]).await?;
        std::fs::write(&file, &case.change)?;
        git(&checkout, &["commit", "-q", "-a", "-m", &case.title]).await?;
        let shape = change_shape(&checkout, &base, &change, &case.file).await?;
        ensure!(
            shape.changed_lines <= MAX_CHANGED_LINES,
            "{}: the change has {} lines, more than {MAX_CHANGED_LINES}",
            case.name,
            shape.changed_lines
        );
        if let Some(line) = case.line {
            ensure!(
                shape.added.iter().any(|r| r.contains(&line)),
                "{}: line {line} is not an added line of the change",
                case.name
            );
        }
    }
    let host = system.web_url.trim_start_matches("http://");
    let remote = format!("http://oauth2:{alice}@{host}/{full_path}.git");
    git(&checkout, &["push", "-q", &remote, "main"]).await?;
    git(&checkout, &["push", "-q", &remote, "--all"]).await?;

    let mut iids = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (status, mr) = system
            .rest(
                &alice,
                reqwest::Method::POST,
                &format!("/projects/{}/merge_requests", project.id),
                Some(json!({"source_branch": format!("change-{i:02}"),
                    "target_branch": format!("base-{i:02}"), "title": case.title})),
            )
            .await?;
        ensure!(
            status == 201,
            "merge request for {}: {status} {mr}",
            case.name
        );
        iids.push(mr["iid"].as_i64().context("merge request iid")?);
    }

    let calls_before = system.fake.requests().len();
    let mut wrong_scripted = 0;
    if args.model == Model::Fake {
        let first_clean = cases.iter().position(Case::clean);
        for (i, case) in cases.iter().enumerate() {
            let lines = u32::try_from(case.change.lines().count()).unwrap_or(u32::MAX / 2);
            let (answer, wrong) = scripted_review(case, i, first_clean == Some(i), lines);
            wrong_scripted += wrong;
            system.fake.reply_when(format!("`{}`", case.file), answer);
        }
    }

    println!(
        "\n{:<34} {:<10} {:<24} {:>6} {:>8} {:>6} {:>6} {:>9}",
        "case", "language", "kind", "line", "comments", "exact", "±2", "time"
    );
    let verbose = std::env::var_os("DUO_BENCH_VERBOSE").is_some();
    let mut times = Latencies::default();
    let (mut defects, mut exact, mut near, mut defect_comments, mut elsewhere) = (0, 0, 0, 0, 0);
    let (mut clean, mut clean_comments, mut clean_flagged) = (0, 0, 0);
    let (mut timed_out, mut model_failed, mut beyond_expected) = (0, 0, 0);
    for (case, iid) in cases.iter().zip(&iids) {
        let outcome = review(&system, &alice, &project, *iid, limit, poll).await?;
        if outcome.timed_out {
            timed_out += 1;
        } else {
            times.push(outcome.time);
        }
        model_failed += usize::from(outcome.model_failed);
        let on_file: Vec<&Comment> = outcome
            .comments
            .iter()
            .filter(|c| c.path == case.file)
            .collect();
        let count = outcome.comments.len();
        let (hit, close) = match case.line {
            Some(line) => {
                defects += 1;
                defect_comments += count;
                let hit = on_file.iter().any(|c| c.new_line == Some(line));
                let close = on_file
                    .iter()
                    .any(|c| c.new_line.is_some_and(|n| n.abs_diff(line) <= 2));
                exact += usize::from(hit);
                near += usize::from(close);
                elsewhere += outcome
                    .comments
                    .iter()
                    .filter(|c| {
                        c.path != case.file || c.new_line.is_none_or(|n| n.abs_diff(line) > 2)
                    })
                    .count();
                beyond_expected += count.saturating_sub(1);
                (
                    if hit { "yes" } else { "no" },
                    if close { "yes" } else { "no" },
                )
            }
            None => {
                clean += 1;
                clean_comments += count;
                clean_flagged += usize::from(count > 0);
                beyond_expected += count;
                ("-", "-")
            }
        };
        println!(
            "{:<34} {:<10} {:<24} {:>6} {:>8} {:>6} {:>6} {:>9}{}",
            case.name,
            case.language,
            case.kind,
            case.line.map_or("clean".to_owned(), |l| l.to_string()),
            count,
            hit,
            close,
            seconds(outcome.time),
            if outcome.timed_out {
                "  TIMED OUT"
            } else if outcome.model_failed {
                "  model call failed"
            } else {
                ""
            }
        );
        if outcome.model_failed {
            // Why the call failed, from the worker's log.
            let why = system.worker.as_ref().and_then(|worker| {
                worker
                    .log_tail(4000)
                    .lines()
                    .rfind(|l| l.contains("review call failed") && l.contains(case.file.as_str()))
                    .and_then(|l| l.rsplit("error").next().map(str::to_owned))
            });
            if let Some(why) = why {
                println!(
                    "    the model call failed: {}",
                    strip_ansi(&why).trim_start_matches('=')
                );
            }
        }
        if verbose {
            for c in &outcome.comments {
                println!(
                    "    {} new {:?} old {:?}: {}",
                    c.path,
                    c.new_line,
                    c.old_line,
                    c.body
                        .chars()
                        .take(160)
                        .collect::<String>()
                        .replace('\n', " ")
                );
            }
        }
    }

    let reviewed = cases.len();
    println!("\n== totals ({profile} build, model {:?})", args.model);
    println!(
        "planted defects commented on the exact line: {exact}/{defects} ({}); within ±2 lines: {near}/{defects} ({})",
        percent(exact, defects),
        percent(near, defects)
    );
    println!(
        "comments per MR: {:.2} overall, {:.2} on defect MRs ({elsewhere} away from the defect), {:.2} on clean MRs",
        (defect_comments + clean_comments) as f64 / reviewed as f64,
        defect_comments as f64 / defects.max(1) as f64,
        clean_comments as f64 / clean.max(1) as f64,
    );
    println!(
        "false comments on clean MRs: {clean_comments} on {clean_flagged} of {clean} clean MRs"
    );
    println!(
        "review time (assignment to summary note, {} ms polling): p50 {}, p95 {}, max {} over {} reviews; {timed_out} timed out (limit {}), {model_failed} with a failed model call",
        poll.as_millis(),
        seconds(times.quantile(0.5)),
        seconds(times.quantile(0.95)),
        seconds(times.quantile(1.0)),
        times.len(),
        seconds(limit)
    );
    if args.model == Model::Fake {
        println!(
            "deliberately wrong scripted comments: {wrong_scripted}, posted anyway: {} (goal 0; the right ones: {exact}/{defects} on their line)",
            beyond_expected
        );
        println!(
            "model calls: {} for {reviewed} merge requests of one changed file each",
            system.fake.requests().len().saturating_sub(calls_before)
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
