//! Personal access tokens over real HTTP: both headers, 401 versus 403 as GitLab
//! answers them, expiry, revocation and admin-only endpoints.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::rest_support;
use crate::support;

use reqwest::Method;
use rest_support::{
    api_tokens, delete, get, integers, post, post_empty, put, send, strings, users,
};
use serde_json::{Value, json};
use support::{Fx, Server};

#[tokio::test]
async fn tokens_authenticate_with_either_header() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    let token = fx.token(alice, &["api"]).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();

    for req in [
        http.get(server.url("/api/v4/user"))
            .header("PRIVATE-TOKEN", &token),
        http.get(server.url("/api/v4/user")).bearer_auth(&token),
    ] {
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 200);
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["username"], "alice");
        assert_eq!(body["id"], alice.id);
        assert_eq!(body["is_admin"], false);
    }
}

#[tokio::test]
async fn unauthorized_and_forbidden_are_told_apart() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    let ai_only = fx.token(alice, &["ai_features"]).await;
    let api = fx.token(alice, &["api"]).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();

    // No token and a wrong token: 401 with GitLab's body.
    let anonymous = send(&server, Method::GET, "/user", None, None).await;
    assert_eq!(
        (anonymous.status, anonymous.body),
        (401, json!({"message": "401 Unauthorized"}))
    );
    let res = http
        .get(server.url("/api/v4/user"))
        .header("PRIVATE-TOKEN", "glpat-nope")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);

    // A valid token without a fitting scope: 403 insufficient_scope.
    let (status, body) = get(&server, "/user", &ai_only).await;
    assert_eq!(status, 403);
    assert_eq!(body["error"], "insufficient_scope");

    // A non-admin on an admin endpoint: 403 Forbidden.
    let new_user = json!({"username": "x", "name": "x", "email": "x@example.com"});
    let (status, body) = post(&server, "/users", &api, new_user).await;
    assert_eq!((status, body), (403, json!({"message": "403 Forbidden"})));
}

