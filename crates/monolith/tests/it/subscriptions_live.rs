//! `aiCompletionResponse` over a real WebSocket (`graphql-transport-ws` and the
//! legacy `graphql-ws`): a question asked over HTTP, answered by an in-process
//! worker, arrives as numbered chunks and then the full message.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests fail loudly"
)]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use monolith::app_state::AppState;
use monolith::chat::completion::{
    ChatAnswer, ChatResponder, ChunkSender, CompletionJob, ResponderError,
};
use monolith::chat::live;
use monolith::config::Realm;
use monolith::policy::Actor;
use monolith::policy::add_ons::AddOnCatalogue;
use serde_json::{Value, json};
use support::Fx;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const DEADLINE: Duration = Duration::from_secs(20);

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A `web` role on 127.0.0.1:0 whose state the test can inspect.
struct Web {
    state: AppState,
    addr: std::net::SocketAddr,
    handle: actix_web::dev::ServerHandle,
}

impl Web {
    async fn start(fx: &Fx) -> Web {
        Self::start_with(fx, &[]).await
    }

    async fn start_with(fx: &Fx, settings: &[(&str, &str)]) -> Web {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let url = fx.db.url().to_string();
        let config = monolith::config::Config::from_lookup(|k| match k {
            "DATABASE_URL" => Some(url.clone()),
            "DUO_WEB_ADDR" => Some(addr.to_string()),
            "DUO_SIGNING_KEY_DIR" => Some(support::test_key_dir()),
            other => settings
                .iter()
                .find(|(name, _)| *name == other)
                .map(|(_, v)| (*v).to_owned()),
        })
        .unwrap();
        let state =
            AppState::new(fx.pool.clone(), config, AddOnCatalogue::built_in().unwrap()).unwrap();
        let server = monolith::server::serve(state.clone(), listener).unwrap();
        let handle = server.handle();
        tokio::spawn(server);
        Web {
            state,
            addr,
            handle,
        }
    }

    async fn gql(&self, token: &str, query: &str, variables: Value) -> Value {
        let res = reqwest::Client::new()
            .post(format!("http://{}/api/graphql", self.addr))
            .bearer_auth(token)
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }

    /// Opens a socket speaking `protocol`, with optional extra headers.
    async fn socket(&self, protocol: &str, headers: &[(&str, &str)]) -> Socket {
        let mut request = format!("ws://{}/api/graphql", self.addr)
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
        for (name, value) in headers {
            let name: tokio_tungstenite::tungstenite::http::HeaderName = name.parse().unwrap();
            request.headers_mut().insert(name, value.parse().unwrap());
        }
        let (socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
        assert_eq!(
            response.headers()["sec-websocket-protocol"]
                .to_str()
                .unwrap(),
            protocol
        );
        socket
    }

    /// Waits until this process listens to `topic` (the subscription is live).
    async fn wait_for_listener(&self, topic: &str) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while self.state.live.receiver_count(topic) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "nobody subscribed to {topic}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { handle.stop(false).await });
        }
    }
}

async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::text(message.to_string()))
        .await
        .unwrap();
}

/// The next protocol message, skipping keep-alives; `None` when the socket closed.
async fn next(socket: &mut Socket) -> Option<Value> {
    loop {
        let frame = tokio::time::timeout(DEADLINE, socket.next())
            .await
            .expect("no message in time");
        match frame {
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(text.as_str()).unwrap();
                if matches!(value["type"].as_str(), Some("ping" | "pong" | "ka")) {
                    continue;
                }
                return Some(value);
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => continue,
        }
    }
}

const SUBSCRIPTION: &str = "subscription aiCompletionResponse($userId: UserID, $resourceId: AiModelID, $agentVersionId: AiAgentVersionID, $clientSubscriptionId: String, $aiAction: AiAction, $htmlResponse: Boolean = true) {
  aiCompletionResponse(userId: $userId, resourceId: $resourceId, agentVersionId: $agentVersionId, aiAction: $aiAction, clientSubscriptionId: $clientSubscriptionId) {
    id requestId content contentHtml @include(if: $htmlResponse) errors role timestamp type chunkId extras { sources }
  }
}";

