//! Model selection per feature, end to end: an admin defines a self-hosted model
//! and points Duo Chat at it through GitLab's GraphQL API; the next answer is
//! asked of that model (name, endpoint, key) through the gateway; its key is
//! sealed at rest and never shown; a switched-off feature is refused.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use e2e_tests::{Options, System};
use serde_json::{Value, json};

const CREATE: &str = "mutation($input: AiSelfHostedModelCreateInput!) {
  aiSelfHostedModelCreate(input: $input) { selfHostedModel { id name model endpoint identifier hasApiToken } errors }
}";
const UPDATE_FEATURE: &str = "mutation($input: AiFeatureSettingUpdateInput!) {
  aiFeatureSettingUpdate(input: $input) { aiFeatureSettings { feature provider selfHostedModel { name } } errors }
}";
const SETTINGS: &str = "query { aiFeatureSettings { nodes { feature title mainFeature provider selfHostedModel { name hasApiToken } } } }";

async fn system() -> System {
    System::start_with(Options {
        gateway_env: vec![("AIGW_CUSTOM_MODELS__ENABLED".into(), "true".into())],
        ..Default::default()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn chat_answers_with_the_self_hosted_model_an_admin_chose() {
    let system = system().await;
    let root = system.token("root").unwrap();
    let alice = system.token("alice").unwrap();

    // Only admins see or change model settings.
    let refused = system.graphql(&alice, SETTINGS, json!({})).await.unwrap();
    assert_eq!(
        refused["errors"][0]["extensions"]["code"], "RESOURCE_NOT_AVAILABLE",
        "{refused}"
    );

    let created = system
        .graphql(
            &root,
            CREATE,
            json!({ "input": {
                "name": "team-mistral",
                "model": "mistral",
                "endpoint": system.fake.openai_base_url(),
                "identifier": "custom_openai/mistral-7b-instruct",
                "apiToken": "sk-team-secret-42",
            }}),
        )
        .await
        .unwrap();
    let model = &created["data"]["aiSelfHostedModelCreate"]["selfHostedModel"];
    assert_eq!(model["hasApiToken"], true, "{created}");
    assert!(!created.to_string().contains("sk-team-secret-42"));
    let model_id = model["id"].as_str().unwrap().to_owned();
    assert!(model_id.starts_with("gid://gitlab/Ai::SelfHostedModel/"));

    // Sealed at rest: the key is not in the table.
    let db = system.db.client().await.unwrap();
    let sealed: Vec<u8> = db
        .query_one("SELECT api_token_sealed FROM ai_self_hosted_models", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!sealed.windows(17).any(|w| w == b"sk-team-secret-42"));

    // A bad definition is refused with a reason.
    let bad = system
        .graphql(
            &root,
            CREATE,
            json!({ "input": { "name": "x", "model": "not-a-model", "endpoint": "ftp://nowhere" } }),
        )
        .await
        .unwrap();
    assert!(
        bad["data"]["aiSelfHostedModelCreate"]["errors"][0]
            .as_str()
            .unwrap()
            .starts_with("Model is not one of"),
        "{bad}"
    );

    let updated = system
        .graphql(
            &root,
            UPDATE_FEATURE,
            json!({ "input": { "features": ["DUO_CHAT"], "provider": "SELF_HOSTED", "aiSelfHostedModelId": model_id } }),
        )
        .await
        .unwrap();
    assert_eq!(
        updated["data"]["aiFeatureSettingUpdate"]["aiFeatureSettings"][0]["provider"],
        "self_hosted",
        "{updated}"
    );

    system
        .fake
        .set_default_text("Thought: fine.\nFinal Answer: Answered by the team's model.");
    let answer = system
        .ask_and_wait(&alice, json!({ "content": "Which model are you?" }))
        .await
        .unwrap();
    assert_eq!(
        answer["content"], "Answered by the team's model.",
        "{answer}"
    );
    let call = system
        .fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/chat/completions"))
        .expect("the self-hosted (OpenAI-compatible) endpoint was called");
    assert_eq!(call.body["model"], "mistral-7b-instruct", "{:?}", call.body);
    assert_eq!(
        call.header("authorization"),
        Some("Bearer sk-team-secret-42")
    );

    // A model in use cannot be deleted.
    let delete = system
        .graphql(
            &root,
            "mutation($id: AiSelfHostedModelID!) { aiSelfHostedModelDelete(input: { id: $id }) { errors } }",
            json!({ "id": model_id }),
        )
        .await
        .unwrap();
    assert!(
        delete["data"]["aiSelfHostedModelDelete"]["errors"][0]
            .as_str()
            .unwrap()
            .contains("duo_chat"),
        "{delete}"
    );

    // Switched off: refused before any model call.
    let calls_before = system.fake.requests().len();
    system
        .graphql(
            &root,
            UPDATE_FEATURE,
            json!({ "input": { "features": ["DUO_CHAT"], "provider": "DISABLED" } }),
        )
        .await
        .unwrap();
    let refused = system
        .ask_and_wait(&alice, json!({ "content": "Still there?" }))
        .await
        .unwrap();
    assert!(refused["errors"].to_string().contains("M3004"), "{refused}");
    assert_eq!(system.fake.requests().len(), calls_before);

    let settings: Value = system.graphql(&root, SETTINGS, json!({})).await.unwrap();
    let chat = settings["data"]["aiFeatureSettings"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["feature"] == "duo_chat")
        .unwrap()
        .clone();
    assert_eq!(chat["provider"], "disabled");
    assert_eq!(chat["mainFeature"], "Duo Chat");
}
