//! REST resources in GitLab's shapes: pagination headers, 404 for what a user may
//! not read, CI job import, settings and seats; and the idempotent demo seed.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use monolith::policy::access;
use serde_json::{Value, json};
use support::{Fx, Server};

#[tokio::test]
async fn projects_issues_and_pagination() {
    let fx = Fx::new().await;
    let owner = fx.user("owner").await;
    let guest = fx.user("guest").await;
    let outsider = fx.user("outsider").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, guest, access::GUEST).await;
    let project = fx.project(group, "api", "private").await;
    for _ in 0..3 {
        fx.issue(project, owner, false).await;
    }
    fx.issue(project, owner, true).await;
    let owner_token = fx.token(owner, &["api"]).await;
    let guest_token = fx.token(guest, &["read_api"]).await;
    let outsider_token = fx.token(outsider, &["api"]).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();

    let res = http
        .get(server.url(&format!(
            "/api/v4/projects/{project}/issues?per_page=2&page=1"
        )))
        .bearer_auth(&owner_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-total"], "4");
    assert_eq!(res.headers()["x-total-pages"], "2");
    assert_eq!(res.headers()["x-next-page"], "2");
    assert!(
        res.headers()["link"]
            .to_str()
            .unwrap()
            .contains("rel=\"next\"")
    );
    let page: Vec<Value> = res.json().await.unwrap();
    assert_eq!(page.len(), 2);
    assert_eq!(page[0]["iid"], 4);
    assert_eq!(page[0]["author"]["username"], "owner");

    // The guest sees the public issues only; the confidential one is just absent.
    let res = http
        .get(server.url(&format!("/api/v4/projects/{project}/issues")))
        .bearer_auth(&guest_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["x-total"], "3");
    let res = http
        .get(server.url(&format!("/api/v4/projects/{project}/issues/4")))
        .bearer_auth(&guest_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(
        res.json::<Value>().await.unwrap(),
        json!({"message": "404 Issue Not Found"})
    );

    // An outsider cannot tell the private project from a missing one.
    let res = http
        .get(server.url(&format!("/api/v4/projects/{project}")))
        .bearer_auth(&outsider_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let res = http
        .get(server.url("/api/v4/projects/999999"))
        .bearer_auth(&outsider_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let res = http
        .get(server.url("/api/v4/projects"))
        .bearer_auth(&outsider_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.json::<Vec<Value>>().await.unwrap().len(), 0);

    let res = http
        .get(server.url(&format!("/api/v4/projects/{project}")))
        .bearer_auth(&guest_token)
        .send()
        .await
        .unwrap();
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["path_with_namespace"], "acme/api");
    assert_eq!(body["visibility"], "private");

    // Creating an issue and a note; read_api tokens cannot write.
    let res = http
        .post(server.url(&format!("/api/v4/projects/{project}/issues")))
        .bearer_auth(&guest_token)
        .json(&json!({"title": "nope"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    let res = http
        .post(server.url(&format!("/api/v4/projects/{project}/issues")))
        .bearer_auth(&owner_token)
        .json(&json!({"title": "Crash on start", "labels": "bug, p1", "assignee_ids": [guest.id]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let issue: Value = res.json().await.unwrap();
    assert_eq!(issue["iid"], 5);
    assert_eq!(issue["labels"], json!(["bug", "p1"]));
    let res = http
        .post(server.url(&format!("/api/v4/projects/{project}/issues/5/notes")))
        .bearer_auth(&owner_token)
        .json(&json!({"body": "Looking into it"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let notes: Vec<Value> = http
        .get(server.url(&format!("/api/v4/projects/{project}/issues/5/notes")))
        .bearer_auth(&guest_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0]["body"], "Looking into it");
}

#[tokio::test]
async fn projects_and_groups_are_addressed_by_url_encoded_path_too() {
    let fx = Fx::new().await;
    let owner = fx.user("owner").await;
    let outsider = fx.user("outsider").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let sub = fx
        .group(Some(group), "platform", "private", "ultimate")
        .await;
    fx.group_member(group, owner, access::OWNER).await;
    let project = fx.project(sub, "api", "private").await;
    fx.issue(project, owner, false).await;
    let owner_token = fx.token(owner, &["api"]).await;
    let outsider_token = fx.token(outsider, &["api"]).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();
    let get = |path: &str, token: &str| {
        http.get(server.url(path))
            .bearer_auth(token.to_owned())
            .send()
    };

    let res = get("/api/v4/projects/acme%2Fplatform%2Fapi", &owner_token)
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["id"], project);
    assert_eq!(body["path_with_namespace"], "acme/platform/api");
    // Nested routes, any case, and the query string survive the rewrite.
    let res = get(
        "/api/v4/projects/ACME%2Fplatform%2Fapi/issues?per_page=1",
        &owner_token,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-per-page"], "1");
    assert_eq!(res.json::<Vec<Value>>().await.unwrap().len(), 1);
    let res = get("/api/v4/groups/acme%2Fplatform", &owner_token)
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["id"], sub);
    let res = get("/api/v4/groups/acme", &owner_token).await.unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["id"], group);

    // Private or missing: the same 404 either way.
    let private = get("/api/v4/projects/acme%2Fplatform%2Fapi", &outsider_token)
        .await
        .unwrap();
    let missing = get("/api/v4/projects/acme%2Fnope", &outsider_token)
        .await
        .unwrap();
    assert_eq!(private.status(), 404);
    assert_eq!(missing.status(), 404);
    assert_eq!(
        private.json::<Value>().await.unwrap(),
        missing.json::<Value>().await.unwrap()
    );
    let broken = get("/api/v4/projects/acme%2", &owner_token).await.unwrap();
    assert_eq!(broken.status(), 404);
}

#[tokio::test]
async fn ci_job_import_settings_and_seats() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let dev = fx.user("dev").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    let project = fx.project(group, "api", "private").await;
    let root_token = fx.token(root, &["api"]).await;
    let dev_token = fx.token(dev, &["api"]).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();

    let job = json!({"name": "rspec", "stage": "test", "status": "failed", "ref": "main", "log": "boom\nERROR: Job failed"});
    let res = http
        .post(server.url(&format!("/api/v4/projects/{project}/jobs/import")))
        .bearer_auth(&dev_token)
        .json(&job)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403, "developers cannot import jobs");
    let res = http
        .post(server.url(&format!("/api/v4/projects/{project}/jobs/import")))
        .bearer_auth(&root_token)
        .json(&job)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let created: Value = res.json().await.unwrap();
    assert_eq!(created["status"], "failed");
    let trace = http
        .get(server.url(&format!(
            "/api/v4/projects/{project}/jobs/{}/trace",
            created["id"]
        )))
        .bearer_auth(&dev_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(trace, "boom\nERROR: Job failed");

    let res = http
        .get(server.url("/api/v4/application/settings"))
        .bearer_auth(&dev_token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    let res = http
        .put(server.url("/api/v4/application/settings"))
        .bearer_auth(&root_token)
        .json(&json!({"instance_tier": "ultimate", "duo_features_enabled": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<Value>().await.unwrap()["instance_tier"],
        "ultimate"
    );

    // Before a seat, chat is unavailable; after the admin assigns one, it is.
    let gql = |token: String| {
        let http = http.clone();
        let url = server.url("/api/graphql");
        async move {
            http.post(url)
                .bearer_auth(token)
                .json(&json!({"query": "{ currentUser { duoChatAvailable } }"}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        gql(dev_token.clone()).await["data"]["currentUser"]["duoChatAvailable"],
        false
    );
    let res = http
        .post(server.url("/api/v4/add_on_purchases/duo_pro/assignments"))
        .bearer_auth(&root_token)
        .json(&json!({"user_id": dev.id}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(
        gql(dev_token.clone()).await["data"]["currentUser"]["duoChatAvailable"],
        true
    );
}

#[tokio::test]
async fn seed_is_idempotent_and_its_tokens_work() {
    let fx = Fx::new().await;
    let first = monolith::seed::run(&fx.pool).await.unwrap();
    let second = monolith::seed::run(&fx.pool).await.unwrap();
    let db = fx.pool.get().await.unwrap();
    let counts: (i64, i64, i64) = {
        let row = db
            .query_one("SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM issues), (SELECT count(*) FROM ci_builds)", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(counts, (5, 4, 2), "a second run adds nothing");
    let json: Value = serde_json::from_str(&second.to_json().unwrap()).unwrap();
    let users = json["users"].as_array().unwrap();
    assert_eq!(users.len(), 5);
    assert!(
        users
            .iter()
            .any(|u| u["username"] == "carol" && u["duo_seat"].is_null())
    );

    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();
    let alice = second.users.iter().find(|u| u.username == "alice").unwrap();
    let res = http
        .get(server.url("/api/v4/user"))
        .bearer_auth(&alice.token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // The first run's tokens were replaced.
    let old = first.users.iter().find(|u| u.username == "alice").unwrap();
    let res = http
        .get(server.url("/api/v4/user"))
        .bearer_auth(&old.token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
}
