//! The agent loop end to end: real PostgreSQL, the real AI gateway in-process,
//! the fake model provider behind it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use crate::agent_support;

use agent_support::{Bench, gid};
use contracts::DuoErrorCode;
use fake_provider::Failure;

const SECRET: &str = "the launch codes are 0000 and must never leak";

fn final_answer(text: &str) -> String {
    format!(" I can answer this myself.\nFinal Answer: {text}")
}

fn action(tool: &str, input: &str) -> String {
    format!(" I should use a tool.\nAction: {tool}\nAction Input: {input}")
}

fn code(answered: &agent_support::Answered) -> Option<DuoErrorCode> {
    answered.answer.error.as_ref().map(|e| e.code)
}

#[tokio::test]
async fn a_direct_answer_is_streamed_in_chunks() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // The model's second half comes only once the first reached the chat
    // stream: what is ready together may leave the gateway in one chunk.
    bench.fake.push(fake_provider::Scripted::Held {
        before: vec![final_answer("Rust has no garbage collector;")],
        after: vec![" ownership frees memory.".into()],
    });

    let answered = bench
        .ask_streamed(world.user, "Does Rust have a GC?", None)
        .await;

    assert_eq!(answered.answer.error, None);
    assert_eq!(
        answered.answer.content,
        "Rust has no garbage collector; ownership frees memory."
    );
    assert!(answered.chunks.len() > 1, "{:?}", answered.chunks);
    assert_eq!(answered.chunks.concat(), answered.answer.content);
    assert_eq!(answered.answer.extras["sources"], serde_json::json!([]));
    // The question reached the model through the gateway's ReAct prompt.
    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].contains("Does Rust have a GC?"));
}

#[tokio::test]
async fn issue_reader_feeds_the_issue_to_the_next_step() {
    let bench = Bench::start().await;
    let world = bench.world().await;
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
    bench
        .fake
        .push_text(action("issue_reader", "Summarise issue #1"));
    bench.fake.push_text(final_answer(
        "Issue #1 is about expired reset emails blocking logins.",
    ));

    let answered = bench
        .ask(
            world.user,
            "Summarise issue #1",
            Some(gid("Project", world.project)),
        )
        .await;

    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert_eq!(
        answered.answer.content,
        "Issue #1 is about expired reset emails blocking logins."
    );
    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        answered.tools,
        ["issue_reader"],
        "the running tool is announced"
    );
    // The question names the issue (`#1` of the page's project), so it is
    // attached to the first step already; the tool's observation follows.
    assert!(bodies[0].contains("password reset email expires"));
    assert!(
        bodies[1].contains("password reset email expires"),
        "the observation reaches the second model call: {}",
        bodies[1]
    );
    assert!(bodies[1].contains("Login broken"));
}

#[tokio::test]
async fn a_full_reference_is_resolved_without_a_page_resource() {
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
    bench
        .fake
        .push_text(action("issue_reader", "What is gl/app#4 about?"));
    bench.fake.push_text(final_answer("A flaky cache test."));

    let answered = bench.ask(world.user, "What is gl/app#4 about?", None).await;

    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert!(bench.provider_bodies()[1].contains("fails on Mondays"));
}

#[tokio::test]
async fn an_unreadable_confidential_issue_is_m3003_and_never_reaches_the_model() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let owner = bench.fx.user("owner").await;
    let secret_project = bench.fx.project(world.group, "secret", "private").await;
    bench.fx.project_member(secret_project, owner, 40).await;
    bench
        .issue(secret_project, owner, 1, "Launch", SECRET, true)
        .await;

    bench
        .fake
        .push_text(action("issue_reader", "Summarise gl/secret#1"));
    let denied = bench.ask(world.user, "Summarise gl/secret#1", None).await;

    bench
        .fake
        .push_text(action("issue_reader", "Summarise gl/secret#99"));
    let missing = bench.ask(world.user, "Summarise gl/secret#99", None).await;

    assert_eq!(code(&denied), Some(DuoErrorCode::M3003));
    assert_eq!(code(&missing), Some(DuoErrorCode::M3003));
    // Unreadable and missing look exactly alike.
    assert_eq!(denied.answer, missing.answer);
    assert!(denied.chunks.is_empty());
    for body in bench.provider_bodies() {
        assert!(!body.contains("launch codes"), "leaked: {body}");
    }
}

#[tokio::test]
async fn an_unreadable_page_resource_is_dropped_from_the_context() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let owner = bench.fx.user("owner").await;
    let secret_project = bench.fx.project(world.group, "secret", "private").await;
    bench.fx.project_member(secret_project, owner, 40).await;
    let issue = bench
        .issue(secret_project, owner, 1, "Launch", SECRET, true)
        .await;
    bench
        .fake
        .push_text(final_answer("I have no context about that."));

    let answered = bench
        .ask(
            world.user,
            "What is this page about?",
            Some(gid("Issue", issue)),
        )
        .await;

    assert_eq!(answered.answer.error, None);
    for body in bench.provider_bodies() {
        assert!(!body.contains("launch codes"), "leaked: {body}");
    }
}

