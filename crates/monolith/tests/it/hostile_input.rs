//! Hostile input at the monolith's edges: NUL characters anywhere, GraphQL
//! documents whose fragments expand to huge costs, nested introspection, large
//! batches, and the same documents sent over a subscription socket. Each is
//! refused with GitLab's status and body before it costs anything.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use monolith::config::Realm;
use serde_json::{Value, json};
use support::{Fx, Server};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Method, URL, token, content type, body, and where the NUL is.
type Case<'a> = (
    reqwest::Method,
    String,
    Option<&'a str>,
    &'a str,
    &'static str,
    &'a str,
);

async fn raw(
    method: reqwest::Method,
    url: String,
    token: Option<&str>,
    content_type: &str,
    body: &'static str,
) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .request(method, url)
        .header("content-type", content_type)
        .body(body);
    if let Some(t) = token {
        req = req.header("PRIVATE-TOKEN", t);
    }
    let res = req.send().await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

async fn gql(server: &Server, token: Option<&str>, body: &Value) -> (Value, usize, Duration) {
    let started = Instant::now();
    let mut req = reqwest::Client::new()
        .post(server.url("/api/graphql"))
        .json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    let elapsed = started.elapsed();
    (serde_json::from_str(&text).unwrap(), text.len(), elapsed)
}

fn first_code(body: &Value) -> &str {
    body["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or("")
}

/// A document of `levels` fragments on `__Type`, each spreading the next
/// `fanout` times: a few hundred bytes that expand to fanout^levels fields.
fn fragment_bomb(levels: usize, fanout: usize) -> String {
    let mut doc = String::from("query { __schema { types { ...F0 } } }");
    for level in 0..levels {
        let spreads = format!("...F{} ", level + 1).repeat(fanout);
        doc.push_str(&format!(" fragment F{level} on __Type {{ name {spreads}}}"));
    }
    doc.push_str(&format!(
        " fragment F{levels} on __Type {{ name kind description }}"
    ));
    doc
}

/// The shape of the standard introspection query tools send (two nested lists).
const INTROSPECTION: &str = "query IntrospectionQuery {
  __schema {
    queryType { name } mutationType { name } subscriptionType { name }
    types { ...FullType }
    directives { name description locations args { ...InputValue } }
  }
}
fragment FullType on __Type {
  kind name description
  fields(includeDeprecated: true) { name description args { ...InputValue } type { ...TypeRef } isDeprecated deprecationReason }
  inputFields { ...InputValue }
  interfaces { ...TypeRef }
  enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason }
  possibleTypes { ...TypeRef }
}
fragment InputValue on __InputValue { name description type { ...TypeRef } defaultValue }
fragment TypeRef on __Type {
  kind name
  ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } }
}";

#[tokio::test]
async fn nul_characters_anywhere_in_a_rest_request_get_a_400() {
    let fx = Fx::new().await;
    let user = fx.user("alice").await;
    let token = fx.token(user, &["api"]).await;
    let group = fx.group(None, "acme", "public", "free").await;
    let project = fx.project(group, "site", "public").await;
    fx.project_member(project, user, monolith::policy::access::DEVELOPER)
        .await;
    let server = Server::start(&fx).await;
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;

    let cases: Vec<Case> = vec![
        // Unauthenticated, a path id with a NUL: the lookup by path must not run.
        (
            get.clone(),
            server.url("/api/v4/projects/acme%00"),
            None,
            "",
            "",
            "path",
        ),
        (
            get.clone(),
            server.url("/api/v4/groups/acme%00site"),
            None,
            "",
            "",
            "path",
        ),
        (
            get.clone(),
            server.url("/api/v4/users?search=a%00"),
            None,
            "",
            "",
            "query string",
        ),
        (
            get.clone(),
            server.url("/api/v4/users?username=%00"),
            Some(&token),
            "",
            "",
            "query string",
        ),
        (
            get.clone(),
            server.url(&format!("/api/v4/projects/{project}/issues?labels=bug%00")),
            Some(&token),
            "",
            "",
            "query string",
        ),
        (
            get.clone(),
            server.url(&format!("/api/v4/projects/{project}/members?query=%00")),
            Some(&token),
            "",
            "",
            "query string",
        ),
        (
            get.clone(),
            server.url("/api/v4/personal_access_tokens?search=x%00"),
            Some(&token),
            "",
            "",
            "query string",
        ),
        (
            post.clone(),
            server.url(&format!("/api/v4/projects/{project}/issues")),
            Some(&token),
            "application/json",
            r#"{"title":"a\u0000b"}"#,
            "body",
        ),
        (
            post.clone(),
            server.url(&format!("/api/v4/projects/{project}/issues")),
            Some(&token),
            "application/x-www-form-urlencoded",
            "title=a%00b",
            "body",
        ),
    ];
    for (method, url, token, content_type, body, place) in cases {
        let (status, text) = raw(method, url.clone(), token, content_type, body).await;
        assert_eq!(status, 400, "{url}: {text}");
        let json: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json,
            json!({ "error": format!("{place} contains a NUL character") }),
            "{url}"
        );
    }
    // Escaped text that merely looks like an escape is fine.
    let (status, text) = raw(
        post,
        server.url(&format!("/api/v4/projects/{project}/issues")),
        Some(&token),
        "application/json",
        r#"{"title":"a\\u0000b"}"#,
    )
    .await;
    assert_eq!(status, 201, "{text}");
    let created: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(created["title"], "a\\u0000b");
}

