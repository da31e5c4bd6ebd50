//! GitLab's own chat clients' GraphQL documents, unchanged: the web frontend's
//! "chat with namespace" mutation, the messages query filtered by request ids,
//! the VS Code extension's additional context with object metadata, thread
//! deletion, and the chat types' names and types as the clients declare them
//! (introspected, snapshotted).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use monolith::config::Realm;
use monolith::policy::Actor;
use serde_json::{Value, json};
use support::{Fx, Server};

async fn gql(server: &Server, token: &str, query: &str, variables: Value) -> Value {
    let res = reqwest::Client::new()
        .post(server.url("/api/graphql"))
        .bearer_auth(token)
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

async fn world() -> (Fx, Server, Actor, String) {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let user = fx.user("alice").await;
    fx.seat(user, "duo_enterprise", false).await;
    let token = fx.token(user, &["api"]).await;
    let server = Server::start(&fx).await;
    (fx, server, user, token)
}

// The web frontend's mutation when chat is opened with a namespace.
const CHAT_WITH_NAMESPACE: &str = "mutation chat($question: String!, $resourceId: AiModelID, $clientSubscriptionId: String, $projectId: ProjectID, $rootNamespaceId: NamespaceID, $threadId: AiConversationThreadID, $conversationType: AiConversationsThreadsConversationType, $additionalContext: [AiAdditionalContextInput!]) {
  aiAction(input: {chat: {resourceId: $resourceId, content: $question, additionalContext: $additionalContext}, clientSubscriptionId: $clientSubscriptionId, projectId: $projectId, rootNamespaceId: $rootNamespaceId, threadId: $threadId, conversationType: $conversationType}) {
    requestId
    errors
    threadId
  }
}";

const MESSAGES_BY_REQUEST: &str = "query getAiMessages($requestIds: [ID!], $roles: [AiMessageRole!], $threadId: AiConversationThreadID) {
  aiMessages(requestIds: $requestIds, roles: $roles, threadId: $threadId) {
    nodes { id requestId content role extras { additionalContext { id category content metadata } } }
  }
}";

const DELETE_THREAD: &str =
    "mutation deleteConversationThread($input: DeleteConversationThreadInput!) {
  deleteConversationThread(input: $input) { success errors }
}";

#[tokio::test]
async fn chat_with_a_namespace_and_object_metadata_validates_and_is_kept() {
    let (_fx, server, user, token) = world().await;
    let res = gql(
        &server,
        &token,
        CHAT_WITH_NAMESPACE,
        json!({
            "question": "What does this file do?",
            "resourceId": format!("gid://gitlab/User/{}", user.id),
            "rootNamespaceId": "gid://gitlab/Group/1",
            "conversationType": "DUO_CHAT",
            // The VS Code extension (17.5+) sends metadata as an object.
            "additionalContext": [{
                "category": "FILE",
                "id": "src/main.rs",
                "content": "fn main() {}",
                "metadata": { "title": "main.rs", "enabled": true, "languageId": "rust", "relativePath": "src/main.rs", "lines": [1, 2] },
            }],
        }),
    )
    .await;
    assert!(res["errors"].is_null(), "{res}");
    let payload = &res["data"]["aiAction"];
    assert_eq!(payload["errors"], json!([]), "{res}");
    let request_id = payload["requestId"].as_str().unwrap();
    let thread_id = payload["threadId"].as_str().unwrap();

    let messages = gql(
        &server,
        &token,
        MESSAGES_BY_REQUEST,
        json!({ "requestIds": [request_id], "roles": ["USER"], "threadId": thread_id }),
    )
    .await;
    assert!(messages["errors"].is_null(), "{messages}");
    let nodes = messages["data"]["aiMessages"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{messages}");
    let context = &nodes[0]["extras"]["additionalContext"][0];
    assert_eq!(context["category"], "FILE");
    assert_eq!(context["id"], "src/main.rs");
    let metadata: Value = serde_json::from_str(context["metadata"].as_str().unwrap()).unwrap();
    assert_eq!(metadata["enabled"], true);
    assert_eq!(metadata["lines"], json!([1, 2]));

    // Scalar metadata (a string, a number) is a JSON value too.
    for metadata in [json!("plain words"), json!(42), json!(null)] {
        let res = gql(
            &server,
            &token,
            CHAT_WITH_NAMESPACE,
            json!({ "question": "Again", "threadId": thread_id, "additionalContext": [{ "category": "SNIPPET", "id": 7, "content": "x", "metadata": metadata }] }),
        )
        .await;
        assert_eq!(res["data"]["aiAction"]["errors"], json!([]), "{res}");
    }

    // A request id that is not ours filters everything out.
    let none = gql(
        &server,
        &token,
        MESSAGES_BY_REQUEST,
        json!({ "requestIds": ["00000000-0000-0000-0000-000000000000"], "threadId": thread_id }),
    )
    .await;
    assert_eq!(none["data"]["aiMessages"]["nodes"], json!([]), "{none}");
}

#[tokio::test]
async fn only_the_owner_deletes_a_thread_and_its_messages_go_with_it() {
    let (fx, server, _user, token) = world().await;
    let res = gql(
        &server,
        &token,
        CHAT_WITH_NAMESPACE,
        json!({ "question": "Remember me", "conversationType": "DUO_CHAT" }),
    )
    .await;
    let thread_id = res["data"]["aiAction"]["threadId"]
        .as_str()
        .unwrap()
        .to_owned();

    let bob = fx.user("bob").await;
    let bob_token = fx.token(bob, &["api"]).await;
    let not_available = |res: &Value| {
        assert!(res["data"]["deleteConversationThread"].is_null(), "{res}");
        assert_eq!(
            res["errors"][0]["message"],
            "The resource that you are attempting to access does not exist or you don't have permission to perform this action"
        );
    };
    // Someone else's thread and a thread that does not exist: the same answer.
    not_available(
        &gql(
            &server,
            &bob_token,
            DELETE_THREAD,
            json!({ "input": { "threadId": thread_id } }),
        )
        .await,
    );
    not_available(
        &gql(
            &server,
            &token,
            DELETE_THREAD,
            json!({ "input": { "threadId": "gid://gitlab/Ai::Conversation::Thread/999999" } }),
        )
        .await,
    );

    let numeric: i64 = thread_id.rsplit('/').next().unwrap().parse().unwrap();
    assert_eq!(message_count(&fx, numeric).await, 1);

    let res = gql(
        &server,
        &token,
        DELETE_THREAD,
        json!({ "input": { "threadId": thread_id } }),
    )
    .await;
    assert_eq!(
        res["data"]["deleteConversationThread"],
        json!({ "success": true, "errors": [] }),
        "{res}"
    );
    assert_eq!(message_count(&fx, numeric).await, 0);
    let threads = gql(
        &server,
        &token,
        "{ aiConversationThreads { nodes { id } } }",
        json!({}),
    )
    .await;
    assert!(!threads.to_string().contains(&thread_id), "{threads}");
    // Deleting it again: gone.
    not_available(
        &gql(
            &server,
            &token,
            DELETE_THREAD,
            json!({ "input": { "threadId": thread_id } }),
        )
        .await,
    );
}

async fn message_count(fx: &Fx, thread: i64) -> i64 {
    fx.pool
        .get()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM ai_conversation_messages WHERE thread_id = $1",
            &[&thread],
        )
        .await
        .unwrap()
        .get(0)
}

