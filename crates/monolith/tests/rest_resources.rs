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

/// Status and JSON body (`Null` when empty) of one REST call.
async fn call(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, server.url(&format!("/api/v4{path}")))
        .bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn iids(list: &Value) -> Vec<i64> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|i| i["iid"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn issues_filter_by_state_and_labels_and_carry_gitlab_fields() {
    use reqwest::Method;
    let fx = Fx::new().await;
    let owner = fx.user("owner").await;
    let guest = fx.user("guest").await;
    let assignee = fx.user("assignee").await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, guest, access::GUEST).await;
    let project = fx.project(group, "api", "private").await;
    let first = fx.issue(project, owner, false).await;
    let second = fx.issue(project, owner, false).await;
    let third = fx.issue(project, owner, false).await;
    fx.exec(
        "UPDATE issues SET labels = '{bug}' WHERE id = $1",
        &[&first],
    )
    .await;
    fx.exec(
        "UPDATE issues SET labels = '{bug,p1}', state = 'closed' WHERE id = $1",
        &[&second],
    )
    .await;
    fx.assign(third, assignee).await;
    let owner_t = fx.token(owner, &["api"]).await;
    let guest_t = fx.token(guest, &["api"]).await;
    let server = Server::start(&fx).await;
    let issues = |query: &str| format!("/projects/{project}/issues{query}");

    for (query, expected) in [
        ("", vec![3, 2, 1]),
        ("?state=all", vec![3, 2, 1]),
        ("?state=opened", vec![3, 1]),
        ("?state=closed", vec![2]),
        ("?labels=bug", vec![2, 1]),
        ("?labels=bug,p1", vec![2]),
        ("?labels=bug&state=opened", vec![1]),
        ("?labels=None", vec![3]),
        ("?labels=Any", vec![2, 1]),
        ("?labels=nothing-has-this", vec![]),
    ] {
        let (status, list) = call(&server, Method::GET, &issues(query), &owner_t, None).await;
        assert_eq!(status, 200, "{query}");
        assert_eq!(iids(&list), expected, "{query}");
    }
    let (status, body) = call(
        &server,
        Method::GET,
        &issues("?state=bogus"),
        &owner_t,
        None,
    )
    .await;
    assert_eq!(
        (status, body),
        (400, json!({"error": "state does not have a valid value"}))
    );

    let (_, closed) = call(&server, Method::GET, &issues("/2"), &owner_t, None).await;
    assert!(closed["closed_at"].is_string(), "{closed}");
    let (_, open) = call(&server, Method::GET, &issues("/3"), &owner_t, None).await;
    assert!(open["closed_at"].is_null());
    assert_eq!(open["assignee"]["username"], "assignee");
    assert_eq!(open["assignees"][0]["id"], assignee.id);
    assert_eq!(open["references"]["full"], "acme/api#3");
    assert_eq!(open["references"]["short"], "#3");
    assert!(
        open["web_url"]
            .as_str()
            .unwrap()
            .ends_with("/acme/api/-/issues/3"),
        "{open}"
    );
    let (_, unassigned) = call(&server, Method::GET, &issues("/1"), &owner_t, None).await;
    assert!(unassigned["assignee"].is_null());

    // Internal notes take reporter access to write, as to read.
    let notes = issues("/1/notes");
    let internal = Some(json!({"body": "between us", "internal": true}));
    let (status, _) = call(&server, Method::POST, &notes, &guest_t, internal.clone()).await;
    assert_eq!(status, 403);
    let (status, note) = call(&server, Method::POST, &notes, &owner_t, internal).await;
    assert_eq!((status, &note["internal"]), (201, &json!(true)));
    assert_eq!(note["noteable_iid"], 1);
    let (_, seen) = call(&server, Method::GET, &notes, &guest_t, None).await;
    assert_eq!(seen, json!([]));
}

