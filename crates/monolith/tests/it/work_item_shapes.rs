//! The wire shapes of work items, pinned: the REST JSON of issues, merge
//! requests, epics, notes, pipelines and jobs, and the HTML of their pages,
//! as GitLab clients and people see them (taken from the code before the
//! work items domain existed). Times and this server's address are redacted;
//! everything else (key order included) must stay as it is.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::rest_support::{get, post, put};
use crate::support::{Fx, Server};
use crate::web_sign_in::{browser, set_password, sign_in};

use monolith::policy::access;
use serde_json::{Map, Value, json};

/// Where the snapshots say this server lives.
const BASE: &str = "http://gitlab.test";

/// `value` with every time (`*_at`) redacted and the server's address made
/// stable.
fn stable(value: Value, server: &Server) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(key, v)| {
                    let v = if key.ends_with("_at") && v.is_string() {
                        json!("[time]")
                    } else {
                        stable(v, server)
                    };
                    (key, v)
                })
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| stable(v, server)).collect()),
        Value::String(text) => Value::String(text.replace(&server.base, BASE)),
        other => other,
    }
}

/// Status and body of a `GET`, made stable.
async fn read(server: &Server, path: &str, token: &str) -> Value {
    let (status, body) = get(server, path, token).await;
    assert_eq!(status, 200, "{path}: {body}");
    stable(body, server)
}

