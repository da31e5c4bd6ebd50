//! Personal access tokens over real HTTP: both headers, 401 versus 403 as GitLab
//! answers them, expiry, revocation and admin-only endpoints.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

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
    let res = http.get(server.url("/api/v4/user")).send().await.unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(
        res.json::<Value>().await.unwrap(),
        json!({"message": "401 Unauthorized"})
    );
    let res = http
        .get(server.url("/api/v4/user"))
        .header("PRIVATE-TOKEN", "glpat-nope")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);

    // A valid token without a fitting scope: 403 insufficient_scope.
    let res = http
        .get(server.url("/api/v4/user"))
        .bearer_auth(&ai_only)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"], "insufficient_scope");

    // A non-admin on an admin endpoint: 403 Forbidden.
    let res = http
        .post(server.url("/api/v4/users"))
        .bearer_auth(&api)
        .json(&json!({"username": "x", "name": "x", "email": "x@example.com"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    assert_eq!(
        res.json::<Value>().await.unwrap(),
        json!({"message": "403 Forbidden"})
    );
}

#[tokio::test]
async fn admin_creates_users_and_tokens_that_can_be_revoked() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let admin_token = fx.token(root, &["api"]).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();

    let res = http
        .post(server.url("/api/v4/users"))
        .bearer_auth(&admin_token)
        .json(&json!({"username": "bob", "name": "Bob", "email": "bob@example.com"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let bob: Value = res.json().await.unwrap();
    let bob_id = bob["id"].as_i64().unwrap();

    let res = http
        .post(server.url(&format!("/api/v4/users/{bob_id}/personal_access_tokens")))
        .bearer_auth(&admin_token)
        .json(&json!({"name": "cli", "scopes": ["api", "ai_features"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let created: Value = res.json().await.unwrap();
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
    assert_eq!(stored, monolith::tokens::digest(&bob_token));

    let res = http
        .get(server.url("/api/v4/personal_access_tokens/self"))
        .bearer_auth(&bob_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);

    let res = http
        .delete(server.url(&format!("/api/v4/personal_access_tokens/{}", created["id"])))
        .bearer_auth(&bob_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    let res = http
        .get(server.url("/api/v4/user"))
        .bearer_auth(&bob_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401, "revoked token");

    let res = http
        .post(server.url(&format!("/api/v4/users/{bob_id}/personal_access_tokens")))
        .bearer_auth(&admin_token)
        .json(&json!({"name": "bad", "scopes": ["everything"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
}

#[tokio::test]
async fn expired_tokens_and_blocked_users_are_refused() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    let db = fx.pool.get().await.unwrap();
    let scopes = vec!["api".to_string()];
    let yesterday = chrono::Utc::now().date_naive() - chrono::Days::new(1);
    let expired = monolith::tokens::create(&**db, alice.id, "old", &scopes, Some(yesterday))
        .await
        .unwrap();
    let fresh = fx.token(alice, &["api"]).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();

    let res = http
        .get(server.url("/api/v4/user"))
        .bearer_auth(&expired.token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    db.execute(
        "UPDATE users SET state = 'blocked' WHERE id = $1",
        &[&alice.id],
    )
    .await
    .unwrap();
    let res = http
        .get(server.url("/api/v4/user"))
        .bearer_auth(&fresh)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
}
