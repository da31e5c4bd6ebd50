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

// ------------------------------------------------- commits, files, directories

use monolith::repositories::writer::{self, CommitRequest, Signature};

const CODE_SECRET: &str = "EXCLUDED_KEY_MATERIAL";

/// One commit on `main` of `project` upserting `files`; its id.
async fn commit(bench: &Bench, project: i64, title: &str, files: &[(&str, &str)]) -> String {
    let path = bench.repositories().ensure(project, "main").await.unwrap();
    writer::commit(
        &path,
        &CommitRequest {
            branch: "main".into(),
            start: None,
            message: format!("{title}\n\nThe reason for it."),
            author: Signature {
                name: "Ada Author".into(),
                email: "ada@example.com".into(),
                when: None,
            },
            actions: crate::agent_support::upserts(files),
        },
    )
    .await
    .unwrap()
    .commit_id
}

/// Thirty numbered lines (`L01X` .. `L30X`).
fn numbered_lines() -> String {
    (1..=30).map(|n| format!("let L{n:02}X = {n};\n")).collect()
}

/// `gl/app` holding `src/lib.rs` (numbered lines), `src/util.rs` and an
/// excluded `secrets/key.rs`; `secrets/` is excluded from Duo context.
async fn code_world(bench: &Bench) -> (agent_support::World, String) {
    let world = bench.world().await;
    let sha = commit(
        bench,
        world.project,
        "Add the library",
        &[
            ("src/lib.rs", &numbered_lines()),
            ("src/util.rs", "pub fn util_helper_marker() {}\n"),
            ("secrets/key.rs", &format!("// {CODE_SECRET}\n")),
        ],
    )
    .await;
    bench
        .fx
        .exec(
            "UPDATE projects SET duo_context_exclusion_rules = '{secrets/}' WHERE id = $1",
            &[&world.project],
        )
        .await;
    (world, sha)
}

fn base(bench: &Bench) -> String {
    bench.external_url.trim_end_matches('/').to_owned()
}

fn attached_nothing(body: &str) {
    assert!(
        !body.contains("The user is currently looking at this"),
        "{body}"
    );
    assert!(!body.contains("<additional_context>"), "{body}");
}

#[tokio::test]
async fn a_commit_named_by_link_reference_or_bare_id_on_a_project_page_is_attached() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    commit(&bench, world.project, "Start", &[("README.md", "hi\n")]).await;
    let sha = commit(
        &bench,
        world.project,
        "Add a rate limiter",
        &[("src/limit.rs", "// LIMITER_MARKER\npub fn limit() {}\n")],
    )
    .await;
    let base = base(&bench);

    answered_without_tools(
        &bench,
        world.user,
        &format!("Explain {base}/gl/app/-/commit/{sha}"),
    )
    .await;
    answered_without_tools(
        &bench,
        world.user,
        &format!("What changed in gl/app@{}?", &sha[..10]),
    )
    .await;
    bench.fake.push_text(final_answer("It adds a limiter."));
    let on_page = bench
        .ask(
            world.user,
            &format!("What does {} do?", &sha[..8]),
            Some(agent_support::gid("Project", world.project)),
        )
        .await;
    assert_eq!(on_page.answer.error, None, "{:?}", on_page.answer);

    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 3);
    for body in &bodies {
        assert!(body.contains("looking at this commit"), "{body}");
        assert!(body.contains("Add a rate limiter"), "{body}");
        assert!(body.contains("Ada Author"), "{body}");
        assert!(body.contains("src/limit.rs"), "{body}");
        assert!(body.contains("LIMITER_MARKER"), "the diff: {body}");
    }
}

#[tokio::test]
async fn a_commit_the_user_may_not_read_or_that_is_missing_is_never_attached() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let owner = bench.fx.user("owner").await;
    let secret = bench.fx.project(world.group, "secret", "private").await;
    bench.fx.project_member(secret, owner, 40).await;
    let hidden = commit(&bench, secret, "Vault", &[("vault.rs", SECRET)]).await;
    // A guest sees the project but not its code.
    let guest_of = bench.fx.project(world.group, "shared", "private").await;
    bench.fx.project_member(guest_of, owner, 40).await;
    bench.fx.project_member(guest_of, world.user, 10).await;
    let guarded = commit(&bench, guest_of, "Guarded", &[("g.rs", SECRET)]).await;
    commit(&bench, world.project, "Mine", &[("a.rs", "a\n")]).await;
    let base = base(&bench);

    answered_without_tools(
        &bench,
        world.user,
        &format!("Explain {base}/gl/secret/-/commit/{hidden}"),
    )
    .await;
    answered_without_tools(&bench, world.user, &format!("Explain gl/shared@{guarded}")).await;
    answered_without_tools(&bench, world.user, "Explain gl/app@0123456789abcdef").await;

    for body in bench.provider_bodies() {
        assert!(!body.contains("vault combination"), "leaked: {body}");
        assert!(
            !body.contains("Vault") && !body.contains("Guarded"),
            "leaked: {body}"
        );
        attached_nothing(&body);
    }
}

#[tokio::test]
async fn a_linked_file_or_its_line_range_is_attached() {
    let bench = Bench::start().await;
    let (world, _) = code_world(&bench).await;
    let base = base(&bench);

    answered_without_tools(
        &bench,
        world.user,
        &format!("Explain {base}/gl/app/-/blob/main/src/util.rs please"),
    )
    .await;
    answered_without_tools(
        &bench,
        world.user,
        &format!("What do lines {base}/gl/app/-/blob/main/src/lib.rs#L10-12 do?"),
    )
    .await;

    let bodies = bench.provider_bodies();
    assert!(bodies[0].contains("util_helper_marker"), "{}", bodies[0]);
    assert!(
        bodies[0].contains("<category>file</category>"),
        "{}",
        bodies[0]
    );
    let ranged = &bodies[1];
    for wanted in ["L10X", "L11X", "L12X"] {
        assert!(ranged.contains(wanted), "{wanted}: {ranged}");
    }
    for unwanted in ["L09X", "L13X", "L30X"] {
        assert!(!ranged.contains(unwanted), "{unwanted}: {ranged}");
    }
}

