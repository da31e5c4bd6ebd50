//! A request may name a model endpoint only when the monolith vouched for it
//! in the token (`model_endpoints`), never metadata or link-local addresses,
//! and never with the gateway's own provider keys: over HTTP
//! (`/v1/prompts`, `/v2/chat/agent`, code embeddings) and over gRPC (the
//! workflow service's `x-gitlab-agent-platform-model-metadata`), with real
//! RS256 tokens checked against the monolith double's JWKS.

use crate::workflow_support::{self as support, CHAT_SCOPES, Monolith};
use fake_provider::FakeProvider;
use serde_json::{Value, json};
use tonic::Code;

const GATEWAY_OPENAI_KEY: &str = "sk-gateway-openai-secret";
const GATEWAY_ANTHROPIC_KEY: &str = "sk-gateway-anthropic-secret";
const PROMPT_SCOPES: &[&str] = &["explain_code", "duo_chat", "generate_embeddings_codebase"];
/// Where a prompt names its model in the body.
const EXPLAIN_CODE: &str = "/v1/prompts/chat/explain_code";

/// The gateway as it runs (real authentication), on 127.0.0.1:0.
fn spawn_gateway(config: gateway::Config) -> String {
    let state = gateway::app_state::AppState::build(config).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let server = gateway::app::build_server(state, listener).unwrap();
    actix_web::rt::spawn(server);
    format!("http://{address}")
}

