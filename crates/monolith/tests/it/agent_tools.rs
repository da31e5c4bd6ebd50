//! The epic, merge request and build readers, the identifier prompt, and
//! model errors, end to end through the real gateway and the fake provider.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use crate::agent_support;

use agent_support::Bench;
use contracts::DuoErrorCode;
use fake_provider::Failure;

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