#[tokio::test]
async fn an_excluded_private_or_missing_file_is_never_attached_and_looks_the_same() {
    let bench = Bench::start().await;
    let (world, _) = code_world(&bench).await;
    let owner = bench.fx.user("owner").await;
    let secret = bench.fx.project(world.group, "secret", "private").await;
    bench.fx.project_member(secret, owner, 40).await;
    commit(&bench, secret, "Vault", &[("vault.rs", SECRET)]).await;
    let base = base(&bench);

    for link in [
        format!("{base}/gl/app/-/blob/main/secrets/key.rs"),
        format!("{base}/gl/secret/-/blob/main/vault.rs"),
        format!("{base}/gl/app/-/blob/main/src/missing.rs"),
        format!("{base}/gl/app/-/blob/no-such-branch/src/util.rs"),
    ] {
        answered_without_tools(&bench, world.user, &format!("Explain {link}")).await;
    }

    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 4);
    for body in &bodies {
        assert!(!body.contains(CODE_SECRET), "leaked: {body}");
        assert!(!body.contains("vault combination"), "leaked: {body}");
        attached_nothing(body);
    }
}

#[tokio::test]
async fn a_linked_directory_is_listed_without_its_excluded_files() {
    let bench = Bench::start().await;
    let (world, _) = code_world(&bench).await;
    let base = base(&bench);

    answered_without_tools(
        &bench,
        world.user,
        &format!("What is in {base}/gl/app/-/tree/main/src?"),
    )
    .await;
    answered_without_tools(
        &bench,
        world.user,
        &format!("What is in {base}/gl/app/-/tree/main?"),
    )
    .await;
    answered_without_tools(
        &bench,
        world.user,
        &format!("What is in {base}/gl/app/-/tree/main/secrets?"),
    )
    .await;

    let bodies = bench.provider_bodies();
    assert!(
        bodies[0].contains("<category>directory</category>"),
        "{}",
        bodies[0]
    );
    assert!(
        bodies[0].contains("src/lib.rs") && bodies[0].contains("src/util.rs"),
        "{}",
        bodies[0]
    );
    // A listing, not the files' content.
    assert!(!bodies[0].contains("util_helper_marker"), "{}", bodies[0]);
    assert!(
        bodies[1].contains("<category>directory</category>"),
        "{}",
        bodies[1]
    );
    assert!(
        bodies[1].contains("\\\"path\\\":\\\"src\\\""),
        "{}",
        bodies[1]
    );
    // The excluded directory: as if it did not exist.
    attached_nothing(&bodies[2]);
    for body in &bodies {
        assert!(!body.contains("secrets/key.rs"), "listed: {body}");
        assert!(!body.contains(CODE_SECRET), "leaked: {body}");
    }
}

#[tokio::test]
async fn code_of_a_project_the_user_may_not_read_is_never_attached() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let owner = bench.fx.user("owner").await;
    let secret = bench.fx.project(world.group, "secret", "private").await;
    bench.fx.project_member(secret, owner, 40).await;
    let sha = commit(&bench, secret, "Vault", &[("vault/hidden_name.rs", SECRET)]).await;
    let base = base(&bench);

    answered_without_tools(
        &bench,
        world.user,
        &format!("What is in {base}/gl/secret/-/tree/main/vault?"),
    )
    .await;
    answered_without_tools(
        &bench,
        world.user,
        &format!("What is in {base}/gl/secret/-/tree/main?"),
    )
    .await;
    answered_without_tools(
        &bench,
        world.user,
        &format!("Explain {base}/gl/secret/-/blob/main/vault/hidden_name.rs"),
    )
    .await;
    // A Duo Pro seat has no commit reader (`ask_commit`), even as a developer.
    let pro = bench.fx.user("pro").await;
    bench.fx.seat(pro, "duo_pro", false).await;
    bench.fx.project_member(secret, pro, 30).await;
    answered_without_tools(&bench, pro, &format!("Explain gl/secret@{sha}")).await;

    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 4);
    // The listings' questions do not name the file: only a listing could.
    for body in &bodies[..2] {
        assert!(!body.contains("hidden_name"), "listed: {body}");
    }
    for body in &bodies {
        assert!(!body.contains("vault combination"), "leaked: {body}");
        attached_nothing(body);
    }
}

#[tokio::test]
async fn an_attached_file_is_shortened_to_the_models_budget() {
    let bench = Bench::start_with_gateway_env(&[(
        "AIGW_MODEL_CONTEXT_TOKENS",
        r#"{"claude-3-5-sonnet-20241022": 6000}"#,
    )])
    .await;
    let world = bench.world().await;
    let big = format!(
        "// BIG_FILE_HEAD\n{}// BIG_FILE_TAIL\n",
        "let filler = 1;\n".repeat(1_200)
    );
    commit(&bench, world.project, "Big", &[("big.rs", &big)]).await;
    let base = base(&bench);

    answered_without_tools(
        &bench,
        world.user,
        &format!("Explain {base}/gl/app/-/blob/main/big.rs"),
    )
    .await;

    let first = &bench.provider_bodies()[0];
    assert!(first.contains("BIG_FILE_HEAD"), "{first}");
    assert!(!first.contains("BIG_FILE_TAIL"), "not shortened: {first}");
    assert!(
        first.contains("Shortened to fit the model's context window"),
        "{first}"
    );
}
