//! Group and project members over HTTP: who may add, change and remove whom,
//! GitLab's 409 for an existing member, and a group always keeping an owner.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use monolith::policy::access;
use reqwest::Method;
use serde_json::{Value, json};
use support::{Fx, Server};

/// Status, headers and JSON body (`Null` when empty) of one REST call.
async fn call(
    server: &Server,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = reqwest::Client::new()
        .request(method, server.url(&format!("/api/v4{path}")))
        .bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let text = res.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, headers, json)
}

#[tokio::test]
async fn project_members_follow_gitlab_roles() {
    let fx = Fx::new().await;
    let owner = fx.user("owner").await;
    let maint = fx.user("maint").await;
    let dev = fx.user("dev").await;
    let newbie = fx.user("newbie").await;
    let outsider = fx.user("outsider").await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, owner, access::OWNER).await;
    let project = fx.project(group, "api", "private").await;
    fx.project_member(project, maint, access::MAINTAINER).await;
    fx.project_member(project, dev, access::DEVELOPER).await;
    let [owner_t, maint_t, dev_t, outsider_t] = [
        fx.token(owner, &["api"]).await,
        fx.token(maint, &["api"]).await,
        fx.token(dev, &["api"]).await,
        fx.token(outsider, &["api"]).await,
    ];
    let server = Server::start(&fx).await;
    let members = format!("/projects/{project}/members");
    let member = |user: i64| format!("/projects/{project}/members/{user}");

    // Direct members only: the group owner is not listed.
    let (status, headers, body) = call(&server, Method::GET, &members, &dev_t, None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "2");
    let ids: Vec<i64> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![maint.id, dev.id]);
    let (status, _, _) = call(&server, Method::GET, &members, &outsider_t, None).await;
    assert_eq!(status, 404, "outsiders cannot tell the project exists");

    // A maintainer adds members up to their own role; a developer adds nobody.
    let add = |user: i64, level: i32| Some(json!({"user_id": user, "access_level": level}));
    let (status, _, _) = call(&server, Method::POST, &members, &dev_t, add(newbie.id, 30)).await;
    assert_eq!(status, 403);
    let (status, _, body) = call(
        &server,
        Method::POST,
        &members,
        &maint_t,
        add(newbie.id, 30),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["access_level"], 30);
    assert_eq!(body["username"], "newbie");
    let (status, _, body) = call(
        &server,
        Method::POST,
        &members,
        &maint_t,
        add(newbie.id, 40),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(body, json!({"message": "Member already exists"}));
    let (status, _, _) = call(
        &server,
        Method::POST,
        &members,
        &maint_t,
        add(outsider.id, 50),
    )
    .await;
    assert_eq!(status, 403, "a maintainer cannot make an owner");
    let (status, _, body) = call(&server, Method::POST, &members, &owner_t, add(999_999, 30)).await;
    assert_eq!(status, 404);
    assert_eq!(body, json!({"message": "404 User Not Found"}));
    let (status, _, _) = call(
        &server,
        Method::POST,
        &members,
        &owner_t,
        add(outsider.id, 5),
    )
    .await;
    assert_eq!(status, 400, "minimal access exists on groups only");

    // Changing roles.
    let level = |l: i32| Some(json!({"access_level": l}));
    let (status, _, body) = call(
        &server,
        Method::PUT,
        &member(newbie.id),
        &maint_t,
        level(40),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["access_level"], 40);
    let (status, _, _) = call(
        &server,
        Method::PUT,
        &member(newbie.id),
        &maint_t,
        level(50),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, body) = call(
        &server,
        Method::PUT,
        &member(newbie.id),
        &owner_t,
        level(50),
    )
    .await;
    assert_eq!((status, &body["access_level"]), (200, &json!(50)));
    // Now an owner: out of the maintainer's reach.
    let (status, _, _) = call(
        &server,
        Method::PUT,
        &member(newbie.id),
        &maint_t,
        level(30),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _, _) = call(&server, Method::DELETE, &member(newbie.id), &maint_t, None).await;
    assert_eq!(status, 403);
    let (status, _, body) = call(
        &server,
        Method::PUT,
        &member(outsider.id),
        &owner_t,
        level(30),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(body, json!({"message": "404 Not found"}));

    // Anyone may leave; owners remove others.
    let (status, _, _) = call(&server, Method::DELETE, &member(dev.id), &dev_t, None).await;
    assert_eq!(status, 204);
    let (status, _, _) = call(&server, Method::DELETE, &member(newbie.id), &owner_t, None).await;
    assert_eq!(status, 204);
    let (status, _, _) = call(&server, Method::GET, &member(newbie.id), &owner_t, None).await;
    assert_eq!(status, 404);
    let (status, _, body) = call(&server, Method::GET, &member(maint.id), &owner_t, None).await;
    assert_eq!((status, &body["access_level"]), (200, &json!(40)));
}

#[tokio::test]
async fn group_members_are_managed_by_owners_and_keep_an_owner() {
    let fx = Fx::new().await;
    let first = fx.user("first").await;
    let maint = fx.user("maint").await;
    let second = fx.user("second").await;
    let sub_owner = fx.user("subowner").await;
    let group = fx.group(None, "acme", "private", "free").await;
    let sub = fx.group(Some(group), "team", "private", "free").await;
    fx.group_member(group, first, access::OWNER).await;
    fx.group_member(group, maint, access::MAINTAINER).await;
    let first_t = fx.token(first, &["api"]).await;
    let maint_t = fx.token(maint, &["api"]).await;
    let sub_owner_t = fx.token(sub_owner, &["api"]).await;
    let server = Server::start(&fx).await;
    let members = format!("/groups/{group}/members");
    let member = |user: i64| format!("/groups/{group}/members/{user}");
    let add = |user: i64, level: i32| Some(json!({"user_id": user, "access_level": level}));

    let (status, _, _) = call(
        &server,
        Method::POST,
        &members,
        &maint_t,
        add(second.id, 30),
    )
    .await;
    assert_eq!(status, 403, "only owners manage group members");
    let (status, _, _) = call(&server, Method::POST, &members, &first_t, add(second.id, 5)).await;
    assert_eq!(status, 201, "minimal access is a group role");
    let (status, _, body) = call(
        &server,
        Method::POST,
        &members,
        &first_t,
        add(second.id, 30),
    )
    .await;
    assert_eq!(
        (status, body),
        (409, json!({"message": "Member already exists"}))
    );

    // The only owner can neither step down nor leave.
    let last_owner = json!({"message": "403 Forbidden - A group must have at least one owner"});
    let (status, _, body) = call(
        &server,
        Method::PUT,
        &member(first.id),
        &first_t,
        Some(json!({"access_level": 40})),
    )
    .await;
    assert_eq!((status, &body), (403, &last_owner));
    let (status, _, body) = call(&server, Method::DELETE, &member(first.id), &first_t, None).await;
    assert_eq!((status, &body), (403, &last_owner));
    let (status, _, _) = call(
        &server,
        Method::PUT,
        &member(second.id),
        &first_t,
        Some(json!({"access_level": 50})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _, _) = call(&server, Method::DELETE, &member(first.id), &first_t, None).await;
    assert_eq!(status, 204, "another owner remains");

    // A subgroup's only direct owner may leave: the parent's owner is inherited.
    let second_t = fx.token(second, &["api"]).await;
    let (status, _, _) = call(
        &server,
        Method::POST,
        &format!("/groups/{sub}/members"),
        &second_t,
        add(sub_owner.id, 50),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _, body) = call(
        &server,
        Method::GET,
        &format!("/groups/{sub}/members/{}", sub_owner.id),
        &sub_owner_t,
        None,
    )
    .await;
    assert_eq!((status, &body["access_level"]), (200, &json!(50)));
    let (status, _, _) = call(
        &server,
        Method::DELETE,
        &format!("/groups/{sub}/members/{}", sub_owner.id),
        &sub_owner_t,
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, headers, _) = call(&server, Method::GET, &members, &second_t, None).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "2", "maint and second remain");
}