#[tokio::test]
async fn admin_creates_users_and_tokens_that_can_be_revoked() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let admin_token = fx.token(root, &["api"]).await;
    let server = Server::start(&fx).await;

    let new_user = json!({"username": "bob", "name": "Bob", "email": "bob@example.com"});
    let (status, bob) = post(&server, "/users", &admin_token, new_user).await;
    assert_eq!(status, 201);
    let bob_id = bob["id"].as_i64().unwrap();

    let tokens = format!("/users/{bob_id}/personal_access_tokens");
    let cli = json!({"name": "cli", "scopes": ["api", "ai_features"]});
    let (status, created) = post(&server, &tokens, &admin_token, cli).await;
    assert_eq!(status, 201);
    let bob_token = created["token"].as_str().unwrap().to_string();
    assert!(bob_token.starts_with("glpat-"));
    assert_eq!(created["scopes"], json!(["api", "ai_features"]));
    assert_eq!(created["active"], true);

    // The plain token is never stored.
    let db = fx.pool.get().await.unwrap();
    let stored: Vec<u8> = db
        .query_one(
            "SELECT token_digest FROM personal_access_tokens WHERE id = $1",
            &[&created["id"].as_i64().unwrap()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, monolith::identity::tokens::digest(&bob_token));

    let (status, _) = get(&server, "/personal_access_tokens/self", &bob_token).await;
    assert_eq!(status, 200);

    let created_path = format!("/personal_access_tokens/{}", created["id"]);
    let (status, _) = delete(&server, &created_path, &bob_token).await;
    assert_eq!(status, 204);
    let (status, _) = get(&server, "/user", &bob_token).await;
    assert_eq!(status, 401, "revoked token");

    let bad = json!({"name": "bad", "scopes": ["everything"]});
    let (status, _) = post(&server, &tokens, &admin_token, bad).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn expired_tokens_and_blocked_users_are_refused() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    let db = fx.pool.get().await.unwrap();
    let scopes = vec!["api".to_string()];
    let yesterday = chrono::Utc::now().date_naive() - chrono::Days::new(1);
    let expired =
        monolith::identity::tokens::create(&**db, alice.id, "old", &scopes, Some(yesterday))
            .await
            .unwrap();
    let fresh = fx.token(alice, &["api"]).await;
    let server = Server::start(&fx).await;

    let (status, _) = get(&server, "/user", &expired.token).await;
    assert_eq!(status, 401);
    db.execute(
        "UPDATE users SET state = 'blocked' WHERE id = $1",
        &[&alice.id],
    )
    .await
    .unwrap();
    let (status, _) = get(&server, "/user", &fresh).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn everyone_lists_users_but_only_admins_see_private_fields() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let alice = fx.user("alice").await;
    fx.user("bob").await;
    let root_t = fx.token(root, &["api"]).await;
    let alice_t = fx.token(alice, &["read_user"]).await;
    let server = Server::start(&fx).await;

    let (status, list) = get(&server, "/users", &alice_t).await;
    assert_eq!(status, 200);
    // The review bot is a user too (an internal one, listed like GitLab's).
    assert_eq!(
        strings(&list, "username"),
        vec!["bob", "alice", "root", "GitLabDuo"]
    );
    for user in list.as_array().unwrap() {
        assert!(user.get("email").is_none(), "{user}");
        assert!(user.get("is_admin").is_none(), "{user}");
        assert_eq!(user["state"], "active");
    }
    let (_, list) = get(&server, "/users?username=ALICE", &alice_t).await;
    assert_eq!(strings(&list, "username"), vec!["alice"]);
    // Email addresses are searchable by admins only.
    let (_, list) = get(&server, "/users?search=example.com", &alice_t).await;
    assert!(strings(&list, "username").is_empty());
    let (_, list) = get(&server, "/users?search=example.com", &root_t).await;
    assert_eq!(strings(&list, "username").len(), 3);
    let (_, list) = get(&server, "/users?search=li", &alice_t).await;
    assert_eq!(strings(&list, "username"), vec!["alice"]);
    let (_, list) = get(&server, "/users", &root_t).await;
    assert_eq!(list[2]["is_admin"], true);
    assert_eq!(list[1]["email"], "alice@example.com");
    let (status, user) = get(&server, &format!("/users/{}", alice.id), &alice_t).await;
    assert_eq!(status, 200);
    assert!(user.get("email").is_none());
}

#[tokio::test]
async fn admins_update_block_and_unblock_users() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let [alice, bob] = users(&fx, ["alice", "bob"]).await;
    let [root_t, alice_t, bob_t] = api_tokens(&fx, [root, alice, bob]).await;
    let server = Server::start(&fx).await;
    let bob_path = format!("/users/{}", bob.id);

    let (status, _) = put(&server, &bob_path, &alice_t, json!({"name": "x"})).await;
    assert_eq!(status, 403);
    let (status, body) = put(
        &server,
        &bob_path,
        &root_t,
        json!({"name": "Bobby", "admin": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["name"], &body["is_admin"]),
        (&json!("Bobby"), &json!(true))
    );
    assert_eq!(body["username"], "bob", "fields not sent stay");
    let (status, body) = put(
        &server,
        &bob_path,
        &root_t,
        json!({"email": "ALICE@example.com"}),
    )
    .await;
    assert_eq!(
        (status, body),
        (409, json!({"message": "Email has already been taken"}))
    );
    let (status, body) = put(&server, "/users/999999", &root_t, json!({"name": "x"})).await;
    assert_eq!(
        (status, body),
        (404, json!({"message": "404 User Not Found"}))
    );

    // A blocked user's tokens answer 403 until the user is unblocked.
    let (status, body) = post_empty(&server, &format!("{bob_path}/block"), &root_t).await;
    assert_eq!((status, body), (201, json!(true)));
    let (status, body) = get(&server, "/user", &bob_t).await;
    assert_eq!(
        (status, body),
        (
            403,
            json!({"message": "403 Forbidden - Your account has been blocked."})
        )
    );
    let (_, list) = get(&server, "/users?blocked=true", &root_t).await;
    assert_eq!(strings(&list, "username"), vec!["bob"]);
    let (status, body) = post_empty(&server, &format!("/users/{}/block", root.id), &root_t).await;
    assert_eq!(
        (status, body),
        (
            403,
            json!({"message": "403 Forbidden - The API initiating user cannot be blocked by the API"})
        )
    );
    let (status, _) = post_empty(&server, &format!("{bob_path}/unblock"), &alice_t).await;
    assert_eq!(status, 403);
    let (status, _) = post_empty(&server, &format!("{bob_path}/unblock"), &root_t).await;
    assert_eq!(status, 201);
    let (status, body) = get(&server, "/user", &bob_t).await;
    assert_eq!((status, &body["username"]), (200, &json!("bob")));

    fx.exec(
        "UPDATE users SET state = 'deactivated' WHERE id = $1",
        &[&alice.id],
    )
    .await;
    let (status, body) =
        post_empty(&server, &format!("/users/{}/unblock", alice.id), &root_t).await;
    assert_eq!(
        (status, body),
        (
            403,
            json!({"message": "403 Forbidden - Deactivated users cannot be unblocked by the API"})
        )
    );
}

