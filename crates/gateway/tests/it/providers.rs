//! Model provider clients against the fake provider over loopback HTTP.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use fake_provider::{Failure, FakeProvider, Scripted};
use futures::StreamExt;
use gateway::Config;
use gateway::providers::{
    ChatMessage, ChatModel, ChatRole, ModelCall, ModelRouter, ModelTarget, ModelWaitClock,
    ProviderError, ProviderKind,
};
use std::time::Duration;

const KEY: &str = "sk-test-secret-key-123";

fn anthropic_router(fake: &FakeProvider) -> ModelRouter {
    let config = Config::for_tests(&[
        ("ANTHROPIC_API_KEY", KEY),
        ("ANTHROPIC_BASE_URL", &fake.url()),
        ("OPENAI_BASE_URL", &fake.openai_base_url()),
        ("OPENAI_API_KEY", KEY),
    ])
    .unwrap();
    ModelRouter::new(&config.providers).unwrap()
}

fn call(kind: ProviderKind, model: &str) -> ModelCall {
    let mut call = ModelCall::new(
        ModelTarget::new(kind, model),
        vec![ChatMessage {
            role: ChatRole::User,
            content: "hello".to_owned(),
        }],
    );
    call.system = Some("You are a test.".to_owned());
    call.params.timeout = Duration::from_secs(5);
    call.params.first_token_timeout = Duration::from_secs(5);
    call
}

async fn collect(router: &ModelRouter, call: ModelCall) -> Result<String, ProviderError> {
    let mut stream = router.stream(call).await?;
    let mut text = String::new();
    while let Some(item) = stream.next().await {
        text.push_str(&item?);
    }
    Ok(text)
}

const KINDS: [ProviderKind; 2] = [ProviderKind::Anthropic, ProviderKind::OpenAiCompatible];