#[tokio::test]
async fn a_nul_in_a_chat_question_is_a_validation_error_that_costs_no_rate_limit_slot() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let user = fx.user("alice").await;
    fx.seat(user, "duo_pro", false).await;
    let token = fx.token(user, &["api"]).await;
    let db = fx.pool.get().await.unwrap();
    // 159 of 160 requests used: one slot left.
    db.execute(
        "INSERT INTO rate_limit_counters (user_id, action, window_ends_at, used)
         VALUES ($1, 'ai_action', now() + interval '1 hour', 159)",
        &[&user.id],
    )
    .await
    .unwrap();
    let server = Server::start(&fx).await;
    let mutation =
        "mutation($q: String!) { aiAction(input: {chat: {content: $q}}) { requestId errors } }";
    for question in ["a\u{0}b", "\u{0}"] {
        let (body, _, _) = gql(
            &server,
            Some(&token),
            &json!({ "query": mutation, "variables": { "q": question } }),
        )
        .await;
        assert_eq!(first_code(&body), "GRAPHQL_VALIDATION_FAILED", "{body}");
        assert!(body.get("data").is_none_or(Value::is_null), "{body}");
    }
    // A NUL in the document itself (inside a string literal) too.
    let (body, _, _) = gql(
        &server,
        Some(&token),
        &json!({ "query": "mutation { aiAction(input: {chat: {content: \"x\u{0}\"}}) { errors } }" }),
    )
    .await;
    assert_eq!(first_code(&body), "GRAPHQL_VALIDATION_FAILED", "{body}");

    // The last slot is still there.
    let (ok, _, _) = gql(
        &server,
        Some(&token),
        &json!({ "query": mutation, "variables": { "q": "a real question" } }),
    )
    .await;
    assert_eq!(ok["data"]["aiAction"]["errors"], json!([]), "{ok}");
    let stored: i64 = db
        .query_one(
            "SELECT count(*) FROM ai_conversation_messages m JOIN ai_conversation_threads t ON t.id = m.thread_id WHERE t.user_id = $1",
            &[&user.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1, "only the real question is stored");
}

#[tokio::test]
async fn fragment_bombs_are_measured_expanded_and_refused_cheaply() {
    let fx = Fx::new().await;
    let server = Server::start(&fx).await;
    // 6^6 = 46,656 copies of the last fragment, in about 500 bytes.
    let bomb = fragment_bomb(6, 6);
    assert!(bomb.len() < 2_000);
    let (body, size, elapsed) = gql(&server, None, &json!({ "query": bomb })).await;
    assert_eq!(first_code(&body), "QUERY_TOO_COMPLEX", "{body}");
    let message = body["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Query has complexity of")
            && message.ends_with("max complexity of 200"),
        "{message}"
    );
    assert!(size < 1_000, "{size} bytes");
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");

    // A small expansion still runs: the check counts, it does not forbid fragments.
    let (body, _, _) = gql(&server, None, &json!({ "query": fragment_bomb(2, 3) })).await;
    assert!(body["errors"].is_null(), "{body}");
    assert!(body["data"]["__schema"]["types"].as_array().unwrap().len() > 10);
}

#[tokio::test]
async fn introspection_is_allowed_two_lists_deep_and_stays_small() {
    let fx = Fx::new().await;
    let server = Server::start(&fx).await;
    let (body, size, _) = gql(&server, None, &json!({ "query": INTROSPECTION })).await;
    assert!(body["errors"].is_null(), "{body}");
    assert!(body["data"]["__schema"]["types"].as_array().unwrap().len() > 20);
    assert!(size < 1024 * 1024, "introspection answer is {size} bytes");

    let nested = "{ __schema { types { fields { type { fields { type { fields { type { interfaces { name } } } } } } } } } }";
    let (body, size, _) = gql(&server, None, &json!({ "query": nested })).await;
    assert_eq!(first_code(&body), "QUERY_TOO_DEEP", "{body}");
    assert_eq!(
        body["errors"][0]["message"],
        "Maximum introspection depth exceeded"
    );
    assert!(size < 1_000);
}

