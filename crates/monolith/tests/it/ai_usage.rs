//! AI usage end to end on a real PostgreSQL: questions answered by the worker
//! (the agent against the real gateway and the fake model) leave usage
//! records with their tools, error codes, timings and categories; the
//! categorisation never holds an answer back and respects Duo switches;
//! GitLab's `aiUsageData` / `aiMetrics` / `aiUserMetrics` answer reporters
//! and admins only; the admin page draws the charts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests fail loudly"
)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use monolith::agent::AgentResponder;
use monolith::ai_usage::store::{self, QuestionFacts};
use monolith::chat::completion::{
    ChatAnswer, ChatResponder, ChunkSender, CompletionJob, QuestionCategorizer, ResponderError,
};
use monolith::config::Realm;
use monolith::policy::{Actor, Subject, access};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::agent_support::{Bench, gid};
use crate::support::{Fx, Server};
use crate::web_sign_in::{set_password, signed_in};

const DEADLINE: Duration = Duration::from_secs(30);

fn final_answer(text: &str) -> String {
    format!(" I can answer this myself.\nFinal Answer: {text}")
}

fn action(tool: &str, input: &str) -> String {
    format!(" I should use a tool.\nAction: {tool}\nAction Input: {input}")
}

/// The categorisation prompt's request for `question` (as the JSON body
/// carries it), and the model's answer naming `category`.
fn categorised(bench: &Bench, question: &str, category: &str) {
    bench.fake.reply_when(
        format!(r"The user's question:\n<question>\n{question}"),
        json!({
            "category": category,
            "detailed_category": "scripted",
            "language": "en",
            "is_proper_sentence": true,
            "number_of_questions_in_history": 0,
            "labels": ["needs_code"],
        })
        .to_string(),
    );
}

fn worker(fx: &Fx, responder: Arc<dyn ChatResponder>) -> job_queue::WorkerHandle {
    monolith::worker::spawn(
        fx.pool.clone(),
        fx.db.url(),
        responder,
        "https://docs.example.com".into(),
        monolith::worker::WorkerSettings {
            queue: job_queue::WorkerConfig {
                concurrency: 2,
                poll_interval: Duration::from_millis(50),
                backoff_base: Duration::from_millis(10),
                backoff_max: Duration::from_millis(50),
                ..Default::default()
            },
            retention_every: Duration::from_secs(3600),
            workflows: None,
            code_index: None,
            workflow_runs: None,
            review: None,
        },
    )
    .unwrap()
}

/// Stores `content` as a new thread's question and queues its answer, as
/// `aiAction` does.
async fn ask(fx: &Fx, user: Actor, content: &str, resource_id: Option<String>) -> Uuid {
    let thread_id = fx
        .id(
            "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, 1) RETURNING id",
            &[&user.id],
        )
        .await;
    let request_id = Uuid::new_v4();
    fx.exec(
        "INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid)
         VALUES ($1, 1, $2, $3, $4)",
        &[&thread_id, &content, &Uuid::new_v4(), &request_id],
    )
    .await;
    let job = CompletionJob {
        request_id,
        user_id: user.id,
        thread_id,
        content: content.to_owned(),
        resource_id,
        ..Default::default()
    };
    let db = fx.pool.get().await.unwrap();
    job_queue::enqueue(
        &**db,
        &job,
        job_queue::EnqueueOptions::default().queue("default"),
    )
    .await
    .unwrap();
    request_id
}

