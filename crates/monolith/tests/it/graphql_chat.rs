//! The chat GraphQL API over real HTTP: GitLab's operation shapes, thread rules,
//! `/clear` and `/reset`, rate limiting, resource checks and error codes.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use monolith::config::Realm;
use monolith::policy::{Actor, access};
use serde_json::{Value, json};
use support::{Fx, Server};

struct Client {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Client {
    async fn gql(&self, query: &str, variables: Value) -> Value {
        let res = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }
}

// GitLab's web client's chat mutation, with its variable types.
const CHAT_MUTATION: &str = "mutation chat($question: String!, $resourceId: AiModelID, $clientSubscriptionId: String, $projectId: ProjectID, $threadId: AiConversationThreadID, $currentFile: AiCurrentFileInput) {
  aiAction(input: {chat: {resourceId: $resourceId, content: $question, currentFile: $currentFile}, clientSubscriptionId: $clientSubscriptionId, projectId: $projectId, threadId: $threadId}) {
    requestId
    errors
    threadId
  }
}";

const NEW_THREAD_MUTATION: &str = "mutation chat($question: String!) {
  aiAction(input: {chat: {content: $question}, conversationType: DUO_CHAT}) { requestId errors threadId }
}";

const MESSAGES_QUERY: &str = "query getAiMessages($threadId: AiConversationThreadID!) {
  aiMessages(threadId: $threadId) {
    nodes { id requestId content contentHtml errors errorCode role timestamp extras { sources hasFeedback } }
  }
}";

async fn world() -> (Fx, Server, Actor, Client) {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let user = fx.user("alice").await;
    fx.seat(user, "duo_pro", false).await;
    let token = fx.token(user, &["api"]).await;
    let server = Server::start(&fx).await;
    let client = Client {
        http: reqwest::Client::new(),
        url: server.url("/api/graphql"),
        token,
    };
    (fx, server, user, client)
}

