//! GitLab's discussions API over HTTP: threads on merge request diff lines
//! (JSON and form positions, refused positions), replies, resolution and
//! who may resolve, issue threads under the notes' reading rules, the
//! payload pinned, and mentions of the review bot that enqueue its answer.

use crate::rest_reviewers::pending_jobs;
use crate::rest_support;
use crate::support;

use monolith::policy::access;
use reqwest::Method;
use rest_support::{api_tokens, get, get_with_headers, post, put, users};
use serde_json::{Map, Value, json};
use support::{Fx, Server};

const DIFF: &str = "\
diff --git a/src/session.rs b/src/session.rs
index 1111111..2222222 100644
--- a/src/session.rs
+++ b/src/session.rs
@@ -10,3 +10,5 @@ impl Session {
-        return Err(Expired);
+        if self.expired() {
+            return self.refresh();
+        }
";

fn position(line: i32) -> Value {
    json!({
        "base_sha": "1111111111111111111111111111111111111111",
        "start_sha": "2222222222222222222222222222222222222222",
        "head_sha": "3333333333333333333333333333333333333333",
        "position_type": "text",
        "old_path": "src/session.rs",
        "new_path": "src/session.rs",
        "new_line": line,
    })
}

/// `value` with times, discussion ids and this server's address made stable.
fn stable(value: Value, server: &Server) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, v)| {
                    let v = match (&*key, &v) {
                        (k, Value::String(_)) if k.ends_with("_at") => json!("[time]"),
                        ("id", Value::String(s)) if s.len() == 40 => json!("[discussion id]"),
                        _ => stable(v, server),
                    };
                    (key, v)
                })
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| stable(v, server)).collect()),
        Value::String(text) => Value::String(text.replace(&server.base, "http://gitlab.test")),
        other => other,
    }
}