async fn wait_for(
    fx: &Fx,
    what: &str,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let db = fx.pool.get().await.unwrap();
        let done: bool = db.query_one(sql, params).await.unwrap().get(0);
        if done {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One question's record, as the tests read it.
#[derive(Debug)]
struct Record {
    event: String,
    user_id: i64,
    project_id: Option<i64>,
    namespace_id: Option<i64>,
    tools: Vec<String>,
    error_code: Option<String>,
    input_tokens: i32,
    tokens_estimated: bool,
    first_token_ms: Option<i32>,
    total_ms: i32,
    category: Option<String>,
    category_skipped: Option<String>,
}

async fn record(fx: &Fx, request_id: Uuid) -> Record {
    let db = fx.pool.get().await.unwrap();
    let r = db
        .query_one(
            "SELECT e.event, e.user_id, e.project_id, e.namespace_id, q.tools, q.error_code,
                    q.input_tokens, q.tokens_estimated, q.first_token_ms, q.total_ms,
                    q.category, q.category_skipped
             FROM ai_chat_question_usage q JOIN ai_usage_events e ON e.id = q.event_id
             WHERE q.request_id = $1",
            &[&request_id],
        )
        .await
        .unwrap();
    Record {
        event: r.get(0),
        user_id: r.get(1),
        project_id: r.get(2),
        namespace_id: r.get(3),
        tools: r.get(4),
        error_code: r.get(5),
        input_tokens: r.get(6),
        tokens_estimated: r.get(7),
        first_token_ms: r.get(8),
        total_ms: r.get(9),
        category: r.get(10),
        category_skipped: r.get(11),
    }
}

#[tokio::test]
async fn usage_counts_after_a_scripted_run() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let fx = &bench.fx;
    bench
        .issue(
            world.project,
            world.user,
            1,
            "Login broken",
            "Users cannot log in after the password reset email expires.",
            false,
        )
        .await;
    let owner = fx.user("owner").await;
    let secret = fx.project(world.group, "secret", "private").await;
    fx.project_member(secret, owner, access::OWNER).await;
    bench
        .issue(secret, owner, 1, "Launch", "The launch codes.", true)
        .await;

    // Categorisation first: its prompt also carries each question.
    categorised(&bench, "Summarise the login issue", "Project management");
    categorised(&bench, "What is a monad?", "General programming");
    categorised(&bench, "Summarise gl/secret#1", "Security");
    // The agent: a tool then an answer, a direct answer, a refused tool.
    bench.fake.reply_when(
        "password reset email expires",
        final_answer("Expired reset emails block logins."),
    );
    // The question names no resource (a named one would be attached as
    // context before the first step); the tool's input does.
    bench.fake.reply_when(
        "Summarise the login issue",
        action("issue_reader", "Summarise issue #1"),
    );
    bench.fake.reply_when(
        "What is a monad?",
        final_answer("A monoid in the category of endofunctors."),
    );
    bench.fake.reply_when(
        "Summarise gl/secret#1",
        action("issue_reader", "Summarise gl/secret#1"),
    );

    let handle = worker(fx, Arc::new(bench.responder.clone()));
    let with_tool = ask(
        fx,
        world.user,
        "Summarise the login issue",
        Some(gid("Project", world.project)),
    )
    .await;
    let direct = ask(fx, world.user, "What is a monad?", None).await;
    let refused = ask(fx, world.user, "Summarise gl/secret#1", None).await;
    wait_for(
        fx,
        "three categorised questions",
        "SELECT count(*) FILTER (WHERE categorized_at IS NOT NULL) = 3 FROM ai_chat_question_usage",
        &[],
    )
    .await;
    handle.shutdown().await;

    let db = fx.pool.get().await.unwrap();
    let events: i64 = db
        .query_one("SELECT count(*) FROM ai_usage_events", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(events, 3, "one event per question");

    let first = record(fx, with_tool).await;
    assert_eq!(first.event, "request_duo_chat_response");
    assert_eq!(first.user_id, world.user.id);
    assert_eq!(first.tools, vec!["issue_reader"]);
    assert_eq!(first.error_code, None);
    assert_eq!(
        first.project_id,
        Some(world.project),
        "asked about the project"
    );
    assert_eq!(first.namespace_id, Some(world.group));
    assert_eq!(first.category.as_deref(), Some("Project management"));
    assert_eq!(first.input_tokens, 7, "25 characters, about 4 a token");
    assert!(first.tokens_estimated);
    let ttft = first.first_token_ms.expect("the answer was streamed");
    assert!(first.total_ms >= ttft, "{first:?}");

    let second = record(fx, direct).await;
    assert_eq!(second.tools, Vec::<String>::new());
    assert_eq!(second.error_code, None);
    assert_eq!(second.project_id, None);
    assert_eq!(second.category.as_deref(), Some("General programming"));

    let third = record(fx, refused).await;
    assert_eq!(third.tools, vec!["issue_reader"]);
    assert_eq!(third.error_code.as_deref(), Some("M3003"));
    assert_eq!(third.first_token_ms, None, "nothing was streamed");
    assert_eq!(third.category.as_deref(), Some("Security"));

    // The same figures as the admin page and GraphQL read them.
    let overview =
        monolith::ai_usage::reports::overview(&*db, monolith::ai_usage::DateRange::last_days(1))
            .await
            .unwrap();
    assert_eq!(overview.per_day.last().map(|d| (d.1, d.2)), Some((3, 1)));
    assert_eq!(overview.errors, vec![("M3003".to_owned(), 1)]);
    assert_eq!(overview.tools, vec![("issue_reader".to_owned(), 2)]);
    let mut categories = overview.categories.clone();
    categories.sort();
    assert_eq!(
        categories,
        vec![
            ("General programming".to_owned(), 1),
            ("Project management".to_owned(), 1),
            ("Security".to_owned(), 1),
        ]
    );
    assert_eq!(overview.first_token.len(), 1, "{overview:?}");
    let metrics = monolith::ai_usage::reports::metrics(
        &*db,
        monolith::ai_usage::UsageScope::Project(world.project),
        monolith::ai_usage::DateRange::last_days(1),
    )
    .await
    .unwrap();
    assert_eq!(metrics.duo_chat_questions, 3, "a member's questions count");
    assert_eq!(metrics.duo_chat_contributors, 1);
}

/// The bench's agent, with a categorizer of the test's choosing.
struct WithCategorizer {
    agent: AgentResponder,
    categorizer: Arc<dyn QuestionCategorizer>,
}

#[async_trait]
impl ChatResponder for WithCategorizer {
    async fn respond(
        &self,
        job: &CompletionJob,
        chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        self.agent.respond(job, chunks).await
    }

    fn categorizer(&self) -> Option<Arc<dyn QuestionCategorizer>> {
        Some(self.categorizer.clone())
    }
}

/// A gateway that accepts connections and never answers; counts them.
async fn silent_gateway() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(socket);
        }
    });
    (url, seen)
}