#[tokio::test]
async fn a_readable_page_resource_is_sent_as_context() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let issue = bench
        .issue(
            world.project,
            world.user,
            2,
            "Dark mode",
            "Add a dark theme to settings.",
            false,
        )
        .await;
    bench
        .fake
        .push_text(final_answer("It asks for a dark theme."));

    let answered = bench
        .ask(
            world.user,
            "What is this issue about?",
            Some(gid("Issue", issue)),
        )
        .await;

    assert_eq!(answered.answer.error, None);
    assert!(bench.provider_bodies()[0].contains("Add a dark theme to settings."));
}

#[tokio::test]
async fn the_step_limit_ends_with_a1006_and_repeated_tools_are_not_rerun() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench
        .issue(
            world.project,
            world.user,
            1,
            "Loop",
            "Round and round.",
            false,
        )
        .await;
    for _ in 0..10 {
        bench
            .fake
            .push_text(action("issue_reader", "Read gl/app#1"));
    }

    let answered = bench.ask(world.user, "Read gl/app#1", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::A1006));
    let bodies = bench.provider_bodies();
    assert_eq!(bodies.len(), 10);
    assert!(bodies[2].contains("You already have the answer from the issue_reader tool"));
}

#[tokio::test]
async fn a_retryable_error_is_retried() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // The gateway retries an overloaded provider once itself; the second
    // failure reaches the monolith as a retryable error event.
    bench.fake.push_failure(Failure::Overloaded);
    bench.fake.push_failure(Failure::Overloaded);
    bench.fake.push_text(final_answer("Third time lucky."));

    let answered = bench.ask(world.user, "Hello?", None).await;

    assert_eq!(answered.answer.error, None, "{:?}", answered.answer);
    assert_eq!(answered.answer.content, "Third time lucky.");
    assert_eq!(bench.provider_bodies().len(), 3);
}

#[tokio::test]
async fn retries_are_bounded() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    for _ in 0..8 {
        bench.fake.push_failure(Failure::Overloaded);
    }

    let answered = bench.ask(world.user, "Hello?", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::A1004));
    // Three monolith attempts, each tried twice by the gateway.
    assert_eq!(bench.provider_bodies().len(), 6);
}

#[tokio::test]
async fn an_unreachable_gateway_is_a1001() {
    let bench = Bench::start_with_gateway(Some(agent_support::closed_url())).await;
    let world = bench.world().await;

    let answered = bench.ask(world.user, "Anyone there?", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::A1001));
    assert!(answered.chunks.is_empty());
}

#[tokio::test]
async fn a_user_without_chat_access_is_m3004_before_any_gateway_call() {
    let bench = Bench::start().await;
    bench.world().await;
    let stranger = bench.fx.user("stranger").await;

    let answered = bench.ask(stranger, "Hi", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::M3004));
    assert!(bench.provider_bodies().is_empty());
}

#[tokio::test]
async fn a_user_blocked_after_asking_is_m3004_before_any_gateway_call() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // Seated and answered while active ...
    let answered = bench.ask(world.user, "Hi", None).await;
    assert_eq!(code(&answered), None);
    let calls = bench.provider_bodies().len();
    // ... and refused by the worker once the account is blocked.
    let c = bench.fx.pool.get().await.unwrap();
    c.execute(
        "UPDATE users SET state = 'blocked' WHERE id = $1",
        &[&world.user.id],
    )
    .await
    .unwrap();

    let answered = bench.ask(world.user, "Hi again", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::M3004));
    assert_eq!(bench.provider_bodies().len(), calls);
}

#[tokio::test]
async fn the_instance_gateway_setting_routes_the_answer() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // The configured gateway answers; the setting, which wins over it, names
    // one that does not.
    let c = bench.fx.pool.get().await.unwrap();
    c.execute(
        "UPDATE instance_settings SET ai_gateway_url = $1",
        &[&agent_support::closed_url()],
    )
    .await
    .unwrap();

    let answered = bench.ask(world.user, "Anyone there?", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::A1001));
    // Blank is unset: the configured gateway answers again.
    c.execute("UPDATE instance_settings SET ai_gateway_url = '  '", &[])
        .await
        .unwrap();
    assert_eq!(
        code(&bench.ask(world.user, "Anyone there?", None).await),
        None
    );
}