const CHAT_MUTATION: &str = "mutation chat($question: String!, $clientSubscriptionId: String) {
  aiAction(input: {chat: {content: $question}, clientSubscriptionId: $clientSubscriptionId}) { requestId errors threadId }
}";

/// Streams three chunks, then answers with their concatenation.
struct ThreeChunks;

#[async_trait]
impl ChatResponder for ThreeChunks {
    async fn respond(
        &self,
        _job: &CompletionJob,
        chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        // A model that pauses after its first piece (longer than the worker
        // holds a first piece for what follows), then streams the rest.
        let _ = chunks.send("Pipelines ".to_owned());
        tokio::time::sleep(Duration::from_millis(300)).await;
        for piece in ["run ", "jobs."] {
            let _ = chunks.send(piece.to_owned());
        }
        Ok(ChatAnswer::text("Pipelines run jobs."))
    }
}

async fn world() -> (Fx, Actor, String, Web) {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let user = fx.user("alice").await;
    fx.seat(user, "duo_pro", false).await;
    let token = fx.token(user, &["api"]).await;
    let web = Web::start(&fx).await;
    (fx, user, token, web)
}

/// Opens a `graphql-transport-ws` socket authenticated in `connection_init`.
async fn transport_socket(web: &Web, token: &str) -> Socket {
    let mut socket = web.socket("graphql-transport-ws", &[]).await;
    send(
        &mut socket,
        json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } }),
    )
    .await;
    let ack = next(&mut socket).await.unwrap();
    assert_eq!(ack["type"], "connection_ack", "{ack}");
    socket
}

