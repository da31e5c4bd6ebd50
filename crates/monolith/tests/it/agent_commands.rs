//! Slash commands and the documentation tool, end to end through the real
//! gateway and the fake provider.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use crate::agent_support;

use agent_support::{Bench, gid};
use contracts::DuoErrorCode;
use monolith::chat::CurrentFile;

fn code(answered: &agent_support::Answered) -> Option<DuoErrorCode> {
    answered.answer.error.as_ref().map(|e| e.code)
}

fn selection(text: &str) -> Option<CurrentFile> {
    Some(CurrentFile {
        file_name: "src/lib.rs".into(),
        selected_text: text.into(),
        content_above_cursor: Some("// above\n".into()),
        content_below_cursor: Some("\n// below".into()),
    })
}

#[tokio::test]
async fn help_needs_no_model() {
    let bench = Bench::start().await;
    let world = bench.world().await;

    let answered = bench.ask(world.user, "/help", None).await;

    assert_eq!(answered.answer.error, None);
    assert!(answered.answer.content.contains("/explain"));
    assert_eq!(answered.chunks.concat(), answered.answer.content);
    assert!(bench.provider_bodies().is_empty());
}

#[tokio::test]
async fn code_commands_send_the_selection_to_their_prompt_and_stream() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench.fake.set_chunk_size(4);
    for (command, marker) in [
        ("/explain", "explain_marker_fn"),
        ("/tests", "tests_marker_fn"),
        ("/refactor", "refactor_marker_fn"),
        ("/fix", "fix_marker_fn"),
    ] {
        // The model's second half comes only once the first reached the
        // chat stream: what is ready together may leave in one chunk.
        bench.fake.push(fake_provider::Scripted::Held {
            before: vec!["Answer ".into(), "for ".into()],
            after: vec![format!("{command}.")],
        });
        let before = bench.provider_bodies().len();
        let answered = bench
            .ask_streamed(
                world.user,
                &format!("{command} focus on errors"),
                selection(&format!("fn {marker}() {{}}")),
            )
            .await;
        assert_eq!(
            answered.answer.error, None,
            "{command}: {:?}",
            answered.answer
        );
        assert_eq!(answered.answer.content, format!("Answer for {command}."));
        assert!(answered.chunks.len() > 1, "{command} streams");
        let bodies = bench.provider_bodies();
        assert_eq!(bodies.len(), before + 1, "{command}: one model call");
        let body = bodies.last().unwrap();
        assert!(body.contains(marker), "{command}: {body}");
        assert!(body.contains("focus on errors"), "{command}");
        assert!(body.contains("Rust"), "{command}: language info");
    }
}

#[tokio::test]
async fn a_code_command_without_a_selection_is_m4000() {
    let bench = Bench::start().await;
    let world = bench.world().await;

    let answered = bench.ask(world.user, "/explain", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::M4000));
    assert!(bench.provider_bodies().is_empty());
}

#[tokio::test]
async fn a_code_command_needs_its_unit_primitive() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // Duo Pro grants explain_code but not troubleshoot_job.
    let pro = bench.fx.user("pro").await;
    bench.fx.seat(pro, "duo_pro", false).await;
    let build = failed_build(&bench, world.project, "boom").await;
    bench.fx.project_member(world.project, pro, 30).await;

    let answered = bench
        .ask(pro, "/troubleshoot", Some(gid("Ci::Build", build)))
        .await;

    assert_eq!(code(&answered), Some(DuoErrorCode::M3005));
    assert!(bench.provider_bodies().is_empty());
}

async fn failed_build(bench: &Bench, project: i64, log: &str) -> i64 {
    build(bench, project, "failed", log).await
}

async fn build(bench: &Bench, project: i64, status: &str, log: &str) -> i64 {
    let pipeline = bench
        .fx
        .id(
            "INSERT INTO ci_pipelines (project_id, ref, sha, status) VALUES ($1, 'main', 'abc', 'failed') RETURNING id",
            &[&project],
        )
        .await;
    bench
        .fx
        .id(
            "INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status, log)
             VALUES ($1, $2, 'rspec', 'test', $3, $4) RETURNING id",
            &[&project, &pipeline, &status, &log],
        )
        .await
}

#[tokio::test]
async fn troubleshoot_sends_the_end_of_a_long_log() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let log = format!(
        "HEAD_OF_LOG\n{}\nERROR: the real failure is here",
        "x".repeat(150_000)
    );
    let build = failed_build(&bench, world.project, &log).await;
    bench.fake.push_text("Fix the failing spec.");

    let answered = bench
        .ask(world.user, "/troubleshoot", Some(gid("Ci::Build", build)))
        .await;

    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert_eq!(answered.answer.content, "Fix the failing spec.");
    let body = bench.provider_bodies().pop().unwrap();
    assert!(body.contains("ERROR: the real failure is here"));
    assert!(
        !body.contains("HEAD_OF_LOG"),
        "the log is cut from the front"
    );
}

