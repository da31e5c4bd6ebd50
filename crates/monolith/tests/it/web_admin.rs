//! The admin pages over real HTTP: hidden (404) from everyone but instance
//! admins, every form refused without its token, API keys never echoed back,
//! refused forms keeping what was entered, and the changes reaching the
//! policy's decisions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use crate::web_sign_in::{SignedIn, browser, set_password, signed_in};

use monolith::config::Realm;
use monolith::policy::{Ability, Subject, access};
use support::{Fx, Server};

const PASSWORD: &str = "correct horse battery";
const SECRET_KEY: &str = "sk-very-secret-4711";

/// Pages every admin section serves (`{id}`: a self-hosted model).
const ADMIN_PAGES: &[&str] = &[
    "/admin",
    "/admin/gitlab_duo",
    "/admin/gitlab_duo/seat_utilization",
    "/admin/gitlab_duo/switches",
    "/admin/ai/duo_self_hosted",
    "/admin/ai/duo_self_hosted/new",
    "/admin/ai/duo_self_hosted/features",
    "/admin/ai/duo_self_hosted/{id}/edit",
    "/admin/feature_flags",
    "/admin/ai_usage",
];

/// Every admin form.
const ADMIN_FORMS: &[&str] = &[
    "/admin/gitlab_duo",
    "/admin/gitlab_duo/seat_utilization",
    "/admin/gitlab_duo/switches",
    "/admin/ai/duo_self_hosted",
    "/admin/ai/duo_self_hosted/{id}",
    "/admin/ai/duo_self_hosted/{id}/delete",
    "/admin/ai/duo_self_hosted/{id}/test",
    "/admin/ai/duo_self_hosted/features",
    "/admin/feature_flags",
];

struct Setup {
    fx: Fx,
    server: Server,
    root: SignedIn,
    alice: monolith::policy::Actor,
    group: i64,
    project: i64,
}

async fn setup_with(settings: &[(&str, &str)]) -> Setup {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let root = fx.admin("root").await;
    let alice = fx.user("alice").await;
    set_password(&fx, root.id, PASSWORD).await;
    set_password(&fx, alice.id, PASSWORD).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, alice, access::DEVELOPER).await;
    let project = fx.project(group, "site", "private").await;
    let server = Server::start_with_settings(&fx, fx.pool.clone(), settings).await;
    let root = signed_in(&server, "root", PASSWORD).await;
    Setup {
        fx,
        server,
        root,
        alice,
        group,
        project,
    }
}

async fn setup() -> Setup {
    setup_with(&[]).await
}

impl Setup {
    fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    async fn post(&self, path: &str, fields: &[(&str, &str)]) -> reqwest::Response {
        self.root.post_form(path, fields).await
    }

    async fn page(&self, path: &str) -> (u16, String) {
        self.root.page(path).await
    }

    async fn create_model(&self, name: &str, key: &str) -> i64 {
        let res = self
            .post(
                "/admin/ai/duo_self_hosted",
                &[
                    ("name", name),
                    ("model", "mistral"),
                    ("endpoint", "http://127.0.0.1:9/v1"),
                    ("identifier", "custom_openai/mistral-7b-instruct"),
                    ("api_token", key),
                ],
            )
            .await;
        assert_eq!(res.status(), 303, "{:?}", res.text().await);
        self.fx
            .id(
                "SELECT id FROM ai_self_hosted_models WHERE name = $1",
                &[&name],
            )
            .await
    }

    async fn count(&self, sql: &str) -> i64 {
        self.fx.id(sql, &[]).await
    }
}

fn with_id(path: &str, id: i64) -> String {
    path.replace("{id}", &id.to_string())
}

