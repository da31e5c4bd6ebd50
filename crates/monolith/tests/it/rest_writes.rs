//! REST writes as GitLab's clients send them: labels as text or list, edits and
//! closing through `PUT` (with who closed and when), form and query parameters
//! as well as JSON, and GitLab's 404 body for routes that do not exist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::rest_support;
use crate::support;

use monolith::policy::access;
use reqwest::Method;
use rest_support::{get, post, put, send};
use serde_json::{Value, json};
use support::{Fx, Server};

async fn form(
    server: &Server,
    method: Method,
    path: &str,
    token: &str,
    body: &str,
) -> (u16, Value) {
    let res = reqwest::Client::new()
        .request(method, server.url(&format!("/api/v4{path}")))
        .bearer_auth(token)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

struct World {
    fx: Fx,
    server: Server,
    project: i64,
    group: i64,
    owner: String,
    guest: String,
    stranger: String,
    guest_id: i64,
}

async fn world() -> World {
    let fx = Fx::new().await;
    let owner = fx.user("olga").await;
    let guest = fx.user("gus").await;
    let stranger = fx.user("stan").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, guest, access::GUEST).await;
    let project = fx.project(group, "site", "private").await;
    let owner_token = fx.token(owner, &["api"]).await;
    let guest_token = fx.token(guest, &["api"]).await;
    let stranger_token = fx.token(stranger, &["api"]).await;
    let server = Server::start(&fx).await;
    World {
        fx,
        server,
        project,
        group,
        owner: owner_token,
        guest: guest_token,
        stranger: stranger_token,
        guest_id: guest.id,
    }
}

#[tokio::test]
async fn labels_are_text_or_lists_on_every_kind() {
    let w = world().await;
    let p = w.project;
    let (status, issue) = post(
        &w.server,
        &format!("/projects/{p}/issues"),
        &w.owner,
        json!({ "title": "List labels", "labels": ["bug", "p1", "bug"] }),
    )
    .await;
    assert_eq!(status, 201, "{issue}");
    assert_eq!(issue["labels"], json!(["bug", "p1"]));
    let (_, issue2) = post(
        &w.server,
        &format!("/projects/{p}/issues"),
        &w.owner,
        json!({ "title": "Text labels", "labels": "ux, docs" }),
    )
    .await;
    assert_eq!(issue2["labels"], json!(["ux", "docs"]));
    let (status, mr) = post(
        &w.server,
        &format!("/projects/{p}/merge_requests"),
        &w.owner,
        json!({ "title": "MR", "source_branch": "feature", "target_branch": "main", "labels": ["review"] }),
    )
    .await;
    assert_eq!(status, 201, "{mr}");
    assert_eq!(mr["labels"], json!(["review"]));
    let (status, epic) = post(
        &w.server,
        &format!("/groups/{}/epics", w.group),
        &w.owner,
        json!({ "title": "Epic", "labels": ["roadmap", "q3"] }),
    )
    .await;
    assert_eq!(status, 201, "{epic}");
    assert_eq!(epic["labels"], json!(["roadmap", "q3"]));
}

