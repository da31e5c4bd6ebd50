//! Contract tests of `POST /v1/prompts/{prompt_id}` against a real server on
//! loopback, with a scripted model standing in for the providers.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test on bad fixtures"
)]

use crate::app_support::{TEST_SCOPES, test_identity};
use crate::scripted_support::{ScriptedModel, config};

use actix_web::dev::ServerHandle;
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};
use gateway::api::prompts::configure;
use gateway::prompts::PromptRegistry;
use gateway::providers::{ChatModel, ProviderError, ProviderKind};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A model answering with these chunks.
fn chunks(parts: &[&str]) -> ScriptedModel {
    ScriptedModel::answering(parts)
}

/// A model that streams these items.
fn streaming(items: Vec<Result<String, ProviderError>>) -> ScriptedModel {
    ScriptedModel {
        chunks: items,
        ..ScriptedModel::default()
    }
}

/// A model that fails before its first token.
fn failing(err: ProviderError) -> ScriptedModel {
    ScriptedModel {
        start_error: Some(err),
        ..ScriptedModel::default()
    }
}

struct TestGateway {
    base: String,
    handle: ServerHandle,
    model: Arc<ScriptedModel>,
    client: reqwest::Client,
}

impl TestGateway {
    /// Starts the endpoint with the shipped `chat/explain_code` prompt and a
    /// `chat/react` stand-in. Requests name the caller's scopes in
    /// [`TEST_SCOPES`] ([`Self::post`]: a debug user unless told).
    async fn start(model: ScriptedModel, env: &[(&str, &str)]) -> Self {
        let config = config(env);
        let registry = Arc::new(PromptRegistry::load(&test_prompts_dir()).unwrap());
        let model = Arc::new(model);
        let chat_model: Arc<dyn ChatModel> = model.clone();

        let server = HttpServer::new(move || {
            App::new()
                .app_data(web::Data::from(registry.clone()))
                .app_data(web::Data::from(chat_model.clone()))
                .app_data(web::Data::new(config.clone()))
                .app_data(web::Data::new(
                    gateway::chat::context_window::ContextWindows::new(),
                ))
                .wrap(from_fn(test_identity))
                .configure(configure)
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Self {
            base: format!("http://{addr}"),
            handle,
            model,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    async fn post(&self, prompt_id: &str, scopes: Option<&str>, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/prompts/{prompt_id}", self.base))
            .header(TEST_SCOPES, scopes.unwrap_or("*"))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// `chat/explain_code` as `scopes` (a debug user when `None`): the
    /// status and the JSON body.
    async fn explain(&self, scopes: Option<&str>, body: Value) -> (u16, Value) {
        json_body(self.post("chat/explain_code", scopes, body).await).await
    }

    async fn stop(self) {
        self.handle.stop(true).await;
    }
}

fn test_prompts_dir() -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gw-prompts-api-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../prompts");
    for file in [
        "chat/explain_code/base/1.0.0.yml",
        "chat/explain_code/openai/1.0.0.yml",
    ] {
        let target = dir.join(file);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(shipped.join(file), target).unwrap();
    }
    let react = dir.join("chat/react/base/1.0.0.yml");
    std::fs::create_dir_all(react.parent().unwrap()).unwrap();
    std::fs::write(
        react,
        "name: agent stand-in\nmodel:\n  name: claude-test\n  params:\n    model_class_provider: anthropic\nunit_primitives: [duo_chat]\nprompt_template:\n  system: agent\n",
    )
    .unwrap();
    dir
}

fn explain_inputs() -> Value {
    json!({
        "file_content": "",
        "input": "",
        "language_info": "The code is written in Python.",
        "selected_text": "print('hi')",
    })
}

async fn json_body(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[actix_web::test]
async fn answers_a_json_string() {
    let gw = TestGateway::start(chunks(&["Hi ", "John!"]), &[]).await;
    let response = gw
        .post(
            "chat/explain_code",
            Some("explain_code"),
            json!({"inputs": explain_inputs()}),
        )
        .await;
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    assert_eq!(json_body(response).await, (200, json!("Hi John!")));

    let calls = gw.model.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.target.kind, ProviderKind::Anthropic);
    assert_eq!(call.target.model, "claude-3-5-sonnet-20241022");
    assert!(
        call.system
            .as_deref()
            .unwrap()
            .contains("software engineer")
    );
    assert!(call.messages[0].content.contains("print('hi')"));
    assert_eq!(call.params.timeout, Duration::from_secs(60));
    assert_eq!(call.params.max_tokens, 2048);
    gw.stop().await;
}

#[actix_web::test]
async fn streams_raw_text_chunks() {
    let gw = TestGateway::start(chunks(&["Hi ", "", "John", "!"]), &[]).await;
    let response = gw
        .post(
            "chat/explain_code",
            None,
            json!({"inputs": explain_inputs(), "stream": true}),
        )
        .await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream; charset=utf-8"
    );
    assert_eq!(response.text().await.unwrap(), "Hi John!");
    gw.stop().await;
}

#[actix_web::test]
async fn a_stream_that_fails_midway_just_ends() {
    let script = streaming(vec![
        Ok("partial ".into()),
        Err(ProviderError::Malformed("connection reset".into())),
        Ok("never sent".into()),
    ]);
    let gw = TestGateway::start(script, &[]).await;
    let response = gw
        .post(
            "chat/explain_code",
            None,
            json!({"inputs": explain_inputs(), "stream": true}),
        )
        .await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.text().await.unwrap(), "partial ");
    gw.stop().await;
}

#[actix_web::test]
async fn a_stream_that_fails_before_any_text_is_421() {
    let script = streaming(vec![
        Ok(String::new()),
        Err(ProviderError::Status {
            status: 529,
            message: "overloaded_error".into(),
        }),
    ]);
    let gw = TestGateway::start(script, &[]).await;
    let got = gw
        .explain(None, json!({"inputs": explain_inputs(), "stream": true}))
        .await;
    assert_eq!(got, (421, json!({"detail": "529: overloaded_error"})));
    gw.stop().await;
}

#[actix_web::test]
async fn error_statuses_and_bodies() {
    let gw = TestGateway::start(chunks(&["unused"]), &[]).await;
    let cases: Vec<(&str, Option<&str>, Value, u16, Value)> = vec![
        (
            "chat/unknown",
            None,
            json!({"inputs": {}}),
            404,
            json!({"detail": "Prompt 'chat/unknown' not found"}),
        ),
        (
            "chat%5Cexplain_code",
            None,
            json!({"inputs": {}}),
            404,
            json!({"detail": "Prompt 'chat\\explain_code' not found"}),
        ),
        (
            "chat/explain_code",
            Some("duo_chat,write_tests"),
            json!({"inputs": explain_inputs()}),
            403,
            json!({"detail": "Unauthorized to access 'chat/explain_code'"}),
        ),
        (
            "chat/react",
            None,
            json!({"inputs": {}}),
            422,
            json!({"detail": "Prompt 'chat/react' is not supported"}),
        ),
        (
            "chat/explain_code",
            None,
            json!({"inputs": explain_inputs(), "prompt_version": "newest please"}),
            422,
            json!({"detail": "Invalid version constraint"}),
        ),
        (
            "chat/explain_code",
            None,
            json!({"inputs": {"input": "", "language_info": "", "selected_text": ""}}),
            422,
            json!({"detail": "Missing prompt input: file_content"}),
        ),
        (
            "chat/explain_code",
            None,
            json!({
                "inputs": explain_inputs(),
                "model_metadata": {"name": "mistral", "provider": "openai", "endpoint": "http://127.0.0.1:1/v1"},
            }),
            422,
            json!({"detail": "model_metadata is not accepted: custom models are disabled on this gateway (AIGW_CUSTOM_MODELS__ENABLED)"}),
        ),
    ];
    for (prompt_id, scopes, body, status, detail) in cases {
        let got = json_body(gw.post(prompt_id, scopes, body.clone()).await).await;
        assert_eq!(got, (status, detail), "{prompt_id} {body}");
    }
    assert!(gw.model.calls().is_empty(), "no case reached the model");
    gw.stop().await;
}

#[actix_web::test]
async fn the_scope_check_comes_before_the_version_check() {
    let gw = TestGateway::start(chunks(&["unused"]), &[]).await;
    let (status, _) = gw
        .explain(
            Some("duo_chat"),
            json!({"inputs": explain_inputs(), "prompt_version": "bogus"}),
        )
        .await;
    assert_eq!(status, 403);
    gw.stop().await;
}

#[actix_web::test]
async fn invalid_bodies_are_422_like_fastapi() {
    let gw = TestGateway::start(chunks(&["unused"]), &[]).await;
    for body in [
        json!({"stream": true}),
        json!({"inputs": "text"}),
        json!([]),
    ] {
        let (status, detail) = gw.explain(None, body.clone()).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(detail["detail"][0]["loc"], json!(["body"]), "{body}");
    }
    let response = gw
        .client
        .post(format!("{}/v1/prompts/chat/explain_code", gw.base))
        .header(TEST_SCOPES, "*")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 422);
    gw.stop().await;
}

#[actix_web::test]
async fn model_failures_are_421() {
    let cases = [
        (
            ProviderError::Status {
                status: 401,
                message: "Unauthorized".into(),
            },
            "401: Unauthorized",
        ),
        (
            ProviderError::Overloaded {
                message: "overloaded_error: try later".into(),
            },
            "529: overloaded_error: try later",
        ),
        (
            ProviderError::Timeout("first token"),
            "timed out waiting for the model (first token)",
        ),
    ];
    for (err, detail) in cases {
        let gw = TestGateway::start(failing(err), &[]).await;
        let got = gw.explain(None, json!({"inputs": explain_inputs()})).await;
        assert_eq!(got, (421, json!({"detail": detail})));
        gw.stop().await;
    }

    // Non-streaming answers fail as a whole when the stream breaks.
    let script = streaming(vec![
        Ok("partial".into()),
        Err(ProviderError::Status {
            status: 500,
            message: "Internal error".into(),
        }),
    ]);
    let gw = TestGateway::start(script, &[]).await;
    let got = gw.explain(None, json!({"inputs": explain_inputs()})).await;
    assert_eq!(got, (421, json!({"detail": "500: Internal error"})));
    gw.stop().await;
}

#[actix_web::test]
async fn mock_mode_answers_mock_without_calling_a_model() {
    let gw = TestGateway::start(chunks(&["real"]), &[("AIGW_MOCK_MODEL_RESPONSES", "true")]).await;
    let got = gw.explain(None, json!({"inputs": explain_inputs()})).await;
    assert_eq!(got, (200, json!("mock")));
    let streamed = gw
        .post(
            "chat/explain_code",
            None,
            json!({"inputs": explain_inputs(), "stream": true}),
        )
        .await;
    assert_eq!(streamed.text().await.unwrap(), "mock");
    assert!(gw.model.calls().is_empty());
    gw.stop().await;
}

#[actix_web::test]
async fn custom_models_use_model_metadata() {
    let gw = TestGateway::start(chunks(&["ok"]), &[("AIGW_CUSTOM_MODELS__ENABLED", "true")]).await;
    let got = gw.explain(None, json!({
                "inputs": explain_inputs(),
                "model_metadata": {"name": "mistral", "provider": "openai", "endpoint": "http://127.0.0.1:11434/v1", "api_key": "k"},
            })).await;
    assert_eq!(got, (200, json!("ok")));
    let call = &gw.model.calls()[0];
    assert_eq!(call.target.kind, ProviderKind::OpenAiCompatible);
    assert_eq!(call.target.model, "mistral");
    assert_eq!(
        call.target.endpoint.as_ref().map(|e| e.base_url()),
        Some("http://127.0.0.1:11434/v1")
    );
    // `mistral` has no prompts of its own: the openai family serves it.
    assert!(
        call.system
            .as_deref()
            .unwrap()
            .starts_with("You are a helpful coding assistant")
    );
    gw.stop().await;
}

#[actix_web::test]
async fn a_prompt_larger_than_its_models_context_is_413_with_the_sizes() {
    let gw = TestGateway::start(
        chunks(&["ok"]),
        &[
            ("AIGW_CUSTOM_MODELS__ENABLED", "true"),
            ("AIGW_MODEL_CONTEXT_TOKENS", r#"{"mistral": 400}"#),
        ],
    )
    .await;
    let metadata = json!({"name": "mistral", "provider": "openai", "endpoint": "http://127.0.0.1:11434/v1", "api_key": "k"});
    let mut inputs = explain_inputs();
    inputs["selected_text"] = json!("print('hi')\n".repeat(200));
    let (status, body) = gw
        .explain(
            None,
            json!({"inputs": inputs, "model_metadata": metadata.clone()}),
        )
        .await;
    assert_eq!(status, 413, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail
            .starts_with("prompt is too long for the model mistral: its context holds 400 tokens"),
        "{detail}"
    );
    assert!(detail.contains("chat/explain_code"), "{detail}");
    assert!(gw.model.calls().is_empty(), "nothing sent that cannot fit");
    // A prompt that fits goes through.
    let got = gw
        .explain(
            None,
            json!({"inputs": explain_inputs(), "model_metadata": metadata}),
        )
        .await;
    assert_eq!(got, (200, json!("ok")));
    gw.stop().await;
}