fn categorizer_at(bench: &Bench, url: &str, timeout: Duration) -> monolith::ai_usage::Categorizer {
    let services = bench.responder.services();
    let settings = monolith::gateway_client::GatewaySettings {
        base_url: url.parse().unwrap(),
        ..services.gateway.settings().clone()
    };
    let gateway = monolith::gateway_client::GatewayClient::with_shared_keys(
        services.gateway.keys().clone(),
        settings,
    )
    .unwrap();
    monolith::ai_usage::Categorizer::new(gateway, services.policy.clone(), services.models.clone())
        .with_timeout(timeout)
}

#[tokio::test]
async fn a_hanging_categorisation_never_holds_an_answer_back() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let fx = &bench.fx;
    bench.fake.reply_when("first", final_answer("One."));
    bench.fake.reply_when("second", final_answer("Two."));
    let (silent, seen) = silent_gateway().await;
    let limit = Duration::from_secs(4);
    let handle = worker(
        fx,
        Arc::new(WithCategorizer {
            agent: bench.responder.clone(),
            categorizer: Arc::new(categorizer_at(&bench, &silent, limit)),
        }),
    );

    let started = tokio::time::Instant::now();
    let first = ask(fx, world.user, "the first question", None).await;
    wait_for(
        fx,
        "the first answer",
        "SELECT EXISTS (SELECT 1 FROM ai_conversation_messages WHERE request_xid = $1 AND role = 2)",
        &[&first],
    )
    .await;
    // Its categorisation is stuck at the silent gateway; a second question
    // is answered meanwhile.
    let second = ask(fx, world.user, "the second question", None).await;
    wait_for(
        fx,
        "the second answer",
        "SELECT EXISTS (SELECT 1 FROM ai_conversation_messages WHERE request_xid = $1 AND role = 2)",
        &[&second],
    )
    .await;
    assert!(
        started.elapsed() < limit,
        "both answers came before the first categorisation gave up ({:?})",
        started.elapsed()
    );
    assert!(
        seen.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "categorisation was tried"
    );

    wait_for(
        fx,
        "both categorisations to give up",
        "SELECT count(*) FILTER (WHERE categorized_at IS NOT NULL) = 2 FROM ai_chat_question_usage",
        &[],
    )
    .await;
    handle.shutdown().await;
    for request in [first, second] {
        let r = record(fx, request).await;
        assert_eq!(r.category, None);
        assert_eq!(
            r.category_skipped.as_deref(),
            Some("gateway: no answer in time")
        );
        assert_eq!(r.error_code, None, "the answers themselves are fine");
    }
}

