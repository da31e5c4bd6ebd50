//! The epic, merge request and build readers, the identifier prompt, the
//! codes every reader answers alike, and model errors, end to end through the
//! real gateway and the fake provider.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use crate::agent_support;

use agent_support::Bench;
use contracts::DuoErrorCode;
use fake_provider::Failure;
use monolith::agent::AgentResponder;

use crate::support::chaos_proxy::ChaosProxy;

fn action(tool: &str, input: &str) -> String {
    format!(" I should use a tool.\nAction: {tool}\nAction Input: {input}")
}

fn final_answer(text: &str) -> String {
    format!(" I know now.\nFinal Answer: {text}")
}

fn code(answered: &agent_support::Answered) -> Option<DuoErrorCode> {
    answered.answer.error.as_ref().map(|e| e.code)
}

#[tokio::test]
async fn the_identifier_prompt_interprets_words() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench
        .issue(
            world.project,
            world.user,
            12,
            "Login",
            "TWELVE_MARKER body",
            false,
        )
        .await;
    let question = "What is the login issue number twelve in gl/app about";
    bench.fake.push_text(action("issue_reader", question));
    bench.fake.push_text(
        "Here you go: {\"ResourceIdentifierType\": \"reference\", \"ResourceIdentifier\": \"gl/app#12\"}",
    );
    bench.fake.push_text(final_answer("About logins."));

    let answered = bench.ask(world.user, question, None).await;

    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 3);
    // The identifier prompt sees the question, never the content.
    assert!(bodies[1].contains("number twelve"));
    assert!(!bodies[1].contains("TWELVE_MARKER"));
    assert!(bodies[2].contains("TWELVE_MARKER"));
}

#[tokio::test]
async fn an_unusable_identifier_answer_ends_with_m3003_after_three_tries() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let question = "Tell me about that thing from yesterday";
    bench.fake.push_text(action("issue_reader", question));
    for _ in 0..3 {
        bench.fake.push_text("I am not sure which one you mean.");
    }

    let answered = bench.ask(world.user, question, None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::M3003));
    assert_eq!(bench.provider_bodies().len(), 4);
}

#[tokio::test]
async fn epic_and_merge_request_readers() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench.fx.group_member(world.group, world.user, 20).await;
    bench
        .fx
        .exec(
            "INSERT INTO epics (group_id, iid, title, description, author_id)
             VALUES ($1, 3, 'Roadmap', 'EPIC_MARKER plans', $2)",
            &[&world.group, &world.user.id],
        )
        .await;
    bench
        .fx
        .exec(
            "INSERT INTO merge_requests (project_id, iid, title, description, author_id, source_branch, diff)
             VALUES ($1, 7, 'Speed up', 'MR_MARKER faster', $2, 'fast', '+ cache')",
            &[&world.project, &world.user.id],
        )
        .await;

    bench
        .fake
        .push_text(action("epic_reader", "What is in gl&3?"));
    bench.fake.push_text(final_answer("Plans."));
    let epic = bench.ask(world.user, "What is in gl&3?", None).await;
    assert_eq!(epic.answer.error, None, "{:?}", epic.answer);
    assert!(bench.provider_bodies()[1].contains("EPIC_MARKER"));

    let url = format!("{}/gl/app/-/merge_requests/7", bench.external_url);
    bench
        .fake
        .push_text(action("merge_request_reader", &format!("Review {url}")));
    bench.fake.push_text(final_answer("Adds a cache."));
    let mr = bench.ask(world.user, &format!("Review {url}"), None).await;
    assert_eq!(mr.answer.error, None, "{:?}", mr.answer);
    assert!(bench.provider_bodies()[3].contains("MR_MARKER"));
}

#[tokio::test]
async fn a_merge_request_in_a_private_project_needs_reporter_access() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let guest = bench.fx.user("guest").await;
    bench.fx.seat(guest, "duo_enterprise", false).await;
    bench.fx.project_member(world.project, guest, 10).await;
    bench
        .fx
        .exec(
            "INSERT INTO merge_requests (project_id, iid, title, description, author_id, source_branch, diff)
             VALUES ($1, 7, 'Secret', 'MR_SECRET_MARKER', $2, 'x', '')",
            &[&world.project, &world.user.id],
        )
        .await;
    bench
        .fake
        .push_text(action("merge_request_reader", "Summarise gl/app!7"));

    let answered = bench.ask(guest, "Summarise gl/app!7", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::M3003));
    assert!(
        bench
            .provider_bodies()
            .iter()
            .all(|b| !b.contains("MR_SECRET_MARKER"))
    );
}

#[tokio::test]
async fn build_reader_reads_a_job_link() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let pipeline = bench
        .fx
        .id(
            "INSERT INTO ci_pipelines (project_id, ref, sha, status) VALUES ($1, 'main', 'abc', 'failed') RETURNING id",
            &[&world.project],
        )
        .await;
    let job = bench
        .fx
        .id(
            "INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status, log)
             VALUES ($1, $2, 'lint', 'test', 'failed', 'JOB_LOG_MARKER error') RETURNING id",
            &[&world.project, &pipeline],
        )
        .await;
    let url = format!("{}/gl/app/-/jobs/{job}", bench.external_url);
    bench
        .fake
        .push_text(action("build_reader", &format!("Why did {url} fail?")));
    bench.fake.push_text(final_answer("Lint errors."));

    let answered = bench
        .ask(world.user, &format!("Why did {url} fail?"), None)
        .await;

    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert!(bench.provider_bodies()[1].contains("JOB_LOG_MARKER"));
}