#[tokio::test]
async fn a_change_of_flags_or_model_settings_reaches_the_next_answer() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // The same responder answers every question here: what it kept from one
    // answer must not outlive a change of the settings it was read from.
    let offers_commit_reader = |bench: &Bench| {
        bench
            .provider_bodies()
            .last()
            .is_some_and(|body| body.contains("commit_reader"))
    };
    assert_eq!(code(&bench.ask(world.user, "Hi", None).await), None);
    assert!(offers_commit_reader(&bench));

    // The flag stored without gates is off: the gateway no longer offers
    // the tool it gates.
    let c = bench.fx.pool.get().await.unwrap();
    c.execute(
        "INSERT INTO features (key) VALUES ('ai_commit_reader_for_chat')",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(code(&bench.ask(world.user, "Hi again", None).await), None);
    assert!(!offers_commit_reader(&bench));
    c.execute(
        "INSERT INTO feature_gates (feature_key, key, value)
         VALUES ('ai_commit_reader_for_chat', 'boolean', 'true')",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(code(&bench.ask(world.user, "And again", None).await), None);
    assert!(offers_commit_reader(&bench));

    // Chat switched off in the AI model settings: refused before any model
    // call; switched back on: answered.
    c.execute(
        "INSERT INTO ai_feature_settings (feature, provider) VALUES ('duo_chat', 'disabled')",
        &[],
    )
    .await
    .unwrap();
    let calls = bench.provider_bodies().len();
    let answered = bench.ask(world.user, "Still there?", None).await;
    assert_eq!(code(&answered), Some(DuoErrorCode::M3004));
    assert_eq!(bench.provider_bodies().len(), calls);
    c.execute("DELETE FROM ai_feature_settings", &[])
        .await
        .unwrap();
    assert_eq!(code(&bench.ask(world.user, "Back?", None).await), None);
}

#[tokio::test]
async fn a_tool_the_monolith_lacks_is_a9999_version_skew() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    // The gateway offers commit_reader; this responder runs without it, as an
    // older monolith would lack a newer tool.
    let responder = bench
        .responder
        .clone()
        .with_tools(monolith::agent::tools::ToolBox::standard().without("commit_reader"));
    bench
        .fake
        .push_text(action("commit_reader", "Explain commit abc123"));

    let answered = bench
        .ask_with(world.user, "Explain commit abc123", None, None, &responder)
        .await;

    assert_eq!(code(&answered), Some(DuoErrorCode::A9999));
    assert!(
        answered
            .answer
            .error
            .as_ref()
            .unwrap()
            .detail
            .contains("commit_reader")
    );
}

#[tokio::test]
async fn a_tool_the_gateway_did_not_offer_is_g3001() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    bench
        .fake
        .push_text(action("vulnerability_fixer", "Fix it"));

    let answered = bench.ask(world.user, "Fix the vulnerability", None).await;

    assert_eq!(code(&answered), Some(DuoErrorCode::G3001));
}

#[tokio::test]
async fn history_after_reset_reaches_the_model() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let thread = bench
        .fx
        .id(
            "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, 1) RETURNING id",
            &[&world.user.id],
        )
        .await;
    bench
        .fake
        .push_text(final_answer("First answer about otters."));
    bench
        .ask_in_thread(
            world.user,
            thread,
            "Tell me about otters",
            None,
            None,
            &bench.responder,
        )
        .await;
    // The worker stores answers; here the test does.
    let request: uuid::Uuid = {
        let c = bench.fx.pool.get().await.unwrap();
        c.query_one(
            "SELECT request_xid FROM ai_conversation_messages WHERE thread_id = $1 AND role = 1",
            &[&thread],
        )
        .await
        .unwrap()
        .get(0)
    };
    bench
        .fx
        .exec(
            "INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid)
             VALUES ($1, 2, 'Otters hold hands while sleeping.', $2, $3)",
            &[&thread, &uuid::Uuid::new_v4(), &request],
        )
        .await;
    bench.fake.push_text(final_answer("Yes."));
    bench
        .ask_in_thread(world.user, thread, "Really?", None, None, &bench.responder)
        .await;
    // `/reset` is stored but never answered.
    bench
        .fx
        .exec(
            "INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid)
             VALUES ($1, 1, '/reset', $2, $3)",
            &[&thread, &uuid::Uuid::new_v4(), &uuid::Uuid::new_v4()],
        )
        .await;
    bench.fake.push_text(final_answer("Fresh start."));
    bench
        .ask_in_thread(
            world.user,
            thread,
            "New topic",
            None,
            None,
            &bench.responder,
        )
        .await;

    let bodies = bench.provider_bodies();
    assert!(bodies[1].contains("Otters hold hands while sleeping."));
    assert!(!bodies.last().unwrap().contains("Otters hold hands"));
}

#[tokio::test]
async fn a_silent_gateway_is_a1000() {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let responder = bench
        .responder
        .clone()
        .with_gateway_timeout(std::time::Duration::from_millis(500))
        .unwrap();
    bench.fake.push_failure(Failure::Hang);

    let answered = bench
        .ask_with(world.user, "Are you there?", None, None, &responder)
        .await;

    assert_eq!(code(&answered), Some(DuoErrorCode::A1000));
}