fn facts(user: Actor, container: Option<Subject>, error: Option<&str>) -> QuestionFacts {
    QuestionFacts {
        request_id: Uuid::new_v4(),
        thread_id: 0,
        user_id: user.id,
        container,
        at: Utc::now(),
        slash_command: None,
        tools: vec!["issue_reader".into()],
        error_code: error.map(str::to_owned),
        input_tokens: 10,
        output_tokens: 20,
        tokens_estimated: true,
        first_token_ms: Some(120),
        total_ms: 900,
    }
}

#[tokio::test]
async fn categorisation_sends_nothing_where_duo_is_off() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let fx = &bench.fx;
    categorised(&bench, "Why is CI slow?", "CI/CD");
    let categorizer = categorizer_at(&bench, &bench.gateway_url, Duration::from_secs(20));

    let mut ids = Vec::new();
    for container in [Some(Subject::Project(world.project)), None] {
        let request_id = ask(fx, world.user, "Why is CI slow?", None).await;
        let thread_id = fx
            .id(
                "SELECT thread_id FROM ai_conversation_messages WHERE request_xid = $1",
                &[&request_id],
            )
            .await;
        let db = fx.pool.get().await.unwrap();
        store::record_question(
            &**db,
            &QuestionFacts {
                request_id,
                thread_id,
                ..facts(world.user, container, None)
            },
        )
        .await
        .unwrap();
        ids.push(request_id);
    }

    // Duo off for the project: nothing is sent for the question asked there.
    fx.project_duo(world.project, false).await;
    categorizer.run(&fx.pool, ids[0]).await.unwrap();
    assert_eq!(bench.provider_bodies().len(), 0);
    let r = record(fx, ids[0]).await;
    assert_eq!(r.category, None);
    assert_eq!(
        r.category_skipped.as_deref(),
        Some("Duo is off where the question was asked")
    );

    // The question asked about no resource is categorised.
    categorizer.run(&fx.pool, ids[1]).await.unwrap();
    assert_eq!(record(fx, ids[1]).await.category.as_deref(), Some("CI/CD"));
    assert_eq!(bench.provider_bodies().len(), 1);

    // Duo off for the whole instance: nothing at all.
    let third = ask(fx, world.user, "Why is CI slow?", None).await;
    let thread_id = fx
        .id(
            "SELECT thread_id FROM ai_conversation_messages WHERE request_xid = $1",
            &[&third],
        )
        .await;
    let db = fx.pool.get().await.unwrap();
    store::record_question(
        &**db,
        &QuestionFacts {
            request_id: third,
            thread_id,
            ..facts(world.user, None, None)
        },
    )
    .await
    .unwrap();
    fx.instance(Realm::SelfManaged, "ultimate", false).await;
    categorizer.run(&fx.pool, third).await.unwrap();
    assert_eq!(bench.provider_bodies().len(), 1);
    assert!(record(fx, third).await.category_skipped.is_some());
}

const ANALYTICS: &str = "query analytics($path: ID!, $start: Date, $end: Date) {
  group(fullPath: $path) {
    fullPath
    aiUsageData { all(startDate: $start, endDate: $end) { nodes { event timestamp user { username } } pageInfo { hasNextPage } } }
    aiMetrics(startDate: $start, endDate: $end) { duoChatContributorsCount duoUsedCount codeSuggestionsContributorsCount }
    aiUserMetrics(startDate: $start, endDate: $end) { nodes { user { username } duoChatInteractionsCount } }
  }
}";