#[tokio::test]
async fn a_question_streams_chunks_then_the_full_answer_to_the_socket() {
    let (fx, user, token, web) = world().await;
    let user_gid = format!("gid://gitlab/User/{}", user.id);

    // One socket follows this request's chunks, another the user's whole chat.
    let mut stream_socket = transport_socket(&web, &token).await;
    send(
        &mut stream_socket,
        json!({ "id": "chunks", "type": "subscribe", "payload": {
            "query": SUBSCRIPTION,
            "variables": { "userId": user_gid, "aiAction": "CHAT", "clientSubscriptionId": "tab-42", "htmlResponse": false },
        }}),
    )
    .await;
    let mut chat_socket = transport_socket(&web, &token).await;
    send(
        &mut chat_socket,
        json!({ "id": "chat", "type": "subscribe", "payload": {
            "query": SUBSCRIPTION,
            "variables": { "userId": user_gid, "aiAction": "CHAT" },
        }}),
    )
    .await;
    web.wait_for_listener(&live::client_topic(user.id, "tab-42"))
        .await;
    web.wait_for_listener(&live::user_topic(user.id)).await;

    let worker = monolith::worker::spawn(
        fx.pool.clone(),
        fx.db.url(),
        Arc::new(ThreeChunks),
        "https://docs.gitlab.com".into(),
        monolith::worker::WorkerSettings {
            queue: job_queue::WorkerConfig {
                poll_interval: Duration::from_millis(100),
                ..Default::default()
            },
            retention_every: Duration::from_secs(3600),
            workflows: None,
            code_index: None,
            workflow_runs: None,
            review: None,
        },
    )
    .unwrap();
    let res = web
        .gql(
            &token,
            CHAT_MUTATION,
            json!({ "question": "What do pipelines do?", "clientSubscriptionId": "tab-42" }),
        )
        .await;
    assert_eq!(res["data"]["aiAction"]["errors"], json!([]), "{res}");
    let request_id = res["data"]["aiAction"]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    let thread_id = res["data"]["aiAction"]["threadId"]
        .as_str()
        .unwrap()
        .to_owned();

    // The first piece goes out alone (the model paused after it); the
    // worker coalesces the pieces that follow into fewer chunks, numbered on
    // from 2, whose texts add up.
    let mut texts = Vec::new();
    let full = loop {
        let msg = next(&mut stream_socket).await.unwrap();
        assert_eq!(msg["type"], "next", "{msg}");
        assert_eq!(msg["id"], "chunks");
        let data = &msg["payload"]["data"]["aiCompletionResponse"];
        if data["chunkId"].is_null() {
            break msg;
        }
        assert_eq!(data["chunkId"], json!(texts.len() + 1), "{msg}");
        assert_eq!(data["requestId"], request_id.as_str());
        assert_eq!(data["role"], "ASSISTANT");
        assert!(data.get("contentHtml").is_none(), "{msg}");
        texts.push(data["content"].as_str().unwrap().to_owned());
    };
    assert_eq!(texts.first().map(String::as_str), Some("Pipelines "));
    assert_eq!(texts.concat(), "Pipelines run jobs.");
    insta::assert_json_snapshot!("full_answer_on_the_client_subscription", full, {
        ".payload.data.aiCompletionResponse.id" => "[uuid]",
        ".payload.data.aiCompletionResponse.requestId" => "[uuid]",
        ".payload.data.aiCompletionResponse.timestamp" => "[timestamp]",
    });
    let data = &full["payload"]["data"]["aiCompletionResponse"];
    assert_eq!(data["chunkId"], Value::Null, "{full}");
    assert_eq!(data["content"], "Pipelines run jobs.");
    assert_eq!(data["errors"], json!([]));
    assert_eq!(data["extras"]["sources"], json!([]));

    // The chat socket sees the question echoed, then the stored answer; no chunks.
    let echo = next(&mut chat_socket).await.unwrap();
    let data = &echo["payload"]["data"]["aiCompletionResponse"];
    assert_eq!(data["role"], "USER", "{echo}");
    assert_eq!(data["content"], "What do pipelines do?");
    assert_eq!(data["requestId"], request_id.as_str());
    let answer = next(&mut chat_socket).await.unwrap();
    insta::assert_json_snapshot!("stored_answer_on_the_chat_subscription", answer, {
        ".payload.data.aiCompletionResponse.id" => "[uuid]",
        ".payload.data.aiCompletionResponse.requestId" => "[uuid]",
        ".payload.data.aiCompletionResponse.timestamp" => "[timestamp]",
    });
    let data = &answer["payload"]["data"]["aiCompletionResponse"];
    assert_eq!(data["role"], "ASSISTANT", "{answer}");
    assert_eq!(data["chunkId"], Value::Null);
    assert_eq!(data["content"], "Pipelines run jobs.");
    assert_eq!(data["contentHtml"], "<p>Pipelines run jobs.</p>\n");
    let answer_id = data["id"].as_str().unwrap().to_owned();
    worker.shutdown().await;

    let res = web
        .gql(
            &token,
            "query($threadId: AiConversationThreadID!) { aiMessages(threadId: $threadId) { nodes { id requestId role content chunkId } } }",
            json!({ "threadId": thread_id }),
        )
        .await;
    let nodes = res["data"]["aiMessages"]["nodes"].as_array().unwrap();
    let answers: Vec<&Value> = nodes.iter().filter(|n| n["role"] == "ASSISTANT").collect();
    assert_eq!(answers.len(), 1, "{res}");
    assert_eq!(answers[0]["id"], answer_id.as_str());
    assert_eq!(answers[0]["content"], "Pipelines run jobs.");
    assert_eq!(answers[0]["requestId"], request_id.as_str());
}

#[tokio::test]
async fn the_legacy_protocol_delivers_messages_published_by_another_process() {
    let (fx, user, token, web) = world().await;
    // Authenticated by the upgrade request's header this time.
    let auth = format!("Bearer {token}");
    let mut socket = web
        .socket("graphql-ws", &[("Authorization", auth.as_str())])
        .await;
    send(
        &mut socket,
        json!({ "type": "connection_init", "payload": {} }),
    )
    .await;
    let ack = next(&mut socket).await.unwrap();
    assert_eq!(ack["type"], "connection_ack", "{ack}");
    send(
        &mut socket,
        json!({ "id": "1", "type": "start", "payload": {
            "query": "subscription($userId: UserID) { aiCompletionResponse(userId: $userId, aiAction: CHAT) { content role chunkId } }",
            "variables": { "userId": format!("gid://gitlab/User/{}", user.id) },
        }}),
    )
    .await;
    web.wait_for_listener(&live::user_topic(user.id)).await;

    // Published on a plain connection, as a worker process would.
    let db = fx.pool.get().await.unwrap();
    let live = live::LiveMessage::chunk(1, uuid::Uuid::new_v4(), 1, "hello".into());
    live::publish_to_user(&**db, user.id, &live).await.unwrap();
    let msg = next(&mut socket).await.unwrap();
    assert_eq!(msg["type"], "data", "{msg}");
    assert_eq!(msg["id"], "1");
    assert_eq!(
        msg["payload"]["data"]["aiCompletionResponse"],
        json!({ "content": "hello", "role": "ASSISTANT", "chunkId": 1 })
    );
}