#[tokio::test]
async fn batches_are_limited_in_count_and_in_total_cost() {
    let fx = Fx::new().await;
    let user = fx.user("alice").await;
    let token = fx.token(user, &["api"]).await;
    let server = Server::start(&fx).await;
    let one = json!({ "query": "query { currentUser { username } }" });

    let huge = Value::Array(vec![one.clone(); 500]);
    let (body, _, elapsed) = gql(&server, Some(&token), &huge).await;
    assert_eq!(first_code(&body), "BATCH_TOO_LARGE", "{body}");
    assert!(elapsed < Duration::from_millis(500), "{elapsed:?}");

    let ten = Value::Array(vec![one; 10]);
    let (body, _, _) = gql(&server, Some(&token), &ten).await;
    let answers = body.as_array().unwrap();
    assert_eq!(answers.len(), 10);
    assert!(
        answers
            .iter()
            .all(|a| a["data"]["currentUser"]["username"] == "alice")
    );

    // Each under the limit, together over it.
    let wide = format!("query {{ currentUser {{ {} }} }}", "username ".repeat(60));
    let costly = Value::Array(vec![json!({ "query": wide }); 5]);
    let (body, _, _) = gql(&server, Some(&token), &costly).await;
    assert_eq!(first_code(&body), "QUERY_TOO_COMPLEX", "{body}");
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next message that is not a keep-alive (`pong` is the server's heartbeat).
async fn next_json(socket: &mut Socket) -> Value {
    next_frame(socket, true).await
}

async fn next_frame(socket: &mut Socket, skip_keep_alive: bool) -> Value {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("no frame within 10 s")
            .expect("socket closed")
            .unwrap();
        if let Message::Text(text) = frame {
            let value: Value = serde_json::from_str(&text).unwrap();
            if skip_keep_alive && value["type"] == "pong" {
                continue;
            }
            return value;
        }
    }
}

async fn send_json(socket: &mut Socket, value: Value) {
    socket
        .send(Message::Text(value.to_string().into()))
        .await
        .unwrap();
}

#[tokio::test]
async fn subscription_documents_meet_the_same_limits() {
    let fx = Fx::new().await;
    let user = fx.user("alice").await;
    let token = fx.token(user, &["api"]).await;
    let server = Server::start(&fx).await;
    let mut request = server
        .url("/api/graphql")
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    send_json(
        &mut socket,
        json!({ "type": "connection_init", "payload": { "Authorization": format!("Bearer {token}") } }),
    )
    .await;
    assert_eq!(next_json(&mut socket).await["type"], "connection_ack");

    let mut doc = String::from(
        "subscription($u: UserID!) { aiCompletionResponse(userId: $u, aiAction: CHAT) { ...M0 } }",
    );
    for level in 0..6 {
        let spreads = format!("...M{} ", level + 1).repeat(6);
        doc.push_str(&format!(
            " fragment M{level} on AiMessage {{ id {spreads}}}"
        ));
    }
    doc.push_str(" fragment M6 on AiMessage { id content }");
    let user_gid = format!("gid://gitlab/User/{}", user.id);
    send_json(
        &mut socket,
        json!({ "id": "bomb", "type": "subscribe", "payload": { "query": doc, "variables": { "u": user_gid } } }),
    )
    .await;
    let refused = next_json(&mut socket).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["id"], "bomb");
    assert_eq!(
        refused["payload"][0]["extensions"]["code"],
        "QUERY_TOO_COMPLEX"
    );

    send_json(
        &mut socket,
        json!({ "id": "nul", "type": "subscribe", "payload": { "query": "subscription { aiCompletionResponse(userId: \"x\u{0}\") { id } }" } }),
    )
    .await;
    let refused = next_json(&mut socket).await;
    assert_eq!(refused["id"], "nul", "{refused}");
    assert_eq!(
        refused["payload"][0]["extensions"]["code"],
        "GRAPHQL_VALIDATION_FAILED"
    );

    // The socket itself is still up.
    send_json(&mut socket, json!({ "type": "ping" })).await;
    assert_eq!(next_frame(&mut socket, false).await["type"], "pong");
}