#[tokio::test]
async fn groups_and_projects_are_edited_by_owners_and_maintainers() {
    use reqwest::Method;
    let fx = Fx::new().await;
    let owner = fx.user("owner").await;
    let maint = fx.user("maint").await;
    let dev = fx.user("dev").await;
    let outsider = fx.user("outsider").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let sub = fx.group(Some(group), "team", "private", "free").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, maint, access::MAINTAINER).await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    let project = fx.project(group, "api", "private").await;
    let [owner_t, maint_t, dev_t, outsider_t] = [
        fx.token(owner, &["api"]).await,
        fx.token(maint, &["api"]).await,
        fx.token(dev, &["api"]).await,
        fx.token(outsider, &["api"]).await,
    ];
    let server = Server::start(&fx).await;
    let group_path = format!("/groups/{group}");
    let project_path = format!("/projects/{project}");

    // GitLab's group entity has no plan.
    let (_, shown) = call(&server, Method::GET, &group_path, &dev_t, None).await;
    assert!(shown.get("plan").is_none(), "{shown}");
    assert_eq!(shown["experiment_features_enabled"], false);

    // Groups: owners only.
    let change = Some(json!({"description": "Tools", "duo_features_enabled": false}));
    let (status, _) = call(&server, Method::PUT, &group_path, &maint_t, change.clone()).await;
    assert_eq!(status, 403);
    let (status, _) = call(
        &server,
        Method::PUT,
        &group_path,
        &outsider_t,
        change.clone(),
    )
    .await;
    assert_eq!(status, 404);
    let (status, body) = call(&server, Method::PUT, &group_path, &owner_t, change).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["description"], "Tools");
    assert_eq!(body["duo_features_enabled"], false);
    assert_eq!(body["name"], "acme", "fields not sent stay");
    let (status, body) = call(
        &server,
        Method::PUT,
        &group_path,
        &owner_t,
        Some(json!({"experiment_features_enabled": true})),
    )
    .await;
    assert_eq!(
        (status, &body["experiment_features_enabled"]),
        (200, &json!(true))
    );
    let (status, body) = call(
        &server,
        Method::PUT,
        &format!("/groups/{sub}"),
        &owner_t,
        Some(json!({"experiment_features_enabled": true})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["message"]["experiment_features_enabled"].is_array(),
        "{body}"
    );
    // A subgroup cannot be more visible than its parent.
    let public = Some(json!({"visibility": "public"}));
    let (status, body) = call(
        &server,
        Method::PUT,
        &format!("/groups/{sub}"),
        &owner_t,
        public.clone(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(body["message"]["visibility_level"].is_array(), "{body}");

    // Projects: maintainers edit, owners rename and change visibility.
    let (status, body) = call(
        &server,
        Method::PUT,
        &project_path,
        &maint_t,
        Some(json!({"description": "The API", "duo_features_enabled": false})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["description"], &body["duo_features_enabled"]),
        (&json!("The API"), &json!(false))
    );
    let (status, _) = call(
        &server,
        Method::PUT,
        &project_path,
        &dev_t,
        Some(json!({"description": "x"})),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = call(
        &server,
        Method::PUT,
        &project_path,
        &maint_t,
        Some(json!({"name": "renamed"})),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = call(
        &server,
        Method::PUT,
        &project_path,
        &maint_t,
        Some(json!({"name": "api"})),
    )
    .await;
    assert_eq!(status, 200, "an unchanged name is no rename: {body}");
    let (status, _) = call(
        &server,
        Method::PUT,
        &project_path,
        &owner_t,
        public.clone(),
    )
    .await;
    assert_eq!(
        status, 400,
        "a project in a private group stays private or internal"
    );
    let (status, _) = call(&server, Method::PUT, &group_path, &owner_t, public.clone()).await;
    assert_eq!(status, 200);
    let (status, _) = call(
        &server,
        Method::PUT,
        &project_path,
        &maint_t,
        public.clone(),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = call(&server, Method::PUT, &project_path, &owner_t, public).await;
    assert_eq!((status, &body["visibility"]), (200, &json!("public")));
    let (status, body) = call(
        &server,
        Method::PUT,
        &group_path,
        &owner_t,
        Some(json!({"visibility": "private"})),
    )
    .await;
    assert_eq!(status, 400, "the group holds a public project: {body}");
    let (status, body) = call(
        &server,
        Method::PUT,
        &project_path,
        &owner_t,
        Some(json!({"name": "Renamed"})),
    )
    .await;
    assert_eq!((status, &body["name"]), (200, &json!("Renamed")));
}

#[tokio::test]
async fn epics_are_created_and_discussed_by_epic_id() {
    use reqwest::Method;
    let fx = Fx::new().await;
    let planner = fx.user("planner").await;
    let guest = fx.user("guest").await;
    let reporter = fx.user("reporter").await;
    let outsider = fx.user("outsider").await;
    // An epic elsewhere first, so this group's epic ids and iids differ.
    let other = fx.group(None, "other", "private", "ultimate").await;
    fx.epic(other, planner, false).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, planner, access::PLANNER).await;
    fx.group_member(group, guest, access::GUEST).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    let [planner_t, guest_t, reporter_t, outsider_t] = [
        fx.token(planner, &["api"]).await,
        fx.token(guest, &["api"]).await,
        fx.token(reporter, &["api"]).await,
        fx.token(outsider, &["api"]).await,
    ];
    let server = Server::start(&fx).await;
    let epics = format!("/groups/{group}/epics");

    let new_epic =
        Some(json!({"title": "Single sign-on", "labels": "auth, q3", "description": "SAML"}));
    let (status, _) = call(&server, Method::POST, &epics, &guest_t, new_epic.clone()).await;
    assert_eq!(status, 403);
    let (status, _) = call(&server, Method::POST, &epics, &outsider_t, new_epic.clone()).await;
    assert_eq!(status, 404);
    let (status, _) = call(
        &server,
        Method::POST,
        &epics,
        &planner_t,
        Some(json!({"title": " "})),
    )
    .await;
    assert_eq!(status, 400);
    let (status, epic) = call(&server, Method::POST, &epics, &planner_t, new_epic).await;
    assert_eq!(status, 201, "{epic}");
    assert_eq!(epic["iid"], 1);
    assert_eq!(epic["labels"], json!(["auth", "q3"]));
    assert_eq!(epic["references"]["full"], "acme&1");
    assert_eq!(epic["author"]["username"], "planner");
    let epic_id = epic["id"].as_i64().unwrap();
    assert_ne!(epic_id, 1);
    let (status, shown) = call(&server, Method::GET, &format!("{epics}/1"), &guest_t, None).await;
    assert_eq!((status, &shown["id"]), (200, &json!(epic_id)));

    // Notes go by the epic's id, not its iid.
    let notes = format!("{epics}/{epic_id}/notes");
    let (status, note) = call(
        &server,
        Method::POST,
        &notes,
        &guest_t,
        Some(json!({"body": "+1"})),
    )
    .await;
    assert_eq!(status, 201, "{note}");
    assert_eq!(note["noteable_type"], "Epic");
    assert_eq!(note["noteable_id"], epic_id);
    let (status, _) = call(
        &server,
        Method::GET,
        &format!("{epics}/1/notes"),
        &guest_t,
        None,
    )
    .await;
    assert_eq!(status, 404, "iid 1 is not an epic id of this group");
    let internal = Some(json!({"body": "budget", "internal": true}));
    let (status, _) = call(&server, Method::POST, &notes, &guest_t, internal.clone()).await;
    assert_eq!(status, 403);
    let (status, _) = call(&server, Method::POST, &notes, &reporter_t, internal).await;
    assert_eq!(status, 201);
    let (_, for_guest) = call(&server, Method::GET, &notes, &guest_t, None).await;
    assert_eq!(for_guest.as_array().unwrap().len(), 1);
    let (_, for_reporter) = call(
        &server,
        Method::GET,
        &format!("{notes}?sort=asc"),
        &reporter_t,
        None,
    )
    .await;
    let bodies: Vec<&str> = for_reporter
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, vec!["+1", "budget"]);

    // A confidential epic and its notes are hidden from guests.
    let (status, secret) = call(
        &server,
        Method::POST,
        &epics,
        &reporter_t,
        Some(json!({"title": "Layoffs", "confidential": true})),
    )
    .await;
    assert_eq!((status, &secret["confidential"]), (201, &json!(true)));
    let secret_notes = format!("{epics}/{}/notes", secret["id"]);
    let (status, _) = call(&server, Method::GET, &secret_notes, &guest_t, None).await;
    assert_eq!(status, 404);
    let (status, _) = call(&server, Method::GET, &secret_notes, &reporter_t, None).await;
    assert_eq!(status, 200);
}
