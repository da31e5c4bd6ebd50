//! Grounded answers on the bundled model: `./dev bench agent-tools
//! --grounding`.
//!
//! A held-out set of questions about the demo data (issues, merge requests,
//! epics, CI jobs, commits, files and a directory, named by link of this
//! instance or by reference, and a few naming nothing) goes through the whole
//! system: GraphQL `aiAction` as a demo user, the monolith's web and worker
//! processes on their own database seeded by `duo-monolith seed`, the AI
//! gateway and the bundled model server. Each final answer is scored twice:
//!
//! - **right context or tool**: the named resource reached the model, read
//!   from what the monolith sent the gateway (a recording proxy in between,
//!   [`crate::eval::observe`]): attached to the question (`context` or an
//!   additional context item holding the resource's marker text) or returned
//!   by the right reader tool. A question naming nothing is right when
//!   nothing was attached and no tool ran.
//! - **grounded**: the answer holds at least one of the resource's facts (its
//!   title, a label, an assignee, a failing job's error line, a changed
//!   file's name, ...), compared case-insensitively. No fact appears in its
//!   question, so repeating the question scores nothing.
//!
//! The set is not the tool-choice bench's nor the evaluation sets' questions.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use contracts::{AgentRequest, MessageRole};
use e2e_tests::{Options, Service, System};
use serde_json::{Value, json};

use crate::eval::observe::GatewayRecorder;
use crate::{Latencies, load_average};

/// How a resource reaches the model when it is attached to the question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attached {
    /// The question's `context` of this resource type (`issue`, `build`, ...).
    Context(&'static str),
    /// An additional context item of this category (`file`, `directory`).
    Item(&'static str),
}

/// What a question should lead to.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// A resource: attached as `attached`, or read by `reader` (none for
    /// files and directories, which have no chat reader); `marker` is a text
    /// of its serialised form; `facts` are what a grounded answer quotes.
    Resource {
        attached: Attached,
        reader: Option<&'static str>,
        marker: &'static str,
        facts: &'static [&'static str],
    },
    /// Nothing named: nothing attached, no tool.
    Direct,
}

/// One question. `{web}` stands for the instance's URL, `{job:NAME}` for the
/// id of the api project's job NAME, `{commit:PROJECT:TITLE}` for the id of
/// PROJECT's commit titled TITLE (the demo history's ids are looked up).
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub question: &'static str,
    pub expect: Expect,
}

const fn resource(
    question: &'static str,
    attached: Attached,
    reader: Option<&'static str>,
    marker: &'static str,
    facts: &'static [&'static str],
) -> Case {
    Case {
        question,
        expect: Expect::Resource {
            attached,
            reader,
            marker,
            facts,
        },
    }
}

const fn direct(question: &'static str) -> Case {
    Case {
        question,
        expect: Expect::Direct,
    }
}

use Attached::{Context as Ctx, Item};

