//! The review bot (`GitLabDuo`) as a user: listed with `bot: true`, never
//! signing in, holding no tokens, password or admin rights, never blocked;
//! and the instance's and groups' default review instructions, checked as
//! a review reads them.

use crate::rest_support;
use crate::support;
use crate::web_sign_in::{browser, set_password, sign_in};

use monolith::policy::access;
use rest_support::{api_tokens, get, post, post_empty, put, strings};
use serde_json::json;
use support::{Fx, Server};

#[tokio::test]
async fn the_bot_is_listed_but_cannot_sign_in_hold_tokens_or_be_blocked() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let alice = fx.user("alice").await;
    let [root_t, alice_t] = api_tokens(&fx, [root, alice]).await;
    let bot = crate::rest_reviewers::bot_id(&fx).await;
    let server = Server::start(&fx).await;

    let (status, found) = get(&server, "/users?username=GitLabDuo", &alice_t).await;
    assert_eq!(status, 200);
    assert_eq!(strings(&found, "username"), vec!["GitLabDuo"]);
    assert_eq!(found[0]["bot"], true);
    assert_eq!(found[0]["name"], "GitLab Duo");
    assert_eq!(found[0]["id"], bot);
    let (_, all) = get(&server, "/users", &alice_t).await;
    assert_eq!(
        strings(&all, "username"),
        vec!["alice", "root", "GitLabDuo"]
    );
    assert_eq!(all[0]["bot"], false);
    let (_, shown) = get(&server, &format!("/users/{bot}"), &root_t).await;
    assert_eq!(
        (&shown["bot"], &shown["is_admin"]),
        (&json!(true), &json!(false))
    );

    // No tokens, no password, no admin rights, no blocking.
    let (status, body) = post(
        &server,
        &format!("/users/{bot}/personal_access_tokens"),
        &root_t,
        json!({"name": "sneaky", "scopes": ["api"]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("cannot have personal access tokens")
    );
    let (status, body) = put(
        &server,
        &format!("/users/{bot}"),
        &root_t,
        json!({"password": "hunter2hunter2"}),
    )
    .await;
    assert_eq!(
        (status, body),
        (
            403,
            json!({"message": "403 Forbidden - An internal user cannot have a password"})
        )
    );
    let (status, _) = put(
        &server,
        &format!("/users/{bot}"),
        &root_t,
        json!({"admin": true}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = post_empty(&server, &format!("/users/{bot}/block"), &root_t).await;
    assert_eq!(
        (status, body),
        (
            403,
            json!({"message": "403 Forbidden - An internal user cannot be blocked"})
        )
    );
    let db = fx.pool.get().await.unwrap();
    let row = db
        .query_one(
            "SELECT state, admin, encrypted_password IS NULL, (SELECT count(*) FROM personal_access_tokens WHERE user_id = $1)
             FROM users WHERE id = $1",
            &[&bot],
        )
        .await
        .unwrap();
    let state: String = row.get(0);
    let (admin, no_password, tokens): (bool, bool, i64) = (row.get(1), row.get(2), row.get(3));
    assert_eq!(
        (state.as_str(), admin, no_password, tokens),
        ("active", false, true, 0)
    );

    // The web sign-in refuses it, even with a password stored behind the
    // API's back.
    set_password(&fx, bot, "correct horse battery").await;
    let res = sign_in(&browser(), &server, "GitLabDuo", "correct horse battery").await;
    assert_eq!(res.status(), 401);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("Invalid username or password.")
    );

    // People get passwords through the same call, and then sign in with them.
    let (status, body) = put(
        &server,
        &format!("/users/{}", alice.id),
        &root_t,
        json!({"password": "short"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = put(
        &server,
        &format!("/users/{}", alice.id),
        &root_t,
        json!({"password": "a much longer secret"}),
    )
    .await;
    assert_eq!(status, 200);
    let res = sign_in(&browser(), &server, "alice", "a much longer secret").await;
    assert_eq!(res.status(), 303);
}

#[tokio::test]
async fn default_review_instructions_are_checked_as_a_review_reads_them() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let [owner, maintainer] = [fx.user("owner").await, fx.user("maintainer").await];
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, maintainer, access::MAINTAINER).await;
    let [root_t, owner_t, maintainer_t] = api_tokens(&fx, [root, owner, maintainer]).await;
    let server = Server::start(&fx).await;
    let good = "instructions:\n  - name: Rust\n    fileFilters: ['**/*.rs', '!target/**']\n    instructions: Check error handling.\n";

    let (status, settings) = get(&server, "/application/settings", &root_t).await;
    assert_eq!(status, 200);
    assert_eq!(settings["duo_code_review_instructions"], "");
    let (status, body) = put(
        &server,
        "/application/settings",
        &root_t,
        json!({"duo_code_review_instructions": "instructions: ["}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap().contains("not valid YAML"),
        "{body}"
    );
    let (status, body) = put(
        &server,
        "/application/settings",
        &root_t,
        json!({"duo_code_review_instructions": "instructions:\n  - fileFilters: ['a[']\n    instructions: x\n"}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap().contains("bad file filter"),
        "{body}"
    );
    let (status, body) = put(
        &server,
        "/application/settings",
        &root_t,
        json!({"duo_code_review_instructions": good}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["duo_code_review_instructions"], good);
    let (status, _) = put(
        &server,
        "/application/settings",
        &owner_t,
        json!({"duo_code_review_instructions": ""}),
    )
    .await;
    assert_eq!(status, 403);

    let one = format!("/groups/{group}");
    let (status, _) = put(
        &server,
        &one,
        &maintainer_t,
        json!({"duo_code_review_instructions": good}),
    )
    .await;
    assert_eq!(status, 403, "owners edit a group");
    let (status, body) = put(
        &server,
        &one,
        &owner_t,
        json!({"duo_code_review_instructions": "instructions: ["}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = put(
        &server,
        &one,
        &owner_t,
        json!({"duo_code_review_instructions": good}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["duo_code_review_instructions"], good);

    // A review finds them from the top-level group down.
    let sub = fx.group(Some(group), "platform", "private", "free").await;
    let project = fx.project(sub, "api", "private").await;
    let db = fx.pool.get().await.unwrap();
    let found = monolith::namespaces::groups::review_instructions_above_project(&*db, project)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].full_path.as_str(), found[0].text.as_str()),
        ("acme", good)
    );
}
