//! Resources named in a question reach the first model step as context when
//! the user may read them, and never otherwise (issue 29): real PostgreSQL,
//! the real gateway in-process, the fake model behind it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use crate::agent_support::{self, Bench};

const SECRET: &str = "the vault combination is 4-8-15-16";

fn final_answer(text: &str) -> String {
    format!(" I can answer this myself.\nFinal Answer: {text}")
}

async fn answered_without_tools(bench: &Bench, user: monolith::policy::Actor, question: &str) {
    bench.fake.push_text(final_answer("Here is what I know."));
    let answered = bench.ask(user, question, None).await;
    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
}

#[tokio::test]
async fn a_full_reference_is_attached_to_the_first_step() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench
        .issue(
            world.project,
            world.user,
            4,
            "Flaky test",
            "The cache test fails on Mondays.",
            false,
        )
        .await;

    answered_without_tools(&bench, world.user, "Summarize gl/app#4").await;

    let first = &bench.provider_bodies()[0];
    assert!(first.contains("fails on Mondays"), "{first}");
    assert!(first.contains("Flaky test"), "{first}");
}

#[tokio::test]
async fn a_link_of_this_instance_is_attached_to_the_first_step() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench
        .issue(
            world.project,
            world.user,
            7,
            "Dark mode",
            "Add a dark theme to settings.",
            false,
        )
        .await;
    let link = format!(
        "{}/gl/app/-/issues/7",
        bench.external_url.trim_end_matches('/')
    );

    answered_without_tools(&bench, world.user, &format!("What does {link} ask for?")).await;

    assert!(bench.provider_bodies()[0].contains("Add a dark theme to settings."));
}

#[tokio::test]
async fn an_unreadable_or_missing_resource_is_never_attached_and_looks_the_same() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let owner = bench.fx.user("owner").await;
    let secret = bench.fx.project(world.group, "secret", "private").await;
    bench.fx.project_member(secret, owner, 40).await;
    bench.issue(secret, owner, 1, "Vault", SECRET, false).await;
    // A confidential issue in a project where the user is only a guest.
    let guest_of = bench.fx.project(world.group, "shared", "private").await;
    bench.fx.project_member(guest_of, owner, 40).await;
    bench.fx.project_member(guest_of, world.user, 10).await;
    bench
        .issue(guest_of, owner, 2, "Hidden", SECRET, true)
        .await;

    answered_without_tools(&bench, world.user, "Summarize gl/secret#1").await;
    answered_without_tools(&bench, world.user, "Summarize gl/shared#2").await;
    answered_without_tools(&bench, world.user, "Summarize gl/secret#99").await;

    let bodies = bench.provider_bodies();
    for body in &bodies {
        assert!(!body.contains("vault combination"), "leaked: {body}");
    }
    // Refused and missing: the same prompt shape (no context at all).
    for body in &bodies {
        assert!(
            !body.contains("The user is currently looking at this"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_question_without_a_resource_gets_no_context() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench
        .issue(
            world.project,
            world.user,
            1,
            "Anything",
            "Some description.",
            false,
        )
        .await;

    answered_without_tools(&bench, world.user, "What is a merge request?").await;

    let first = &bench.provider_bodies()[0];
    assert!(
        !first.contains("The user is currently looking at this"),
        "{first}"
    );
    assert!(!first.contains("Some description."), "{first}");
}

#[tokio::test]
async fn a_seat_without_the_reader_primitive_gets_no_context() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // A Duo Pro seat: chat, but not the issue reader (a Duo Enterprise tool).
    let pro = bench.fx.user("pro").await;
    bench.fx.seat(pro, "duo_pro", false).await;
    bench.fx.project_member(world.project, pro, 30).await;
    bench
        .issue(world.project, world.user, 5, "Roadmap", SECRET, false)
        .await;

    answered_without_tools(&bench, pro, "Summarize gl/app#5").await;

    for body in bench.provider_bodies() {
        assert!(!body.contains("vault combination"), "leaked: {body}");
    }
    let _ = agent_support::gid("Issue", 0);
}

#[tokio::test]
async fn a_linked_job_is_attached_for_a_reader_and_never_for_anyone_else() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let base = bench.external_url.trim_end_matches('/').to_owned();
    let readable = bench
        .failed_job(world.project, "error: LINT_FAILED_HERE")
        .await;
    let owner = bench.fx.user("owner").await;
    let secret = bench.fx.project(world.group, "secret", "private").await;
    bench.fx.project_member(secret, owner, 40).await;
    let hidden = bench.failed_job(secret, "error: HIDDEN_JOB_LOG").await;

    answered_without_tools(
        &bench,
        world.user,
        &format!("Why did {base}/gl/app/-/jobs/{readable} fail?"),
    )
    .await;
    answered_without_tools(
        &bench,
        world.user,
        &format!("Why did {base}/gl/secret/-/jobs/{hidden} fail?"),
    )
    .await;

    let bodies = bench.provider_bodies();
    assert!(bodies[0].contains("LINT_FAILED_HERE"), "{}", bodies[0]);
    assert!(
        !bodies[1].contains("HIDDEN_JOB_LOG"),
        "leaked: {}",
        bodies[1]
    );
}
