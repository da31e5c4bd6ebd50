//! REST resources in GitLab's shapes: pagination headers, 404 for what a user may
//! not read, CI job import, settings and seats; and the idempotent demo seed.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::rest_support;
use crate::support;

use monolith::policy::access;
use rest_support::{api_tokens, get, get_with_headers, integers, post, put, strings, users};
use serde_json::{Value, json};
use support::{Fx, Server};

#[tokio::test]
async fn projects_issues_and_pagination() {
    let fx = Fx::new().await;
    let [owner, guest, outsider] = users(&fx, ["owner", "guest", "outsider"]).await;
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
    let issues = format!("/projects/{project}/issues");

    let first_page = format!("{issues}?per_page=2&page=1");
    let (status, headers, page) = get_with_headers(&server, &first_page, &owner_token).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "4");
    assert_eq!(headers["x-total-pages"], "2");
    assert_eq!(headers["x-next-page"], "2");
    assert!(headers["link"].to_str().unwrap().contains("rel=\"next\""));
    assert_eq!(page.as_array().unwrap().len(), 2);
    assert_eq!(page[0]["iid"], 4);
    assert_eq!(page[0]["author"]["username"], "owner");

    // The guest sees the public issues only; the confidential one is just absent.
    let (_, headers, _) = get_with_headers(&server, &issues, &guest_token).await;
    assert_eq!(headers["x-total"], "3");
    let (status, body) = get(&server, &format!("{issues}/4"), &guest_token).await;
    assert_eq!(
        (status, body),
        (404, json!({"message": "404 Issue Not Found"}))
    );

    // An outsider cannot tell the private project from a missing one.
    let (status, _) = get(&server, &format!("/projects/{project}"), &outsider_token).await;
    assert_eq!(status, 404);
    let (status, _) = get(&server, "/projects/999999", &outsider_token).await;
    assert_eq!(status, 404);
    let (_, projects) = get(&server, "/projects", &outsider_token).await;
    assert_eq!(projects.as_array().unwrap().len(), 0);

    let (_, body) = get(&server, &format!("/projects/{project}"), &guest_token).await;
    assert_eq!(body["path_with_namespace"], "acme/api");
    assert_eq!(body["visibility"], "private");

    // Creating an issue and a note; read_api tokens cannot write.
    let (status, _) = post(&server, &issues, &guest_token, json!({"title": "nope"})).await;
    assert_eq!(status, 403);
    let new_issue =
        json!({"title": "Crash on start", "labels": "bug, p1", "assignee_ids": [guest.id]});
    let (status, issue) = post(&server, &issues, &owner_token, new_issue).await;
    assert_eq!(status, 201);
    assert_eq!(issue["iid"], 5);
    assert_eq!(issue["labels"], json!(["bug", "p1"]));
    let notes = format!("{issues}/5/notes");
    let note = json!({"body": "Looking into it"});
    let (status, _) = post(&server, &notes, &owner_token, note).await;
    assert_eq!(status, 201);
    let (_, notes) = get(&server, &notes, &guest_token).await;
    assert_eq!(notes.as_array().unwrap().len(), 1);
    assert_eq!(notes[0]["body"], "Looking into it");
}