#[tokio::test]
async fn personal_access_tokens_are_listed_shown_and_revoked() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let [alice, bob] = users(&fx, ["alice", "bob"]).await;
    let [root_t, alice_t] = api_tokens(&fx, [root, alice]).await;
    let alice_ro = fx.token(alice, &["read_api"]).await;
    let bob_t = fx.token(bob, &["api"]).await;
    let server = Server::start(&fx).await;
    let id_of = |token: String| {
        let server = &server;
        async move {
            let (_, me) = get(server, "/personal_access_tokens/self", &token).await;
            me["id"].as_i64().unwrap()
        }
    };
    let bob_token_id = id_of(bob_t.clone()).await;
    let alice_ro_id = id_of(alice_ro.clone()).await;

    // Non-admins see their own tokens, whatever user_id they ask for.
    for path in [
        "/personal_access_tokens",
        &format!("/personal_access_tokens?user_id={}", bob.id),
    ] {
        let (status, list) = get(&server, path, &alice_t).await;
        assert_eq!(status, 200);
        assert_eq!(
            integers(&list, "user_id"),
            vec![alice.id, alice.id],
            "{path}"
        );
    }
    let (_, list) = get(
        &server,
        &format!("/personal_access_tokens?user_id={}", bob.id),
        &root_t,
    )
    .await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], bob_token_id);
    let (_, list) = get(&server, "/personal_access_tokens", &root_t).await;
    assert_eq!(list.as_array().unwrap().len(), 4);

    // One token: owners and admins; others cannot even learn it exists.
    let bob_token = format!("/personal_access_tokens/{bob_token_id}");
    let (status, body) = get(&server, &bob_token, &alice_t).await;
    assert_eq!(
        (status, body),
        (401, json!({"message": "401 Unauthorized"}))
    );
    let (status, body) = get(&server, &bob_token, &bob_t).await;
    assert_eq!((status, &body["user_id"]), (200, &json!(bob.id)));
    let (status, _) = get(&server, "/personal_access_tokens/999999", &root_t).await;
    assert_eq!(status, 404);
    let (status, _) = get(&server, "/personal_access_tokens/999999", &alice_t).await;
    assert_eq!(status, 401);

    // Revoking the token in use.
    let (status, _) = delete(&server, "/personal_access_tokens/self", &alice_ro).await;
    assert_eq!(status, 204);
    let (status, _) = get(&server, "/user", &alice_ro).await;
    assert_eq!(status, 401);
    let (_, revoked) = get(&server, "/personal_access_tokens?revoked=true", &alice_t).await;
    assert_eq!(revoked.as_array().unwrap().len(), 1);
    assert_eq!(revoked[0]["id"], alice_ro_id);
    assert_eq!(revoked[0]["active"], false);
    let (_, active) = get(&server, "/personal_access_tokens?state=active", &alice_t).await;
    assert_eq!(active.as_array().unwrap().len(), 1);
    assert_ne!(active[0]["id"], alice_ro_id);
    let (status, _) = get(&server, "/personal_access_tokens?state=odd", &alice_t).await;
    assert_eq!(status, 400);
}
