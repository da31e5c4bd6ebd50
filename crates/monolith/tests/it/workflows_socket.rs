//! The executor socket (`GET /api/v4/ai/duo_workflows/ws`) against a real
//! gRPC server playing the workflow service: protojson frames relayed both
//! ways, the service's requests to this instance answered by the monolith
//! itself, one live run per workflow, and bad frames refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use contracts::duo_workflow::{action_response, client_event};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::workflows_support::fake_service::{self, Script};
use crate::workflows_support::{World, setup};

const DEADLINE: Duration = Duration::from_secs(20);

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(
    w: &World,
    token: &str,
    query: &str,
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    let url = w
        .server
        .url(&format!("/api/v4/ai/duo_workflows/ws{query}"))
        .replace("http://", "ws://");
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::connect_async(request)
        .await
        .map(|(s, _)| s)
}

fn start_frame(id: i64) -> Message {
    Message::text(
        json!({"startRequest": {"workflowID": id.to_string(), "goal": "Add a line", "workflowDefinition": "software_development"}})
            .to_string(),
    )
}

/// The next text frame as JSON, or the close frame's (code, reason).
async fn next(socket: &mut Socket) -> Result<Value, (u16, String)> {
    loop {
        let frame = tokio::time::timeout(DEADLINE, socket.next())
            .await
            .expect("a frame in time");
        match frame {
            Some(Ok(Message::Text(text))) => return Ok(serde_json::from_str(&text).unwrap()),
            Some(Ok(Message::Close(Some(close)))) => {
                return Err((u16::from(close.code), close.reason.to_string()));
            }
            Some(Ok(Message::Close(None))) | None => return Err((1005, String::new())),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err((0, e.to_string())),
        }
    }
}

async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn leases(w: &World) -> i64 {
    w.fx.id("SELECT count(*) FROM duo_workflows_run_leases", &[])
        .await
}

