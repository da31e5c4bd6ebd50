//! The gateway client against a stub gateway on loopback: GitLab's headers,
//! the token's claims, and how HTTP failures map to Duo error codes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests fail loudly on setup errors"
)]

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use contracts::{AgentMessage, AgentRequest, DuoErrorCode, MessageRole};
use futures::StreamExt;
use monolith::gateway_client::{GatewayAuth, GatewayClient, GatewaySettings};
use monolith::identity::jwt::KeyRing;

type Seen = Arc<Mutex<Vec<Vec<(String, String)>>>>;

async fn stub(req: HttpRequest, seen: web::Data<Seen>) -> HttpResponse {
    seen.lock().unwrap().push(
        req.headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
    );
    match req.path() {
        "/forbidden/v2/chat/agent" => {
            HttpResponse::Forbidden().json(serde_json::json!({"detail": "no"}))
        }
        "/broken/v2/chat/agent" => HttpResponse::InternalServerError().body("boom"),
        "/long/v2/chat/agent" => HttpResponse::BadRequest()
            .json(serde_json::json!({"detail": "prompt is too long: 1 > 0"})),
        _ => {
            // One event split across two writes, then a second event.
            let pieces = vec![
                "{\"type\": \"final_answer_delta\", \"da".to_owned(),
                "ta\": {\"text\": \"Hi\"}}\n{\"type\": \"final_answer_delta\", \"data\": {\"text\": \"!\"}}\n".to_owned(),
            ];
            HttpResponse::Ok()
                .content_type("application/x-ndjson")
                .streaming(futures::stream::iter(
                    pieces
                        .into_iter()
                        .map(|p| Ok::<_, std::io::Error>(bytes::Bytes::from(p))),
                ))
        }
    }
}

fn client(base: &str, key_dir: &std::path::Path) -> GatewayClient {
    let keys = KeyRing::load_or_create(key_dir).unwrap();
    GatewayClient::new(
        keys,
        GatewaySettings {
            base_url: url::Url::parse(base).unwrap(),
            instance_id: "instance-1".into(),
            issuer: "http://gitlab.test:3000/".into(),
            audience: "gitlab-ai-gateway".into(),
            timeout: Duration::from_secs(5),
            enabled_feature_flags: vec!["flag_a".into(), "flag_b".into()],
        },
    )
    .unwrap()
}

fn auth() -> GatewayAuth {
    GatewayAuth {
        user_id: 42,
        scopes: vec!["duo_chat".into(), "ask_issue".into()],
        realm: "self-managed".into(),
        request_id: uuid::Uuid::from_u128(7),
        gateway_url: None,
    }
}

fn body() -> AgentRequest {
    AgentRequest {
        messages: vec![AgentMessage::new(MessageRole::User, "hi")],
        options: None,
        model_metadata: None,
        unavailable_resources: None,
    }
}

#[tokio::test]
async fn headers_token_and_failure_codes() {
    let seen: Seen = Arc::default();
    let data = web::Data::new(seen.clone());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .default_service(web::to(stub))
    })
    .workers(1)
    .listen(listener)
    .unwrap()
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    let key_dir = std::path::PathBuf::from(support::test_key_dir());

    let ok = client(&format!("{base}/ok/"), &key_dir);
    let mut events = ok.agent_step(&auth(), &body()).await.unwrap();
    let mut texts = Vec::new();
    while let Some(event) = events.next().await {
        if let contracts::AgentEvent::FinalAnswerDelta { text, .. } = event.unwrap() {
            texts.push(text);
        }
    }
    assert_eq!(texts, vec!["Hi", "!"]);

    let headers = seen.lock().unwrap()[0].clone();
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("missing header {name}"))
    };
    assert_eq!(get("x-gitlab-authentication-type"), "oidc");
    assert_eq!(get("x-gitlab-realm"), "self-managed");
    assert_eq!(get("x-gitlab-instance-id"), "instance-1");
    assert_eq!(get("x-gitlab-host-name"), "gitlab.test");
    assert_eq!(get("x-gitlab-version"), "17.6.0");
    assert_eq!(get("x-request-id"), uuid::Uuid::from_u128(7).to_string());
    assert_eq!(get("x-gitlab-enabled-feature-flags"), "flag_a,flag_b");
    let global_user = get("x-gitlab-global-user-id");
    assert_eq!(
        global_user,
        monolith::gid::stable_uuid("instance-1:42").to_string()
    );
    // The token: instance as subject, the user's scopes, our issuer.
    let token = get("authorization");
    let token = token.strip_prefix("Bearer ").unwrap();
    let payload = token.split('.').nth(1).unwrap();
    use base64::Engine;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["sub"], "instance-1");
    assert_eq!(
        claims["scopes"],
        serde_json::json!(["duo_chat", "ask_issue"])
    );
    assert_eq!(claims["iss"], "http://gitlab.test:3000");
    assert_eq!(claims["aud"], "gitlab-ai-gateway");

    for (path, code) in [
        ("forbidden", DuoErrorCode::M3006),
        ("broken", DuoErrorCode::A9999),
        ("long", DuoErrorCode::A1005),
    ] {
        let err = client(&format!("{base}/{path}/"), &key_dir)
            .agent_step(&auth(), &body())
            .await
            .err()
            .unwrap_or_else(|| panic!("{path} should fail"));
        assert_eq!(err.code(), code, "{path}");
    }

    // The instance setting wins over the configured URL (a base without a
    // trailing slash keeps its last segment).
    let overridden = GatewayAuth {
        gateway_url: Some(url::Url::parse(&format!("{base}/ok")).unwrap()),
        ..auth()
    };
    let texts: Vec<_> = client(&format!("{base}/broken/"), &key_dir)
        .agent_step(&overridden, &body())
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(texts.len(), 2, "answered by the overriding URL");
    assert!(texts.iter().all(Result::is_ok));
    handle.stop(false).await;
}