const PROJECT_ANALYTICS: &str = "query analytics($path: ID!) {
  project(fullPath: $path) {
    aiUsageData { all { nodes { event user { username } } } }
    aiMetrics { duoChatContributorsCount }
  }
}";

async fn gql(server: &Server, token: Option<&str>, query: &str, variables: Value) -> Value {
    let mut req = reqwest::Client::new()
        .post(server.url("/api/graphql"))
        .json(&json!({ "query": query, "variables": variables }));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

fn error_codes(res: &Value) -> Vec<String> {
    res["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| e["extensions"]["code"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn analytics_answer_reporters_and_admins_in_gitlabs_shapes() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let sub = fx
        .group(Some(group), "platform", "private", "ultimate")
        .await;
    let project = fx.project(sub, "api", "private").await;
    let other_group = fx.group(None, "elsewhere", "public", "ultimate").await;
    let other_project = fx.project(other_group, "site", "public").await;
    let dev = fx.user("dev").await;
    let outsider = fx.user("outsider").await;
    let guest = fx.user("guest").await;
    let reporter = fx.user("reporter").await;
    let admin = fx.admin("root").await;
    fx.project_member(project, dev, access::DEVELOPER).await;
    fx.group_member(group, guest, access::GUEST).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    fx.project_member(other_project, outsider, access::DEVELOPER)
        .await;

    {
        let db = fx.pool.get().await.unwrap();
        for record in [
            // Asked about the project (counted in the group above it).
            facts(dev, Some(Subject::Project(project)), None),
            facts(dev, Some(Subject::Project(project)), Some("A1000")),
            // About no resource, by a member: counted.
            facts(dev, None, None),
            // Elsewhere, by someone else: not counted.
            facts(outsider, Some(Subject::Project(other_project)), None),
            facts(outsider, None, None),
        ] {
            store::record_question(&**db, &record).await.unwrap();
        }
    }
    let server = Server::start(&fx).await;
    let today = Utc::now().date_naive();
    let vars = json!({
        "path": "acme",
        "start": (today - chrono::Duration::days(7)).to_string(),
        "end": today.to_string(),
    });

    // Anonymous: the private group is not there at all.
    let res = gql(&server, None, ANALYTICS, vars.clone()).await;
    assert_eq!(res["data"]["group"], Value::Null, "{res}");
    // Anonymous on a public group: the group, but no analytics.
    let res = gql(&server, None, ANALYTICS, json!({ "path": "elsewhere" })).await;
    assert_eq!(res["data"]["group"]["fullPath"], "elsewhere", "{res}");
    assert_eq!(res["data"]["group"]["aiUsageData"], Value::Null, "{res}");
    assert_eq!(res["data"]["group"]["aiMetrics"], Value::Null, "{res}");
    assert!(error_codes(&res).iter().all(|c| c == "FORBIDDEN"), "{res}");

    // A guest reads the group, not its analytics.
    let token = fx.token(guest, &["api"]).await;
    let res = gql(&server, Some(&token), ANALYTICS, vars.clone()).await;
    assert_eq!(res["data"]["group"]["fullPath"], "acme", "{res}");
    assert_eq!(res["data"]["group"]["aiUsageData"], Value::Null, "{res}");
    assert_eq!(res["data"]["group"]["aiMetrics"], Value::Null, "{res}");
    assert_eq!(res["data"]["group"]["aiUserMetrics"], Value::Null, "{res}");
    assert_eq!(error_codes(&res), vec!["FORBIDDEN"; 3], "{res}");

    // A reporter (of a group above) and an admin read them.
    let token = fx.token(reporter, &["read_api"]).await;
    let as_reporter = gql(&server, Some(&token), ANALYTICS, vars.clone()).await;
    assert_eq!(as_reporter["errors"], Value::Null, "{as_reporter}");
    let group_data = &as_reporter["data"]["group"];
    assert_eq!(
        group_data["aiUsageData"]["all"]["nodes"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(group_data["aiMetrics"]["duoChatContributorsCount"], 1);
    assert_eq!(
        group_data["aiMetrics"]["codeSuggestionsContributorsCount"],
        Value::Null
    );
    insta::assert_json_snapshot!("group_analytics", as_reporter, {
        ".data.group.aiUsageData.all.nodes[].timestamp" => "[timestamp]",
    });

    let token = fx.token(admin, &["api"]).await;
    let as_admin = gql(&server, Some(&token), ANALYTICS, vars.clone()).await;
    assert_eq!(as_admin["data"], as_reporter["data"], "{as_admin}");
    let res = gql(
        &server,
        Some(&token),
        PROJECT_ANALYTICS,
        json!({ "path": "acme/platform/api" }),
    )
    .await;
    assert_eq!(res["errors"], Value::Null, "{res}");
    assert_eq!(
        res["data"]["project"]["aiUsageData"]["all"]["nodes"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // A developer of the project alone reads the project's, not the group's.
    let token = fx.token(dev, &["api"]).await;
    let res = gql(
        &server,
        Some(&token),
        PROJECT_ANALYTICS,
        json!({ "path": "acme/platform/api" }),
    )
    .await;
    assert_eq!(
        res["data"]["project"]["aiMetrics"]["duoChatContributorsCount"], 1,
        "{res}"
    );
    let res = gql(&server, Some(&token), ANALYTICS, vars.clone()).await;
    assert_eq!(res["data"]["group"]["aiUsageData"], Value::Null, "{res}");

    // Bounded: more than a year is refused.
    let token = fx.token(reporter, &["api"]).await;
    let res = gql(
        &server,
        Some(&token),
        ANALYTICS,
        json!({ "path": "acme", "start": "2020-01-01", "end": "2022-01-01" }),
    )
    .await;
    assert!(
        error_codes(&res).contains(&"ARGUMENT_ERROR".to_owned()),
        "{res}"
    );
}

#[tokio::test]
async fn the_admin_page_draws_the_charts() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let root = fx.admin("root").await;
    let alice = fx.user("alice").await;
    set_password(&fx, root.id, "correct horse battery").await;
    set_password(&fx, alice.id, "correct horse battery").await;
    {
        let db = fx.pool.get().await.unwrap();
        let categorised = facts(alice, None, None);
        store::record_question(&**db, &categorised).await.unwrap();
        store::store_category(
            &**db,
            categorised.request_id,
            &store::Category {
                category: "CI/CD".into(),
                detailed_category: None,
                language: Some("en".into()),
                labels: Vec::new(),
            },
        )
        .await
        .unwrap();
        store::record_question(&**db, &facts(alice, None, Some("A1003")))
            .await
            .unwrap();
    }
    let server = Server::start(&fx).await;

    let admin = signed_in(&server, "root", "correct horse battery").await;
    let (status, page) = admin.page("/admin/ai_usage?days=7").await;
    assert_eq!(status, 200);
    for chart in ["questions", "first-token", "errors", "tools", "categories"] {
        assert!(
            page.contains(&format!("<svg class=\"chart\" data-chart=\"{chart}\"")),
            "{chart} chart missing"
        );
    }
    assert!(page.contains("2 questions, 1 failed"), "{page}");
    assert!(page.contains("A1003: 1"));
    assert!(page.contains("issue_reader: 2"));
    assert!(page.contains("CI/CD: 1"));
    assert!(page.contains("Not categorised: 1"));
    assert!(page.contains("p50 120 ms, p95 120 ms"));
    assert!(page.contains("class=\"bar-failed\""));
    assert!(
        page.contains("href=\"/admin/ai_usage\""),
        "listed in the admin navigation"
    );

    let user = signed_in(&server, "alice", "correct horse battery").await;
    assert_eq!(user.page("/admin/ai_usage").await.0, 404);
}

/// Two runs of one answer job recording its usage at once (an expired
/// lease): the one that loses the race on the unique request id is told so,
/// its statement leaves nothing behind, and its second try updates the
/// record. One event in the end, with the last facts.
#[tokio::test]
async fn two_records_of_one_question_at_once_leave_one_event() {
    let fx = Fx::new().await;
    let user = fx.user("dev").await;
    let first = facts(user, None, None);
    let second = QuestionFacts {
        total_ms: 1234,
        ..first.clone()
    };

    let mut db1 = fx.pool.get().await.unwrap();
    let tx = db1.transaction().await.unwrap();
    assert!(store::record_question(&tx, &first).await.unwrap());
    // The second run's insert waits on the first one's uncommitted row.
    let pool = fx.pool.clone();
    let racing = second.clone();
    let loser = tokio::spawn(async move {
        let db2 = pool.get().await.unwrap();
        store::record_question(&**db2, &racing).await
    });
    let watcher = fx.pool.get().await.unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the second record never waited on the first"
        );
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE '%INSERT INTO ai_chat_question_usage%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    tx.commit().await.unwrap();
    let err = loser.await.unwrap().unwrap_err();
    assert!(store::is_race(&err), "{err}");

    // The retry finds the record and updates it.
    let db2 = fx.pool.get().await.unwrap();
    assert!(!store::record_question(&**db2, &second).await.unwrap());
    let row = db2
        .query_one(
            "SELECT count(*), max(q.total_ms)
             FROM ai_usage_events e JOIN ai_chat_question_usage q ON q.event_id = e.id
             WHERE q.request_id = $1",
            &[&first.request_id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    assert_eq!(row.get::<_, Option<i32>>(1), Some(1234));
    let events: i64 = db2
        .query_one(
            "SELECT count(*) FROM ai_usage_events WHERE user_id = $1",
            &[&user.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        events, 1,
        "the losing statement's event was rolled back with it"
    );
}

#[tokio::test]
async fn the_categorisation_switch_is_asked_about_each_questions_user() {
    use monolith::features::{FlagActor, GateChange};
    let bench = Bench::start().await;
    let world = bench.world().await;
    let fx = &bench.fx;
    let other = fx.user("other").await;
    fx.seat(other, "duo_enterprise", false).await;
    // Off for everyone but `other`: read once with the agent's other flags.
    let mut db = fx.pool.get().await.unwrap();
    monolith::features::store::set(
        &mut db,
        monolith::ai_usage::categorize::FLAG,
        &[
            GateChange::Boolean(false),
            GateChange::Actors(
                vec![FlagActor::User {
                    id: other.id,
                    admin: false,
                }],
                true,
            ),
        ],
    )
    .await
    .unwrap();
    drop(db);
    bench
        .fake
        .reply_when("Which way is north?", final_answer("Up the map."));
    categorised(&bench, "Which way is north?", "General programming");

    let handle = worker(fx, Arc::new(bench.responder.clone()));
    let off = ask(fx, world.user, "Which way is north?", None).await;
    let on = ask(fx, other, "Which way is north?", None).await;
    wait_for(
        fx,
        "the other user's question categorised",
        "SELECT count(*) = 1 FROM ai_chat_question_usage WHERE request_id = $1 AND categorized_at IS NOT NULL",
        &[&on],
    )
    .await;
    wait_for(
        fx,
        "the first user's question recorded",
        "SELECT count(*) = 1 FROM ai_chat_question_usage WHERE request_id = $1",
        &[&off],
    )
    .await;
    handle.shutdown().await;
    // The record and its categorisation job are written together: a
    // recorded question without a job never gets one.
    let db = fx.pool.get().await.unwrap();
    let jobs: Vec<String> = db
        .query(
            "SELECT dedupe_key FROM background_jobs WHERE kind = 'ai_categorize_question' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(jobs, vec![format!("ai_categorize:{on}")]);
    let uncategorised: bool = db
        .query_one(
            "SELECT categorized_at IS NULL FROM ai_chat_question_usage WHERE request_id = $1",
            &[&off],
        )
        .await
        .unwrap()
        .get(0);
    assert!(uncategorised);
}