#[tokio::test]
async fn rest_shapes_of_issues_merge_requests_epics_notes_and_jobs() {
    let fx = Fx::new().await;
    let owner = fx.user("owner").await;
    let dev = fx.user("dev").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    let project = fx.project(group, "api", "private").await;
    let token = fx.token(owner, &["api"]).await;
    let server = Server::start(&fx).await;
    let mut written = Map::new();
    let mut write = async |name: &str, path: String, body: Value, update: bool| {
        let (status, reply) = if update {
            put(&server, &path, &token, body).await
        } else {
            post(&server, &path, &token, body).await
        };
        assert!(status == 200 || status == 201, "{path}: {status} {reply}");
        written.insert(name.to_owned(), stable(reply, &server));
    };

    let issues = format!("/projects/{project}/issues");
    let body = json!({"title": "Crash on start", "description": "It *crashes*.", "labels": "bug,p1",
                      "assignee_ids": [dev.id]});
    write("issue created", issues.clone(), body, false).await;
    let body = json!({"title": "Secret plan", "confidential": true});
    write("confidential issue created", issues.clone(), body, false).await;
    let body = json!({"state_event": "close", "due_date": "2030-01-02", "add_labels": "triaged"});
    write("issue updated", format!("{issues}/1"), body, true).await;
    let notes = format!("{issues}/1/notes");
    write(
        "issue note",
        notes.clone(),
        json!({"body": "Seen it"}),
        false,
    )
    .await;
    let body = json!({"body": "Staff only", "internal": true});
    write("internal issue note", notes.clone(), body, false).await;

    let mrs = format!("/projects/{project}/merge_requests");
    let diff = "--- a/src/main.rs\n+++ b/src/main.rs\n@@ -1 +1 @@\n-old\n+new\n";
    let body = json!({"source_branch": "fix", "target_branch": "main", "title": "Fix crash",
                      "description": "Closes #1", "labels": "bug", "diff": diff});
    write("merge request created", mrs.clone(), body, false).await;
    let body = json!({"title": "Fix the crash", "target_branch": "stable"});
    write("merge request updated", format!("{mrs}/1"), body, true).await;
    let body = json!({"body": "Looks right"});
    write("merge request note", format!("{mrs}/1/notes"), body, false).await;

    let epics = format!("/groups/{group}/epics");
    let body = json!({"title": "Stability", "description": "Fewer crashes", "labels": "q3"});
    write("epic created", epics.clone(), body, false).await;
    let body = json!({"state_event": "close"});
    write("epic updated", format!("{epics}/1"), body, true).await;

    let jobs = format!("/projects/{project}/jobs");
    let body = json!({"name": "lint", "stage": "test", "status": "failed", "ref": "fix",
                      "sha": "abc123", "log": "error: unused variable"});
    write("job imported", format!("{jobs}/import"), body, false).await;

    let epic_id = written["epic created"]["id"].as_i64().unwrap();
    let job_id = written["job imported"]["id"].as_i64().unwrap();
    let pipeline_id = written["job imported"]["pipeline"]["id"].as_i64().unwrap();
    let mut read_back = Map::new();
    for (name, path) in [
        ("issues", format!("{issues}?state=all")),
        ("issues labelled bug", format!("{issues}?labels=bug")),
        ("issue", format!("{issues}/1")),
        ("issue notes oldest first", format!("{notes}?sort=asc")),
        ("merge requests", mrs.clone()),
        ("merge request", format!("{mrs}/1")),
        ("merge request changes", format!("{mrs}/1/changes")),
        ("merge request diffs", format!("{mrs}/1/diffs")),
        ("merge request notes", format!("{mrs}/1/notes")),
        ("epics", epics.clone()),
        ("epic", format!("{epics}/1")),
        ("epic notes", format!("{epics}/{epic_id}/notes")),
        ("pipelines", format!("/projects/{project}/pipelines")),
        (
            "pipeline",
            format!("/projects/{project}/pipelines/{pipeline_id}"),
        ),
        (
            "pipeline jobs",
            format!("/projects/{project}/pipelines/{pipeline_id}/jobs"),
        ),
        ("jobs", format!("{jobs}?scope[]=failed")),
        ("job", format!("{jobs}/{job_id}")),
    ] {
        read_back.insert(name.to_owned(), read(&server, &path, &token).await);
    }
    let trace = reqwest::Client::new()
        .get(server.url(&format!("/api/v4{jobs}/{job_id}/trace")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let content_type = trace.headers()["content-type"].to_str().unwrap().to_owned();
    read_back.insert(
        "job trace".to_owned(),
        json!({"content_type": content_type, "body": trace.text().await.unwrap()}),
    );

    insta::assert_json_snapshot!("written", Value::Object(written));
    insta::assert_json_snapshot!("read_back", Value::Object(read_back));
}

#[tokio::test]
async fn pages_of_a_project_and_its_issues_merge_requests_and_epics() {
    let fx = Fx::new().await;
    let owner = fx.user("owner").await;
    set_password(&fx, owner.id, "correct horse battery").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, owner, access::OWNER).await;
    let project = fx.project(group, "api", "private").await;
    let issue = fx.issue(project, owner, false).await;
    fx.issue(project, owner, true).await;
    let mr = fx.merge_request(project, owner).await;
    let epic = fx.epic(group, owner, false).await;
    fx.note("Issue", issue, owner, false).await;
    fx.note("Issue", issue, owner, true).await;
    fx.note("MergeRequest", mr, owner, false).await;
    fx.note("Epic", epic, owner, false).await;
    let server = Server::start(&fx).await;
    let client = browser();
    sign_in(&client, &server, "owner", "correct horse battery").await;

    let mut pages = Vec::new();
    for path in [
        "/explore/projects",
        "/acme/api",
        "/acme/api/-/issues/1",
        "/acme/api/-/merge_requests/1",
        "/groups/acme/-/epics/1",
    ] {
        let res = client.get(server.url(path)).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path}");
        let html = res.text().await.unwrap();
        // What the page itself shows; the layout around it is not ours here.
        let start = html.find("<main").unwrap();
        let end = html.find("</main>").unwrap() + "</main>".len();
        let mut main = html[start..end].replace(&server.base, BASE);
        // The session's form token changes with every sign-in.
        let csrf = crate::web_sign_in::token_in(&html, "name=\"csrf-token\"");
        main = main.replace(&csrf, "[csrf]");
        pages.push(format!("==== {path}\n{main}"));
    }

    insta::assert_snapshot!("pages", pages.join("\n"));
}