#[tokio::test]
async fn projects_and_groups_are_addressed_by_url_encoded_path_too() {
    let fx = Fx::new().await;
    let [owner, outsider] = users(&fx, ["owner", "outsider"]).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let sub = fx
        .group(Some(group), "platform", "private", "ultimate")
        .await;
    fx.group_member(group, owner, access::OWNER).await;
    let project = fx.project(sub, "api", "private").await;
    fx.issue(project, owner, false).await;
    let [owner_token, outsider_token] = api_tokens(&fx, [owner, outsider]).await;
    let server = Server::start(&fx).await;

    let (status, body) = get(&server, "/projects/acme%2Fplatform%2Fapi", &owner_token).await;
    assert_eq!(status, 200);
    assert_eq!(body["id"], project);
    assert_eq!(body["path_with_namespace"], "acme/platform/api");
    // Nested routes, any case, and the query string survive the rewrite.
    let nested = "/projects/ACME%2Fplatform%2Fapi/issues?per_page=1";
    let (status, headers, list) = get_with_headers(&server, nested, &owner_token).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-per-page"], "1");
    assert_eq!(list.as_array().unwrap().len(), 1);
    let (status, body) = get(&server, "/groups/acme%2Fplatform", &owner_token).await;
    assert_eq!(status, 200);
    assert_eq!(body["id"], sub);
    let (_, body) = get(&server, "/groups/acme", &owner_token).await;
    assert_eq!(body["id"], group);

    // Private or missing: the same 404 either way.
    let private = get(&server, "/projects/acme%2Fplatform%2Fapi", &outsider_token).await;
    let missing = get(&server, "/projects/acme%2Fnope", &outsider_token).await;
    assert_eq!(private.0, 404);
    assert_eq!(private, missing);
    let (status, _) = get(&server, "/projects/acme%2", &owner_token).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn ci_job_import_settings_and_seats() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let dev = fx.user("dev").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    let project = fx.project(group, "api", "private").await;
    let [root_token, dev_token] = api_tokens(&fx, [root, dev]).await;
    let server = Server::start(&fx).await;
    let http = reqwest::Client::new();

    let job = json!({"name": "rspec", "stage": "test", "status": "failed", "ref": "main", "log": "boom\nERROR: Job failed"});
    let import = format!("/projects/{project}/jobs/import");
    let (status, _) = post(&server, &import, &dev_token, job.clone()).await;
    assert_eq!(status, 403, "developers cannot import jobs");
    let (status, created) = post(&server, &import, &root_token, job).await;
    assert_eq!(status, 201);
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

    let (status, _) = get(&server, "/application/settings", &dev_token).await;
    assert_eq!(status, 403);
    let tier = json!({"instance_tier": "ultimate", "duo_features_enabled": true});
    let (status, settings) = put(&server, "/application/settings", &root_token, tier).await;
    assert_eq!(status, 200);
    assert_eq!(settings["instance_tier"], "ultimate");

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
    let assignments = "/add_on_purchases/duo_pro/assignments";
    let (status, _) = post(
        &server,
        assignments,
        &root_token,
        json!({"user_id": dev.id}),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(
        gql(dev_token.clone()).await["data"]["currentUser"]["duoChatAvailable"],
        true
    );
}

#[tokio::test]
async fn seed_is_idempotent_and_its_tokens_work() {
    let fx = Fx::new().await;
    let server = Server::start(&fx).await;
    let repos = monolith::repositories::Repositories::new(server.repositories.clone(), 4);
    let first = monolith::seed::run(&fx.pool, &repos).await.unwrap();
    let second = monolith::seed::run(&fx.pool, &repos).await.unwrap();
    let db = fx.pool.get().await.unwrap();
    let counts: (i64, i64, i64, i64) = {
        let row = db
            .query_one("SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM issues), (SELECT count(*) FROM ci_builds), (SELECT count(*) FROM repository_pushes)", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3))
    };
    // Users: the seeded people, their service account and the review bot.
    assert_eq!(counts, (7, 4, 2, 7), "a second run adds nothing");
    let json: Value = serde_json::from_str(&second.to_json().unwrap()).unwrap();
    let users = json["users"].as_array().unwrap();
    assert_eq!(users.len(), 5);
    assert!(
        users
            .iter()
            .any(|u| u["username"] == "carol" && u["duo_seat"].is_null())
    );

    let alice = second.users.iter().find(|u| u.username == "alice").unwrap();
    let (status, _) = get(&server, "/user", &alice.token).await;
    assert_eq!(status, 200);
    // The first run's tokens were replaced.
    let old = first.users.iter().find(|u| u.username == "alice").unwrap();
    let (status, _) = get(&server, "/user", &old.token).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn issues_filter_by_state_and_labels_and_carry_gitlab_fields() {
    let fx = Fx::new().await;
    let [owner, guest, assignee] = users(&fx, ["owner", "guest", "assignee"]).await;
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
    let [owner_t, guest_t] = api_tokens(&fx, [owner, guest]).await;
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
        let (status, list) = get(&server, &issues(query), &owner_t).await;
        assert_eq!(status, 200, "{query}");
        assert_eq!(integers(&list, "iid"), expected, "{query}");
    }
    let (status, body) = get(&server, &issues("?state=bogus"), &owner_t).await;
    assert_eq!(
        (status, body),
        (400, json!({"error": "state does not have a valid value"}))
    );

    let (_, closed) = get(&server, &issues("/2"), &owner_t).await;
    assert!(closed["closed_at"].is_string(), "{closed}");
    let (_, open) = get(&server, &issues("/3"), &owner_t).await;
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
    let (_, unassigned) = get(&server, &issues("/1"), &owner_t).await;
    assert!(unassigned["assignee"].is_null());

    // Internal notes take reporter access to write, as to read.
    let notes = issues("/1/notes");
    let internal = json!({"body": "between us", "internal": true});
    let (status, _) = post(&server, &notes, &guest_t, internal.clone()).await;
    assert_eq!(status, 403);
    let (status, note) = post(&server, &notes, &owner_t, internal).await;
    assert_eq!((status, &note["internal"]), (201, &json!(true)));
    assert_eq!(note["noteable_iid"], 1);
    let (_, seen) = get(&server, &notes, &guest_t).await;
    assert_eq!(seen, json!([]));
}