/// `[ID!]`-style spelling of an introspected type reference.
fn spell(ty: &Value) -> String {
    match ty["kind"].as_str().unwrap() {
        "NON_NULL" => format!("{}!", spell(&ty["ofType"])),
        "LIST" => format!("[{}]", spell(&ty["ofType"])),
        _ => ty["name"].as_str().unwrap().to_owned(),
    }
}

#[tokio::test]
async fn the_chat_types_carry_gitlabs_names_and_types() {
    let (_fx, server, _user, token) = world().await;
    let type_ref =
        "type { kind name ofType { kind name ofType { kind name ofType { kind name } } } }";
    let mut report = String::new();
    for name in [
        "AiActionInput",
        "AiChatInput",
        "AiCurrentFileInput",
        "AiAdditionalContextInput",
        "AiMessage",
        "AiMessageExtras",
        "AiAdditionalContext",
        "AiConversationsThread",
        "DeleteConversationThreadInput",
        "DeleteConversationThreadPayload",
    ] {
        let query = format!(
            "{{ __type(name: \"{name}\") {{ kind fields {{ name {type_ref} }} inputFields {{ name {type_ref} }} }} }}"
        );
        let res = gql(&server, &token, &query, json!({})).await;
        let ty = &res["data"]["__type"];
        assert!(!ty.is_null(), "{name} is missing");
        let fields = ty["fields"]
            .as_array()
            .or(ty["inputFields"].as_array())
            .unwrap();
        let mut lines: Vec<String> = fields
            .iter()
            .map(|f| format!("  {}: {}", f["name"].as_str().unwrap(), spell(&f["type"])))
            .collect();
        lines.sort();
        report.push_str(&format!("{name}\n{}\n", lines.join("\n")));
    }
    for (root, field) in [
        ("Query", "aiMessages"),
        ("Subscription", "aiCompletionResponse"),
        ("Mutation", "aiAction"),
    ] {
        let query = format!(
            "{{ __type(name: \"{root}\") {{ fields {{ name args {{ name {type_ref} }} }} }} }}"
        );
        let res = gql(&server, &token, &query, json!({})).await;
        let f = res["data"]["__type"]["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == field)
            .unwrap()
            .clone();
        let mut lines: Vec<String> = f["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| format!("  {}: {}", a["name"].as_str().unwrap(), spell(&a["type"])))
            .collect();
        lines.sort();
        report.push_str(&format!("{root}.{field}(..)\n{}\n", lines.join("\n")));
    }
    insta::assert_snapshot!(report);
}
