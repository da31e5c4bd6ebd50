//! Merge request reviewers over HTTP (`reviewer_ids` on create and update,
//! `reviewers` in the merge request, `/reviewers` with states), the review
//! the bot's addition enqueues, and a project's Duo triggers.

use crate::rest_support;
use crate::support;

use monolith::policy::access;
use rest_support::{api_tokens, get, post, put, strings, users};
use serde_json::json;
use support::{Fx, Server};

/// Pending jobs of `kind` (no worker runs beside the test server).
pub(crate) async fn pending_jobs(fx: &Fx, kind: &str) -> Vec<serde_json::Value> {
    let db = fx.pool.get().await.unwrap();
    db.query(
        "SELECT payload FROM background_jobs WHERE kind = $1 AND state = 'pending' ORDER BY id",
        &[&kind],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

pub(crate) async fn bot_id(fx: &Fx) -> i64 {
    fx.id("SELECT id FROM users WHERE username = 'GitLabDuo'", &[])
        .await
}

#[tokio::test]
async fn developers_set_reviewers_and_adding_the_bot_asks_for_one_review() {
    let fx = Fx::new().await;
    let [dev, reporter, guest, colleague, stranger] =
        users(&fx, ["dev", "reporter", "guest", "colleague", "stranger"]).await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    fx.group_member(group, guest, access::GUEST).await;
    fx.group_member(group, colleague, access::REPORTER).await;
    let project = fx.project(group, "api", "private").await;
    let [dev_t, reporter_t, guest_t] = api_tokens(&fx, [dev, reporter, guest]).await;
    let bot = bot_id(&fx).await;
    let server = Server::start(&fx).await;
    let mrs = format!("/projects/{project}/merge_requests");

    // Reviewers on creation; nobody asked the bot, so no review.
    let (status, mr) = post(
        &server,
        &mrs,
        &dev_t,
        json!({"source_branch": "fix", "target_branch": "main", "title": "Fix", "reviewer_ids": [colleague.id]}),
    )
    .await;
    assert_eq!(status, 201, "{mr}");
    assert_eq!(strings(&mr["reviewers"], "username"), vec!["colleague"]);
    assert!(pending_jobs(&fx, "duo_code_review").await.is_empty());
    let one = format!("{mrs}/1");

    // Who may not edit, or not set reviewers, is refused; nothing changes.
    let (status, _) = put(&server, &one, &guest_t, json!({"reviewer_ids": [bot]})).await;
    assert_eq!(
        status, 404,
        "a guest does not see a private project's merge requests"
    );
    let (status, _) = put(&server, &one, &reporter_t, json!({"reviewer_ids": [bot]})).await;
    assert_eq!(status, 403);
    // Unknown users and users who cannot read the project are refused.
    let (status, body) = put(&server, &one, &dev_t, json!({"reviewer_ids": [999_999]})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body,
        json!({"message": {"reviewer_ids": ["user 999999 does not exist"]}})
    );
    let (status, body) = put(
        &server,
        &one,
        &dev_t,
        json!({"reviewer_ids": [stranger.id]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]["reviewer_ids"][0]
            .as_str()
            .unwrap()
            .contains("cannot read")
    );
    // Refused updates change nothing, not even the other fields.
    let (status, _) = put(
        &server,
        &one,
        &dev_t,
        json!({"title": "Renamed", "reviewer_ids": [999_999]}),
    )
    .await;
    assert_eq!(status, 400);
    let (_, shown) = get(&server, &one, &dev_t).await;
    assert_eq!(shown["title"], "Fix");
    assert_eq!(strings(&shown["reviewers"], "username"), vec!["colleague"]);
    assert!(pending_jobs(&fx, "duo_code_review").await.is_empty());

    // The bot may review a private project it is no member of; adding it
    // (the list replaces the old one) asks for one review.
    let (status, updated) = put(
        &server,
        &one,
        &dev_t,
        json!({"reviewer_ids": [colleague.id, bot]}),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(
        strings(&updated["reviewers"], "username"),
        vec!["colleague", "GitLabDuo"]
    );
    let jobs = pending_jobs(&fx, "duo_code_review").await;
    assert_eq!(
        jobs,
        vec![json!({
            "project_id": project, "merge_request_iid": 1, "requester_id": dev.id,
            "trigger": "reviewer_assigned",
        })]
    );
    // Keeping the bot is not adding it again.
    let (status, _) = put(
        &server,
        &one,
        &dev_t,
        json!({"reviewer_ids": [bot], "description": "Now with tests"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(pending_jobs(&fx, "duo_code_review").await.len(), 1);

    // States, and the lists that show reviewers.
    let db = fx.pool.get().await.unwrap();
    let mr_id = mr["id"].as_i64().unwrap();
    assert!(
        monolith::work_items::reviewers::set_state(&*db, mr_id, bot, "review_started")
            .await
            .unwrap()
    );
    let (status, reviewers) = get(&server, &format!("{one}/reviewers"), &reporter_t).await;
    assert_eq!(status, 200);
    assert_eq!(reviewers.as_array().unwrap().len(), 1);
    assert_eq!(reviewers[0]["user"]["username"], "GitLabDuo");
    assert_eq!(reviewers[0]["state"], "review_started");
    let (_, list) = get(&server, &mrs, &reporter_t).await;
    assert_eq!(
        strings(&list[0]["reviewers"], "username"),
        vec!["GitLabDuo"]
    );
    // Form keys, and `0` for none, as GitLab takes them.
    let reply = rest_support::send(
        &server,
        reqwest::Method::PUT,
        &format!("{one}?reviewer_ids=0"),
        Some(&dev_t),
        None,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["reviewers"], json!([]));
    // Issues have no reviewers.
    fx.issue(project, dev, false).await;
    let (status, body) = put(
        &server,
        &format!("/projects/{project}/issues/1"),
        &dev_t,
        json!({"reviewer_ids": [bot]}),
    )
    .await;
    assert_eq!(
        (status, body),
        (
            400,
            json!({"error": "reviewer_ids is not a parameter here"})
        )
    );
}

#[tokio::test]
async fn guests_who_read_a_merge_request_may_not_set_its_reviewers() {
    let fx = Fx::new().await;
    let [dev, guest] = users(&fx, ["dev", "guest"]).await;
    let group = fx.group(None, "open", "public", "free").await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    fx.group_member(group, guest, access::GUEST).await;
    let project = fx.project(group, "site", "public").await;
    fx.merge_request(project, dev).await;
    let [guest_t] = api_tokens(&fx, [guest]).await;
    let bot = bot_id(&fx).await;
    let server = Server::start(&fx).await;
    let one = format!("/projects/{project}/merge_requests/1");

    let (status, _) = get(&server, &one, &guest_t).await;
    assert_eq!(status, 200, "a guest reads a public merge request");
    let (status, body) = put(&server, &one, &guest_t, json!({"reviewer_ids": [bot]})).await;
    assert_eq!((status, body), (403, json!({"message": "403 Forbidden"})));
    assert!(pending_jobs(&fx, "duo_code_review").await.is_empty());
}

#[tokio::test]
async fn maintainers_switch_the_duo_triggers_of_a_project() {
    let fx = Fx::new().await;
    let [maintainer, dev] = users(&fx, ["maintainer", "dev"]).await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, maintainer, access::MAINTAINER).await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    let project = fx.project(group, "api", "private").await;
    let [maintainer_t, dev_t] = api_tokens(&fx, [maintainer, dev]).await;
    let bot = bot_id(&fx).await;
    let server = Server::start(&fx).await;
    let triggers = format!("/projects/{project}/duo_triggers");

    let (status, list) = get(&server, &triggers, &maintainer_t).await;
    assert_eq!(status, 200);
    assert_eq!(
        list,
        json!([
            {"event": "reviewer_assigned", "enabled": true, "default": true},
            {"event": "mention", "enabled": true, "default": true},
            {"event": "pipeline_failed", "enabled": false, "default": false},
        ])
    );
    let (status, _) = get(&server, &triggers, &dev_t).await;
    assert_eq!(status, 403);
    let (status, _) = put(
        &server,
        &format!("{triggers}/reviewer_assigned"),
        &dev_t,
        json!({"enabled": false}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = put(
        &server,
        &format!("{triggers}/on_full_moon"),
        &maintainer_t,
        json!({"enabled": false}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, body) = put(
        &server,
        &format!("{triggers}/reviewer_assigned"),
        &maintainer_t,
        json!({"enabled": "false"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"event": "reviewer_assigned", "enabled": false, "default": true})
    );
    let (_, list) = get(&server, &triggers, &maintainer_t).await;
    assert_eq!(list[0]["enabled"], false);

    // Switched off, adding the bot asks for no review.
    let (status, _) = post(
        &server,
        &format!("/projects/{project}/merge_requests"),
        &dev_t,
        json!({"source_branch": "fix", "target_branch": "main", "title": "Fix", "reviewer_ids": [bot]}),
    )
    .await;
    assert_eq!(status, 201);
    assert!(pending_jobs(&fx, "duo_code_review").await.is_empty());
}