#[tokio::test]
async fn issues_are_edited_closed_and_reopened_with_put() {
    let w = world().await;
    let p = w.project;
    let (_, issue) = post(
        &w.server,
        &format!("/projects/{p}/issues"),
        &w.owner,
        json!({ "title": "Before", "labels": "a,b" }),
    )
    .await;
    let iid = issue["iid"].as_i64().unwrap();
    let path = format!("/projects/{p}/issues/{iid}");

    let (status, edited) = put(
        &w.server,
        &path,
        &w.owner,
        json!({
            "title": "After", "description": "Now with words", "add_labels": ["c"], "remove_labels": "a",
            "assignee_ids": [w.guest_id], "confidential": true, "due_date": "2026-12-31",
        }),
    )
    .await;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(edited["title"], "After");
    assert_eq!(edited["description"], "Now with words");
    assert_eq!(edited["labels"], json!(["b", "c"]));
    assert_eq!(edited["assignees"][0]["username"], "gus");
    assert_eq!(edited["confidential"], true);
    assert_eq!(edited["due_date"], "2026-12-31");
    assert_eq!(edited["state"], "opened");
    assert!(edited["closed_at"].is_null());

    let (status, closed) = put(
        &w.server,
        &path,
        &w.owner,
        json!({ "state_event": "close" }),
    )
    .await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["state"], "closed");
    assert!(closed["closed_at"].is_string(), "{closed}");
    assert_eq!(closed["closed_by"]["username"], "olga");

    // The assignee may edit even as a guest; the stranger cannot even see it.
    let (status, reopened) = put(
        &w.server,
        &path,
        &w.guest,
        json!({ "state_event": "reopen" }),
    )
    .await;
    assert_eq!(status, 200, "{reopened}");
    assert_eq!(reopened["state"], "opened");
    assert!(reopened["closed_at"].is_null());
    assert!(reopened["closed_by"].is_null());
    let (status, body) = put(&w.server, &path, &w.stranger, json!({ "title": "x" })).await;
    assert_eq!(status, 404, "{body}");

    // Replacing labels, clearing the due date; bad values are 400s.
    let (_, relabeled) = put(
        &w.server,
        &path,
        &w.owner,
        json!({ "labels": [], "due_date": "" }),
    )
    .await;
    assert_eq!(relabeled["labels"], json!([]));
    assert!(relabeled["due_date"].is_null());
    let (status, body) = put(
        &w.server,
        &path,
        &w.owner,
        json!({ "state_event": "explode" }),
    )
    .await;
    assert_eq!(
        (status, body),
        (
            400,
            json!({ "error": "state_event does not have a valid value" })
        )
    );
    let (status, body) = put(&w.server, &path, &w.owner, json!({ "title": "  " })).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["message"]["title"], json!(["can't be blank"]));
    let (status, _) = put(&w.server, &path, &w.owner, json!({})).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn only_editors_edit_and_merge_requests_and_epics_close_too() {
    let w = world().await;
    let p = w.project;
    let (_, issue) = post(
        &w.server,
        &format!("/projects/{p}/issues"),
        &w.owner,
        json!({ "title": "Owner's" }),
    )
    .await;
    let iid = issue["iid"].as_i64().unwrap();
    // A guest who is neither author nor assignee may read but not edit.
    let (status, body) = put(
        &w.server,
        &format!("/projects/{p}/issues/{iid}"),
        &w.guest,
        json!({ "title": "Mine now" }),
    )
    .await;
    assert_eq!((status, body), (403, json!({ "message": "403 Forbidden" })));

    let (_, mr) = post(
        &w.server,
        &format!("/projects/{p}/merge_requests"),
        &w.owner,
        json!({ "title": "MR", "source_branch": "f", "target_branch": "main" }),
    )
    .await;
    let mr_path = format!("/projects/{p}/merge_requests/{}", mr["iid"]);
    let (status, closed) = put(
        &w.server,
        &mr_path,
        &w.owner,
        json!({ "state_event": "close", "add_labels": "stale" }),
    )
    .await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["state"], "closed");
    assert_eq!(closed["labels"], json!(["stale"]));
    assert_eq!(closed["closed_by"]["username"], "olga");
    let (_, reopened) = put(
        &w.server,
        &mr_path,
        &w.owner,
        json!({ "state_event": "reopen" }),
    )
    .await;
    assert_eq!(reopened["state"], "opened");

    let (_, epic) = post(
        &w.server,
        &format!("/groups/{}/epics", w.group),
        &w.owner,
        json!({ "title": "E" }),
    )
    .await;
    let epic_path = format!("/groups/{}/epics/{}", w.group, epic["iid"]);
    let (status, closed) = put(
        &w.server,
        &epic_path,
        &w.owner,
        json!({ "state_event": "close" }),
    )
    .await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["state"], "closed");
    assert!(closed["closed_at"].is_string());
}

#[tokio::test]
async fn form_and_query_parameters_work_like_json() {
    let w = world().await;
    let p = w.project;
    let (status, issue) = form(
        &w.server,
        Method::POST,
        &format!("/projects/{p}/issues"),
        &w.owner,
        "title=From%20a%20form&labels[]=one&labels[]=two&confidential=true",
    )
    .await;
    assert_eq!(status, 201, "{issue}");
    assert_eq!(issue["title"], "From a form");
    assert_eq!(issue["labels"], json!(["one", "two"]));
    assert_eq!(issue["confidential"], true);

    // curl -X POST .../issues?title=...: parameters in the query string.
    let reply = send(
        &w.server,
        Method::POST,
        &format!("/projects/{p}/issues?title=From%20the%20query&labels=x,y"),
        Some(&w.owner),
        None,
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_eq!(reply.body["labels"], json!(["x", "y"]));

    let iid = issue["iid"].as_i64().unwrap();
    let (status, closed) = form(
        &w.server,
        Method::PUT,
        &format!("/projects/{p}/issues/{iid}"),
        &w.owner,
        "state_event=close&add_labels=three",
    )
    .await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["state"], "closed");
    assert_eq!(closed["labels"], json!(["one", "two", "three"]));

    // A form with a wrong type is refused clearly.
    let (status, body) = form(
        &w.server,
        Method::POST,
        &format!("/projects/{p}/issues"),
        &w.owner,
        "title=x&confidential=perhaps",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = form(
        &w.server,
        Method::POST,
        &format!("/projects/{p}/issues"),
        &w.owner,
        "labels=x",
    )
    .await;
    assert_eq!(
        (status, body),
        (400, json!({ "error": "title is missing" }))
    );
}

#[tokio::test]
async fn unknown_api_routes_answer_gitlabs_404_body() {
    let w = world().await;
    for path in ["/nothing/here", "/projects/1/nonsense", "/version2"] {
        let (status, body) = get(&w.server, path, &w.owner).await;
        assert_eq!(
            (status, body),
            (404, json!({ "error": "404 Not Found" })),
            "{path}"
        );
    }
    let _ = &w.fx;
}