#[tokio::test]
async fn another_users_messages_are_refused() {
    let (fx, _user, token, web) = world().await;
    let other = fx.user("mallory-target").await;
    let mut socket = transport_socket(&web, &token).await;
    send(
        &mut socket,
        json!({ "id": "spy", "type": "subscribe", "payload": {
            "query": SUBSCRIPTION,
            "variables": { "userId": format!("gid://gitlab/User/{}", other.id), "aiAction": "CHAT" },
        }}),
    )
    .await;
    let msg = next(&mut socket).await.unwrap();
    assert_ne!(msg["type"], "connection_ack");
    let text = msg.to_string();
    assert!(
        text.contains("don't have permission") && msg["payload"]["data"].is_null(),
        "{msg}"
    );
    assert_eq!(
        web.state.live.receiver_count(&live::user_topic(other.id)),
        0
    );
}

#[tokio::test]
async fn a_socket_without_a_valid_token_is_refused() {
    let (_fx, _user, _token, web) = world().await;
    for payload in [json!({}), json!({ "Authorization": "Bearer not-a-token" })] {
        let mut socket = web.socket("graphql-transport-ws", &[]).await;
        send(
            &mut socket,
            json!({ "type": "connection_init", "payload": payload }),
        )
        .await;
        match next(&mut socket).await {
            None => {}
            Some(msg) => assert_ne!(msg["type"], "connection_ack", "{msg}"),
        }
    }
}

#[tokio::test]
async fn a_question_asked_on_one_replica_reaches_a_socket_on_another() {
    let (fx, user, token, web_a) = world().await;
    let web_b = Web::start(&fx).await;
    let mut socket = transport_socket(&web_b, &token).await;
    send(
        &mut socket,
        json!({ "id": "chat", "type": "subscribe", "payload": {
            "query": SUBSCRIPTION,
            "variables": { "userId": format!("gid://gitlab/User/{}", user.id), "aiAction": "CHAT" },
        }}),
    )
    .await;
    web_b.wait_for_listener(&live::user_topic(user.id)).await;
    // Replica A has never had a subscriber: it only publishes.
    assert_eq!(
        web_a.state.live.receiver_count(&live::user_topic(user.id)),
        0
    );
    let res = web_a
        .gql(
            &token,
            CHAT_MUTATION,
            json!({ "question": "Across replicas?" }),
        )
        .await;
    assert_eq!(res["data"]["aiAction"]["errors"], json!([]), "{res}");
    let echo = next(&mut socket).await.unwrap();
    let data = &echo["payload"]["data"]["aiCompletionResponse"];
    assert_eq!(data["role"], "USER", "{echo}");
    assert_eq!(data["content"], "Across replicas?");
    assert_eq!(data["requestId"], res["data"]["aiAction"]["requestId"]);
}