/// The held-out set over the demo seed (`crates/monolith/src/seed`).
pub const CASES: &[Case] = &[
    resource(
        "What is {web}/acme/platform/api/-/issues/1 about?",
        Ctx("issue"),
        Some("issue_reader"),
        "Login fails with expired sessions",
        &[
            "Login fails with expired sessions",
            "expired session",
            "30 days",
        ],
    ),
    resource(
        "Who is assigned to acme/platform/api#1, and which labels does it carry?",
        Ctx("issue"),
        Some("issue_reader"),
        "Login fails with expired sessions",
        &["bob", "auth", "bug"],
    ),
    resource(
        "Summarize acme/platform/api#2 in two sentences.",
        Ctx("issue"),
        Some("issue_reader"),
        "Security: token leak in debug logs",
        &["token leak", "debug log", "Authorization header"],
    ),
    resource(
        "Is {web}/acme/website/-/issues/1 still open?",
        Ctx("issue"),
        Some("issue_reader"),
        "Update the pricing page",
        &["pricing", "last year"],
    ),
    resource(
        "What does hobby/notes#1 ask for?",
        Ctx("issue"),
        Some("issue_reader"),
        "Add dark mode",
        &["dark mode", "system preference"],
    ),
    resource(
        "Summarize {web}/acme/platform/api/-/merge_requests/1",
        Ctx("merge_request"),
        Some("merge_request_reader"),
        "Refresh expired sessions instead of failing",
        &[
            "Refresh expired sessions",
            "fix-session-refresh",
            "session.rs",
            "expired session",
        ],
    ),
    resource(
        "Which files does acme/platform/api!1 change?",
        Ctx("merge_request"),
        Some("merge_request_reader"),
        "Refresh expired sessions instead of failing",
        &["session.rs"],
    ),
    resource(
        "From which branch does acme/platform/api!1 merge?",
        Ctx("merge_request"),
        Some("merge_request_reader"),
        "Refresh expired sessions instead of failing",
        &["fix-session-refresh"],
    ),
    resource(
        "What is {web}/groups/acme/-/epics/1 about?",
        Ctx("epic"),
        Some("epic_reader"),
        "Single sign-on",
        &["Single sign-on", "SAML", "OIDC"],
    ),
    resource(
        "Which sign-in protocols does acme&1 plan?",
        Ctx("epic"),
        Some("epic_reader"),
        "Single sign-on",
        &["SAML", "OIDC"],
    ),
    resource(
        "Why did {web}/acme/platform/api/-/jobs/{job:rspec} fail?",
        Ctx("build"),
        Some("build_reader"),
        "Session#refresh refreshes an expired session",
        &[
            "expected 200, got 500",
            "got 500",
            "Session#refresh",
            "exit code 1",
        ],
    ),
    resource(
        "What did {web}/acme/platform/api/-/jobs/{job:build} do?",
        Ctx("build"),
        Some("build_reader"),
        "Compiling api v0.1.0",
        &["Compiling api", "Finished release", "v0.1.0"],
    ),
    resource(
        "Explain the commit {web}/acme/platform/api/-/commit/{commit:acme/platform/api:Add sessions with an expiry}",
        Ctx("commit"),
        Some("commit_reader"),
        "Add sessions with an expiry",
        &[
            "sessions with an expiry",
            "max_age_days",
            "session.rs",
            "SessionError",
        ],
    ),
    resource(
        "What changed in acme/website@{commit:acme/website:Add a contact form script}?",
        Ctx("commit"),
        Some("commit_reader"),
        "Add a contact form script",
        &["contact form", "contact.js", "email"],
    ),
    resource(
        "What does {web}/acme/platform/api/-/blob/main/src/rate_limit.rs do?",
        Item("file"),
        None,
        "refill_per_sec",
        &["token bucket", "429", "burst", "refill"],
    ),
    resource(
        "Which settings does {web}/acme/platform/api/-/blob/main/config/api.toml set?",
        Item("file"),
        None,
        "requests_per_minute = 120",
        &["max_age_days", "requests_per_minute", "8080", "burst"],
    ),
    resource(
        "What plans and prices are listed in {web}/acme/website/-/blob/main/pricing.html?",
        Item("file"),
        None,
        "$25 per user",
        &["Starter", "$10", "$25"],
    ),
    resource(
        "What files are in {web}/acme/platform/api/-/tree/main/src?",
        Item("directory"),
        None,
        "rate_limit.rs",
        &["rate_limit.rs", "session.rs", "config.rs", "main.rs"],
    ),
    direct("Hello! What can you help me with?"),
    direct("Write a Python function that tells whether a number is prime."),
    direct("What is a race condition?"),
];

/// Whether `text` holds `needle`, ignoring case.
fn holds(text: &str, needle: &str) -> bool {
    text.to_lowercase().contains(&needle.to_lowercase())
}

/// The question's message of an agent request (its last).
fn question_of(request: &AgentRequest) -> Option<&contracts::AgentMessage> {
    request
        .messages
        .last()
        .filter(|m| m.role == MessageRole::User)
}

/// Whether anything was attached to the question of any of `requests`.
pub fn attached_anything(requests: &[AgentRequest]) -> bool {
    requests.iter().filter_map(question_of).any(|m| {
        m.context.is_some() || m.additional_context.as_ref().is_some_and(|i| !i.is_empty())
    })
}

/// Whether the resource (`attached` holding `marker`) was attached to the
/// question, or `reader` returned it, in any of `requests`.
pub fn reached_model(
    attached: Attached,
    reader: Option<&str>,
    marker: &str,
    requests: &[AgentRequest],
) -> bool {
    requests.iter().any(|request| {
        let in_question = question_of(request).is_some_and(|m| match attached {
            Attached::Context(kind) => m
                .context
                .as_ref()
                .is_some_and(|c| c.resource_type.as_str() == kind && holds(&c.content, marker)),
            Attached::Item(category) => m.additional_context.iter().flatten().any(|item| {
                item.category.as_str() == category
                    && item.content.as_deref().is_some_and(|c| holds(c, marker))
            }),
        });
        let read_by_tool = request
            .steps()
            .iter()
            .any(|s| Some(s.tool.as_str()) == reader && holds(&s.observation, marker));
        in_question || read_by_tool
    })
}