#[tokio::test]
async fn only_instance_admins_see_the_admin_area() {
    let s = setup().await;
    let model = s.create_model("team-mistral", SECRET_KEY).await;

    // The admin reaches every page, and the navigation links to the area.
    for path in ADMIN_PAGES {
        let path = with_id(path, model);
        let res = s.root.browser.get(s.url(&path)).send().await.unwrap();
        let expected = if path == "/admin" { 303 } else { 200 };
        assert_eq!(res.status(), expected, "{path}");
        if expected == 200 {
            assert!(res.text().await.unwrap().contains("href=\"/admin\""));
        }
    }

    // Alice, signed in with a valid form token, finds nothing at all.
    let alice = signed_in(&s.server, "alice", PASSWORD).await;
    let (_, chat) = alice.page("/-/chat").await;
    assert!(!chat.contains("href=\"/admin\""), "no admin link for alice");
    for path in ADMIN_PAGES {
        let path = with_id(path, model);
        assert_eq!(alice.page(&path).await.0, 404, "GET {path}");
    }
    let alice_id = s.alice.id.to_string();
    let model_value = format!("self_hosted:{model}");
    for path in ADMIN_FORMS {
        let path = with_id(path, model);
        let res = alice
            .post_form(
                &path,
                &[
                    ("ai_gateway_url", "https://evil.example"),
                    ("user_id", &alice_id),
                    ("add_on", "duo_enterprise"),
                    ("action", "assign"),
                    ("kind", "project"),
                    ("id", &s.project.to_string()),
                    ("enabled", "false"),
                    ("name", "hijacked"),
                    ("model", "gpt"),
                    ("endpoint", "https://evil.example/v1"),
                    ("duo_chat", model_value.as_str()),
                ],
            )
            .await;
        assert_eq!(res.status(), 404, "POST {path}");
    }
    // ... and changed nothing.
    assert_eq!(
        s.count("SELECT count(*) FROM add_on_seat_assignments")
            .await,
        0
    );
    assert_eq!(
        s.count("SELECT count(*) FROM ai_self_hosted_models WHERE name = 'team-mistral'")
            .await,
        1
    );
    assert_eq!(s.count("SELECT count(*) FROM ai_feature_settings").await, 0);
    assert_eq!(
        s.count("SELECT count(*) FROM instance_settings WHERE ai_gateway_url IS NULL AND duo_features_enabled")
            .await,
        1
    );
    assert_eq!(
        s.count("SELECT count(*) FROM projects WHERE duo_features_enabled")
            .await,
        1
    );

    // Signed out: the sign-in page, and back here afterwards.
    let anonymous = browser();
    let res = anonymous
        .get(s.server.url("/admin/gitlab_duo"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(
        res.headers()["location"],
        "/users/sign_in?redirect_to=%2Fadmin%2Fgitlab_duo"
    );
}

#[tokio::test]
async fn admin_forms_need_the_session_form_token() {
    let s = setup().await;
    let model = s.create_model("team-mistral", SECRET_KEY).await;
    let alice_id = s.alice.id.to_string();
    for token in [None, Some("0".repeat(64)), Some("short".to_owned())] {
        for path in ADMIN_FORMS {
            let path = with_id(path, model);
            let mut fields = vec![
                ("duo_features_enabled", "1"),
                ("ai_gateway_url", "https://evil.example"),
                ("user_id", alice_id.as_str()),
                ("add_on", "duo_pro"),
                ("action", "assign"),
                ("name", "forged"),
                ("model", "gpt"),
                ("endpoint", "https://evil.example/v1"),
                ("duo_chat", "disabled"),
            ];
            if let Some(t) = &token {
                fields.push(("authenticity_token", t.as_str()));
            }
            let res = s
                .root
                .browser
                .post(s.url(&path))
                .form(&fields)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 403, "POST {path} with {token:?}");
            assert!(res.text().await.unwrap().contains("Invalid form token"));
        }
    }
    assert_eq!(
        s.count("SELECT count(*) FROM add_on_seat_assignments")
            .await,
        0
    );
    assert_eq!(
        s.count("SELECT count(*) FROM ai_self_hosted_models").await,
        1
    );
    assert_eq!(s.count("SELECT count(*) FROM ai_feature_settings").await, 0);
    assert_eq!(
        s.count("SELECT count(*) FROM instance_settings WHERE ai_gateway_url IS NULL")
            .await,
        1
    );
}

#[tokio::test]
async fn an_api_key_is_sealed_and_never_shown_again() {
    let s = setup().await;
    let model = s.create_model("team-mistral", SECRET_KEY).await;

    let sealed: Vec<u8> =
        s.fx.pool
            .get()
            .await
            .unwrap()
            .query_one(
                "SELECT api_token_sealed FROM ai_self_hosted_models WHERE id = $1",
                &[&model],
            )
            .await
            .unwrap()
            .get(0);
    assert!(
        !sealed
            .windows(SECRET_KEY.len())
            .any(|w| w == SECRET_KEY.as_bytes())
    );

    let (status, list) = s.page("/admin/ai/duo_self_hosted?notice=created").await;
    assert_eq!(status, 200);
    assert!(list.contains("Self-hosted model created."), "{list}");
    assert!(list.contains(">set<"), "the list says a key is set");
    for path in ADMIN_PAGES {
        let (_, html) = s.page(&with_id(path, model)).await;
        assert!(!html.contains(SECRET_KEY), "{path} shows the key");
        assert!(!html.contains("sk-very"), "{path} shows part of the key");
    }
    let (_, edit) = s
        .page(&format!("/admin/ai/duo_self_hosted/{model}/edit"))
        .await;
    assert!(edit.contains("Currently <strong>set</strong>"), "{edit}");

    // Saving without a key keeps the stored one.
    let res = s
        .post(
            &format!("/admin/ai/duo_self_hosted/{model}"),
            &[
                ("name", "team-mistral-2"),
                ("model", "mistral"),
                ("endpoint", "http://127.0.0.1:9/v1"),
                ("identifier", ""),
                ("api_token", ""),
            ],
        )
        .await;
    assert_eq!(res.status(), 303);
    let kept = s
        .count("SELECT count(*) FROM ai_self_hosted_models WHERE name = 'team-mistral-2' AND api_token_sealed IS NOT NULL AND identifier IS NULL")
        .await;
    assert_eq!(kept, 1);

    // A refused form with a new key: the key is not put back in the page.
    let res = s
        .post(
            &format!("/admin/ai/duo_self_hosted/{model}"),
            &[
                ("name", "team-mistral-2"),
                ("model", "mistral"),
                ("endpoint", "not a url"),
                ("api_token", "sk-another-secret-0815"),
            ],
        )
        .await;
    assert_eq!(res.status(), 422);
    let html = res.text().await.unwrap();
    assert!(!html.contains("sk-another-secret-0815"));
    assert!(html.contains("The key you entered was not kept"), "{html}");

    // Removing the key.
    let res = s
        .post(
            &format!("/admin/ai/duo_self_hosted/{model}"),
            &[
                ("name", "team-mistral-2"),
                ("model", "mistral"),
                ("endpoint", "http://127.0.0.1:9/v1"),
                ("remove_api_token", "1"),
            ],
        )
        .await;
    assert_eq!(res.status(), 303);
    let (_, list) = s.page("/admin/ai/duo_self_hosted").await;
    assert!(list.contains(">not set<"), "{list}");
}

#[tokio::test]
async fn the_edit_form_drops_the_key_when_the_endpoint_or_provider_changes() {
    let s = setup().await;
    let model = s.create_model("team-mistral", SECRET_KEY).await;
    let edit = format!("/admin/ai/duo_self_hosted/{model}");
    let has_key = format!(
        "SELECT count(*) FROM ai_self_hosted_models WHERE id = {model} AND api_token_sealed IS NOT NULL"
    );
    // (what changes, family, endpoint, key entered, key kept afterwards)
    let steps: [(&str, &str, &str, &str, bool); 5] = [
        (
            "the family, same provider",
            "gpt",
            "http://127.0.0.1:9/v1",
            "",
            true,
        ),
        (
            "the endpoint's host",
            "gpt",
            "https://collector.evil.example/v1",
            "",
            false,
        ),
        (
            "the endpoint, with a key",
            "gpt",
            "http://127.0.0.1:9/v1",
            "sk-new-0815",
            true,
        ),
        (
            "the provider",
            "claude_3",
            "http://127.0.0.1:9/v1",
            "",
            false,
        ),
        (
            "nothing, with a key",
            "claude_3",
            "http://127.0.0.1:9/v1",
            "sk-new-0816",
            true,
        ),
    ];
    for (what, family, endpoint, key, kept) in steps {
        let res = s
            .post(
                &edit,
                &[
                    ("name", "team-mistral"),
                    ("model", family),
                    ("endpoint", endpoint),
                    ("identifier", ""),
                    ("api_token", key),
                ],
            )
            .await;
        assert_eq!(res.status(), 303, "{what}: {:?}", res.text().await);
        assert_eq!(s.count(&has_key).await, i64::from(kept), "{what}");
    }
    let (_, page) = s.page(&format!("{edit}/edit")).await;
    assert!(page.contains("changing the endpoint"), "{page}");
}

#[tokio::test]
async fn refused_forms_say_why_and_keep_what_was_entered() {
    let s = setup().await;

    // A model with a bad endpoint.
    let res = s
        .post(
            "/admin/ai/duo_self_hosted",
            &[
                ("name", "my-model"),
                ("model", "codestral"),
                ("endpoint", "ftp://models.internal"),
                ("identifier", "custom_openai/codestral-22b"),
                ("api_token", SECRET_KEY),
            ],
        )
        .await;
    assert_eq!(res.status(), 422);
    let html = res.text().await.unwrap();
    assert!(html.contains("Endpoint must be an http(s) URL"), "{html}");
    assert!(html.contains("value=\"my-model\""));
    assert!(html.contains("value=\"ftp://models.internal\""));
    assert!(html.contains("value=\"custom_openai/codestral-22b\""));
    assert!(
        html.contains("<option value=\"codestral\" selected>"),
        "{html}"
    );
    assert!(!html.contains(SECRET_KEY));

    // Blank name, unknown family, a taken name.
    let res = s
        .post(
            "/admin/ai/duo_self_hosted",
            &[
                ("name", "  "),
                ("model", "mistral"),
                ("endpoint", "http://m/v1"),
            ],
        )
        .await;
    assert_eq!(res.status(), 422);
    assert!(res.text().await.unwrap().contains("Name can't be blank"));
    let res = s
        .post(
            "/admin/ai/duo_self_hosted",
            &[
                ("name", "x"),
                ("model", "not-a-model"),
                ("endpoint", "http://m/v1"),
            ],
        )
        .await;
    assert_eq!(res.status(), 422);
    assert!(res.text().await.unwrap().contains("Model is not one of"));
    s.create_model("taken", "").await;
    let res = s
        .post(
            "/admin/ai/duo_self_hosted",
            &[
                ("name", "taken"),
                ("model", "mistral"),
                ("endpoint", "http://m/v1"),
            ],
        )
        .await;
    assert_eq!(res.status(), 422);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("Name has already been taken")
    );

    // A bad gateway URL: refused, the entry kept, nothing saved.
    let res = s
        .post(
            "/admin/gitlab_duo",
            &[
                ("duo_features_enabled", "1"),
                ("ai_gateway_url", "aigw without scheme"),
            ],
        )
        .await;
    assert_eq!(res.status(), 422);
    let html = res.text().await.unwrap();
    assert!(
        html.contains("AI gateway URL must be an http(s) URL"),
        "{html}"
    );
    assert!(html.contains("value=\"aigw without scheme\""));
    assert_eq!(
        s.count("SELECT count(*) FROM instance_settings WHERE ai_gateway_url IS NULL")
            .await,
        1
    );

    // Model selection naming a model that does not exist: nothing saved, the
    // other choices kept on the page.
    let res = s
        .post(
            "/admin/ai/duo_self_hosted/features",
            &[
                ("duo_chat_explain_code", "disabled"),
                ("duo_chat", "self_hosted:999999"),
            ],
        )
        .await;
    assert_eq!(res.status(), 422);
    let html = res.text().await.unwrap();
    assert!(
        html.contains("that self-hosted model no longer exists"),
        "{html}"
    );
    assert_eq!(s.count("SELECT count(*) FROM ai_feature_settings").await, 0);
    let res = s
        .post(
            "/admin/ai/duo_self_hosted/features",
            &[("duo_chat", "gpt-4")],
        )
        .await;
    assert_eq!(res.status(), 422);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("choose the default model, a self-hosted model or off")
    );

    // A seat for nobody.
    let res = s
        .post(
            "/admin/gitlab_duo/seat_utilization",
            &[
                ("user_id", "999999"),
                ("add_on", "duo_pro"),
                ("action", "assign"),
            ],
        )
        .await;
    assert_eq!(res.status(), 404);
    assert!(res.text().await.unwrap().contains("User not found"));
}