#[tokio::test]
async fn socket_relays_frames_and_answers_requests_to_this_instance() {
    let service = fake_service::start(Script::Relay).await;
    let w = setup().await.start(Some(service), &[]).await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
    socket.send(start_frame(id)).await.unwrap();

    // The service's own requests never reach the client; its file read does.
    let read = next(&mut socket).await.unwrap();
    assert_eq!(
        read,
        json!({"requestID": "read-1", "runReadFile": {"filepath": "README.md"}})
    );
    socket
        .send(Message::text(
            json!({"actionResponse": {"requestID": "read-1", "plainTextResponse": {"response": "# Hello"}}}).to_string(),
        ))
        .await
        .unwrap();
    let checkpoint = next(&mut socket).await.unwrap();
    assert_eq!(checkpoint["requestID"], "cp-1");
    assert_eq!(checkpoint["newCheckpoint"]["status"], "RUNNING");
    assert_eq!(
        next(&mut socket).await,
        Err((1000, "workflow stream ended".into()))
    );

    // The monolith answered GET and PATCH itself, as the user.
    assert_eq!(w.status_of(id).await, 1);
    let (events, streams) = {
        let seen = w.service.as_ref().unwrap().seen.lock().unwrap();
        (seen.events.clone(), seen.streams.clone())
    };
    let http: Vec<(String, i32, String)> = events
        .iter()
        .filter_map(|e| match &e.response {
            Some(client_event::Response::ActionResponse(r)) => match &r.response_type {
                Some(action_response::ResponseType::HttpResponse(h)) => {
                    Some((r.request_id.clone(), h.status_code, h.body.clone()))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(http.len(), 2, "{http:?}");
    assert_eq!((http[0].0.as_str(), http[0].1), ("get-1", 200));
    let shown: Value = serde_json::from_str(&http[0].2).unwrap();
    assert_eq!(shown["id"], id);
    assert_eq!((http[1].0.as_str(), http[1].1), ("patch-1", 200));
    let plain = events.iter().find_map(|e| match &e.response {
        Some(client_event::Response::ActionResponse(r)) if r.request_id == "read-1" => {
            match &r.response_type {
                Some(action_response::ResponseType::PlainTextResponse(p)) => {
                    Some(p.response.clone())
                }
                _ => None,
            }
        }
        _ => None,
    });
    assert_eq!(plain.as_deref(), Some("# Hello"));
    // The stream carried the user's service token and cloud-connector headers.
    let metadata = &streams[0];
    assert!(metadata["authorization"].starts_with("Bearer service-token-for-"));
    assert_eq!(metadata["x-gitlab-realm"], "self-managed");
    let model: Value =
        serde_json::from_str(&metadata["x-gitlab-agent-platform-model-metadata"]).unwrap();
    assert_eq!(model["provider"], "gitlab");
    // The run's token is revoked and its lease released.
    assert_eq!(leases(&w).await, 0);
    assert_eq!(
        w.fx.id(
            "SELECT count(*) FROM oauth_access_tokens WHERE revoked_at IS NULL",
            &[]
        )
        .await,
        0
    );
}

#[tokio::test]
async fn a_second_run_of_the_same_workflow_is_refused_until_the_first_ends() {
    let service = fake_service::start(Script::Hold).await;
    let w = setup().await.start(Some(service), &[]).await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let mut first = connect(&w, &w.dev_token, "").await.unwrap();
    first.send(start_frame(id)).await.unwrap();
    let seen = w.service.as_ref().unwrap().seen.clone();
    wait_until("the first run to reach the service", || {
        !seen.lock().unwrap().events.is_empty()
    })
    .await;

    // Named up front: refused before the upgrade.
    match connect(&w, &w.dev_token, &format!("?workflow_id={id}")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 409);
            let body: Value = serde_json::from_slice(response.body().as_deref().unwrap()).unwrap();
            assert_eq!(
                body,
                json!({"message": format!("Workflow {id} is already running in another session")})
            );
        }
        other => panic!("expected 409, got {:?}", other.map(|_| ())),
    }
    // Named in the start request: closed with the reason.
    let mut second = connect(&w, &w.dev_token, "").await.unwrap();
    second.send(start_frame(id)).await.unwrap();
    assert_eq!(
        next(&mut second).await,
        Err((
            4409,
            format!("Workflow {id} is already running in another session")
        ))
    );
    assert_eq!(seen.lock().unwrap().streams.len(), 1);

    // The first run ends: the lease goes, the next run may start.
    first.send(Message::Close(None)).await.unwrap();
    let _ = next(&mut first).await;
    assert_eq!(leases(&w).await, 0);
    let mut third = connect(&w, &w.dev_token, &format!("?workflow_id={id}"))
        .await
        .unwrap();
    third.send(start_frame(id)).await.unwrap();
    wait_until("the third run to reach the service", || {
        seen.lock().unwrap().streams.len() == 2
    })
    .await;
    third.send(Message::Close(None)).await.unwrap();
    let _ = next(&mut third).await;
}

#[tokio::test]
async fn frames_that_are_not_protojson_close_the_socket() {
    let service = fake_service::start(Script::Hold).await;
    let w = setup().await.start(Some(service), &[]).await;
    let id = w.workflow(&w.dev_token, json!({})).await;

    let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
    socket.send(Message::text("hello")).await.unwrap();
    let (code, reason) = next(&mut socket).await.unwrap_err();
    assert_eq!(code, u16::from(CloseCode::Invalid));
    assert!(
        reason.starts_with("invalid protojson ClientEvent"),
        "{reason}"
    );

    let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
    socket
        .send(Message::text(
            json!({"actionResponse": {"requestID": "x"}}).to_string(),
        ))
        .await
        .unwrap();
    assert_eq!(
        next(&mut socket).await,
        Err((1007, "the first frame must be a startRequest".into()))
    );

    let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
    socket.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    assert_eq!(next(&mut socket).await.unwrap_err().0, 1003);

    // Mid-run: the run ends and its lease goes.
    let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
    socket.send(start_frame(id)).await.unwrap();
    let seen = w.service.as_ref().unwrap().seen.clone();
    wait_until("the run to reach the service", || {
        !seen.lock().unwrap().events.is_empty()
    })
    .await;
    socket
        .send(Message::text(
            json!({"startRequest": {"goal": 5}}).to_string(),
        ))
        .await
        .unwrap();
    assert_eq!(next(&mut socket).await.unwrap_err().0, 1007);
    assert_eq!(leases(&w).await, 0);
    wait_until("the service stream to end", || {
        seen.lock().unwrap().ended == 1
    })
    .await;
}

#[tokio::test]
async fn foreign_and_unknown_workflows_are_not_found_on_the_socket() {
    let service = fake_service::start(Script::Hold).await;
    let w = setup().await.start(Some(service), &[]).await;
    let theirs = w.workflow(&w.other_token, json!({})).await;
    for id in [theirs, 999_999] {
        let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
        socket.send(start_frame(id)).await.unwrap();
        assert_eq!(
            next(&mut socket).await,
            Err((1008, "404 Workflow Not Found".into()))
        );
    }
    match connect(&w, &w.dev_token, &format!("?workflow_id={theirs}")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 404)
        }
        other => panic!("expected 404, got {:?}", other.map(|_| ())),
    }
    // A plain GET is not a socket; no token is 401.
    let plain = reqwest::Client::new()
        .get(w.server.url("/api/v4/ai/duo_workflows/ws"))
        .bearer_auth(&w.dev_token)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 400);
    let anonymous = reqwest::Client::new()
        .get(w.server.url("/api/v4/ai/duo_workflows/ws"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert!(
        w.service
            .as_ref()
            .unwrap()
            .seen
            .lock()
            .unwrap()
            .streams
            .is_empty()
    );
}

#[tokio::test]
async fn a_dead_holders_lease_lapses() {
    let w = setup().await.start(None, &[]).await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let db = w.fx.pool.get().await.unwrap();
    let ttl = Duration::from_secs(30);
    let held = monolith::workflows::lease::acquire(&**db, id, ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(
        monolith::workflows::lease::acquire(&**db, id, ttl)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        monolith::workflows::lease::renew(&**db, &held, ttl)
            .await
            .unwrap()
    );
    // The holder stopped renewing long ago.
    w.fx.exec(
        "UPDATE duo_workflows_run_leases SET expires_at = now() - interval '1 second'",
        &[],
    )
    .await;
    let next = monolith::workflows::lease::acquire(&**db, id, ttl)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(next.holder, held.holder);
    assert!(
        !monolith::workflows::lease::renew(&**db, &held, ttl)
            .await
            .unwrap()
    );
    // Two racing takers: exactly one wins.
    monolith::workflows::lease::release(&**db, &next)
        .await
        .unwrap();
    let pool = w.fx.pool.clone();
    let take = || {
        let pool = pool.clone();
        async move {
            let c = pool.get().await.unwrap();
            monolith::workflows::lease::acquire(&**c, id, ttl)
                .await
                .unwrap()
        }
    };
    let (a, b) = tokio::join!(take(), take());
    assert_eq!(usize::from(a.is_some()) + usize::from(b.is_some()), 1);
}

#[tokio::test]
async fn a_self_hosted_models_key_goes_to_the_service_only() {
    use monolith::ai_models::{Feature, ModelInput, Provider};
    let service = fake_service::start(Script::Relay).await;
    let w = setup().await.start(Some(service), &[]).await;
    {
        let db = w.fx.pool.get().await.unwrap();
        let models = &w.server.state.models;
        let model = models
            .create_model(
                &**db,
                &ModelInput {
                    name: "local".into(),
                    model: "mistral".into(),
                    endpoint: "http://127.0.0.1:8000/v1".into(),
                    identifier: Some("mistral-small".into()),
                    api_token: Some("sk-very-secret".into()),
                },
            )
            .await
            .unwrap();
        models
            .update_features(
                &**db,
                &[Feature::DuoAgentPlatform],
                Provider::SelfHosted,
                Some(model.id),
            )
            .await
            .unwrap();
    }
    let (status, access) = crate::rest_support::post(
        &w.server,
        "/ai/duo_workflows/direct_access",
        &w.dev_token,
        json!({}),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(
        access["model_metadata"]["endpoint"],
        "http://127.0.0.1:8000/v1"
    );
    assert!(!access.to_string().contains("sk-very-secret"));

    let id = w.workflow(&w.dev_token, json!({})).await;
    let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
    socket.send(start_frame(id)).await.unwrap();
    let read = next(&mut socket).await.unwrap();
    socket
        .send(Message::text(
            json!({"actionResponse": {"requestID": read["requestID"], "plainTextResponse": {"response": "x"}}}).to_string(),
        ))
        .await
        .unwrap();
    while next(&mut socket).await.is_ok() {}
    let streams = w
        .service
        .as_ref()
        .unwrap()
        .seen
        .lock()
        .unwrap()
        .streams
        .clone();
    let model: Value =
        serde_json::from_str(&streams[0]["x-gitlab-agent-platform-model-metadata"]).unwrap();
    assert_eq!(model["api_key"], "sk-very-secret");
    assert_eq!(model["name"], "mistral");

    // Switched off: no run.
    {
        let db = w.fx.pool.get().await.unwrap();
        w.server
            .state
            .models
            .update_features(
                &**db,
                &[Feature::DuoAgentPlatform],
                Provider::Disabled,
                None,
            )
            .await
            .unwrap();
    }
    let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
    socket.send(start_frame(id)).await.unwrap();
    assert_eq!(
        next(&mut socket).await,
        Err((
            1008,
            "Duo Agent Platform is disabled on this instance".into()
        ))
    );
    let (status, _) = crate::rest_support::post(
        &w.server,
        "/ai/duo_workflows/direct_access",
        &w.dev_token,
        json!({}),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(leases(&w).await, 0);
}

#[tokio::test]
async fn requests_outside_the_api_are_refused_and_never_reach_the_client() {
    const HOSTILE: &[&str] = &[
        "/api/v4/../../admin",
        "/api/v4/%2e%2e/admin",
        "/api/v4/..%2f..%2fadmin",
        "/api/v4/%252e%252e/admin",
        "//evil.example/api/v4/projects",
        "http://evil.example/api/v4/projects",
        "/api/v4/..\\..\\admin",
        "/api/v4//projects",
        "/api/v4/x%00y",
        "/admin",
        "/users/sign_in",
    ];
    let service = fake_service::start(Script::HttpPaths(HOSTILE)).await;
    let w = setup().await.start(Some(service), &[]).await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let mut socket = connect(&w, &w.dev_token, "").await.unwrap();
    socket.send(start_frame(id)).await.unwrap();

    // The client sees the checkpoint only: no request was handed to it.
    let checkpoint = next(&mut socket).await.unwrap();
    assert_eq!(checkpoint["requestID"], "cp-1", "{checkpoint}");
    assert_eq!(
        next(&mut socket).await,
        Err((1000, "workflow stream ended".into()))
    );

    let events = w
        .service
        .as_ref()
        .unwrap()
        .seen
        .lock()
        .unwrap()
        .events
        .clone();
    let answers: std::collections::HashMap<String, contracts::duo_workflow::HttpResponse> = events
        .iter()
        .filter_map(|e| match &e.response {
            Some(client_event::Response::ActionResponse(r)) => match &r.response_type {
                Some(action_response::ResponseType::HttpResponse(h)) => {
                    Some((r.request_id.clone(), h.clone()))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    for (n, path) in HOSTILE.iter().enumerate() {
        let answer = &answers[&format!("h{n}")];
        assert!(
            answer.error.starts_with("refusing the request path") && answer.status_code == 0,
            "{path:?}: {answer:?}"
        );
        assert!(answer.body.is_empty(), "{path:?}: {answer:?}");
    }
    // A good path in the same run is still answered, as the user.
    let good = &answers["h-workflow"];
    assert_eq!(good.status_code, 200, "{good:?}");
    let shown: Value = serde_json::from_str(&good.body).unwrap();
    assert_eq!(shown["id"], id);
}