#[tokio::test]
async fn a_too_long_conversation_is_a1005() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench.fake.push_failure(Failure::Status {
        status: 400,
        kind: "invalid_request_error".into(),
        message: "prompt is too long: 250000 tokens > 200000 maximum".into(),
    });

    let answered = bench.ask(world.user, "Hello again", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::A1005));
}

/// A failed pipeline with one failed job in `project`; the job's id.
/// The readers go through one entry (`work_items::read_for_ai`), so a
/// refusal is the policy's code whichever tool met it, and the answer is the
/// same whether the item is hidden or missing.
#[tokio::test]
async fn every_reader_refuses_alike() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let owner = bench.fx.user("owner").await;
    let secret = bench.fx.project(world.group, "secret", "private").await;
    bench.fx.project_member(secret, owner, 40).await;
    bench
        .issue(secret, owner, 1, "Launch", "SECRET_ISSUE", false)
        .await;
    let hidden_job = bench.failed_job(secret, "SECRET_LOG").await;
    // Duo is off in this project, which the user can read.
    let quiet = bench.fx.project(world.group, "quiet", "private").await;
    bench.fx.project_member(quiet, world.user, 30).await;
    bench.fx.project_duo(quiet, false).await;
    bench
        .issue(quiet, world.user, 1, "Calm", "QUIET_ISSUE", false)
        .await;
    let quiet_job = bench.failed_job(quiet, "QUIET_LOG").await;
    let job_url =
        |id: i64, project: &str| format!("{}/gl/{project}/-/jobs/{id}", bench.external_url);

    let cases = [
        (
            "issue_reader",
            "Summarise gl/secret#1".to_owned(),
            DuoErrorCode::M3003,
        ),
        (
            "issue_reader",
            "Summarise gl/secret#9".to_owned(),
            DuoErrorCode::M3003,
        ),
        (
            "build_reader",
            format!("Why did {} fail?", job_url(hidden_job, "secret")),
            DuoErrorCode::M3003,
        ),
        (
            "build_reader",
            format!("Why did {} fail?", job_url(999_999, "secret")),
            DuoErrorCode::M3003,
        ),
        (
            "issue_reader",
            "Summarise gl/quiet#1".to_owned(),
            DuoErrorCode::M3002,
        ),
        (
            "build_reader",
            format!("Why did {} fail?", job_url(quiet_job, "quiet")),
            DuoErrorCode::M3002,
        ),
    ];
    let mut answers = Vec::new();
    for (tool, question, expected) in &cases {
        bench.fake.push_text(action(tool, question));
        let answered = bench.ask(world.user, question, None).await;
        assert_eq!(code(&answered), Some(*expected), "{tool}: {question}");
        answers.push(answered.answer);
    }
    // Hidden and missing look exactly alike, for issues and for jobs.
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[2], answers[3]);
    assert_eq!(answers[0], answers[2]);
    assert_eq!(answers[4], answers[5]);
    for body in bench.provider_bodies() {
        for secret in ["SECRET_ISSUE", "SECRET_LOG", "QUIET_ISSUE", "QUIET_LOG"] {
            assert!(!body.contains(secret), "{secret} reached the model");
        }
    }
}

/// The same failure ends with the same code in every reader, as GitLab's
/// identifier tools answer: the database failing while the item is
/// authorized is M4001, while it is serialised M5000. (build_reader answered
/// M4002 for both before the readers shared `read_for_ai`.) The database is
/// reached through a proxy that drops the connection when the chosen
/// statement is sent.
#[tokio::test]
async fn every_reader_answers_the_same_code_for_the_same_failure() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench
        .issue(world.project, world.user, 1, "Crash", "CRASH_BODY", false)
        .await;
    let job = bench.failed_job(world.project, "JOB_LOG").await;
    let job_question = format!("Why did {}/gl/app/-/jobs/{job} fail?", bench.external_url);
    let mut url = url::Url::parse(bench.fx.db.url()).unwrap();
    let proxy = ChaosProxy::start(url.port().unwrap()).await;
    url.set_port(Some(proxy.port)).unwrap();

    // The statements: the policy reading the item, then its serialization.
    let issue_read = "FROM issue_assignees WHERE issue_id = i.id";
    let issue_serialized = "FROM issues i JOIN projects p ON p.id = i.project_id";
    let job_read = "SELECT project_id FROM ci_builds WHERE id = $1";
    let job_serialized = "FROM ci_builds b JOIN ci_pipelines pl";
    let cases = [
        (
            "issue_reader",
            "Summarise gl/app#1",
            issue_read,
            DuoErrorCode::M4001,
        ),
        (
            "build_reader",
            job_question.as_str(),
            job_read,
            DuoErrorCode::M4001,
        ),
        (
            "issue_reader",
            "Summarise gl/app#1",
            issue_serialized,
            DuoErrorCode::M5000,
        ),
        (
            "build_reader",
            job_question.as_str(),
            job_serialized,
            DuoErrorCode::M5000,
        ),
    ];
    for (tool, question, statement, expected) in cases {
        // A pool of its own each time: no connection outlives a cut.
        let pool = monolith::db::pool_for_url(url.as_str(), 4).unwrap();
        let responder = AgentResponder::from_config(&bench.config, pool).unwrap();
        bench.fake.push_text(action(tool, question));
        proxy.cut_when_sent(statement.as_bytes());
        // The user's words name nothing (a named resource would be read
        // before the first step, taking the cut); the tool's input does.
        let (answered, ()) = tokio::join!(
            bench.ask_with(world.user, "Why is this broken?", None, None, &responder),
            proxy.wait_cut()
        );
        assert_eq!(code(&answered), Some(expected), "{tool} cut at {statement}");
    }
    for body in bench.provider_bodies() {
        assert!(
            !body.contains("CRASH_BODY") && !body.contains("JOB_LOG"),
            "{body}"
        );
    }
}