#[tokio::test]
async fn admin_changes_reach_the_policy() {
    let s = setup().await;
    let policy = s.fx.policy();
    let db = s.fx.pool.get().await.unwrap();
    let alice = Some(s.alice);
    let alice_id = s.alice.id.to_string();
    assert!(
        !policy
            .can(&**db, alice, Ability::AccessDuoChat, Subject::Global)
            .await
            .unwrap()
    );

    // Finding her: any case, wildcards taken literally.
    let (_, found) = s
        .page("/admin/gitlab_duo/seat_utilization?search=ALI")
        .await;
    assert!(
        found.contains("<tr data-username=\"alice\"")
            && !found.contains("<tr data-username=\"root\""),
        "{found}"
    );
    let (_, none) = s
        .page("/admin/gitlab_duo/seat_utilization?search=%25")
        .await;
    assert!(
        none.contains("No users match.") && !none.contains("<tr data-username="),
        "{none}"
    );

    // A seat: chat becomes available; the seats page shows it, still searched.
    let res = s
        .post(
            "/admin/gitlab_duo/seat_utilization",
            &[
                ("user_id", &alice_id),
                ("add_on", "duo_pro"),
                ("action", "assign"),
                ("search", "ali"),
            ],
        )
        .await;
    assert_eq!(res.status(), 303);
    assert_eq!(
        res.headers()["location"],
        "/admin/gitlab_duo/seat_utilization?search=ali&notice=assigned"
    );
    assert!(
        policy
            .can(&**db, alice, Ability::AccessDuoChat, Subject::Global)
            .await
            .unwrap()
    );
    let (_, seats) = s
        .page("/admin/gitlab_duo/seat_utilization?notice=assigned")
        .await;
    assert!(seats.contains("Seat assigned."));
    assert!(seats.contains("id=\"seat-duo_pro-alice\""));
    assert!(
        seats.contains("Remove the Duo Pro seat of @alice"),
        "{seats}"
    );

    // The project's switch, then the group's.
    assert!(
        policy
            .can(
                &**db,
                alice,
                Ability::AccessDuoFeatures,
                Subject::Project(s.project)
            )
            .await
            .unwrap()
    );
    let project = s.project.to_string();
    let res = s
        .post(
            "/admin/gitlab_duo/switches",
            &[("kind", "project"), ("id", &project), ("enabled", "false")],
        )
        .await;
    assert_eq!(res.status(), 303);
    assert!(
        !policy
            .can(
                &**db,
                alice,
                Ability::AccessDuoFeatures,
                Subject::Project(s.project)
            )
            .await
            .unwrap()
    );
    s.post(
        "/admin/gitlab_duo/switches",
        &[("kind", "project"), ("id", &project), ("enabled", "true")],
    )
    .await;
    let group = s.group.to_string();
    s.post(
        "/admin/gitlab_duo/switches",
        &[("kind", "group"), ("id", &group), ("enabled", "false")],
    )
    .await;
    assert!(
        !policy
            .can(
                &**db,
                alice,
                Ability::AccessDuoFeatures,
                Subject::Project(s.project)
            )
            .await
            .unwrap()
    );
    let (_, switches) = s.page("/admin/gitlab_duo/switches").await;
    assert!(switches.contains("(off through its group)"), "{switches}");
    let res = s
        .post(
            "/admin/gitlab_duo/switches",
            &[
                ("kind", "group_experiments"),
                ("id", &group),
                ("enabled", "true"),
            ],
        )
        .await;
    assert_eq!(res.status(), 303);
    assert_eq!(
        s.count("SELECT count(*) FROM groups WHERE experiment_and_beta_features")
            .await,
        1
    );

    // Instance settings: Duo off for everyone; the gateway URL and experiments stored.
    let res = s
        .post(
            "/admin/gitlab_duo",
            &[
                ("ai_gateway_url", "https://aigw.example.com"),
                ("experiment_features_enabled", "1"),
            ],
        )
        .await;
    assert_eq!(res.status(), 303);
    assert!(
        !policy
            .can(&**db, alice, Ability::AccessDuoChat, Subject::Global)
            .await
            .unwrap()
    );
    let settings = monolith::duo_settings::instance_settings(&**db)
        .await
        .unwrap();
    assert_eq!(
        settings.ai_gateway_url.as_deref(),
        Some("https://aigw.example.com")
    );
    assert!(settings.experiment_features_enabled);
    assert!(!settings.duo_features_enabled);
    let (_, page) = s.page("/admin/gitlab_duo?notice=saved").await;
    assert!(page.contains("Settings saved."));
    assert!(page.contains("value=\"https://aigw.example.com\""));

    // Taking the seat back.
    s.post(
        "/admin/gitlab_duo",
        &[("duo_features_enabled", "1"), ("ai_gateway_url", "")],
    )
    .await;
    let res = s
        .post(
            "/admin/gitlab_duo/seat_utilization",
            &[
                ("user_id", &alice_id),
                ("add_on", "duo_pro"),
                ("action", "unassign"),
            ],
        )
        .await;
    assert_eq!(res.status(), 303);
    assert!(
        !policy
            .can(&**db, alice, Ability::AccessDuoChat, Subject::Global)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn model_selection_is_saved_and_a_model_in_use_cannot_be_deleted() {
    let s = setup().await;
    let model = s.create_model("team-mistral", SECRET_KEY).await;
    let value = format!("self_hosted:{model}");
    let res = s
        .post(
            "/admin/ai/duo_self_hosted/features",
            &[
                ("duo_chat", value.as_str()),
                ("duo_chat_explain_code", "disabled"),
                ("code_embeddings", "vendored"),
            ],
        )
        .await;
    assert_eq!(res.status(), 303);
    let db = s.fx.pool.get().await.unwrap();
    let choice = s
        .server
        .state
        .models
        .choice(&**db, monolith::ai_models::Feature::DuoChat)
        .await
        .unwrap();
    let metadata = choice.metadata().unwrap();
    assert_eq!(metadata.api_key.as_deref(), Some(SECRET_KEY));
    assert_eq!(
        s.server
            .state
            .models
            .choice(&**db, monolith::ai_models::Feature::ExplainCode)
            .await
            .unwrap(),
        monolith::ai_models::Choice::Disabled
    );
    let (_, page) = s.page("/admin/ai/duo_self_hosted/features").await;
    assert!(
        page.contains(&format!("<option value=\"{value}\" selected>")),
        "{page}"
    );

    let res = s
        .post(&format!("/admin/ai/duo_self_hosted/{model}/delete"), &[])
        .await;
    assert_eq!(res.status(), 409);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("still selected for: duo_chat")
    );

    s.post(
        "/admin/ai/duo_self_hosted/features",
        &[("duo_chat", "vendored")],
    )
    .await;
    let res = s
        .post(&format!("/admin/ai/duo_self_hosted/{model}/delete"), &[])
        .await;
    assert_eq!(res.status(), 303);
    assert_eq!(
        s.count("SELECT count(*) FROM ai_self_hosted_models").await,
        0
    );
}

#[tokio::test]
async fn a_connection_test_says_clearly_when_the_gateway_is_unreachable() {
    // Port 9 (discard) on loopback: nothing listens there.
    let s = setup_with(&[("AI_GATEWAY_URL", "http://127.0.0.1:9")]).await;
    let model = s.create_model("team-mistral", SECRET_KEY).await;
    let res = s
        .post(&format!("/admin/ai/duo_self_hosted/{model}/test"), &[])
        .await;
    assert_eq!(res.status(), 200);
    let html = res.text().await.unwrap();
    assert!(
        html.contains("Connection to team-mistral failed: the AI gateway is unreachable"),
        "{html}"
    );
    assert!(!html.contains(SECRET_KEY));
}

#[tokio::test]
async fn the_graphql_api_narrows_models_and_settings_as_gitlab_does() {
    let s = setup().await;
    let first = s.create_model("team-mistral", SECRET_KEY).await;
    let second = s.create_model("team-claude", "").await;
    s.post(
        "/admin/ai/duo_self_hosted/features",
        &[
            ("duo_chat", &format!("self_hosted:{first}")),
            ("duo_chat_fix_code", &format!("self_hosted:{first}")),
            ("duo_chat_explain_code", &format!("self_hosted:{second}")),
        ],
    )
    .await;
    let root = s.fx.admin("root2").await;
    let token = s.fx.token(root, &["api"]).await;
    let gql = |query: &'static str, variables: serde_json::Value| {
        let token = token.clone();
        let url = s.server.url("/api/graphql");
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&serde_json::json!({ "query": query, "variables": variables }))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let gid = format!("gid://gitlab/Ai::SelfHostedModel/{first}");
    let one = gql(
        "query($id: AiSelfHostedModelID) { aiSelfHostedModels(id: $id) { nodes { name model modelDisplayName hasApiToken } } }",
        serde_json::json!({ "id": gid }),
    )
    .await;
    assert_eq!(
        one["data"]["aiSelfHostedModels"]["nodes"],
        serde_json::json!([{ "name": "team-mistral", "model": "mistral", "modelDisplayName": "Mistral", "hasApiToken": true }]),
        "{one}"
    );
    assert!(!one.to_string().contains(SECRET_KEY));
    let used = gql(
        "query($id: AiSelfHostedModelID) { aiFeatureSettings(selfHostedModelId: $id) { nodes { feature provider } } }",
        serde_json::json!({ "id": gid }),
    )
    .await;
    let features: Vec<&str> = used["data"]["aiFeatureSettings"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["feature"].as_str().unwrap())
        .collect();
    assert_eq!(features, ["duo_chat", "duo_chat_fix_code"], "{used}");
    let all = gql(
        "{ aiFeatureSettings { nodes { feature } } }",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(
        all["data"]["aiFeatureSettings"]["nodes"]
            .as_array()
            .unwrap()
            .len(),
        9
    );
    let bad = gql(
        "{ aiSelfHostedModels(id: \"gid://gitlab/Project/1\") { nodes { name } } }",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(
        bad["errors"][0]["extensions"]["code"], "ARGUMENT_ERROR",
        "{bad}"
    );
}

#[tokio::test]
async fn the_chat_page_says_why_duo_chat_is_unavailable() {
    let s = setup().await;
    let alice = signed_in(&s.server, "alice", PASSWORD).await;
    let reason = |html: String| {
        let start = html.find("id=\"page-data\">").unwrap() + "id=\"page-data\">".len();
        let end = html[start..].find("</script>").unwrap();
        let json: serde_json::Value = serde_json::from_str(&html[start..start + end]).unwrap();
        json["unavailable"].as_str().map(str::to_owned)
    };
    let chat = || async { alice.page("/-/chat").await.1 };
    let no_seat = reason(chat().await).unwrap();
    assert!(no_seat.contains("you need a GitLab Duo seat"), "{no_seat}");

    let alice_id = s.alice.id.to_string();
    s.post(
        "/admin/gitlab_duo/seat_utilization",
        &[
            ("user_id", &alice_id),
            ("add_on", "duo_pro"),
            ("action", "assign"),
        ],
    )
    .await;
    assert_eq!(reason(chat().await), None);

    s.post(
        "/admin/ai/duo_self_hosted/features",
        &[("duo_chat", "disabled")],
    )
    .await;
    let off = reason(chat().await).unwrap();
    assert!(off.contains("an administrator turned it off"), "{off}");
    assert!(!off.contains("As an administrator"), "{off}");

    s.post("/admin/gitlab_duo", &[("ai_gateway_url", "")]).await;
    let instance_off = reason(chat().await).unwrap();
    assert!(
        instance_off.contains("turned GitLab Duo off for this instance"),
        "{instance_off}"
    );
    // The admin is told they can change it.
    let (_, root_chat) = s.page("/-/chat").await;
    let for_root = reason(root_chat).unwrap();
    assert!(
        for_root.contains("As an administrator, you can change this"),
        "{for_root}"
    );

    s.fx.instance(Realm::SelfManaged, "free", true).await;
    let not_included = reason(chat().await).unwrap();
    assert!(
        not_included.contains("not part of this instance's subscription"),
        "{not_included}"
    );
}
