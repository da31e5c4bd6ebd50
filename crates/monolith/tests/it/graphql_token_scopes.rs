//! What each token scope may do through GraphQL, over real HTTP with tokens
//! made by the project's own token code: an admin's `ai_features` token asks
//! Duo Chat but never changes (or reads) the AI configuration; `api` does
//! everything; `read_api` only reads. And a self-hosted model's stored key is
//! dropped when its endpoint or provider changes without a new key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use monolith::config::Realm;
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

const CREATE_MODEL: &str = "mutation($input: AiSelfHostedModelCreateInput!) {
  aiSelfHostedModelCreate(input: $input) { selfHostedModel { id endpoint hasApiToken } errors }
}";
const UPDATE_MODEL: &str = "mutation($input: AiSelfHostedModelUpdateInput!) {
  aiSelfHostedModelUpdate(input: $input) { selfHostedModel { id endpoint model hasApiToken } errors }
}";
const DELETE_MODEL: &str = "mutation($input: AiSelfHostedModelDeleteInput!) {
  aiSelfHostedModelDelete(input: $input) { selfHostedModel { id } errors }
}";
const UPDATE_FEATURES: &str = "mutation($input: AiFeatureSettingUpdateInput!) {
  aiFeatureSettingUpdate(input: $input) { aiFeatureSettings { feature provider } errors }
}";
const MODELS: &str = "{ aiSelfHostedModels { nodes { id name endpoint hasApiToken } } }";
const FEATURES: &str = "{ aiFeatureSettings { nodes { feature provider } } }";
const CHAT: &str = "mutation($question: String!) {
  aiAction(input: {chat: {content: $question}, conversationType: DUO_CHAT}) { requestId errors threadId }
}";
const DELETE_THREAD: &str = "mutation($input: DeleteConversationThreadInput!) {
  deleteConversationThread(input: $input) { success errors }
}";

/// A field refused for the token's scope: no data, `INSUFFICIENT_SCOPE`.
fn assert_insufficient_scope(res: &Value, field: &str, what: &str) {
    assert!(res["data"][field].is_null(), "{what}: {res}");
    assert_eq!(
        res["errors"][0]["extensions"]["code"], "INSUFFICIENT_SCOPE",
        "{what}: {res}"
    );
    assert_eq!(res["errors"][0]["path"], json!([field]), "{what}: {res}");
}

struct World {
    fx: Fx,
    server: Server,
    ai_only: String,
    read_api: String,
    api: String,
}

/// An admin with a Duo seat and three tokens: `ai_features`, `read_api`, `api`.
async fn world() -> World {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let root = fx.admin("root").await;
    fx.seat(root, "duo_enterprise", false).await;
    let ai_only = fx.token(root, &["ai_features"]).await;
    let read_api = fx.token(root, &["read_api"]).await;
    let api = fx.token(root, &["api"]).await;
    let server = Server::start(&fx).await;
    World {
        fx,
        server,
        ai_only,
        read_api,
        api,
    }
}

