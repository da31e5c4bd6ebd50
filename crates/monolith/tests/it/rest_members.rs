//! Group and project members over HTTP: who may add, change and remove whom,
//! GitLab's 409 for an existing member, and a group always keeping an owner.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::rest_support;
use crate::support;

use monolith::policy::access;
use rest_support::{api_tokens, delete, get, get_with_headers, integers, post, put, users};
use serde_json::json;
use support::{Fx, Server};

#[tokio::test]
async fn project_members_follow_gitlab_roles() {
    let fx = Fx::new().await;
    let [owner, maint, dev, newbie, outsider] =
        users(&fx, ["owner", "maint", "dev", "newbie", "outsider"]).await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, owner, access::OWNER).await;
    let project = fx.project(group, "api", "private").await;
    fx.project_member(project, maint, access::MAINTAINER).await;
    fx.project_member(project, dev, access::DEVELOPER).await;
    let [owner_t, maint_t, dev_t, outsider_t] =
        api_tokens(&fx, [owner, maint, dev, outsider]).await;
    let server = Server::start(&fx).await;
    let members = format!("/projects/{project}/members");
    let member = |user: i64| format!("/projects/{project}/members/{user}");

    // Direct members only: the group owner is not listed.
    let (status, headers, body) = get_with_headers(&server, &members, &dev_t).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "2");
    assert_eq!(integers(&body, "id"), vec![maint.id, dev.id]);
    let (status, _) = get(&server, &members, &outsider_t).await;
    assert_eq!(status, 404, "outsiders cannot tell the project exists");

    // A maintainer adds members up to their own role; a developer adds nobody.
    let add = |user: i64, level: i32| json!({"user_id": user, "access_level": level});
    let (status, _) = post(&server, &members, &dev_t, add(newbie.id, 30)).await;
    assert_eq!(status, 403);
    let (status, body) = post(&server, &members, &maint_t, add(newbie.id, 30)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["access_level"], 30);
    assert_eq!(body["username"], "newbie");
    let (status, body) = post(&server, &members, &maint_t, add(newbie.id, 40)).await;
    assert_eq!(status, 409);
    assert_eq!(body, json!({"message": "Member already exists"}));
    let (status, _) = post(&server, &members, &maint_t, add(outsider.id, 50)).await;
    assert_eq!(status, 403, "a maintainer cannot make an owner");
    let (status, body) = post(&server, &members, &owner_t, add(999_999, 30)).await;
    assert_eq!(status, 404);
    assert_eq!(body, json!({"message": "404 User Not Found"}));
    let (status, _) = post(&server, &members, &owner_t, add(outsider.id, 5)).await;
    assert_eq!(status, 400, "minimal access exists on groups only");

    // Changing roles.
    let level = |l: i32| json!({"access_level": l});
    let (status, body) = put(&server, &member(newbie.id), &maint_t, level(40)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["access_level"], 40);
    let (status, _) = put(&server, &member(newbie.id), &maint_t, level(50)).await;
    assert_eq!(status, 403);
    let (status, body) = put(&server, &member(newbie.id), &owner_t, level(50)).await;
    assert_eq!((status, &body["access_level"]), (200, &json!(50)));
    // Now an owner: out of the maintainer's reach.
    let (status, _) = put(&server, &member(newbie.id), &maint_t, level(30)).await;
    assert_eq!(status, 403);
    let (status, _) = delete(&server, &member(newbie.id), &maint_t).await;
    assert_eq!(status, 403);
    let (status, body) = put(&server, &member(outsider.id), &owner_t, level(30)).await;
    assert_eq!(status, 404);
    assert_eq!(body, json!({"message": "404 Not found"}));

    // Anyone may leave; owners remove others.
    let (status, _) = delete(&server, &member(dev.id), &dev_t).await;
    assert_eq!(status, 204);
    let (status, _) = delete(&server, &member(newbie.id), &owner_t).await;
    assert_eq!(status, 204);
    let (status, _) = get(&server, &member(newbie.id), &owner_t).await;
    assert_eq!(status, 404);
    let (status, body) = get(&server, &member(maint.id), &owner_t).await;
    assert_eq!((status, &body["access_level"]), (200, &json!(40)));
}

#[tokio::test]
async fn group_members_are_managed_by_owners_and_keep_an_owner() {
    let fx = Fx::new().await;
    let [first, maint, second, sub_owner] =
        users(&fx, ["first", "maint", "second", "subowner"]).await;
    let group = fx.group(None, "acme", "private", "free").await;
    let sub = fx.group(Some(group), "team", "private", "free").await;
    fx.group_member(group, first, access::OWNER).await;
    fx.group_member(group, maint, access::MAINTAINER).await;
    let [first_t, maint_t, sub_owner_t] = api_tokens(&fx, [first, maint, sub_owner]).await;
    let server = Server::start(&fx).await;
    let members = format!("/groups/{group}/members");
    let member = |user: i64| format!("/groups/{group}/members/{user}");
    let add = |user: i64, level: i32| json!({"user_id": user, "access_level": level});

    let (status, _) = post(&server, &members, &maint_t, add(second.id, 30)).await;
    assert_eq!(status, 403, "only owners manage group members");
    let (status, _) = post(&server, &members, &first_t, add(second.id, 5)).await;
    assert_eq!(status, 201, "minimal access is a group role");
    let (status, body) = post(&server, &members, &first_t, add(second.id, 30)).await;
    assert_eq!(
        (status, body),
        (409, json!({"message": "Member already exists"}))
    );

    // The only owner can neither step down nor leave.
    let last_owner = json!({"message": "403 Forbidden - A group must have at least one owner"});
    let (status, body) = put(
        &server,
        &member(first.id),
        &first_t,
        json!({"access_level": 40}),
    )
    .await;
    assert_eq!((status, &body), (403, &last_owner));
    let (status, body) = delete(&server, &member(first.id), &first_t).await;
    assert_eq!((status, &body), (403, &last_owner));
    let (status, _) = put(
        &server,
        &member(second.id),
        &first_t,
        json!({"access_level": 50}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = delete(&server, &member(first.id), &first_t).await;
    assert_eq!(status, 204, "another owner remains");

    // A subgroup's only direct owner may leave: the parent's owner is inherited.
    let second_t = fx.token(second, &["api"]).await;
    let (status, _) = post(
        &server,
        &format!("/groups/{sub}/members"),
        &second_t,
        add(sub_owner.id, 50),
    )
    .await;
    assert_eq!(status, 201);
    let (status, body) = get(
        &server,
        &format!("/groups/{sub}/members/{}", sub_owner.id),
        &sub_owner_t,
    )
    .await;
    assert_eq!((status, &body["access_level"]), (200, &json!(50)));
    let (status, _) = delete(
        &server,
        &format!("/groups/{sub}/members/{}", sub_owner.id),
        &sub_owner_t,
    )
    .await;
    assert_eq!(status, 204);
    let (status, headers, _) = get_with_headers(&server, &members, &second_t).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "2", "maint and second remain");
}