/// How many of `facts` `answer` holds.
pub fn facts_found(answer: &str, facts: &[&str]) -> usize {
    facts.iter().filter(|f| holds(answer, f)).count()
}

/// What one question came to.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub question: String,
    /// `None` for a question naming nothing.
    pub facts: Option<&'static [&'static str]>,
    pub right_context: bool,
    pub found: usize,
    pub tools: Vec<String>,
    pub answer: String,
    pub error: Option<String>,
    pub latency: Duration,
}

impl Outcome {
    pub fn grounded(&self) -> Option<bool> {
        self.facts.map(|_| self.found > 0 && self.error.is_none())
    }
}

/// The figures of a run.
#[derive(Debug, Default)]
pub struct Summary {
    pub outcomes: Vec<Outcome>,
}

fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

impl Summary {
    /// Right context or tool, over all questions.
    pub fn right_share(&self) -> f64 {
        share(
            self.outcomes.iter().filter(|o| o.right_context).count(),
            self.outcomes.len(),
        )
    }

    /// Grounded answers, over the questions naming a resource.
    pub fn grounded_share(&self) -> f64 {
        let named: Vec<bool> = self.outcomes.iter().filter_map(Outcome::grounded).collect();
        share(named.iter().filter(|g| **g).count(), named.len())
    }

    pub fn print(&self) {
        let named: Vec<&Outcome> = self.outcomes.iter().filter(|o| o.facts.is_some()).collect();
        let plain: Vec<&Outcome> = self.outcomes.iter().filter(|o| o.facts.is_none()).collect();
        let right = |list: &[&Outcome]| list.iter().filter(|o| o.right_context).count();
        let grounded = named.iter().filter(|o| o.grounded() == Some(true)).count();
        let (found, total) = named.iter().fold((0, 0), |(f, t), o| {
            (f + o.found, t + o.facts.map_or(0, <[&str]>::len))
        });
        let failed = self.outcomes.iter().filter(|o| o.error.is_some()).count();
        let mut latencies = Latencies::default();
        for o in &self.outcomes {
            latencies.push(o.latency);
        }
        println!(
            "right context or tool: {:.1}% ({} of {} naming a resource, {} of {} naming none; goal >= 90%)",
            self.right_share(),
            right(&named),
            named.len(),
            right(&plain),
            plain.len()
        );
        println!(
            "grounded answers: {:.1}% ({grounded} of {}; goal >= 80%); facts quoted: {found} of {total} ({:.1}%)",
            self.grounded_share(),
            named.len(),
            share(found, total)
        );
        println!(
            "answers with an error: {failed}; latency per answer p50 {:.1} s, p99 {:.1} s; load average {}",
            latencies.quantile(0.5).as_secs_f64(),
            latencies.quantile(0.99).as_secs_f64(),
            load_average()
        );
    }
}

/// Settings of a grounding run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Ask only the first N questions.
    pub limit: usize,
    /// How long to wait for one answer.
    pub timeout: Duration,
    pub verbose: bool,
}

/// The system with the bundled model and the proxy recording what the
/// monolith sends the gateway.
struct Harness {
    system: System,
    recorder: GatewayRecorder,
    _model_server: Service,
}

async fn start() -> anyhow::Result<Harness> {
    let (model_server, model_url) = crate::eval::start_model_server().await?;
    let recorder = GatewayRecorder::start()?;
    // The product's own time limits: a step that cannot finish in time
    // counts as a failed answer here, as it would for a user.
    let options = Options {
        monolith_env: vec![
            ("AI_GATEWAY_URL".into(), recorder.url().to_owned()),
            ("DUO_AI_ACTION_RATE_LIMIT".into(), "1000000".into()),
            ("RUST_LOG".into(), "warn".into()),
        ],
        gateway_env: vec![("AIGW_LOGGING__LEVEL".into(), "warn".into())],
        local_model_url: Some(model_url),
        ..Options::default()
    };
    let system = System::start_with(options)
        .await
        .context("starting the system")?;
    recorder.set_upstream(&system.gateway_url);
    Ok(Harness {
        system,
        recorder,
        _model_server: model_server,
    })
}

/// GET `path` under `/api/v4` as `token`; the JSON answer.
async fn get(system: &System, token: &str, path: &str) -> anyhow::Result<Value> {
    let (status, body) = system.rest(token, reqwest::Method::GET, path, None).await?;
    ensure!(status == 200, "GET {path}: {status} {body}");
    Ok(body)
}