#[tokio::test]
async fn streams_text_from_both_protocols() {
    let fake = FakeProvider::start().await.unwrap();
    let router = anthropic_router(&fake);
    for kind in KINDS {
        fake.push_text("Thought: I know this.\nFinal Answer: 42 — done ✓");
        let text = collect(&router, call(kind, "fake-model")).await.unwrap();
        assert_eq!(text, "Thought: I know this.\nFinal Answer: 42 — done ✓");
    }
    let requests = fake.requests();
    assert_eq!(requests[0].path, "/v1/messages");
    assert_eq!(requests[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(requests[0].header("x-api-key"), Some(KEY));
    assert_eq!(requests[0].body["system"], "You are a test.");
    assert_eq!(requests[0].body["stream"], true);
    assert_eq!(requests[1].path, "/v1/chat/completions");
    let bearer = format!("Bearer {KEY}");
    assert_eq!(requests[1].header("authorization"), Some(bearer.as_str()));
    assert_eq!(requests[1].body["messages"][0]["role"], "system");
}

#[tokio::test]
async fn stop_sequences_are_sent_and_honoured() {
    let fake = FakeProvider::start().await.unwrap();
    let router = anthropic_router(&fake);
    for kind in KINDS {
        fake.push_text("Action: search\nObservation: made up");
        let mut c = call(kind, "fake-model");
        c.params.stop = vec!["Observation:".to_owned()];
        assert_eq!(collect(&router, c).await.unwrap(), "Action: search\n");
    }
    let requests = fake.requests();
    assert_eq!(requests[0].body["stop_sequences"][0], "Observation:");
    assert_eq!(requests[1].body["stop"][0], "Observation:");
}

#[tokio::test]
async fn events_split_at_any_byte_are_reassembled() {
    let fake = FakeProvider::start().await.unwrap();
    let router = anthropic_router(&fake);
    for split in [1, 3, 7] {
        fake.set_wire_split(Some(split));
        for kind in KINDS {
            fake.push(Scripted::Chunks(vec!["héllo ".into(), "wörld".into()]));
            assert_eq!(
                collect(&router, call(kind, "fake-model")).await.unwrap(),
                "héllo wörld"
            );
        }
    }
}

#[tokio::test]
async fn assistant_prefill_is_the_last_message() {
    let fake = FakeProvider::start().await.unwrap();
    let router = anthropic_router(&fake);
    let mut c = call(ProviderKind::Anthropic, "fake-model");
    c.messages.push(ChatMessage {
        role: ChatRole::Assistant,
        content: "Thought:".to_owned(),
    });
    collect(&router, c).await.unwrap();
    let body = &fake.requests()[0].body;
    assert_eq!(body["messages"][1]["role"], "assistant");
    assert_eq!(body["messages"][1]["content"], "Thought:");
}

#[tokio::test]
async fn failure_modes_map_to_provider_errors() {
    let fake = FakeProvider::start().await.unwrap();
    let router = anthropic_router(&fake);
    for kind in KINDS {
        let mut c = call(kind, "fake-overloaded");
        c.params.max_retries = 0;
        match router.stream(c).await {
            Err(ProviderError::Overloaded { message }) => {
                assert!(message.contains("overloaded_error"), "{message}")
            }
            other => panic!("{kind:?}: expected overload, got {:?}", other.err()),
        }
        match router.stream(call(kind, "fake-500")).await {
            Err(ProviderError::Status { status: 500, .. }) => {}
            other => panic!("{kind:?}: expected 500, got {:?}", other.err()),
        }
        // Some text first, then the error arrives in the stream.
        let mut stream = router
            .stream(call(kind, "fake-error-mid-stream"))
            .await
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), "partial answer ");
        assert!(matches!(
            stream.next().await,
            Some(Err(ProviderError::Malformed(_)))
        ));
        assert!(matches!(
            collect(&router, call(kind, "fake-malformed")).await,
            Err(ProviderError::Malformed(_))
        ));
    }
    fake.push_failure(Failure::Status {
        status: 400,
        kind: "invalid_request_error".into(),
        message: "bad".into(),
    });
    match router
        .stream(call(ProviderKind::Anthropic, "fake-model"))
        .await
    {
        Err(ProviderError::Status { status, message }) => {
            assert_eq!(status, 400);
            assert!(message.contains("invalid_request_error"));
        }
        other => panic!("expected 400, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn retries_once_on_overload_then_succeeds() {
    let fake = FakeProvider::start().await.unwrap();
    let router = anthropic_router(&fake);
    for kind in KINDS {
        fake.reset();
        fake.push_failure(Failure::Overloaded);
        fake.push_text("second time lucky");
        let text = collect(&router, call(kind, "fake-model")).await.unwrap();
        assert_eq!(text, "second time lucky");
        assert_eq!(fake.requests().len(), 2);
    }
    // Two overloads exhaust the single retry.
    fake.reset();
    fake.push_failure(Failure::Overloaded);
    fake.push_failure(Failure::Overloaded);
    assert!(matches!(
        router
            .stream(call(ProviderKind::Anthropic, "fake-model"))
            .await,
        Err(ProviderError::Overloaded { .. })
    ));
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn first_token_and_whole_call_timeouts() {
    let fake = FakeProvider::start().await.unwrap();
    fake.set_slow_first_token_delay(Duration::from_secs(30));
    let router = anthropic_router(&fake);
    for kind in KINDS {
        let mut c = call(kind, "fake-slow-first-token");
        c.params.first_token_timeout = Duration::from_millis(200);
        assert!(matches!(
            router.stream(c).await,
            Err(ProviderError::Timeout("first token"))
        ));
        let mut c = call(kind, "fake-hang");
        c.params.first_token_timeout = Duration::from_millis(200);
        assert!(matches!(
            router.stream(c).await,
            Err(ProviderError::Timeout("first token"))
        ));
        let mut c = call(kind, "fake-hang");
        c.params.timeout = Duration::from_millis(200);
        assert!(matches!(
            router.stream(c).await,
            Err(ProviderError::Timeout("whole call"))
        ));
    }
}

#[tokio::test]
async fn connection_failure_is_a_connection_error() {
    let fake = FakeProvider::start().await.unwrap();
    let router = anthropic_router(&fake);
    fake.stop().await;
    match router
        .stream(call(ProviderKind::Anthropic, "fake-model"))
        .await
    {
        Err(ProviderError::Connection(message)) => assert!(!message.contains(KEY)),
        other => panic!("expected a connection error, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn local_default_sends_everything_to_the_local_server() {
    let fake = FakeProvider::start().await.unwrap();
    let config = Config::for_tests(&[("AIGW_LOCAL_LLM__URL", &fake.openai_base_url())]).unwrap();
    let router = ModelRouter::new(&config.providers).unwrap();
    fake.push_text("local answer");
    let text = collect(&router, call(ProviderKind::Anthropic, "claude-3-5-sonnet"))
        .await
        .unwrap();
    assert_eq!(text, "local answer");
    let request = &fake.requests()[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.body["model"], "smollm2-135m-instruct");
    assert!(router.probe().await.is_ok());
}

#[tokio::test]
async fn mock_mode_answers_mock_without_calling_out() {
    let config = Config::for_tests(&[("AIGW_MOCK_MODEL_RESPONSES", "true")]).unwrap();
    let router = ModelRouter::new(&config.providers).unwrap();
    let text = collect(&router, call(ProviderKind::Anthropic, "claude"))
        .await
        .unwrap();
    assert_eq!(text, "mock");
}

#[tokio::test]
async fn wait_clock_accumulates_model_time() {
    let fake = FakeProvider::start().await.unwrap();
    fake.set_slow_first_token_delay(Duration::from_millis(50));
    let router = anthropic_router(&fake);
    let clock = ModelWaitClock::default();
    let mut c = call(ProviderKind::Anthropic, "fake-slow-first-token");
    c.wait_clock = Some(clock.clone());
    collect(&router, c).await.unwrap();
    assert!(
        clock.total() >= Duration::from_millis(50),
        "{:?}",
        clock.total()
    );
}

#[tokio::test]
async fn probes_report_each_configured_provider() {
    let fake = FakeProvider::start().await.unwrap();
    let router = anthropic_router(&fake);
    let results = router.probe_all().await;
    let names: Vec<_> = results.iter().map(|r| r.provider).collect();
    assert_eq!(names, ["anthropic", "openai_compatible"]);
    assert!(results.iter().all(|r| r.result.is_ok()));
    fake.stop().await;
    assert!(matches!(
        router.probe().await,
        Err(ProviderError::Connection(_))
    ));
}

#[tokio::test]
async fn readiness_fails_when_the_local_server_lacks_the_configured_model() {
    let fake = FakeProvider::start().await.unwrap();
    let config = Config::for_tests(&[
        ("AIGW_LOCAL_LLM__URL", &fake.openai_base_url()),
        ("AIGW_LOCAL_LLM__MODEL", "no-such-model"),
    ])
    .unwrap();
    let router = ModelRouter::new(&config.providers).unwrap();
    let err = router.probe().await.unwrap_err();
    assert!(err.to_string().contains("no-such-model"), "{err}");
}

#[tokio::test]
async fn the_fake_provider_answers_by_what_the_request_contains() {
    let fake = FakeProvider::start().await.unwrap();
    let config = Config::for_tests(&[("AIGW_LOCAL_LLM__URL", &fake.openai_base_url())]).unwrap();
    let router = ModelRouter::new(&config.providers).unwrap();
    fake.set_default_text("default");
    fake.reply_when("no such needle", "never");
    fake.reply_when("hello", "matched");
    let matched = collect(&router, call(ProviderKind::Anthropic, "m"))
        .await
        .unwrap();
    assert_eq!(matched, "matched");
    // A queued answer still comes first.
    fake.push_text("queued");
    let queued = collect(&router, call(ProviderKind::Anthropic, "m"))
        .await
        .unwrap();
    assert_eq!(queued, "queued");
    let mut other = call(ProviderKind::Anthropic, "m");
    other.messages[0].content = "bye".to_owned();
    assert_eq!(collect(&router, other).await.unwrap(), "default");
}