#[tokio::test]
async fn chat_question_is_stored_and_answered_with_a_coded_error() {
    let (fx, _server, user, client) = world().await;
    let res = client
        .gql(CHAT_MUTATION, json!({ "question": "What is **Duo**?", "resourceId": format!("gid://gitlab/User/{}", user.id) }))
        .await;
    let payload = &res["data"]["aiAction"];
    assert_eq!(payload["errors"], json!([]), "{res}");
    let request_id = payload["requestId"].as_str().unwrap().to_string();
    let thread_id = payload["threadId"].as_str().unwrap().to_string();
    assert!(thread_id.starts_with("gid://gitlab/Ai::Conversation::Thread/"));

    // The answer comes from a worker (here in-process, with the default responder).
    let worker = monolith::worker::spawn(
        fx.pool.clone(),
        fx.db.url(),
        std::sync::Arc::new(monolith::chat::jobs::NotYetAvailableResponder),
        "https://docs.gitlab.com".into(),
        monolith::worker::WorkerSettings {
            queue: job_queue::WorkerConfig {
                poll_interval: std::time::Duration::from_millis(100),
                ..Default::default()
            },
            retention_every: std::time::Duration::from_secs(3600),
            workflows: None,
            code_index: None,
            workflow_runs: None,
            review: None,
        },
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let (res, nodes) = loop {
        let res = client
            .gql(MESSAGES_QUERY, json!({ "threadId": thread_id }))
            .await;
        let nodes = res["data"]["aiMessages"]["nodes"]
            .as_array()
            .unwrap()
            .clone();
        if nodes.len() >= 2 || tokio::time::Instant::now() > deadline {
            break (res, nodes);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    worker.shutdown().await;
    assert_eq!(nodes.len(), 2, "{res}");
    assert_eq!(nodes[0]["role"], "USER");
    assert_eq!(nodes[0]["content"], "What is **Duo**?");
    assert_eq!(
        nodes[0]["contentHtml"],
        "<p>What is <strong>Duo</strong>?</p>\n"
    );
    assert_eq!(nodes[0]["requestId"], request_id);
    assert_eq!(nodes[1]["role"], "ASSISTANT");
    assert_eq!(nodes[1]["requestId"], request_id);
    assert_eq!(nodes[1]["errorCode"], "A9999");
    assert_eq!(nodes[1]["contentHtml"], Value::Null);
    let error = nodes[1]["errors"][0].as_str().unwrap();
    assert!(
        error.contains("not yet available") && error.contains("Error code: [A9999]"),
        "{error}"
    );
}

#[tokio::test]
async fn threads_clear_and_reset_follow_gitlab() {
    let (fx, _server, _user, client) = world().await;
    let first = client
        .gql(CHAT_MUTATION, json!({ "question": "one" }))
        .await;
    let legacy = first["data"]["aiAction"]["threadId"]
        .as_str()
        .unwrap()
        .to_string();
    // No thread and no type: the same legacy thread again.
    let second = client
        .gql(CHAT_MUTATION, json!({ "question": "two" }))
        .await;
    assert_eq!(second["data"]["aiAction"]["threadId"], legacy.as_str());
    // A conversation type alone starts a new thread.
    let fresh = client
        .gql(NEW_THREAD_MUTATION, json!({ "question": "three" }))
        .await;
    let fresh_id = fresh["data"]["aiAction"]["threadId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(fresh_id, legacy);

    let before = count_messages(&fx).await;
    // /reset is stored but nothing is answered.
    let reset = client
        .gql(
            CHAT_MUTATION,
            json!({ "question": "/reset", "threadId": legacy }),
        )
        .await;
    assert_eq!(reset["data"]["aiAction"]["threadId"], legacy.as_str());
    assert_eq!(count_messages(&fx).await, before + 1);
    // /clear stores nothing and moves to a new thread.
    let clear = client
        .gql(
            CHAT_MUTATION,
            json!({ "question": "/clear", "threadId": legacy }),
        )
        .await;
    let cleared = clear["data"]["aiAction"]["threadId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(cleared, legacy);
    assert_eq!(count_messages(&fx).await, before + 1);
    // /new stores nothing either and opens a new multi-thread conversation.
    let new = client
        .gql(
            CHAT_MUTATION,
            json!({ "question": "/new", "threadId": cleared }),
        )
        .await;
    let newest = new["data"]["aiAction"]["threadId"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(new["data"]["aiAction"]["requestId"].is_string(), "{new}");
    assert!(newest != cleared && newest != legacy && newest != fresh_id);
    assert_eq!(count_messages(&fx).await, before + 1);

    let threads = client
        .gql("{ aiConversationThreads { nodes { id lastUpdatedAt createdAt conversationType title } pageInfo { endCursor hasNextPage } } }", json!({}))
        .await;
    let nodes = threads["data"]["aiConversationThreads"]["nodes"]
        .as_array()
        .unwrap();
    assert_eq!(nodes.len(), 4, "{threads}");
    assert_eq!(
        nodes
            .iter()
            .filter(|t| t["conversationType"] == "DUO_CHAT")
            .count(),
        2,
        "{threads}"
    );
    assert!(
        nodes
            .iter()
            .any(|t| t["conversationType"] == "DUO_CHAT" && t["title"] == "three")
    );

    // Someone else's or a made-up thread is not found.
    let bad = client
        .gql(
            CHAT_MUTATION,
            json!({ "question": "x", "threadId": "gid://gitlab/Ai::Conversation::Thread/999999" }),
        )
        .await;
    assert_eq!(
        bad["errors"][0]["extensions"]["code"], "THREAD_NOT_FOUND",
        "{bad}"
    );
    assert_eq!(
        bad["errors"][0]["message"],
        "Thread not found. It may have expired."
    );
}

async fn count_messages(fx: &Fx) -> i64 {
    let db = fx.pool.get().await.unwrap();
    db.query_one("SELECT count(*) FROM ai_conversation_messages", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn refusals_carry_codes() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let no_seat = fx.user("noseat").await;
    let seated = fx.user("seated").await;
    fx.seat(seated, "duo_pro", false).await;
    let group = fx.group(None, "g", "private", "ultimate").await;
    let project = fx.project(group, "p", "private").await;
    let outsider_issue = fx.issue(project, no_seat, true).await;
    fx.group_member(group, no_seat, access::GUEST).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();
    let client = Client {
        http: http.clone(),
        url: server.url("/api/graphql"),
        token: fx.token(no_seat, &["api"]).await,
    };
    let seated_client = Client {
        http,
        url: server.url("/api/graphql"),
        token: fx.token(seated, &["ai_features"]).await,
    };

    let res = client.gql(CHAT_MUTATION, json!({ "question": "hi" })).await;
    let errors = res["data"]["aiAction"]["errors"].as_array().unwrap();
    assert!(
        errors[0].as_str().unwrap().contains("Error code: [M3004]"),
        "{res}"
    );

    // A confidential issue the user cannot read is answered as if it did not exist.
    for resource in [
        format!("gid://gitlab/Issue/{outsider_issue}"),
        "gid://gitlab/Issue/999999".into(),
        "gid://gitlab/Nope/1".into(),
    ] {
        let res = seated_client
            .gql(
                CHAT_MUTATION,
                json!({ "question": "hi", "resourceId": resource }),
            )
            .await;
        assert_eq!(
            res["errors"][0]["extensions"]["code"], "RESOURCE_NOT_AVAILABLE",
            "{res}"
        );
    }

    let res = seated_client
        .gql(CHAT_MUTATION, json!({ "question": "   " }))
        .await;
    assert_eq!(res["errors"][0]["extensions"]["code"], "ARGUMENT_ERROR");
    let res = seated_client
        .gql(
            "mutation { aiAction(input: {clientSubscriptionId: \"x\"}) { errors } }",
            json!({}),
        )
        .await;
    assert_eq!(
        res["errors"][0]["message"],
        "Only one method argument is required"
    );

    let res = seated_client
        .gql(
            "{ currentUser { duoChatAvailable duoChatAvailableFeatures } }",
            json!({}),
        )
        .await;
    assert_eq!(res["data"]["currentUser"]["duoChatAvailable"], true);
    assert!(
        res["data"]["currentUser"]["duoChatAvailableFeatures"]
            .as_array()
            .unwrap()
            .contains(&json!("include_file_context"))
    );
    let res = client
        .gql(
            "{ currentUser { duoChatAvailable duoChatAvailableFeatures } }",
            json!({}),
        )
        .await;
    assert_eq!(res["data"]["currentUser"]["duoChatAvailable"], false);
    assert_eq!(
        res["data"]["currentUser"]["duoChatAvailableFeatures"],
        json!([])
    );

    // Documents juniper rejects before running them still carry a code.
    for broken in ["{ currentUser { id ", "{ currentUser { noSuchField } }"] {
        let res = client.gql(broken, json!({})).await;
        assert_eq!(
            res["errors"][0]["extensions"]["code"], "GRAPHQL_VALIDATION_FAILED",
            "{res}"
        );
    }
    let res = client.gql(CHAT_MUTATION, json!({ "question": 42 })).await;
    assert_eq!(
        res["errors"][0]["extensions"]["code"], "GRAPHQL_VALIDATION_FAILED",
        "{res}"
    );

    let deep = format!("query {}{}", "{ currentUser ".repeat(25), "}".repeat(25));
    let res = client.gql(&deep, json!({})).await;
    assert_eq!(res["errors"][0]["extensions"]["code"], "QUERY_TOO_DEEP");
}

#[tokio::test]
async fn rate_limit_is_shared_through_the_database() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let user = fx.user("alice").await;
    fx.seat(user, "duo_pro", false).await;
    let token = fx.token(user, &["api"]).await;
    let db = fx.pool.get().await.unwrap();
    // 160 requests already made within the window (e.g. through another replica).
    db.execute(
        "INSERT INTO rate_limit_counters (user_id, action, window_ends_at, used)
         VALUES ($1, 'ai_action', now() + interval '1 hour', 159)",
        &[&user.id],
    )
    .await
    .unwrap();
    let server = Server::start(&fx).await;
    let client = Client {
        http: reqwest::Client::new(),
        url: server.url("/api/graphql"),
        token,
    };
    let ok = client
        .gql(CHAT_MUTATION, json!({ "question": "160th" }))
        .await;
    assert_eq!(ok["data"]["aiAction"]["errors"], json!([]), "{ok}");
    let limited = client
        .gql(CHAT_MUTATION, json!({ "question": "161st" }))
        .await;
    assert_eq!(
        limited["errors"][0]["extensions"]["code"], "RATE_LIMITED",
        "{limited}"
    );
    assert_eq!(
        limited["errors"][0]["message"],
        "This endpoint has been requested too many times. Try again later."
    );
}

#[tokio::test]
async fn idle_threads_are_deleted_by_retention() {
    let (fx, _server, _user, client) = world().await;
    let res = client
        .gql(CHAT_MUTATION, json!({ "question": "old question" }))
        .await;
    assert_eq!(res["data"]["aiAction"]["errors"], json!([]));
    let fresh = client
        .gql(NEW_THREAD_MUTATION, json!({ "question": "new question" }))
        .await;
    let fresh_id = fresh["data"]["aiAction"]["threadId"]
        .as_str()
        .unwrap()
        .to_string();
    let db = fx.pool.get().await.unwrap();
    db.execute(
        "UPDATE ai_conversation_threads SET last_updated_at = now() - interval '31 days' WHERE conversation_type = 1",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(monolith::chat::apply_retention(&fx.pool).await.unwrap(), 1);
    let left: Vec<i64> = db
        .query("SELECT id FROM ai_conversation_threads", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left.len(), 1);
    assert!(fresh_id.ends_with(&format!("/{}", left[0])));
}

#[tokio::test]
async fn read_api_tokens_query_but_cannot_ask() {
    let (fx, server, user, _client) = world().await;
    let reader = Client {
        http: reqwest::Client::new(),
        url: server.url("/api/graphql"),
        token: fx.token(user, &["read_api"]).await,
    };
    let res = reader
        .gql("{ currentUser { duoChatAvailable } }", json!({}))
        .await;
    assert_eq!(
        res["data"]["currentUser"]["duoChatAvailable"], true,
        "{res}"
    );
    let res = reader.gql(CHAT_MUTATION, json!({ "question": "hi" })).await;
    assert_eq!(
        res["errors"][0]["extensions"]["code"], "INSUFFICIENT_SCOPE",
        "{res}"
    );
    assert_eq!(count_messages(&fx).await, 0, "nothing may be stored");
}

#[tokio::test]
async fn resources_where_duo_is_off_are_never_sent() {
    let (fx, _server, user, client) = world().await;
    let group = fx.group(None, "g", "private", "ultimate").await;
    let on = fx.project(group, "on", "private").await;
    let off = fx.project(group, "off", "private").await;
    fx.project_duo(off, false).await;
    fx.group_member(group, user, access::DEVELOPER).await;
    let readable_on = fx.issue(on, user, false).await;
    let readable_off = fx.issue(off, user, false).await;

    let res = client
        .gql(
            CHAT_MUTATION,
            json!({ "question": "hi", "resourceId": format!("gid://gitlab/Issue/{readable_off}") }),
        )
        .await;
    assert_eq!(
        res["data"]["aiAction"]["errors"],
        json!(["AI features are not enabled or resource is not permitted to be sent."]),
        "{res}"
    );
    assert!(res["data"]["aiAction"]["requestId"].is_null());
    assert_eq!(count_messages(&fx).await, 0);

    let res = client
        .gql(
            CHAT_MUTATION,
            json!({ "question": "hi", "resourceId": format!("gid://gitlab/Issue/{readable_on}") }),
        )
        .await;
    assert_eq!(res["data"]["aiAction"]["errors"], json!([]), "{res}");

    // The worker's check: Duo switched off after the question was accepted.
    let policy = fx.policy();
    let db = fx.pool.get().await.unwrap();
    let on_gid = format!("gid://gitlab/Issue/{readable_on}");
    assert!(
        monolith::agent::readable_resource(&policy, &**db, user, &on_gid)
            .await
            .unwrap()
            .is_some()
    );
    fx.project_duo(on, false).await;
    assert!(
        monolith::agent::readable_resource(&policy, &**db, user, &on_gid)
            .await
            .unwrap()
            .is_none(),
        "a resource in a project with Duo off must not become page context"
    );
}