/// The value of one `{...}` placeholder (without its braces).
async fn lookup(system: &System, token: &str, placeholder: &str) -> anyhow::Result<String> {
    let encoded = |path: &str| path.replace('/', "%2F");
    if placeholder == "web" {
        return Ok(system.web_url.clone());
    }
    if let Some(name) = placeholder.strip_prefix("job:") {
        let jobs = get(
            system,
            token,
            &format!("/projects/{}/jobs", encoded("acme/platform/api")),
        )
        .await?;
        let job = jobs
            .as_array()
            .and_then(|all| all.iter().find(|j| j["name"] == name))
            .with_context(|| format!("no job {name} in acme/platform/api"))?;
        return Ok(job["id"].as_i64().context("a job without id")?.to_string());
    }
    if let Some(rest) = placeholder.strip_prefix("commit:") {
        let (project, title) = rest
            .split_once(':')
            .with_context(|| format!("{{commit:PROJECT:TITLE}}, not {{{placeholder}}}"))?;
        let commits = get(
            system,
            token,
            &format!(
                "/projects/{}/repository/commits?per_page=100",
                encoded(project)
            ),
        )
        .await?;
        let commit = commits
            .as_array()
            .and_then(|all| all.iter().find(|c| c["title"] == title))
            .with_context(|| format!("no commit {title:?} in {project}"))?;
        return Ok(commit["id"]
            .as_str()
            .context("a commit without id")?
            .to_owned());
    }
    anyhow::bail!("unknown placeholder {{{placeholder}}}")
}

/// `text` with its placeholders filled in (looked up once each).
async fn fill(
    system: &System,
    token: &str,
    cache: &mut HashMap<String, String>,
    text: &str,
) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        let end = start
            + rest[start..]
                .find('}')
                .with_context(|| format!("an unclosed placeholder in {text:?}"))?;
        let name = &rest[start + 1..end];
        let value = match cache.get(name) {
            Some(value) => value.clone(),
            None => {
                let value = lookup(system, token, name).await?;
                cache.insert(name.to_owned(), value.clone());
                value
            }
        };
        out.push_str(&rest[..start]);
        out.push_str(&value);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