#[tokio::test]
async fn a_quiet_client_that_never_pings_keeps_its_subscription() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let user = fx.user("alice").await;
    fx.seat(user, "duo_pro", false).await;
    let token = fx.token(user, &["api"]).await;
    let web = Web::start_with(&fx, &[("DUO_WS_KEEP_ALIVE_SECS", "1")]).await;
    let mut socket = transport_socket(&web, &token).await;
    send(
        &mut socket,
        json!({ "id": "1", "type": "subscribe", "payload": {
            "query": "subscription($userId: UserID) { aiCompletionResponse(userId: $userId, aiAction: CHAT) { content } }",
            "variables": { "userId": format!("gid://gitlab/User/{}", user.id) },
        }}),
    )
    .await;
    web.wait_for_listener(&live::user_topic(user.id)).await;

    // Three keep-alive intervals pass (the server's own keep-alives count
    // them) while the client stays silent, as graphql-ws clients do.
    let mut keep_alives = 0;
    while keep_alives < 3 {
        let frame = tokio::time::timeout(DEADLINE, socket.next())
            .await
            .expect("no keep-alive in time");
        match frame {
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(text.as_str()).unwrap();
                assert!(
                    matches!(value["type"].as_str(), Some("pong" | "ping")),
                    "{value}"
                );
                keep_alives += 1;
            }
            Some(Ok(Message::Close(reason))) => panic!("the server closed the socket: {reason:?}"),
            Some(Ok(_)) => {}
            other => panic!("socket ended: {other:?}"),
        }
    }

    let db = fx.pool.get().await.unwrap();
    let live = live::LiveMessage::chunk(1, uuid::Uuid::new_v4(), 1, "still here".into());
    live::publish_to_user(&**db, user.id, &live).await.unwrap();
    let msg = next(&mut socket).await.expect("the socket is still open");
    assert_eq!(
        msg["payload"]["data"]["aiCompletionResponse"]["content"], "still here",
        "{msg}"
    );
}

/// Reads an issue (a tool), then answers in one chunk.
struct ToolThenAnswer;

#[async_trait]
impl ChatResponder for ToolThenAnswer {
    async fn respond(
        &self,
        _job: &CompletionJob,
        chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        chunks.tool("issue_reader");
        let _ = chunks.send("It is about logins.".to_owned());
        Ok(ChatAnswer::text("It is about logins."))
    }
}

#[tokio::test]
async fn a_running_tool_is_announced_to_the_client_as_a_tool_message() {
    let (fx, user, token, web) = world().await;
    let user_gid = format!("gid://gitlab/User/{}", user.id);
    let mut socket = transport_socket(&web, &token).await;
    send(
        &mut socket,
        json!({ "id": "chunks", "type": "subscribe", "payload": {
            "query": SUBSCRIPTION,
            "variables": { "userId": user_gid, "aiAction": "CHAT", "clientSubscriptionId": "tab-7", "htmlResponse": true },
        }}),
    )
    .await;
    web.wait_for_listener(&live::client_topic(user.id, "tab-7"))
        .await;
    let worker = monolith::worker::spawn(
        fx.pool.clone(),
        fx.db.url(),
        Arc::new(ToolThenAnswer),
        "https://docs.gitlab.com".into(),
        monolith::worker::WorkerSettings {
            queue: job_queue::WorkerConfig {
                poll_interval: Duration::from_millis(100),
                ..Default::default()
            },
            retention_every: Duration::from_secs(3600),
            workflows: None,
            code_index: None,
            workflow_runs: None,
            review: None,
        },
    )
    .unwrap();
    let res = web
        .gql(
            &token,
            CHAT_MUTATION,
            json!({ "question": "What is gl/app#1 about?", "clientSubscriptionId": "tab-7" }),
        )
        .await;
    assert_eq!(res["data"]["aiAction"]["errors"], json!([]), "{res}");

    // First the tool (GitLab's TOOL type, no chunk id, no HTML), then the
    // answer's chunk, then the stored answer.
    let tool = next(&mut socket).await.unwrap();
    let data = &tool["payload"]["data"]["aiCompletionResponse"];
    assert_eq!(data["type"], "TOOL", "{tool}");
    assert_eq!(data["role"], "ASSISTANT");
    assert_eq!(data["chunkId"], Value::Null);
    assert_eq!(data["contentHtml"], Value::Null);
    assert_eq!(data["content"], "Reading the issue…");
    let chunk = next(&mut socket).await.unwrap();
    let data = &chunk["payload"]["data"]["aiCompletionResponse"];
    assert_eq!(data["chunkId"], json!(1), "{chunk}");
    assert_eq!(data["type"], Value::Null);
    let full = next(&mut socket).await.unwrap();
    let data = &full["payload"]["data"]["aiCompletionResponse"];
    assert_eq!(data["content"], "It is about logins.", "{full}");
    assert_eq!(data["type"], Value::Null);
    // The tool message is live only: the stored conversation has the
    // question and the answer.
    let stored: i64 = fx
        .pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM ai_conversation_messages", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 2);
    worker.shutdown().await;
}
