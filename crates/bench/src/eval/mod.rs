//! `duo-eval`: question sets run through the real system (PostgreSQL, the
//! monolith's web and worker processes, the gateway, a model) and scored:
//! the first tool the agent ran, the facts an answer contains, and a judge
//! model's verdict. See `docs/evaluation.md`.
//!
//! [`run`] is the library entry: the binary and the harness's own test call
//! it, then print [`report::render_table`], write [`report::to_json`] and
//! compare with a stored [`report::Baseline`].

pub mod judge;
pub mod observe;
pub mod report;
pub mod sets;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use e2e_tests::{Options, Service, System};
use fake_provider::FakeProvider;
use serde_json::{Value, json};

use judge::{Judge, Verdict};
use observe::GatewayRecorder;
use report::{CaseResult, Observed};
use sets::{Case, Expectation, Resource};

/// Which model answers the questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// The fake provider with each case's scripted turns: checks the
    /// harness and the plumbing, not a model.
    Fake,
    /// The bundled model server (`duo-local-llm`).
    Bundled,
    /// A real provider: Anthropic (`ANTHROPIC_API_KEY`) or an
    /// OpenAI-compatible server (`OPENAI_BASE_URL`), only with
    /// `REAL_AI_REQUEST=1`.
    Real,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Fake => "fake",
            ModelKind::Bundled => "bundled",
            ModelKind::Real => "real",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [ModelKind::Fake, ModelKind::Bundled, ModelKind::Real]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// Without `--model`: a real provider when `REAL_AI_REQUEST` is on and
    /// one is configured, the bundled model otherwise.
    pub fn default_from_env() -> Self {
        if real_requests_allowed() && real_provider().is_some() {
            ModelKind::Real
        } else {
            ModelKind::Bundled
        }
    }
}

/// Which judge grades the QA set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JudgeKind {
    Fake,
    Bundled,
    Anthropic,
    OpenAi,
}