#[tokio::test]
async fn groups_and_projects_are_edited_by_owners_and_maintainers() {
    let fx = Fx::new().await;
    let [owner, maint, dev, outsider] = users(&fx, ["owner", "maint", "dev", "outsider"]).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let sub = fx.group(Some(group), "team", "private", "free").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, maint, access::MAINTAINER).await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    let project = fx.project(group, "api", "private").await;
    let [owner_t, maint_t, dev_t, outsider_t] =
        api_tokens(&fx, [owner, maint, dev, outsider]).await;
    let server = Server::start(&fx).await;
    let group_path = format!("/groups/{group}");
    let project_path = format!("/projects/{project}");

    // GitLab's group entity has no plan.
    let (_, shown) = get(&server, &group_path, &dev_t).await;
    assert!(shown.get("plan").is_none(), "{shown}");
    assert_eq!(shown["experiment_features_enabled"], false);

    // Groups: owners only.
    let change = json!({"description": "Tools", "duo_features_enabled": false});
    let (status, _) = put(&server, &group_path, &maint_t, change.clone()).await;
    assert_eq!(status, 403);
    let (status, _) = put(&server, &group_path, &outsider_t, change.clone()).await;
    assert_eq!(status, 404);
    let (status, body) = put(&server, &group_path, &owner_t, change).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["description"], "Tools");
    assert_eq!(body["duo_features_enabled"], false);
    assert_eq!(body["name"], "acme", "fields not sent stay");
    let (status, body) = put(
        &server,
        &group_path,
        &owner_t,
        json!({"experiment_features_enabled": true}),
    )
    .await;
    assert_eq!(
        (status, &body["experiment_features_enabled"]),
        (200, &json!(true))
    );
    let (status, body) = put(
        &server,
        &format!("/groups/{sub}"),
        &owner_t,
        json!({"experiment_features_enabled": true}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["message"]["experiment_features_enabled"].is_array(),
        "{body}"
    );
    // A subgroup cannot be more visible than its parent.
    let public = json!({"visibility": "public"});
    let (status, body) = put(&server, &format!("/groups/{sub}"), &owner_t, public.clone()).await;
    assert_eq!(status, 400);
    assert!(body["message"]["visibility_level"].is_array(), "{body}");

    // Projects: maintainers edit, owners rename and change visibility.
    let (status, body) = put(
        &server,
        &project_path,
        &maint_t,
        json!({"description": "The API", "duo_features_enabled": false}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["description"], &body["duo_features_enabled"]),
        (&json!("The API"), &json!(false))
    );
    let (status, _) = put(&server, &project_path, &dev_t, json!({"description": "x"})).await;
    assert_eq!(status, 403);
    let (status, _) = put(&server, &project_path, &maint_t, json!({"name": "renamed"})).await;
    assert_eq!(status, 403);
    let (status, body) = put(&server, &project_path, &maint_t, json!({"name": "api"})).await;
    assert_eq!(status, 200, "an unchanged name is no rename: {body}");
    let (status, _) = put(&server, &project_path, &owner_t, public.clone()).await;
    assert_eq!(
        status, 400,
        "a project in a private group stays private or internal"
    );
    let (status, _) = put(&server, &group_path, &owner_t, public.clone()).await;
    assert_eq!(status, 200);
    let (status, _) = put(&server, &project_path, &maint_t, public.clone()).await;
    assert_eq!(status, 403);
    let (status, body) = put(&server, &project_path, &owner_t, public).await;
    assert_eq!((status, &body["visibility"]), (200, &json!("public")));
    let (status, body) = put(
        &server,
        &group_path,
        &owner_t,
        json!({"visibility": "private"}),
    )
    .await;
    assert_eq!(status, 400, "the group holds a public project: {body}");
    let (status, body) = put(&server, &project_path, &owner_t, json!({"name": "Renamed"})).await;
    assert_eq!((status, &body["name"]), (200, &json!("Renamed")));
}

