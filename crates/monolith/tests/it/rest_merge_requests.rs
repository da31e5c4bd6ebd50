//! Merge requests with their diff and notes, and CI pipelines and jobs, over
//! HTTP: GitLab's shapes, validation answers and `read_build` checks.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::rest_support;
use crate::support;

use monolith::policy::access;
use reqwest::Method;
use rest_support::{api_tokens, get, get_with_headers, post, send, strings, users};
use serde_json::json;
use support::{Fx, Server};

const TWO_FILES: &str = "\
diff --git a/src/session.rs b/src/session.rs
index 1111111..2222222 100644
--- a/src/session.rs
+++ b/src/session.rs
@@ -10,3 +10,5 @@ impl Session {
-        return Err(Expired);
+        if self.expired() {
+            return self.refresh();
+        }
diff --git a/src/refresh.rs b/src/refresh.rs
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/src/refresh.rs
@@ -0,0 +1 @@
+pub fn refresh() {}
";

#[tokio::test]
async fn merge_requests_carry_their_diff_and_notes() {
    let fx = Fx::new().await;
    let [dev, reporter, guest] = users(&fx, ["dev", "reporter", "guest"]).await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    fx.group_member(group, guest, access::GUEST).await;
    let project = fx.project(group, "api", "private").await;
    let [dev_t, reporter_t, guest_t] = api_tokens(&fx, [dev, reporter, guest]).await;
    let server = Server::start(&fx).await;
    let mrs = format!("/projects/{project}/merge_requests");
    let new_mr = |source: &str, target: &str, diff: &str| {
        json!({
            "source_branch": source, "target_branch": target, "title": "Refresh sessions",
            "description": "Fixes #1", "labels": "auth", "diff": diff,
        })
    };

    let (status, _) = post(&server, &mrs, &reporter_t, new_mr("fix", "main", TWO_FILES)).await;
    assert_eq!(status, 403, "opening a merge request takes a developer");
    let (status, mr) = post(&server, &mrs, &dev_t, new_mr("fix", "main", TWO_FILES)).await;
    assert_eq!(status, 201, "{mr}");
    assert_eq!(mr["iid"], 1);
    assert_eq!(mr["state"], "opened");
    assert_eq!(mr["labels"], json!(["auth"]));
    assert_eq!(mr["author"]["username"], "dev");
    assert_eq!(mr["references"]["full"], "acme/api!1");
    assert!(
        mr["web_url"]
            .as_str()
            .unwrap()
            .ends_with("/acme/api/-/merge_requests/1")
    );
    let (status, body) = post(&server, &mrs, &dev_t, new_mr("fix", "main", "")).await;
    assert_eq!(status, 409);
    assert_eq!(
        body,
        json!({"message": "Another open merge request already exists for this source branch: !1"})
    );
    let (status, body) = post(&server, &mrs, &dev_t, new_mr("main", "main", "")).await;
    assert_eq!(status, 400);
    assert_eq!(
        body,
        json!({"message": {"validate_branches": ["You can't use same project/branch for source and target"]}})
    );
    let (status, body) = post(&server, &mrs, &dev_t, new_mr("docs", "main", "not a diff")).await;
    assert_eq!(status, 400);
    assert!(body["message"]["diff"].is_array(), "{body}");
    let (status, plain) = post(&server, &mrs, &dev_t, new_mr("docs", "main", "")).await;
    assert_eq!((status, &plain["iid"]), (201, &json!(2)));

    // The stored diff, per file, in both of GitLab's forms.
    let (status, changes) = get(&server, &format!("{mrs}/1/changes"), &reporter_t).await;
    assert_eq!(status, 200, "{changes}");
    assert_eq!(changes["title"], "Refresh sessions");
    assert_eq!(changes["changes_count"], "2");
    assert_eq!(changes["overflow"], false);
    let files = changes["changes"].as_array().unwrap();
    assert_eq!(files[0]["new_path"], "src/session.rs");
    assert_eq!(files[0]["new_file"], false);
    assert!(
        files[0]["diff"]
            .as_str()
            .unwrap()
            .starts_with("@@ -10,3 +10,5 @@")
    );
    assert_eq!(files[1]["new_path"], "src/refresh.rs");
    assert_eq!(files[1]["new_file"], true);
    assert_eq!(files[1]["a_mode"], "0");
    assert_eq!(files[1]["diff"], "@@ -0,0 +1 @@\n+pub fn refresh() {}\n");
    let (status, headers, page) = get_with_headers(
        &server,
        &format!("{mrs}/1/diffs?per_page=1&page=2"),
        &reporter_t,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "2");
    assert_eq!(page.as_array().unwrap().len(), 1);
    assert_eq!(page[0]["new_path"], "src/refresh.rs");
    let (_, empty) = get(&server, &format!("{mrs}/2/changes"), &reporter_t).await;
    assert_eq!(empty["changes"], json!([]));
    // Guests do not read merge requests of a private project.
    let (status, body) = get(&server, &format!("{mrs}/1/changes"), &guest_t).await;
    assert_eq!(
        (status, body),
        (404, json!({"message": "404 Merge Request Not Found"}))
    );

    // Notes.
    let notes = format!("{mrs}/1/notes");
    let (status, note) = post(&server, &notes, &reporter_t, json!({"body": "LGTM"})).await;
    assert_eq!(status, 201, "{note}");
    assert_eq!(note["noteable_type"], "MergeRequest");
    assert_eq!(note["noteable_iid"], 1);
    assert_eq!(note["project_id"], project);
    let (status, body) = post(
        &server,
        &notes,
        &dev_t,
        json!({"body": "psst", "internal": true}),
    )
    .await;
    assert_eq!(status, 400, "no internal notes on merge requests: {body}");
    let (status, _) = post(&server, &notes, &guest_t, json!({"body": "hi"})).await;
    assert_eq!(status, 404);
    let (status, headers, list) = get_with_headers(&server, &notes, &dev_t).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-total"], "1");
    assert_eq!(list[0]["body"], "LGTM");
    assert_eq!(list[0]["author"]["username"], "reporter");

    let (_, opened) = get(&server, &format!("{mrs}?state=opened"), &dev_t).await;
    assert_eq!(opened.as_array().unwrap().len(), 2);
    let (_, merged) = get(&server, &format!("{mrs}?state=merged"), &dev_t).await;
    assert_eq!(merged, json!([]));
}

#[tokio::test]
async fn pipelines_and_jobs_need_read_build() {
    let fx = Fx::new().await;
    let [maint, reporter, guest, outsider] =
        users(&fx, ["maint", "reporter", "guest", "outsider"]).await;
    let group = fx.group(None, "acme", "private", "free").await;
    fx.group_member(group, maint, access::MAINTAINER).await;
    fx.group_member(group, reporter, access::REPORTER).await;
    fx.group_member(group, guest, access::GUEST).await;
    let project = fx.project(group, "api", "private").await;
    let public_group = fx.group(None, "oss", "public", "free").await;
    let public = fx.project(public_group, "lib", "public").await;
    let public_build = fx.build(public).await;
    let [maint_t, reporter_t, guest_t, outsider_t] =
        api_tokens(&fx, [maint, reporter, guest, outsider]).await;
    let server = Server::start(&fx).await;

    let mut pipelines = Vec::new();
    for (name, status, git_ref) in [("rspec", "failed", "main"), ("lint", "success", "fix")] {
        let (code, job) = post(
            &server,
            &format!("/projects/{project}/jobs/import"),
            &maint_t,
            json!({"name": name, "stage": "test", "status": status, "ref": git_ref, "log": "..."}),
        )
        .await;
        assert_eq!(code, 201, "{job}");
        assert_eq!(job["pipeline"]["status"], status);
        pipelines.push(job["pipeline"]["id"].as_i64().unwrap());
    }

    let list = format!("/projects/{project}/pipelines");
    let (status, headers, all) = get_with_headers(&server, &list, &reporter_t).await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(headers["x-total"], "2");
    assert_eq!(all[0]["id"], pipelines[1], "newest first");
    assert_eq!(all[0]["iid"], 2);
    assert_eq!(all[1]["iid"], 1);
    assert_eq!(all[1]["ref"], "main");
    assert!(
        all[1]["web_url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/acme/api/-/pipelines/{}", pipelines[0]))
    );
    let (_, failed) = get(&server, &format!("{list}?status=failed"), &reporter_t).await;
    assert_eq!(failed.as_array().unwrap().len(), 1);
    assert_eq!(failed[0]["id"], pipelines[0]);
    let (_, on_fix) = get(&server, &format!("{list}?ref=fix&sort=asc"), &reporter_t).await;
    assert_eq!(on_fix[0]["id"], pipelines[1]);
    let (status, _) = get(&server, &format!("{list}?status=exploded"), &reporter_t).await;
    assert_eq!(status, 400);
    let (status, one) = get(&server, &format!("{list}/{}", pipelines[0]), &reporter_t).await;
    assert_eq!((status, &one["status"]), (200, &json!("failed")));

    // Readable project without CI access: 403; unreadable project: 404.
    let (status, body) = get(&server, &list, &guest_t).await;
    assert_eq!((status, body), (403, json!({"message": "403 Forbidden"})));
    let (status, _) = get(&server, &format!("/projects/{project}/jobs"), &guest_t).await;
    assert_eq!(status, 403);
    let (status, body) = get(&server, &list, &outsider_t).await;
    assert_eq!(
        (status, body),
        (404, json!({"message": "404 Project Not Found"}))
    );

    // Jobs, filtered by status with GitLab's `scope[]`.
    let jobs = format!("/projects/{project}/jobs");
    let (_, headers, every) = get_with_headers(&server, &jobs, &reporter_t).await;
    assert_eq!(headers["x-total"], "2");
    assert_eq!(every[0]["name"], "lint");
    let (_, failed) = get(&server, &format!("{jobs}?scope[]=failed"), &reporter_t).await;
    assert_eq!(strings(&failed, "name"), vec!["rspec"]);
    let (_, both) = get(
        &server,
        &format!("{jobs}?scope[]=failed&scope[]=success"),
        &reporter_t,
    )
    .await;
    assert_eq!(both.as_array().unwrap().len(), 2);
    let (status, _) = get(&server, &format!("{jobs}?scope=exploded"), &reporter_t).await;
    assert_eq!(status, 400);
    let (status, of_pipeline) = get(
        &server,
        &format!("{list}/{}/jobs", pipelines[1]),
        &reporter_t,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(of_pipeline.as_array().unwrap().len(), 1);
    assert_eq!(of_pipeline[0]["name"], "lint");
    // Another project's pipeline is not found through this one.
    let other_pipeline: i64 = fx
        .id(
            "SELECT pipeline_id FROM ci_builds WHERE id = $1",
            &[&public_build],
        )
        .await;
    let (status, _) = get(
        &server,
        &format!("{list}/{other_pipeline}/jobs"),
        &reporter_t,
    )
    .await;
    assert_eq!(status, 404);

    // Public projects show their CI to anyone.
    let pipelines = format!("/projects/{public}/pipelines");
    let pipelines = send(&server, Method::GET, &pipelines, None, None).await;
    assert_eq!(pipelines.status, 200);
    assert_eq!(pipelines.body.as_array().unwrap().len(), 1);
    let jobs = format!("/projects/{public}/jobs");
    let jobs = send(&server, Method::GET, &jobs, None, None).await;
    assert_eq!(
        (jobs.status, &jobs.body[0]["id"]),
        (200, &json!(public_build))
    );
}