async fn ask_one(
    harness: &Harness,
    token: &str,
    question: &str,
    expect: Expect,
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    let system = &harness.system;
    // A fresh conversation: earlier questions are not in the history.
    let fresh = crate::eval::ask(system, token, json!({ "content": "/new" }), None).await?;
    let thread = fresh["threadId"].as_str().map(str::to_owned);
    let (actions, requests) = (harness.recorder.mark(), harness.recorder.request_mark());
    let started = Instant::now();
    let accepted = crate::eval::ask(
        system,
        token,
        json!({ "content": question }),
        thread.as_deref(),
    )
    .await?;
    let request_id = accepted["requestId"].as_str().unwrap_or_default();
    let answer = crate::eval::wait_answer(
        system,
        token,
        request_id,
        thread.as_deref(),
        timeout,
        Duration::from_millis(200),
    )
    .await?;
    let latency = started.elapsed();
    // The answer is stored after the question's last gateway call ended.
    let tools: Vec<String> = harness
        .recorder
        .since(actions)
        .into_iter()
        .map(|a| a.tool)
        .collect();
    let requests = harness.recorder.requests_since(requests);
    let (answer, error) = match answer {
        Some(message) => {
            let errors: Vec<String> = message["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str().map(str::to_owned))
                .collect();
            (
                message["content"].as_str().unwrap_or_default().to_owned(),
                (!errors.is_empty()).then(|| errors.join("; ")),
            )
        }
        None => (String::new(), Some(format!("no answer within {timeout:?}"))),
    };
    let (facts, right_context) = match expect {
        Expect::Resource {
            attached,
            reader,
            marker,
            facts,
        } => (
            Some(facts),
            reached_model(attached, reader, marker, &requests),
        ),
        Expect::Direct => (None, !attached_anything(&requests) && tools.is_empty()),
    };
    Ok(Outcome {
        question: question.to_owned(),
        facts,
        right_context,
        found: facts.map_or(0, |f| facts_found(&answer, f)),
        tools,
        answer,
        error,
        latency,
    })
}

/// Asks the set through a freshly started system and scores the answers.
pub async fn run(options: &RunOptions) -> anyhow::Result<Summary> {
    let cases = &CASES[..options.limit.min(CASES.len())];
    let harness = start().await?;
    // alice: a Duo Enterprise seat, owner of the demo group acme.
    let token = harness.system.token("alice")?;
    println!(
        "grounding: {} held-out questions as alice through GraphQL aiAction, the monolith (web + worker), duo-gateway and the bundled model (duo-local-llm); {} build; load average {}",
        cases.len(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        load_average()
    );
    let mut cache = HashMap::new();
    let mut summary = Summary::default();
    for case in cases {
        let question = fill(&harness.system, &token, &mut cache, case.question).await?;
        let outcome = ask_one(&harness, &token, &question, case.expect, options.timeout).await?;
        if options.verbose {
            let grounded = match outcome.grounded() {
                Some(true) => "grounded",
                Some(false) => "NOT grounded",
                None => "-",
            };
            println!(
                "  {} {:<12} {:>6.1}s tools {:?} {:?}\n      -> {}",
                if outcome.right_context {
                    "ok-context "
                } else {
                    "BAD-context"
                },
                grounded,
                outcome.latency.as_secs_f64(),
                outcome.tools,
                outcome.question,
                match &outcome.error {
                    Some(error) => format!("error: {error}"),
                    None => outcome
                        .answer
                        .chars()
                        .take(240)
                        .collect::<String>()
                        .replace('\n', " "),
                }
            );
        }
        summary.outcomes.push(outcome);
    }
    harness.recorder.stop().await;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use contracts::{AdditionalContext, AgentMessage, ResourceContext, ResourceType};

    fn request(message: AgentMessage) -> AgentRequest {
        serde_json::from_value(json!({"messages": [message]})).unwrap()
    }

    /// The question as asked, but for its placeholders (filled with ids).
    fn without_placeholders(question: &str) -> String {
        let mut out = String::new();
        let mut rest = question;
        while let Some(start) = rest.find('{') {
            out.push_str(&rest[..start]);
            rest = rest[start..].split_once('}').map_or("", |(_, after)| after);
        }
        out + rest
    }

    #[test]
    fn no_fact_is_in_its_own_question() {
        for case in CASES {
            if let Expect::Resource { facts, .. } = case.expect {
                assert!(!facts.is_empty(), "{}", case.question);
                for fact in facts {
                    assert!(
                        !holds(&without_placeholders(case.question), fact),
                        "{:?} holds its fact {fact:?}",
                        case.question
                    );
                }
            }
        }
    }

    #[test]
    fn an_attached_resource_counts_only_with_its_kind_and_marker() {
        let mut message = AgentMessage::new(MessageRole::User, "what is it?");
        message.context = Some(ResourceContext {
            resource_type: ResourceType::Issue,
            content: "<issue><title>Add dark mode</title></issue>".into(),
        });
        let requests = [request(message)];
        assert!(reached_model(
            Attached::Context("issue"),
            None,
            "add DARK mode",
            &requests
        ));
        assert!(!reached_model(
            Attached::Context("epic"),
            None,
            "Add dark mode",
            &requests
        ));
        assert!(!reached_model(
            Attached::Context("issue"),
            None,
            "Single sign-on",
            &requests
        ));
        assert!(attached_anything(&requests));
    }

    #[test]
    fn an_item_or_a_reader_result_counts_too() {
        let mut message = AgentMessage::new(MessageRole::User, "files?");
        message.additional_context = Some(vec![AdditionalContext {
            category: contracts::ContextCategory::Directory,
            id: Some("src".into()),
            content: Some("main.rs\nrate_limit.rs".into()),
            metadata: None,
        }]);
        assert!(reached_model(
            Attached::Item("directory"),
            None,
            "rate_limit.rs",
            &[request(message)]
        ));

        let plain = AgentMessage::new(MessageRole::User, "why?");
        let with_step: AgentRequest = serde_json::from_value(json!({
            "messages": [plain],
            "options": {"agent_scratchpad": {"agent_type": "react", "steps": [
                {"thought": "t", "tool": "build_reader", "tool_input": "x",
                 "observation": "Failure/Error: expected 200, got 500"}
            ]}}
        }))
        .unwrap();
        assert!(!attached_anything(std::slice::from_ref(&with_step)));
        assert!(reached_model(
            Attached::Context("build"),
            Some("build_reader"),
            "expected 200",
            std::slice::from_ref(&with_step)
        ));
        assert!(!reached_model(
            Attached::Context("build"),
            Some("issue_reader"),
            "expected 200",
            &[with_step]
        ));
    }

    #[test]
    fn facts_are_found_without_regard_to_case() {
        assert_eq!(
            facts_found("It plans **saml** and OIDC.", &["SAML", "OIDC", "LDAP"]),
            2
        );
    }
}