/// Status and body of a form-encoded `method` call to `/api/v4{path}`.
async fn send_form(
    server: &Server,
    method: Method,
    path: &str,
    token: &str,
    fields: &[(&str, &str)],
) -> (u16, Value) {
    let body: String = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    let res = reqwest::Client::new()
        .request(method, server.url(&format!("/api/v4{path}")))
        .bearer_auth(token)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn threads_on_diff_lines_take_replies_and_resolve() {
    let fx = Fx::new().await;
    let [dev, reporter, watcher] = users(&fx, ["dev", "reporter", "watcher"]).await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    fx.group_member(group, watcher, access::REPORTER).await;
    let project = fx.project(group, "api", "private").await;
    let [dev_t, reporter_t, watcher_t] = api_tokens(&fx, [dev, reporter, watcher]).await;
    let server = Server::start(&fx).await;
    let (status, _) = post(
        &server,
        &format!("/projects/{project}/merge_requests"),
        &dev_t,
        json!({"source_branch": "fix", "target_branch": "main", "title": "Refresh", "diff": DIFF}),
    )
    .await;
    assert_eq!(status, 201);
    let mr = format!("/projects/{project}/merge_requests/1");
    let threads = format!("{mr}/discussions");

    // A plain note first: a discussion of its own.
    let (status, _) = post(
        &server,
        &format!("{mr}/notes"),
        &dev_t,
        json!({"body": "Looks fine"}),
    )
    .await;
    assert_eq!(status, 201);

    // A thread on a line of the diff, as JSON.
    let (status, thread) = post(
        &server,
        &threads,
        &reporter_t,
        json!({"body": "Can this loop forever?", "position": position(11)}),
    )
    .await;
    assert_eq!(status, 201, "{thread}");
    assert_eq!(thread["individual_note"], false);
    let note = &thread["notes"][0];
    assert_eq!(note["type"], "DiffNote");
    assert_eq!(note["position"]["new_line"], 11);
    assert_eq!(note["position"]["old_line"], Value::Null);
    assert_eq!(note["resolvable"], true);
    assert_eq!(note["resolved"], false);
    let id = thread["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 40);

    // The same with GitLab's form keys.
    let (status, form_thread) = send_form(
        &server,
        Method::POST,
        &threads,
        &dev_t,
        &[
            ("body", "And the old line?"),
            ("position[position_type]", "text"),
            (
                "position[base_sha]",
                "1111111111111111111111111111111111111111",
            ),
            (
                "position[start_sha]",
                "2222222222222222222222222222222222222222",
            ),
            (
                "position[head_sha]",
                "3333333333333333333333333333333333333333",
            ),
            ("position[old_path]", "src/session.rs"),
            ("position[new_path]", "src/session.rs"),
            ("position[old_line]", "10"),
        ],
    )
    .await;
    assert_eq!(status, 201, "{form_thread}");
    assert_eq!(form_thread["notes"][0]["position"]["old_line"], 10);

    // Positions GitLab would not take.
    for (bad, why) in [
        (json!({"new_path": ""}), "an empty path"),
        (json!({"new_line": 0}), "line 0"),
        (json!({"new_line": null}), "no line"),
        (json!({"position_type": "image"}), "an image position"),
        (json!({"head_sha": "HEAD"}), "a ref for a commit"),
        (
            json!({"new_path": "src/other.rs", "old_path": "src/other.rs"}),
            "a file outside the diff",
        ),
    ] {
        let mut p = position(11);
        for (k, v) in bad.as_object().unwrap() {
            p[k] = v.clone();
        }
        let (status, body) = post(
            &server,
            &threads,
            &dev_t,
            json!({"body": "x", "position": p}),
        )
        .await;
        assert_eq!(status, 400, "{why}: {body}");
    }
    let mut no_sha = position(11);
    no_sha.as_object_mut().unwrap().remove("base_sha");
    let (status, _) = post(
        &server,
        &threads,
        &dev_t,
        json!({"body": "x", "position": no_sha}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = post(&server, &threads, &dev_t, json!({"body": "  "})).await;
    assert_eq!(status, 400);

    // A reply keeps the line.
    let (status, reply) = post(
        &server,
        &format!("{threads}/{id}/notes"),
        &dev_t,
        json!({"body": "No: refresh() resets the clock."}),
    )
    .await;
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply["type"], "DiffNote");
    assert_eq!(reply["position"]["new_line"], 11);
    let (status, _) = post(
        &server,
        &format!("{threads}/{}/notes", "0".repeat(40)),
        &dev_t,
        json!({"body": "lost"}),
    )
    .await;
    assert_eq!(status, 404);

    // Resolving: not a bystander; a developer, the starter, the author may.
    let one = format!("{threads}/{id}");
    let (status, _) = put(&server, &one, &watcher_t, json!({"resolved": true})).await;
    assert_eq!(status, 403);
    let (status, resolved) = put(&server, &one, &dev_t, json!({"resolved": true})).await;
    assert_eq!(status, 200, "{resolved}");
    for note in resolved["notes"].as_array().unwrap() {
        assert_eq!(note["resolved"], true);
        assert_eq!(note["resolved_by"]["username"], "dev");
        assert!(note["resolved_at"].is_string());
    }
    let (status, reopened) = put(&server, &one, &reporter_t, json!({"resolved": false})).await;
    assert_eq!(status, 200);
    assert_eq!(reopened["notes"][0]["resolved"], false);
    assert_eq!(reopened["notes"][0]["resolved_by"], Value::Null);
    let (_, resolved) = put(&server, &one, &reporter_t, json!({"resolved": "true"})).await;
    assert_eq!(resolved["notes"][1]["resolved"], true);

    // A plain note does not resolve until a reply makes it a thread.
    let (_, list) = get(&server, &threads, &dev_t).await;
    let plain = list[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list[0]["individual_note"], true);
    let (status, _) = put(
        &server,
        &format!("{threads}/{plain}"),
        &dev_t,
        json!({"resolved": true}),
    )
    .await;
    assert_eq!(status, 403);

    // The list, paginated like GitLab's, oldest first; notes show their thread.
    let (status, headers, page) =
        get_with_headers(&server, &format!("{threads}?per_page=2&page=2"), &dev_t).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "3");
    assert_eq!(page.as_array().unwrap().len(), 1);
    let (status, shown) = get(&server, &one, &watcher_t).await;
    assert_eq!(status, 200);
    assert_eq!(shown["notes"].as_array().unwrap().len(), 2);
    let (status, _) = get(&server, &format!("{threads}/{}", "f".repeat(40)), &dev_t).await;
    assert_eq!(status, 404);
    let (_, notes) = get(&server, &format!("{mr}/notes?sort=asc"), &dev_t).await;
    assert_eq!(notes[1]["type"], "DiffNote");
    assert_eq!(notes[1]["resolved"], true);
    assert!(notes[0].get("position").is_none(), "{}", notes[0]);
    assert!(notes[0].get("resolved").is_none(), "{}", notes[0]);

    let (_, list) = get(&server, &threads, &dev_t).await;
    insta::assert_json_snapshot!("merge_request_discussions", stable(list, &server));

    let (status, converted) = post(
        &server,
        &format!("{threads}/{plain}/notes"),
        &reporter_t,
        json!({"body": "Agreed"}),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(converted["type"], "DiscussionNote");
    assert_eq!(converted["resolvable"], true);
    let (status, thread) = put(
        &server,
        &format!("{threads}/{plain}"),
        &dev_t,
        json!({"resolved": true}),
    )
    .await;
    assert_eq!(status, 200, "{thread}");
    assert_eq!(thread["individual_note"], false);
}

#[tokio::test]
async fn issue_threads_follow_the_notes_rules() {
    let fx = Fx::new().await;
    let [owner, reporter, guest, stranger] =
        users(&fx, ["owner", "reporter", "guest", "stranger"]).await;
    let group = fx.group(None, "open", "public", "free").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    fx.group_member(group, guest, access::GUEST).await;
    let public = fx.project(group, "site", "public").await;
    fx.issue(public, owner, false).await;
    fx.issue(public, owner, true).await;
    let private = fx.project(group, "vault", "private").await;
    fx.issue(private, owner, false).await;
    let [reporter_t, guest_t, stranger_t] = api_tokens(&fx, [reporter, guest, stranger]).await;
    let server = Server::start(&fx).await;
    let threads = format!("/projects/{public}/issues/1/discussions");

    // Anyone who reads the issue comments; issue threads do not resolve.
    let (status, open) = post(&server, &threads, &guest_t, json!({"body": "Same here"})).await;
    assert_eq!(status, 201, "{open}");
    assert_eq!(open["notes"][0]["type"], "DiscussionNote");
    assert_eq!(open["notes"][0]["resolvable"], false);
    assert!(open["notes"][0].get("resolved").is_none());
    let (status, _) = post(
        &server,
        &threads,
        &guest_t,
        json!({"body": "x", "position": position(1)}),
    )
    .await;
    assert_eq!(status, 400, "positions are for merge requests");
    let open_id = open["id"].as_str().unwrap();
    let reply = rest_support::send(
        &server,
        Method::PUT,
        &format!("{threads}/{open_id}"),
        Some(&reporter_t),
        Some(json!({"resolved": true})),
    )
    .await;
    assert_eq!(reply.status, 404, "no resolving route for issues");

    // Internal threads: reporters write them, guests neither see nor join them.
    let (status, _) = post(
        &server,
        &threads,
        &guest_t,
        json!({"body": "psst", "internal": true}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, internal) = post(
        &server,
        &threads,
        &reporter_t,
        json!({"body": "psst", "internal": true}),
    )
    .await;
    assert_eq!(status, 201);
    let internal_id = internal["id"].as_str().unwrap();
    let (status, reply) = post(
        &server,
        &format!("{threads}/{internal_id}/notes"),
        &reporter_t,
        json!({"body": "agreed"}),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(
        reply["internal"], true,
        "a reply in an internal thread is internal"
    );
    let (_, list) = get(&server, &threads, &guest_t).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    let (_, list) = get(&server, &threads, &reporter_t).await;
    assert_eq!(list.as_array().unwrap().len(), 2);
    let (status, _) = get(&server, &format!("{threads}/{internal_id}"), &guest_t).await;
    assert_eq!(status, 404);
    let (status, _) = post(
        &server,
        &format!("{threads}/{internal_id}/notes"),
        &guest_t,
        json!({"body": "let me in"}),
    )
    .await;
    assert_eq!(status, 404);

    // Confidential issues and private projects stay hidden.
    let confidential = format!("/projects/{public}/issues/2/discussions");
    let (status, _) = get(&server, &confidential, &guest_t).await;
    assert_eq!(status, 404);
    let (status, _) = post(&server, &confidential, &guest_t, json!({"body": "hi"})).await;
    assert_eq!(status, 404);
    let (status, _) = get(&server, &confidential, &reporter_t).await;
    assert_eq!(status, 200);
    let hidden = format!("/projects/{private}/issues/1/discussions");
    let (status, _) = get(&server, &hidden, &stranger_t).await;
    assert_eq!(status, 404);
    let (status, _) = post(&server, &hidden, &stranger_t, json!({"body": "hi"})).await;
    assert_eq!(status, 404);
    let anonymous = rest_support::send(&server, Method::GET, &threads, None, None).await;
    assert_eq!(anonymous.status, 200, "a public issue's threads are public");
    assert_eq!(anonymous.body.as_array().unwrap().len(), 1);
    let anonymous = rest_support::send(
        &server,
        Method::POST,
        &threads,
        None,
        Some(json!({"body": "hi"})),
    )
    .await;
    assert_eq!(anonymous.status, 401);
}

#[tokio::test]
async fn mentions_of_the_bot_enqueue_its_answer() {
    let fx = Fx::new().await;
    let [dev, maintainer] = users(&fx, ["dev", "maintainer"]).await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    fx.group_member(group, maintainer, access::MAINTAINER).await;
    let project = fx.project(group, "api", "private").await;
    fx.issue(project, dev, false).await;
    fx.merge_request(project, dev).await;
    let [dev_t, maintainer_t] = api_tokens(&fx, [dev, maintainer]).await;
    let server = Server::start(&fx).await;
    let issue = format!("/projects/{project}/issues/1");
    let mr = format!("/projects/{project}/merge_requests/1");

    let (status, plain) = post(
        &server,
        &format!("{issue}/notes"),
        &dev_t,
        json!({"body": "no mention"}),
    )
    .await;
    assert_eq!(status, 201);
    let (_, quoted) = post(
        &server,
        &format!("{issue}/notes"),
        &dev_t,
        json!({"body": "> @GitLabDuo said so"}),
    )
    .await;
    assert!(
        pending_jobs(&fx, "duo_mention_reply").await.is_empty(),
        "{plain} {quoted}"
    );

    let (_, asked) = post(
        &server,
        &format!("{issue}/notes"),
        &dev_t,
        json!({"body": "@GitLabDuo why does login fail?"}),
    )
    .await;
    assert_eq!(
        pending_jobs(&fx, "duo_mention_reply").await,
        vec![json!({
            "project_id": project, "noteable_type": "Issue", "noteable_iid": 1,
            "note_id": asked["id"], "requester_id": dev.id,
        })]
    );

    // On a merge request, "review" asks for a review; a reply in a thread
    // mentioning the bot asks for an answer.
    let (status, thread) = post(
        &server,
        &format!("{mr}/discussions"),
        &dev_t,
        json!({"body": "@GitLabDuo review"}),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(
        pending_jobs(&fx, "duo_code_review").await,
        vec![json!({
            "project_id": project, "merge_request_iid": 1, "requester_id": dev.id, "trigger": "mention",
        })]
    );
    let id = thread["id"].as_str().unwrap();
    let (status, reply) = post(
        &server,
        &format!("{mr}/discussions/{id}/notes"),
        &dev_t,
        json!({"body": "@GitLabDuo what about the tests?"}),
    )
    .await;
    assert_eq!(status, 201);
    let jobs = pending_jobs(&fx, "duo_mention_reply").await;
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[1]["note_id"], reply["id"]);
    assert_eq!(jobs[1]["noteable_type"], "MergeRequest");

    // A maintainer switches mentions off: nothing more is enqueued.
    let (status, _) = put(
        &server,
        &format!("/projects/{project}/duo_triggers/mention"),
        &maintainer_t,
        json!({"enabled": false}),
    )
    .await;
    assert_eq!(status, 200);
    post(
        &server,
        &format!("{issue}/notes"),
        &dev_t,
        json!({"body": "@GitLabDuo hello?"}),
    )
    .await;
    assert_eq!(pending_jobs(&fx, "duo_mention_reply").await.len(), 2);
}