impl JudgeKind {
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "fake" => JudgeKind::Fake,
            "bundled" => JudgeKind::Bundled,
            "anthropic" => JudgeKind::Anthropic,
            "openai" => JudgeKind::OpenAi,
            _ => return None,
        })
    }

    /// The judge that goes with a model kind when none is named.
    pub fn for_model(model: ModelKind) -> Self {
        match model {
            ModelKind::Fake => JudgeKind::Fake,
            ModelKind::Bundled => JudgeKind::Bundled,
            ModelKind::Real => match real_provider() {
                Some(RealProvider::OpenAi) => JudgeKind::OpenAi,
                _ => JudgeKind::Anthropic,
            },
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// `REAL_AI_REQUEST` is `1`/`true`/`yes`/`on`.
pub fn real_requests_allowed() -> bool {
    env("REAL_AI_REQUEST")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RealProvider {
    Anthropic,
    OpenAi,
}

/// The real provider the environment configures, Anthropic first.
fn real_provider() -> Option<RealProvider> {
    if env("ANTHROPIC_API_KEY").is_some() {
        Some(RealProvider::Anthropic)
    } else if env("OPENAI_BASE_URL").is_some() {
        Some(RealProvider::OpenAi)
    } else {
        None
    }
}

/// One run's settings.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub model: ModelKind,
    pub judge: JudgeKind,
    /// `full`, `tiny`, a set's name or case ids (see [`sets::select`]).
    pub selection: String,
    /// Where the sets and the judge prompt are (`crates/bench/eval`).
    pub dir: PathBuf,
    /// How long one answer may take.
    pub timeout: Duration,
    /// Print each case as it finishes.
    pub verbose: bool,
}

impl RunConfig {
    pub fn new(model: ModelKind, selection: &str) -> Self {
        Self {
            model,
            judge: JudgeKind::for_model(model),
            selection: selection.to_owned(),
            dir: sets::eval_dir(),
            timeout: match model {
                ModelKind::Fake => Duration::from_secs(60),
                ModelKind::Bundled => Duration::from_secs(900),
                ModelKind::Real => Duration::from_secs(180),
            },
            verbose: false,
        }
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Report {
    pub model: ModelKind,
    pub model_detail: String,
    pub judge: String,
    pub selection: String,
    pub results: Vec<CaseResult>,
}

impl Report {
    pub fn to_json(&self) -> Value {
        report::to_json(
            &self.results,
            json!({
                "model": self.model.name(),
                "model_detail": self.model_detail,
                "judge": self.judge,
                "selection": self.selection,
                "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
                "finished_unix": std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            }),
        )
    }
}

/// The default baseline of a model kind: `eval/baseline-<kind>.json`.
pub fn baseline_path(dir: &std::path::Path, model: ModelKind) -> PathBuf {
    dir.join(format!("baseline-{}.json", model.name()))
}

/// The system under evaluation and what it needs around it.
struct Harness {
    system: System,
    recorder: GatewayRecorder,
    _model_server: Option<Service>,
    local_url: Option<String>,
    model_detail: String,
}

/// Starts the bundled model server; its OpenAI-compatible base URL.
pub async fn start_model_server() -> anyhow::Result<(Service, String)> {
    let (binary, models) = e2e_tests::local_model_server()
        .await
        .context("the bundled model server")?;
    let port = e2e_tests::free_port()?;
    let env = [
        ("DUO_LOCAL_LLM_ADDR".to_owned(), format!("127.0.0.1:{port}")),
        ("DUO_MODELS_DIR".to_owned(), models.display().to_string()),
    ];
    let mut server = Service::spawn("local-llm", &binary, &["serve"], &env)?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    server
        .wait_ready(&http, &format!("http://127.0.0.1:{port}/health"))
        .await?;
    Ok((server, format!("http://127.0.0.1:{port}/v1")))
}

async fn start(config: &RunConfig) -> anyhow::Result<Harness> {
    let recorder = GatewayRecorder::start()?;
    let mut options = Options {
        monolith_env: vec![
            ("AI_GATEWAY_URL".into(), recorder.url().to_owned()),
            ("DUO_AI_ACTION_RATE_LIMIT".into(), "1000000".into()),
            ("DUO_JOB_LEASE_SECS".into(), "15".into()),
            ("RUST_LOG".into(), "warn".into()),
        ],
        gateway_env: vec![("AIGW_LOGGING__LEVEL".into(), "warn".into())],
        ..Options::default()
    };
    let need_local = config.model == ModelKind::Bundled || config.judge == JudgeKind::Bundled;
    let (model_server, local_url) = if need_local {
        let (server, url) = start_model_server().await?;
        (Some(server), Some(url))
    } else {
        (None, None)
    };
    let model_detail = match config.model {
        ModelKind::Fake => "fake provider, scripted turns".to_owned(),
        ModelKind::Bundled => {
            options.local_model_url = local_url.clone();
            // A small CPU model is slow to start answering long prompts.
            options.gateway_env.push((
                "AIGW_MODELS__FIRST_TOKEN_TIMEOUT_SECONDS".into(),
                config.timeout.as_secs().to_string(),
            ));
            options.monolith_env.push((
                "DUO_AI_GATEWAY_TIMEOUT_SECS".into(),
                config.timeout.as_secs().to_string(),
            ));
            format!(
                "bundled model server ({})",
                env("AIGW_LOCAL_LLM__MODEL").unwrap_or_else(|| "its default chat model".into())
            )
        }
        ModelKind::Real => {
            ensure!(
                real_requests_allowed(),
                "--model real calls a paid provider: set REAL_AI_REQUEST=1 to allow it"
            );
            match real_provider() {
                Some(RealProvider::Anthropic) => {
                    let key = env("ANTHROPIC_API_KEY").unwrap_or_default();
                    let base = env("ANTHROPIC_BASE_URL")
                        .unwrap_or_else(|| "https://api.anthropic.com".into());
                    options.gateway_env.extend([
                        ("ANTHROPIC_API_KEY".into(), key),
                        ("ANTHROPIC_BASE_URL".into(), base.clone()),
                    ]);
                    format!("anthropic at {base}")
                }
                Some(RealProvider::OpenAi) => {
                    let base = env("OPENAI_BASE_URL").unwrap_or_default();
                    options.gateway_env.extend([
                        // Blank means unset: the harness's fake key goes away.
                        ("ANTHROPIC_API_KEY".into(), String::new()),
                        ("OPENAI_BASE_URL".into(), base.clone()),
                        (
                            "OPENAI_API_KEY".into(),
                            env("OPENAI_API_KEY").unwrap_or_default(),
                        ),
                    ]);
                    format!("openai-compatible at {base}")
                }
                None => bail!(
                    "--model real needs ANTHROPIC_API_KEY or OPENAI_BASE_URL (see docs/evaluation.md)"
                ),
            }
        }
    };
    let system = System::start_with(options)
        .await
        .context("starting the system")?;
    recorder.set_upstream(&system.gateway_url);
    if config.model == ModelKind::Fake {
        system
            .fake
            .set_default_text("Thought: Nothing was scripted.\nFinal Answer: (no scripted answer)");
    }
    Ok(Harness {
        system,
        recorder,
        _model_server: model_server,
        local_url,
        model_detail,
    })
}

async fn make_judge(config: &RunConfig, local_url: Option<&str>) -> anyhow::Result<Judge> {
    let model_override = env("DUO_EVAL_JUDGE_MODEL");
    let base_override = env("DUO_EVAL_JUDGE_BASE_URL");
    let key_override = env("DUO_EVAL_JUDGE_API_KEY");
    Ok(match config.judge {
        JudgeKind::Fake => Judge::Fake(
            FakeProvider::start()
                .await
                .context("starting the fake judge")?,
        ),
        JudgeKind::Bundled => Judge::OpenAi {
            base_url: base_override
                .or_else(|| local_url.map(str::to_owned))
                .context("the bundled judge needs the model server")?,
            api_key: None,
            model: model_override
                .or_else(|| env("AIGW_LOCAL_LLM__MODEL"))
                .unwrap_or_else(|| "smollm2-135m-instruct".into()),
        },
        JudgeKind::Anthropic => {
            ensure!(
                real_requests_allowed(),
                "an Anthropic judge calls a paid provider: set REAL_AI_REQUEST=1"
            );
            Judge::Anthropic {
                base_url: base_override
                    .or_else(|| env("ANTHROPIC_BASE_URL"))
                    .unwrap_or_else(|| "https://api.anthropic.com".into()),
                api_key: key_override.or_else(|| env("ANTHROPIC_API_KEY")).context(
                    "an Anthropic judge needs ANTHROPIC_API_KEY or DUO_EVAL_JUDGE_API_KEY",
                )?,
                model: model_override.unwrap_or_else(|| "claude-3-5-sonnet-20241022".into()),
            }
        }
        JudgeKind::OpenAi => {
            ensure!(
                real_requests_allowed(),
                "an OpenAI-compatible judge may be a paid provider: set REAL_AI_REQUEST=1"
            );
            Judge::OpenAi {
                base_url: base_override.or_else(|| env("OPENAI_BASE_URL")).context(
                    "an OpenAI-compatible judge needs OPENAI_BASE_URL or DUO_EVAL_JUDGE_BASE_URL",
                )?,
                api_key: key_override.or_else(|| env("OPENAI_API_KEY")),
                model: model_override
                    .context("an OpenAI-compatible judge needs DUO_EVAL_JUDGE_MODEL")?,
            }
        }
    })
}

/// The global id of the page a case is asked from.
async fn resource_gid(system: &System, token: &str, resource: &Resource) -> anyhow::Result<String> {
    let encoded = |path: &str| path.replace('/', "%2F");
    let get = |path: String| async move {
        let (status, body) = system
            .rest(token, reqwest::Method::GET, &path, None)
            .await?;
        ensure!(status == 200, "GET {path}: {status} {body}");
        Ok::<Value, anyhow::Error>(body)
    };
    let id_of = |body: &Value| body["id"].as_i64().context("no id in the answer");
    Ok(match resource {
        Resource::Issue { project, iid } => {
            let body = get(format!("/projects/{}/issues/{iid}", encoded(project))).await?;
            format!("gid://gitlab/Issue/{}", id_of(&body)?)
        }
        Resource::MergeRequest { project, iid } => {
            let body = get(format!(
                "/projects/{}/merge_requests/{iid}",
                encoded(project)
            ))
            .await?;
            format!("gid://gitlab/MergeRequest/{}", id_of(&body)?)
        }
        Resource::Epic { group, iid } => {
            let body = get(format!("/groups/{}/epics/{iid}", encoded(group))).await?;
            format!("gid://gitlab/Epic/{}", id_of(&body)?)
        }
        Resource::Build { project, name } => {
            let body = get(format!("/projects/{}/jobs", encoded(project))).await?;
            let job = body
                .as_array()
                .and_then(|jobs| jobs.iter().find(|j| j["name"] == name.as_str()))
                .with_context(|| format!("no job {name} in {project}"))?;
            format!("gid://gitlab/Ci::Build/{}", id_of(job)?)
        }
        Resource::Project { project } => {
            let body = get(format!("/projects/{}", encoded(project))).await?;
            format!("gid://gitlab/Project/{}", id_of(&body)?)
        }
    })
}

const ASK: &str =
    "mutation($input: AiActionInput!) { aiAction(input: $input) { requestId threadId errors } }";
const ANSWER: &str = "query($ids: [ID!], $thread: AiConversationThreadID) { aiMessages(requestIds: $ids, roles: [ASSISTANT], threadId: $thread) { nodes { requestId content errors role } } }";

/// `text` with `{web_url}` replaced by the monolith's address and
/// `{head:<project>}` by the id of the project's newest commit (the demo
/// history's ids change from one seed to the next).
async fn fill_in(
    system: &System,
    token: &str,
    cache: &mut HashMap<String, String>,
    text: &str,
) -> anyhow::Result<String> {
    let mut out = text.replace("{web_url}", &system.web_url);
    while let Some(start) = out.find("{head:") {
        let end = start
            + out[start..]
                .find('}')
                .with_context(|| format!("an unclosed {{head:...}} in {text:?}"))?;
        let project = out[start + "{head:".len()..end].to_owned();
        let key = format!("head {project}");
        let sha = match cache.get(&key) {
            Some(sha) => sha.clone(),
            None => {
                let path = format!(
                    "/projects/{}/repository/commits?per_page=1",
                    project.replace('/', "%2F")
                );
                let (status, body) = system
                    .rest(token, reqwest::Method::GET, &path, None)
                    .await?;
                ensure!(status == 200, "GET {path}: {status} {body}");
                let sha = body[0]["id"]
                    .as_str()
                    .with_context(|| format!("{project} has no commits"))?
                    .to_owned();
                cache.insert(key, sha.clone());
                sha
            }
        };
        out.replace_range(start..=end, &sha);
    }
    Ok(out)
}

/// Sends `chat` (in `thread` when given); `aiAction`'s payload.
pub async fn ask(
    system: &System,
    token: &str,
    chat: Value,
    thread: Option<&str>,
) -> anyhow::Result<Value> {
    let mut input = json!({ "chat": chat });
    if let Some(thread) = thread {
        input["threadId"] = json!(thread);
    }
    let body = system
        .graphql(token, ASK, json!({ "input": input }))
        .await?;
    let payload = body["data"]["aiAction"].clone();
    ensure!(
        payload["requestId"].is_string(),
        "aiAction refused the question: {body}"
    );
    Ok(payload)
}

/// Polls for the answer to `request_id`; `None` after `limit`.
pub async fn wait_answer(
    system: &System,
    token: &str,
    request_id: &str,
    thread: Option<&str>,
    limit: Duration,
    poll: Duration,
) -> anyhow::Result<Option<Value>> {
    let deadline = Instant::now() + limit;
    loop {
        let body = system
            .graphql(
                token,
                ANSWER,
                json!({ "ids": [request_id], "thread": thread }),
            )
            .await?;
        if let Some(errors) = body.get("errors") {
            bail!("aiMessages: {errors}");
        }
        if let Some(found) = body["data"]["aiMessages"]["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|m| m["requestId"] == request_id))
        {
            return Ok(Some(found.clone()));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(poll).await;
    }
}

/// Asks one case in a fresh conversation and observes what happened.
async fn run_case(
    harness: &Harness,
    config: &RunConfig,
    token: &str,
    gids: &mut HashMap<String, String>,
    case: &Case,
) -> anyhow::Result<Observed> {
    let system = &harness.system;
    // A fresh thread, so earlier cases are not in the history.
    let fresh = ask(system, token, json!({ "content": "/new" }), None).await?;
    let thread = fresh["threadId"].as_str().map(str::to_owned);

    let mut chat = json!({ "content": case.question });
    if let Some(resource) = &case.resource {
        let key = format!("{resource:?}");
        let gid = match gids.get(&key) {
            Some(gid) => gid.clone(),
            None => {
                let gid = resource_gid(system, token, resource)
                    .await
                    .with_context(|| format!("{}: its resource", case.id))?;
                gids.insert(key, gid.clone());
                gid
            }
        };
        chat["resourceId"] = json!(gid);
    }
    if config.model == ModelKind::Fake {
        system.fake.reset();
        for turn in &case.fake {
            let turn = fill_in(system, token, gids, turn).await?;
            system.fake.push_text(turn);
        }
    }
    let poll = match config.model {
        ModelKind::Fake => Duration::from_millis(20),
        _ => Duration::from_millis(200),
    };

    let mark = harness.recorder.mark();
    let started = Instant::now();
    let accepted = ask(system, token, chat, thread.as_deref()).await?;
    let request_id = accepted["requestId"].as_str().unwrap_or_default();
    let answer = wait_answer(
        system,
        token,
        request_id,
        thread.as_deref(),
        config.timeout,
        poll,
    )
    .await?;
    let latency = started.elapsed();
    // An answer is stored after its last gateway call has ended.
    let tools = harness
        .recorder
        .since(mark)
        .into_iter()
        .map(|a| a.tool)
        .collect();
    let mut observed = Observed {
        latency,
        tools,
        ..Observed::default()
    };
    match answer {
        Some(message) => {
            observed.answered = true;
            observed.answer = message["content"].as_str().unwrap_or_default().to_owned();
            let errors: Vec<String> = message["errors"]
                .as_array()
                .map(|e| {
                    e.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            if !errors.is_empty() {
                observed.error = Some(errors.join("; "));
            }
        }
        None => observed.error = Some(format!("no answer within {:?}", config.timeout)),
    }
    Ok(observed)
}

/// Runs the selected cases through a freshly started system.
pub async fn run(config: &RunConfig) -> anyhow::Result<Report> {
    let all = sets::load_all(&config.dir)?;
    let cases = sets::select(all, &config.selection)?;
    let template_path = config.dir.join("judge-prompt.md");
    let template = std::fs::read_to_string(&template_path)
        .with_context(|| template_path.display().to_string())?;
    // Fails early on a template without its slots.
    judge::render_prompt(&template, "", "", "")?;

    let harness = start(config).await?;
    let judge = make_judge(config, harness.local_url.as_deref()).await?;
    let http = reqwest::Client::new();
    // alice: a Duo Enterprise seat and owner of the demo group acme.
    let token = harness.system.token("alice")?;
    let mut gids = HashMap::new();
    let mut results = Vec::new();
    for case in &cases {
        let mut observed = run_case(&harness, config, &token, &mut gids, case).await?;
        if let Expectation::Reference(reference) = &case.expect {
            observed.verdict = Some(if observed.answered {
                judge
                    .judge(
                        &http,
                        &template,
                        &case.question,
                        reference,
                        &answer_for_judge(&observed),
                        case.fake_judge.as_deref(),
                    )
                    .await
            } else {
                Verdict::Incorrect {
                    reason: "no answer arrived".to_owned(),
                }
            });
        }
        let result = report::score(case, observed);
        if config.verbose {
            println!(
                "  {:<6} {:<26} {:>7.2}s first tool {:<22} {}",
                if result.passed { "pass" } else { "FAIL" },
                result.id,
                result.latency.as_secs_f64(),
                result.first_tool.as_deref().unwrap_or("none"),
                result
                    .answer
                    .chars()
                    .take(100)
                    .collect::<String>()
                    .replace('\n', " ")
            );
        }
        results.push(result);
    }
    let report = Report {
        model: config.model,
        model_detail: harness.model_detail.clone(),
        judge: judge.describe(),
        selection: config.selection.clone(),
        results,
    };
    harness.recorder.stop().await;
    if let Judge::Fake(fake) = judge {
        fake.stop().await;
    }
    Ok(report)
}

/// What the judge is shown: the answer, or the error the user saw.
fn answer_for_judge(observed: &Observed) -> String {
    match (&observed.error, observed.answer.is_empty()) {
        (Some(error), true) => format!("(no answer; the user saw the error: {error})"),
        _ => observed.answer.clone(),
    }
}
