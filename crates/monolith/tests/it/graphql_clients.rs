//! GitLab's own chat clients' GraphQL documents, unchanged: the web frontend's
//! "chat with namespace" mutation, the messages query filtered by request ids,
//! the VS Code extension's additional context with object metadata (and
//! metadata as serialised JSON text, as our docs describe it), thread
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

    // No metadata at all is fine; what is not an object (nor text holding
    // one) is refused (see `metadata_as_json_text_...`).
    let res = gql(
        &server,
        &token,
        CHAT_WITH_NAMESPACE,
        json!({ "question": "Again", "threadId": thread_id, "additionalContext": [{ "category": "SNIPPET", "id": 7, "content": "x", "metadata": null }] }),
    )
    .await;
    assert_eq!(res["data"]["aiAction"]["errors"], json!([]), "{res}");

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

/// One chat question with `metadata` (as a variable) on a SNIPPET context item.
async fn ask_with_metadata(server: &Server, token: &str, metadata: Value) -> Value {
    gql(
        server,
        token,
        CHAT_WITH_NAMESPACE,
        json!({ "question": "With context", "conversationType": "DUO_CHAT", "additionalContext": [{ "category": "SNIPPET", "id": "s1", "content": "x", "metadata": metadata }] }),
    )
    .await
}

/// The stored metadata of the question `res` asked, as the messages query
/// answers it (serialised JSON text, or null).
async fn stored_metadata(server: &Server, token: &str, res: &Value) -> Value {
    let payload = &res["data"]["aiAction"];
    assert_eq!(payload["errors"], json!([]), "{res}");
    let messages = gql(
        server,
        token,
        MESSAGES_BY_REQUEST,
        json!({ "requestIds": [payload["requestId"]], "roles": ["USER"], "threadId": payload["threadId"] }),
    )
    .await;
    let context = &messages["data"]["aiMessages"]["nodes"][0]["extras"]["additionalContext"][0];
    assert_eq!(context["id"], "s1", "{messages}");
    match context["metadata"].as_str() {
        Some(text) => serde_json::from_str(text).unwrap(),
        None => Value::Null,
    }
}

#[tokio::test]
async fn metadata_as_json_text_is_parsed_and_anything_but_an_object_is_refused() {
    let (fx, server, _user, token) = world().await;
    let object = json!({ "relativePath": "src/lib.rs", "enabled": true, "lines": [3, 4] });

    // Serialised JSON text, as docs/graphql.md describes it, and the object
    // itself (GitLab's editor extensions) are stored as the same object.
    for metadata in [Value::String(object.to_string()), object.clone()] {
        let res = ask_with_metadata(&server, &token, metadata).await;
        assert_eq!(stored_metadata(&server, &token, &res).await, object);
    }
    // Inline in the document, as a string literal, too.
    let inline = format!(
        "mutation {{ aiAction(input: {{chat: {{content: \"inline\", additionalContext: [{{category: SNIPPET, id: \"s1\", content: \"x\", metadata: {}}}]}}, conversationType: DUO_CHAT}}) {{ requestId errors threadId }} }}",
        Value::String(object.to_string())
    );
    let res = gql(&server, &token, &inline, json!({})).await;
    assert_eq!(stored_metadata(&server, &token, &res).await, object);

    let deep = (0..20).fold(json!(1), |inner, _| json!({ "a": inner }));
    let large = json!({ "blob": "x".repeat(70 * 1024) });
    let refused: [(&str, Value, &str); 9] = [
        ("plain text", json!("plain words"), "is not valid JSON text"),
        ("a number", json!(42), "must be a JSON object"),
        ("a boolean", json!(true), "must be a JSON object"),
        ("an array", json!([1, 2]), "must be a JSON object"),
        (
            "text holding an array",
            json!("[1, 2]"),
            "must be a JSON object",
        ),
        (
            "text holding text",
            json!("\"{}\""),
            "must be a JSON object",
        ),
        ("too deep", deep.clone(), "is nested too deeply"),
        (
            "too deep, as text",
            Value::String(deep.to_string()),
            "is nested too deeply",
        ),
        (
            "too large",
            Value::String(large.to_string()),
            "is too large",
        ),
    ];
    let questions_before = fx
        .id(
            "SELECT count(*) FROM ai_conversation_messages WHERE role = 1",
            &[],
        )
        .await;
    for (what, metadata, message) in refused {
        let res = ask_with_metadata(&server, &token, metadata).await;
        assert!(res["data"]["aiAction"].is_null(), "{what}: {res}");
        let error = &res["errors"][0];
        assert_eq!(
            error["extensions"]["code"], "ARGUMENT_ERROR",
            "{what}: {res}"
        );
        let text = error["message"].as_str().unwrap();
        assert!(
            text.starts_with("additionalContext.metadata "),
            "{what}: {text}"
        );
        assert!(text.contains(message), "{what}: {text}");
    }
    let large_object = ask_with_metadata(&server, &token, large).await;
    assert_eq!(
        large_object["errors"][0]["extensions"]["code"], "ARGUMENT_ERROR",
        "{large_object}"
    );
    // Nothing refused was stored.
    let questions_after = fx
        .id(
            "SELECT count(*) FROM ai_conversation_messages WHERE role = 1",
            &[],
        )
        .await;
    assert_eq!(questions_after, questions_before);
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
