//! The admin pages in a real browser against real processes: a user without
//! a seat is told why Duo is unavailable, an admin assigns the seat and the
//! user's chat then answers; an admin defines a self-hosted model pointing at
//! the fake provider, tests its connection through the gateway, selects it for
//! Duo Chat, and the next answer comes from that model. Screenshots of the
//! admin pages go to target/screenshots/.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use e2e_tests::{Options, System};

use crate::web_support::{ask, open_chat, signed_in};

const FINISHED_ANSWER: &str =
    "return document.querySelector('.message.assistant .body:not(.streaming)')?.textContent";

#[tokio::test]
async fn a_seat_assigned_by_an_admin_opens_chat_to_the_user() {
    let system = System::start().await.unwrap();
    system
        .fake
        .set_default_text("Thought: ok.\nFinal Answer: Welcome aboard, Carol.");

    // Carol has no seat: the chat page says why and will not send.
    let carol = signed_in(&system, "carol").await;
    carol
        .goto(&format!("{}/-/chat", system.web_url))
        .await
        .unwrap();
    let notice = carol
        .until(
            "the availability notice",
            "const n = document.getElementById('availability'); return !n.hidden && n.textContent",
        )
        .await
        .unwrap();
    assert!(notice.as_str().unwrap().contains("Duo seat"), "{notice}");

    // Carol cannot reach the admin area.
    carol
        .goto(&format!(
            "{}/admin/gitlab_duo/seat_utilization",
            system.web_url
        ))
        .await
        .unwrap();
    let heading = carol.text("h1").await.unwrap();
    assert_eq!(heading, "Page not found");

    let root = signed_in(&system, "root").await;
    root.goto(&format!("{}/admin", system.web_url))
        .await
        .unwrap();
    let heading = root.text("h1").await.unwrap();
    assert_eq!(heading, "GitLab Duo");
    root.screenshot("admin-duo-settings").await.unwrap();

    root.click(".admin-nav a[href='/admin/gitlab_duo/seat_utilization']")
        .await
        .unwrap();
    let button = root.text("#seat-duo_pro-carol").await.unwrap();
    assert_eq!(button, "Assign");
    root.click("#seat-duo_pro-carol").await.unwrap();
    root.until(
        "the seat notice",
        "return document.querySelector('.flash.notice')?.textContent.includes('Seat assigned')",
    )
    .await
    .unwrap();
    assert_eq!(root.text("#seat-duo_pro-carol").await.unwrap(), "Remove");
    root.screenshot("admin-seats").await.unwrap();

    // Carol's chat now works.
    open_chat(&carol, &system).await;
    let state = carol
        .js(
            "return { notice: document.getElementById('availability').hidden, \
                      send: document.getElementById('send').disabled }",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(state["notice"], true, "{state}");
    assert_eq!(state["send"], false, "{state}");
    ask(&carol, "Can I use Duo now?").await;
    let answer = carol
        .until("Carol's answer", FINISHED_ANSWER)
        .await
        .unwrap();
    assert!(
        answer.as_str().unwrap().contains("Welcome aboard, Carol."),
        "{answer}"
    );
}

#[tokio::test]
async fn duo_chat_answers_with_the_self_hosted_model_an_admin_selected() {
    let system = System::start_with(Options {
        gateway_env: vec![("AIGW_CUSTOM_MODELS__ENABLED".into(), "true".into())],
        ..Default::default()
    })
    .await
    .unwrap();
    system
        .fake
        .set_default_text("Thought: fine.\nFinal Answer: Answered by the team model.");
    let key = "sk-team-secret-42";

    let root = signed_in(&system, "root").await;
    root.goto(&format!("{}/admin/ai/duo_self_hosted", system.web_url))
        .await
        .unwrap();
    root.click("#new-model").await.unwrap();
    root.type_into("#name", "team-mistral").await.unwrap();
    root.click("#model option[value='mistral']").await.unwrap();
    // First a wrong endpoint: the form comes back with the reason and the input.
    root.type_into("#endpoint", "mistral.internal:8000")
        .await
        .unwrap();
    root.type_into("#identifier", "custom_openai/mistral-7b-instruct")
        .await
        .unwrap();
    root.type_into("#api_token", key).await.unwrap();
    // The browser would refuse the malformed URL itself; the server must too.
    root.js(
        "document.getElementById('model-form').noValidate = true",
        vec![],
    )
    .await
    .unwrap();
    root.click("#model-form button[type=submit]").await.unwrap();
    let error = root
        .until(
            "the validation error",
            "return document.getElementById('form-error')?.textContent",
        )
        .await
        .unwrap();
    assert!(
        error
            .as_str()
            .unwrap()
            .contains("Endpoint must be an http(s) URL"),
        "{error}"
    );
    let kept = root
        .js(
            "return [document.getElementById('name').value, document.getElementById('model').value, \
                     document.getElementById('identifier').value, document.getElementById('api_token').value]",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        kept,
        serde_json::json!([
            "team-mistral",
            "mistral",
            "custom_openai/mistral-7b-instruct",
            ""
        ])
    );
    root.screenshot("admin-self-hosted-model-error")
        .await
        .unwrap();

    // Corrected: the fake provider's OpenAI-compatible endpoint.
    root.js("document.getElementById('endpoint').value = ''", vec![])
        .await
        .unwrap();
    root.type_into("#endpoint", &system.fake.openai_base_url())
        .await
        .unwrap();
    root.type_into("#api_token", key).await.unwrap();
    root.click("#model-form button[type=submit]").await.unwrap();
    root.until(
        "the created notice",
        "return document.querySelector('.flash.notice')?.textContent.includes('Self-hosted model created')",
    )
    .await
    .unwrap();
    let listed = root.text("tr[data-model='team-mistral']").await.unwrap();
    assert!(listed.contains("set"), "{listed}");
    let source = root.client.source().await.unwrap();
    assert!(!source.contains(key), "the key is never shown");

    // The connection test goes through the gateway to the model.
    let before = system.fake.requests().len();
    root.click("tr[data-model='team-mistral'] .test-connection")
        .await
        .unwrap();
    let result = root
        .until(
            "the connection test result",
            // The page still shows the earlier "created" notice until the
            // test's answer replaces it: wait for the connection's own text.
            "const t = document.querySelector('.flash')?.textContent; \
             return t && t.includes('Connection to') ? t : null",
        )
        .await
        .unwrap();
    assert!(
        result
            .as_str()
            .unwrap()
            .contains("Connection to team-mistral works"),
        "{result}"
    );
    let checked = system.fake.requests()[before..]
        .iter()
        .find(|r| r.path.ends_with("/chat/completions"))
        .cloned()
        .expect("the connection test reached the model");
    assert_eq!(checked.body["model"], "mistral-7b-instruct");
    root.screenshot("admin-self-hosted-models").await.unwrap();

    // Duo Chat on the new model.
    root.click(".admin-nav a[href='/admin/ai/duo_self_hosted/features']")
        .await
        .unwrap();
    root.click("#feature-duo_chat option[value^='self_hosted:']")
        .await
        .unwrap();
    root.click("#feature-settings button[type=submit]")
        .await
        .unwrap();
    root.until(
        "the saved notice",
        "return document.querySelector('.flash.notice')?.textContent.includes('Model selection saved')",
    )
    .await
    .unwrap();
    let selected = root
        .js(
            "const s = document.getElementById('feature-duo_chat'); return s.options[s.selectedIndex].textContent",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(selected, "Self-hosted: team-mistral (mistral)");
    root.screenshot("admin-ai-features").await.unwrap();

    // The next answer comes from that model, with its key.
    let before = system.fake.requests().len();
    let alice = signed_in(&system, "alice").await;
    open_chat(&alice, &system).await;
    ask(&alice, "Which model are you?").await;
    let answer = alice.until("the answer", FINISHED_ANSWER).await.unwrap();
    assert!(
        answer
            .as_str()
            .unwrap()
            .contains("Answered by the team model."),
        "{answer}"
    );
    let call = system.fake.requests()[before..]
        .iter()
        .find(|r| r.path.ends_with("/chat/completions"))
        .cloned()
        .expect("the self-hosted (OpenAI-compatible) endpoint was called");
    assert_eq!(call.body["model"], "mistral-7b-instruct", "{:?}", call.body);
    assert_eq!(
        call.header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
}

#[tokio::test]
async fn a_connection_test_shows_why_the_gateway_refused() {
    // Custom models are off on this gateway (its default).
    let system = System::start().await.unwrap();
    let root_token = system.token("root").unwrap();
    let created = system
        .graphql(
            &root_token,
            "mutation($input: AiSelfHostedModelCreateInput!) { aiSelfHostedModelCreate(input: $input) { errors } }",
            serde_json::json!({ "input": {
                "name": "team-mistral",
                "model": "mistral",
                "endpoint": system.fake.openai_base_url(),
            }}),
        )
        .await
        .unwrap();
    assert_eq!(
        created["data"]["aiSelfHostedModelCreate"]["errors"],
        serde_json::json!([]),
        "{created}"
    );
    let before = system.fake.requests().len();
    let root = signed_in(&system, "root").await;
    root.goto(&format!("{}/admin/ai/duo_self_hosted", system.web_url))
        .await
        .unwrap();
    root.click("tr[data-model='team-mistral'] .test-connection")
        .await
        .unwrap();
    let error = root
        .until(
            "the refusal",
            "return document.querySelector('.flash.error')?.textContent",
        )
        .await
        .unwrap();
    let error = error.as_str().unwrap();
    assert!(
        error.contains("Connection to team-mistral failed: the AI gateway answered HTTP 422")
            && error.contains("AIGW_CUSTOM_MODELS__ENABLED"),
        "{error}"
    );
    assert_eq!(system.fake.requests().len(), before, "no model was called");
}
