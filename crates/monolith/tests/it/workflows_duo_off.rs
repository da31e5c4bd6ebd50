//! An `ai_workflows` token minted while Duo was on is refused (403) on every
//! GitLab tool endpoint and workflow endpoint of its project once Duo is
//! turned off there: for the project, its group or the instance, through the
//! REST API an admin uses. Real tokens, a real server, a real repository.

use monolith::repositories::writer::{self, CommitRequest, FileAction, Signature};
use reqwest::Method;
use serde_json::{Value, json};

use crate::rest_support::{put, send};
use crate::workflows_support::{World, world};

/// Every tool endpoint of the project (`WORKFLOW_TOOL_ENDPOINTS`), as
/// (method, path, body).
async fn tool_calls(w: &World) -> Vec<(Method, String, Option<Value>)> {
    let issue = w.fx.issue(w.project, w.dev, false).await;
    let mr = w.fx.merge_request(w.project, w.dev).await;
    let build = w.fx.build(w.project).await;
    let db = w.fx.pool.get().await.unwrap();
    let iid = |sql: &'static str, id: i64| {
        let db = &db;
        async move { db.query_one(sql, &[&id]).await.unwrap().get::<_, i32>(0) }
    };
    let issue_iid = iid("SELECT iid FROM issues WHERE id = $1", issue).await;
    let mr_iid = iid("SELECT iid FROM merge_requests WHERE id = $1", mr).await;
    let pipeline: i64 = db
        .query_one("SELECT pipeline_id FROM ci_builds WHERE id = $1", &[&build])
        .await
        .unwrap()
        .get(0);
    let p = w.project;
    vec![
        (
            Method::GET,
            format!("/projects/{p}/issues/{issue_iid}"),
            None,
        ),
        (
            Method::GET,
            format!("/projects/{p}/issues/{issue_iid}/notes"),
            None,
        ),
        (
            Method::POST,
            format!("/projects/{p}/issues/{issue_iid}/notes"),
            Some(json!({"body": "From a workflow"})),
        ),
        (
            Method::GET,
            format!("/projects/{p}/merge_requests/{mr_iid}"),
            None,
        ),
        (
            Method::POST,
            format!("/projects/{p}/merge_requests"),
            Some(
                json!({"title": "From a workflow", "source_branch": "feature", "target_branch": "main"}),
            ),
        ),
        (
            Method::GET,
            format!("/projects/{p}/pipelines/{pipeline}/jobs"),
            None,
        ),
        (
            Method::GET,
            format!("/projects/{p}/repository/files/README.md/raw?ref=main"),
            None,
        ),
    ]
}

async fn readme(w: &World) {
    let repositories = monolith::repositories::Repositories::new(w.server.repositories.clone(), 4);
    let path = repositories.ensure(w.project, "main").await.unwrap();
    writer::commit(
        &path,
        &CommitRequest {
            branch: "main".into(),
            start: None,
            message: "Readme".into(),
            author: Signature {
                name: "Dev".into(),
                email: "dev@example.com".into(),
                when: None,
            },
            actions: vec![FileAction::Upsert {
                path: "README.md".into(),
                content: b"# App\n".to_vec(),
            }],
        },
    )
    .await
    .unwrap();
}

async fn switch(w: &World, what: &str, on: bool) {
    let path = match what {
        "project" => format!("/projects/{}", w.project),
        "group" => format!("/groups/{}", w.group),
        _ => "/application/settings".to_owned(),
    };
    let (status, body) = put(
        &w.server,
        &path,
        &w.admin_token,
        json!({ "duo_features_enabled": on }),
    )
    .await;
    assert_eq!(status, 200, "{what}: {body}");
}

#[tokio::test]
async fn a_workflow_token_is_refused_on_every_tool_endpoint_once_duo_is_off() {
    let w = world().await;
    readme(&w).await;
    let workflow = w.workflow(&w.dev_token, json!({})).await;
    let token = w.workflow_token(w.dev).await;
    let calls = tool_calls(&w).await;

    // Duo on: each endpoint answers the token (as its user).
    for (method, path, body) in &calls {
        let reply = send(&w.server, method.clone(), path, Some(&token), body.clone()).await;
        assert!(
            reply.status != 403 && reply.status < 500,
            "{method} {path} with Duo on: {} {}",
            reply.status,
            reply.body
        );
    }
    let shown = send(
        &w.server,
        Method::GET,
        &format!("/ai/duo_workflows/workflows/{workflow}"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(shown.status, 200, "{}", shown.body);

    for what in ["project", "group", "instance"] {
        switch(&w, what, false).await;
        for (method, path, body) in &calls {
            let reply = send(&w.server, method.clone(), path, Some(&token), body.clone()).await;
            assert_eq!(
                reply.status, 403,
                "{what} off: {method} {path} answered {} {}",
                reply.status, reply.body
            );
            let message = reply.body["message"].as_str().unwrap_or_default();
            assert!(message.contains("Duo"), "{what} off: {message}");
        }
        // The workflow's own endpoints too.
        for (method, path) in [
            (
                Method::GET,
                format!("/ai/duo_workflows/workflows/{workflow}"),
            ),
            (
                Method::GET,
                format!("/ai/duo_workflows/workflows/{workflow}/checkpoints"),
            ),
        ] {
            let reply = send(&w.server, method.clone(), &path, Some(&token), None).await;
            assert_eq!(
                reply.status, 403,
                "{what} off: {method} {path}: {}",
                reply.body
            );
        }
        switch(&w, what, true).await;
        let reply = send(&w.server, Method::GET, &calls[0].1, Some(&token), None).await;
        assert_eq!(reply.status, 200, "{what} on again: {}", reply.body);
    }

    // The user's own `api` token is not a workflow's: it still reads the
    // project with Duo off (Duo off stops AI, not people).
    switch(&w, "project", false).await;
    let reply = send(
        &w.server,
        Method::GET,
        &calls[0].1,
        Some(&w.dev_token),
        None,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test]
async fn a_workflow_token_learns_nothing_about_a_private_project_it_cannot_read() {
    let w = world().await;
    let hidden = w.fx.project(w.group, "hidden", "private").await;
    let issue = w.fx.issue(hidden, w.admin, false).await;
    let token = w.workflow_token(w.dev).await;
    let path = format!("/projects/{hidden}/issues/1");
    let on = send(&w.server, Method::GET, &path, Some(&token), None).await;
    w.fx.project_duo(hidden, false).await;
    let off = send(&w.server, Method::GET, &path, Some(&token), None).await;
    assert_eq!(on.status, 404, "{}", on.body);
    assert_eq!((off.status, off.body), (on.status, on.body));
    assert!(issue > 0);
}