#[tokio::test]
async fn epics_are_created_and_discussed_by_epic_id() {
    let fx = Fx::new().await;
    let [planner, guest, reporter, outsider] =
        users(&fx, ["planner", "guest", "reporter", "outsider"]).await;
    // An epic elsewhere first, so this group's epic ids and iids differ.
    let other = fx.group(None, "other", "private", "ultimate").await;
    fx.epic(other, planner, false).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, planner, access::PLANNER).await;
    fx.group_member(group, guest, access::GUEST).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    let [planner_t, guest_t, reporter_t, outsider_t] =
        api_tokens(&fx, [planner, guest, reporter, outsider]).await;
    let server = Server::start(&fx).await;
    let epics = format!("/groups/{group}/epics");

    let new_epic = json!({"title": "Single sign-on", "labels": "auth, q3", "description": "SAML"});
    let (status, _) = post(&server, &epics, &guest_t, new_epic.clone()).await;
    assert_eq!(status, 403);
    let (status, _) = post(&server, &epics, &outsider_t, new_epic.clone()).await;
    assert_eq!(status, 404);
    let (status, _) = post(&server, &epics, &planner_t, json!({"title": " "})).await;
    assert_eq!(status, 400);
    let (status, epic) = post(&server, &epics, &planner_t, new_epic).await;
    assert_eq!(status, 201, "{epic}");
    assert_eq!(epic["iid"], 1);
    assert_eq!(epic["labels"], json!(["auth", "q3"]));
    assert_eq!(epic["references"]["full"], "acme&1");
    assert_eq!(epic["author"]["username"], "planner");
    let epic_id = epic["id"].as_i64().unwrap();
    assert_ne!(epic_id, 1);
    let (status, shown) = get(&server, &format!("{epics}/1"), &guest_t).await;
    assert_eq!((status, &shown["id"]), (200, &json!(epic_id)));

    // Notes go by the epic's id, not its iid.
    let notes = format!("{epics}/{epic_id}/notes");
    let (status, note) = post(&server, &notes, &guest_t, json!({"body": "+1"})).await;
    assert_eq!(status, 201, "{note}");
    assert_eq!(note["noteable_type"], "Epic");
    assert_eq!(note["noteable_id"], epic_id);
    let (status, _) = get(&server, &format!("{epics}/1/notes"), &guest_t).await;
    assert_eq!(status, 404, "iid 1 is not an epic id of this group");
    let internal = json!({"body": "budget", "internal": true});
    let (status, _) = post(&server, &notes, &guest_t, internal.clone()).await;
    assert_eq!(status, 403);
    let (status, _) = post(&server, &notes, &reporter_t, internal).await;
    assert_eq!(status, 201);
    let (_, for_guest) = get(&server, &notes, &guest_t).await;
    assert_eq!(for_guest.as_array().unwrap().len(), 1);
    let (_, for_reporter) = get(&server, &format!("{notes}?sort=asc"), &reporter_t).await;
    assert_eq!(strings(&for_reporter, "body"), vec!["+1", "budget"]);

    // A confidential epic and its notes are hidden from guests.
    let (status, secret) = post(
        &server,
        &epics,
        &reporter_t,
        json!({"title": "Layoffs", "confidential": true}),
    )
    .await;
    assert_eq!((status, &secret["confidential"]), (201, &json!(true)));
    let secret_notes = format!("{epics}/{}/notes", secret["id"]);
    let (status, _) = get(&server, &secret_notes, &guest_t).await;
    assert_eq!(status, 404);
    let (status, _) = get(&server, &secret_notes, &reporter_t).await;
    assert_eq!(status, 200);
}