impl World {
    async fn create_model(&self, name: &str, model: &str, endpoint: &str, key: &str) -> String {
        let res = gql(
            &self.server,
            &self.api,
            CREATE_MODEL,
            json!({ "input": { "name": name, "model": model, "endpoint": endpoint, "apiToken": key } }),
        )
        .await;
        let created = &res["data"]["aiSelfHostedModelCreate"];
        assert_eq!(created["errors"], json!([]), "{res}");
        assert_eq!(created["selfHostedModel"]["hasApiToken"], true, "{res}");
        created["selfHostedModel"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Whether model `name` holds a sealed key, from the database itself.
    async fn key_stored(&self, name: &str) -> bool {
        self.fx
            .id(
                "SELECT count(*) FROM ai_self_hosted_models WHERE name = $1 AND api_token_sealed IS NOT NULL",
                &[&name],
            )
            .await
            == 1
    }
}

#[tokio::test]
async fn an_admins_ai_features_token_changes_no_configuration() {
    let w = world().await;
    let model = w
        .create_model(
            "team-mistral",
            "mistral",
            "http://vllm.internal:8000/v1",
            "sk-1",
        )
        .await;
    let admin_mutations: [(&str, &str, Value); 4] = [
        (
            "aiSelfHostedModelCreate",
            CREATE_MODEL,
            json!({ "input": { "name": "planted", "model": "gpt", "endpoint": "https://collector.evil.example/v1" } }),
        ),
        (
            "aiSelfHostedModelUpdate",
            UPDATE_MODEL,
            json!({ "input": { "id": model, "name": "team-mistral", "model": "mistral", "endpoint": "https://collector.evil.example/v1" } }),
        ),
        (
            "aiFeatureSettingUpdate",
            UPDATE_FEATURES,
            json!({ "input": { "features": ["DUO_CHAT"], "provider": "DISABLED" } }),
        ),
        (
            "aiSelfHostedModelDelete",
            DELETE_MODEL,
            json!({ "input": { "id": model } }),
        ),
    ];
    for token in [&w.ai_only, &w.read_api] {
        for (field, query, variables) in &admin_mutations {
            let res = gql(&w.server, token, query, variables.clone()).await;
            assert_insufficient_scope(&res, field, field);
        }
    }
    // Nothing changed: one model, at its endpoint, with its key; chat vendored.
    let (models, features) = (
        gql(&w.server, &w.api, MODELS, json!({})).await,
        gql(&w.server, &w.api, FEATURES, json!({})).await,
    );
    assert_eq!(
        models["data"]["aiSelfHostedModels"]["nodes"],
        json!([{ "id": model, "name": "team-mistral", "endpoint": "http://vllm.internal:8000/v1", "hasApiToken": true }]),
        "{models}"
    );
    assert_eq!(
        features["data"]["aiFeatureSettings"]["nodes"][0],
        json!({ "feature": "duo_chat", "provider": "vendored" }),
        "{features}"
    );
    // Reading the configuration is not for an `ai_features` token either.
    for (field, query) in [
        ("aiSelfHostedModels", MODELS),
        ("aiFeatureSettings", FEATURES),
    ] {
        let res = gql(&w.server, &w.ai_only, query, json!({})).await;
        assert_insufficient_scope(&res, field, field);
        let res = gql(&w.server, &w.read_api, query, json!({})).await;
        assert!(res["errors"].is_null(), "read_api reads {field}: {res}");
    }

    // The same admin's `api` token makes each change.
    for (field, query, variables) in &admin_mutations {
        let res = gql(&w.server, &w.api, query, variables.clone()).await;
        assert!(res["errors"].is_null(), "{field}: {res}");
        assert_eq!(res["data"][field]["errors"], json!([]), "{field}: {res}");
    }
}

#[tokio::test]
async fn an_ai_features_token_still_asks_duo_chat_and_manages_its_threads() {
    let w = world().await;
    let res = gql(&w.server, &w.ai_only, CHAT, json!({ "question": "Hello?" })).await;
    assert!(res["errors"].is_null(), "{res}");
    assert_eq!(res["data"]["aiAction"]["errors"], json!([]), "{res}");
    let thread = res["data"]["aiAction"]["threadId"]
        .as_str()
        .unwrap()
        .to_owned();

    // `read_api` may read but not ask, nor delete.
    let res = gql(
        &w.server,
        &w.read_api,
        CHAT,
        json!({ "question": "Hello?" }),
    )
    .await;
    assert_insufficient_scope(&res, "aiAction", "read_api asks");
    let input = json!({ "input": { "threadId": thread } });
    let res = gql(&w.server, &w.read_api, DELETE_THREAD, input.clone()).await;
    assert_insufficient_scope(&res, "deleteConversationThread", "read_api deletes");

    let res = gql(&w.server, &w.ai_only, DELETE_THREAD, input).await;
    assert_eq!(
        res["data"]["deleteConversationThread"],
        json!({ "success": true, "errors": [] }),
        "{res}"
    );
}

#[tokio::test]
async fn a_new_endpoint_or_provider_without_a_new_key_drops_the_stored_key() {
    let w = world().await;
    let id = w
        .create_model(
            "team",
            "mistral",
            "http://vllm.internal:8000/v1",
            "sk-original",
        )
        .await;
    // (what changes, model, endpoint, key given, key kept afterwards)
    let steps: [(&str, &str, &str, Option<&str>, bool); 7] = [
        (
            "nothing but the name",
            "mistral",
            "http://vllm.internal:8000/v1",
            None,
            true,
        ),
        (
            "a family of the same provider",
            "gpt",
            "http://vllm.internal:8000/v1",
            None,
            true,
        ),
        (
            "the endpoint's host",
            "gpt",
            "https://collector.evil.example/v1",
            None,
            false,
        ),
        (
            "the endpoint, with a new key",
            "gpt",
            "http://vllm.internal:8000/v1",
            Some("sk-second"),
            true,
        ),
        (
            "the endpoint's path only",
            "gpt",
            "http://vllm.internal:8000/v2",
            None,
            false,
        ),
        (
            "the key, given again",
            "gpt",
            "http://vllm.internal:8000/v2",
            Some("sk-third"),
            true,
        ),
        (
            "the provider (Claude goes to Anthropic)",
            "claude_3",
            "http://vllm.internal:8000/v2",
            None,
            false,
        ),
    ];
    for (n, (what, model, endpoint, key, kept)) in steps.into_iter().enumerate() {
        let mut input =
            json!({ "id": id, "name": format!("team-{n}"), "model": model, "endpoint": endpoint });
        if let Some(key) = key {
            input["apiToken"] = json!(key);
        }
        let res = gql(&w.server, &w.api, UPDATE_MODEL, json!({ "input": input })).await;
        let updated = &res["data"]["aiSelfHostedModelUpdate"];
        assert_eq!(updated["errors"], json!([]), "{what}: {res}");
        assert_eq!(updated["selfHostedModel"]["endpoint"], endpoint, "{what}");
        assert_eq!(
            updated["selfHostedModel"]["hasApiToken"], kept,
            "{what}: {res}"
        );
        assert_eq!(w.key_stored(&format!("team-{n}")).await, kept, "{what}");
    }
    // The key that is kept is the one given last, for the endpoint it was given with.
    let db = w.fx.pool.get().await.unwrap();
    let model_id: i64 = id.rsplit('/').next().unwrap().parse().unwrap();
    let res = gql(
        &w.server,
        &w.api,
        UPDATE_MODEL,
        json!({ "input": { "id": id, "name": "team-last", "model": "claude_3", "endpoint": "http://vllm.internal:8000/v2", "apiToken": "sk-last" } }),
    )
    .await;
    assert_eq!(
        res["data"]["aiSelfHostedModelUpdate"]["errors"],
        json!([]),
        "{res}"
    );
    let metadata = w
        .server
        .state
        .models
        .metadata_of(&**db, model_id)
        .await
        .unwrap();
    assert_eq!(metadata.api_key.as_deref(), Some("sk-last"));
    assert_eq!(metadata.endpoint, "http://vllm.internal:8000/v2");
    assert_eq!(metadata.provider, "anthropic");
}