#[tokio::test]
async fn troubleshoot_needs_a_failed_job() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let passed = build(&bench, world.project, "success", "all good").await;

    let on_success = bench
        .ask(world.user, "/troubleshoot", Some(gid("Ci::Build", passed)))
        .await;
    let without_job = bench.ask(world.user, "/troubleshoot", None).await;

    assert_eq!(code(&on_success), Some(DuoErrorCode::M4005));
    assert_eq!(code(&without_job), Some(DuoErrorCode::M4005));
    assert!(bench.provider_bodies().is_empty());
}

#[tokio::test]
async fn summarize_comments_sends_only_notes_the_user_may_read() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let guest = bench.fx.user("guest").await;
    bench.fx.seat(guest, "duo_enterprise", false).await;
    bench.fx.project_member(world.project, guest, 10).await;
    let issue = bench
        .issue(
            world.project,
            world.user,
            1,
            "Ideas",
            "Collect ideas.",
            false,
        )
        .await;
    for (body, internal) in [
        ("PUBLIC_NOTE we should cache results", false),
        ("INTERNAL_NOTE salaries are in the spreadsheet", true),
    ] {
        bench
            .fx
            .exec(
                "INSERT INTO notes (noteable_type, noteable_id, author_id, body, internal)
                 VALUES ('Issue', $1, $2, $3, $4)",
                &[&issue, &world.user.id, &body, &internal],
            )
            .await;
    }
    bench.fake.push_text("People want caching.");

    let answered = bench
        .ask(guest, "/summarize_comments", Some(gid("Issue", issue)))
        .await;

    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let body = bench.provider_bodies().pop().unwrap();
    assert!(body.contains("PUBLIC_NOTE"));
    assert!(
        !body.contains("INTERNAL_NOTE"),
        "an internal note leaked to a guest"
    );
}

#[tokio::test]
async fn summarize_comments_without_comments_is_m4004() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let issue = bench
        .issue(
            world.project,
            world.user,
            1,
            "Quiet",
            "Nobody commented.",
            false,
        )
        .await;

    let answered = bench
        .ask(world.user, "/summarize_comments", Some(gid("Issue", issue)))
        .await;

    assert_eq!(code(&answered), Some(DuoErrorCode::M4004));
    assert!(bench.provider_bodies().is_empty());
}

#[tokio::test]
async fn the_documentation_tool_answers_with_sources() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench.fake.push_text(
        " This is about GitLab itself.\nAction: gitlab_documentation\nAction Input: error code M3003",
    );
    bench
        .fake
        .push_text("M3003 means the resource was not found.");

    let answered = bench
        .ask(world.user, "What does error M3003 mean?", None)
        .await;

    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    let sources = answered.answer.extras["sources"].as_array().unwrap();
    assert!(!sources.is_empty(), "{:?}", answered.answer.extras);
    assert_eq!(answered.chunks.concat().trim_end(), answered.answer.content);
    // Two model calls: the step, then the documentation answer's prompt.
    assert_eq!(bench.provider_bodies().len(), 2);
}

#[tokio::test]
async fn the_worker_seam_reads_the_selection_from_the_job() {
    use monolith::chat::completion::{ChatResponder, CompletionJob};
    let bench = Bench::start().await;
    let world = bench.world().await;
    let thread = bench
        .fx
        .id(
            "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, 1) RETURNING id",
            &[&world.user.id],
        )
        .await;
    let request_id = uuid::Uuid::new_v4();
    bench
        .fx
        .exec(
            "INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid)
             VALUES ($1, 1, '/explain', $2, $3)",
            &[&thread, &uuid::Uuid::new_v4(), &request_id],
        )
        .await;
    bench.fake.push_text("It does nothing.");
    let job = CompletionJob {
        request_id,
        user_id: world.user.id,
        thread_id: thread,
        content: "/explain".into(),
        current_file: selection("fn job_marker_fn() {}"),
        ..Default::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();

    let answer = bench.responder.respond(&job, tx.into()).await.unwrap();

    assert_eq!(answer.error, None, "{answer:?}");
    assert_eq!(answer.content, "It does nothing.");
    assert_eq!(rx.recv().await.as_deref(), Some("It does nothing."));
    assert!(bench.provider_bodies()[0].contains("job_marker_fn"));
}