/// The gateway (see [`gateway_vars`]) checking tokens against `monolith`.
fn spawn_gateway_with(
    monolith: &Monolith,
    own: &FakeProvider,
    extra: &[(&'static str, String)],
) -> String {
    spawn_gateway(support::config(monolith, &gateway_vars(own, extra)))
}

/// The gateway with its own keys for both providers (at `own`) and custom
/// models on.
fn gateway_vars(
    own: &FakeProvider,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("ANTHROPIC_API_KEY", GATEWAY_ANTHROPIC_KEY.to_owned()),
        ("ANTHROPIC_BASE_URL", own.url()),
        ("OPENAI_BASE_URL", own.openai_base_url()),
        ("OPENAI_API_KEY", GATEWAY_OPENAI_KEY.to_owned()),
        ("AIGW_CUSTOM_MODELS__ENABLED", "true".to_owned()),
    ];
    vars.extend(extra.iter().cloned());
    vars
}

fn explain_body(endpoint: &str, api_key: Option<&str>) -> Value {
    let mut metadata = json!({"name": "mistral", "provider": "openai", "endpoint": endpoint});
    if let Some(key) = api_key {
        metadata["api_key"] = json!(key);
    }
    json!({
        "inputs": {
            "input": "", "language_info": "Rust", "selected_text": "fn main() {}", "file_content": ""
        },
        "model_metadata": metadata,
    })
}

async fn post(gateway: &str, path: &str, token: &str, body: &Value) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{gateway}{path}"))
        .bearer_auth(token)
        .header("x-gitlab-authentication-type", "oidc")
        .json(body);
    for (name, value) in support::metadata_headers() {
        request = request.header(name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `chat/explain_code` naming `endpoint` as its model, with a token that
/// vouches for `vouched`.
async fn explain_vouched(gateway: &str, vouched: &str, endpoint: &str) -> (u16, Value) {
    let token = support::monolith_token_vouching(PROMPT_SCOPES, &[vouched]);
    post(gateway, EXPLAIN_CODE, &token, &explain_body(endpoint, None)).await
}

/// Every credential-looking header the fake provider received.
fn credentials_seen(fake: &FakeProvider) -> Vec<String> {
    fake.requests()
        .iter()
        .flat_map(|r| [r.header("authorization"), r.header("x-api-key")])
        .flatten()
        .map(str::to_owned)
        .collect()
}

#[actix_web::test]
async fn a_prompt_may_name_only_an_endpoint_its_token_vouches_for() {
    let own = FakeProvider::start().await.unwrap();
    let named = FakeProvider::start().await.unwrap();
    let monolith = Monolith::start();
    let gateway = spawn_gateway_with(&monolith, &own, &[]);
    let endpoint = named.openai_base_url();

    // A bare body field: refused, nothing is called anywhere.
    let token = support::monolith_token(PROMPT_SCOPES);
    let (status, body) = post(
        &gateway,
        EXPLAIN_CODE,
        &token,
        &explain_body(&endpoint, None),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("not one this GitLab instance configured"),
        "{body}"
    );
    assert!(named.requests().is_empty() && own.requests().is_empty());

    // Vouched, without a key: called, and with no key of the gateway's.
    named.push_text("It prints nothing.");
    let (status, body) = explain_vouched(&gateway, &endpoint, &format!("{endpoint}/")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!("It prints nothing."));
    assert_eq!(named.requests().len(), 1);
    assert_eq!(credentials_seen(&named), Vec::<String>::new());

    // With the caller's own key: that key, still never the gateway's.
    named.push_text("Still nothing.");
    let vouched = support::monolith_token_vouching(PROMPT_SCOPES, &[endpoint.as_str()]);
    let (status, _) = post(
        &gateway,
        EXPLAIN_CODE,
        &vouched,
        &explain_body(&endpoint, Some("sk-the-callers-own")),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(credentials_seen(&named), ["Bearer sk-the-callers-own"]);
    assert!(own.requests().is_empty());
}

#[actix_web::test]
async fn chat_and_embeddings_follow_the_same_rule() {
    let own = FakeProvider::start().await.unwrap();
    let named = FakeProvider::start().await.unwrap();
    let monolith = Monolith::start();
    let gateway = spawn_gateway_with(&monolith, &own, &[]);
    let endpoint = named.openai_base_url();
    let unvouched = support::monolith_token(PROMPT_SCOPES);

    let chat = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "model_metadata": {"name": "m", "provider": "openai", "endpoint": endpoint},
    });
    let (status, body) = post(&gateway, "/v2/chat/agent", &unvouched, &chat).await;
    assert_eq!(status, 403, "{body}");

    let embed = json!({
        "contents": ["fn main() {}"],
        "model_metadata": {"provider": "openai", "name": "e", "endpoint": endpoint},
    });
    let (status, body) = post(
        &gateway,
        "/v1/embeddings/code_embeddings/index",
        &unvouched,
        &embed,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(named.requests().is_empty() && own.requests().is_empty());

    // Vouched embeddings reach the named server without the gateway's key.
    let vouched = support::monolith_token_vouching(PROMPT_SCOPES, &[endpoint.as_str()]);
    let (status, body) = post(
        &gateway,
        "/v1/embeddings/code_embeddings/index",
        &vouched,
        &embed,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["predictions"].as_array().unwrap().len(), 1);
    assert!(!named.requests().is_empty());
    assert_eq!(credentials_seen(&named), Vec::<String>::new());
}

#[actix_web::test]
async fn metadata_addresses_are_refused_even_when_vouched_until_allowed() {
    let own = FakeProvider::start().await.unwrap();
    let monolith = Monolith::start();
    let metadata_service = "http://169.254.169.254/latest/v1";
    let gateway = spawn_gateway_with(&monolith, &own, &[]);
    let (status, body) = explain_vouched(&gateway, metadata_service, metadata_service).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("link-local"),
        "{body}"
    );

    // An allow-list that names other hosts refuses the rest, loopback too.
    let named = FakeProvider::start().await.unwrap();
    let endpoint = named.openai_base_url();
    let listed = spawn_gateway_with(
        &monolith,
        &own,
        &[(
            "AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST",
            "llm.internal, 10.0.0.0/8".into(),
        )],
    );
    let (status, body) = explain_vouched(&listed, &endpoint, &endpoint).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("allow-list"),
        "{body}"
    );
    assert!(named.requests().is_empty());
}

#[actix_web::test]
async fn a_name_that_resolves_to_a_refused_address_is_not_connected_to() {
    // `localhost` passes the URL check when the allow-list has networks
    // only; its addresses are refused when the call resolves it.
    let own = FakeProvider::start().await.unwrap();
    let named = FakeProvider::start().await.unwrap();
    let monolith = Monolith::start();
    let endpoint = format!("http://localhost:{}/v1", named.addr().port());
    let gateway = spawn_gateway_with(
        &monolith,
        &own,
        &[("AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST", "10.0.0.0/8".into())],
    );
    let (status, body) = explain_vouched(&gateway, &endpoint, &endpoint).await;
    // The gateway's answer for a provider it cannot connect to.
    assert_eq!(status, 421, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("connect"),
        "{body}"
    );
    assert!(named.requests().is_empty());
    assert!(own.requests().is_empty());
}

fn model_header(endpoint: &str, provider: &str) -> (&'static str, String) {
    (
        "x-gitlab-agent-platform-model-metadata",
        json!({"provider": provider, "name": "my-model", "endpoint": endpoint}).to_string(),
    )
}

#[actix_web::test]
async fn the_workflow_service_refuses_an_unvouched_model_header() {
    let (own, monolith, service) = support::harness(|own| gateway_vars(own, &[])).await;
    let named = FakeProvider::start().await.unwrap();
    let id = monolith.create_workflow("chat", &[1, 2], &[2]);
    for provider in ["openai", "anthropic"] {
        let refused = support::refused(
            &service,
            &support::monolith_token(CHAT_SCOPES),
            &[model_header(&named.openai_base_url(), provider)],
            support::start_event(id, "chat", "hi"),
        )
        .await;
        assert_eq!(refused.code(), Code::PermissionDenied, "{provider}");
        assert!(
            refused
                .message()
                .contains("not one this GitLab instance configured")
        );
    }
    let metadata_service = "http://169.254.169.254/v1";
    let refused = support::refused(
        &service,
        &support::monolith_token_vouching(CHAT_SCOPES, &[metadata_service]),
        &[model_header(metadata_service, "openai")],
        support::start_event(id, "chat", "hi"),
    )
    .await;
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(named.requests().is_empty() && own.requests().is_empty());
    assert_eq!(monolith.workflow(id).events, Vec::<String>::new());
}

#[actix_web::test]
async fn a_vouched_workflow_endpoint_never_gets_the_gateways_keys() {
    let (own, monolith, service) = support::harness(|own| gateway_vars(own, &[])).await;
    let named = FakeProvider::start().await.unwrap();
    for (provider, endpoint) in [
        ("openai", named.openai_base_url()),
        ("anthropic", named.url()),
    ] {
        let id = monolith.create_workflow("chat", &[1, 2], &[2]);
        named.reset();
        named.push_text("Hello from the named model.");
        let token = support::monolith_token_vouching(CHAT_SCOPES, &[endpoint.as_str()]);
        let stream = support::open_stream_with(
            &service,
            &token,
            &[model_header(&endpoint, provider)],
            support::start_event(id, "chat", "hi"),
        )
        .await
        .unwrap();
        let workspace = support::TempWorkspace::new(&[]);
        let (_status, _seen) = stream
            .serve(&support::runner(&workspace.path, &monolith))
            .await;
        // An Anthropic-shaped endpoint without a key of its own is not
        // called with the gateway's key: the run fails before any call.
        let credentials = credentials_seen(&named);
        assert!(
            credentials.iter().all(|c| !c.contains("gateway")),
            "{provider}: {credentials:?}"
        );
        if provider == "openai" {
            assert!(!named.requests().is_empty(), "the named model was called");
            assert_eq!(credentials, Vec::<String>::new());
        }
    }
    assert!(
        own.requests().is_empty(),
        "the gateway's providers were not asked"
    );
}
