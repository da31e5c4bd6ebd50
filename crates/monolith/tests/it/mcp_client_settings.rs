//! Duo Workflow using MCP servers: the three switches (the instance's, its
//! allow-list, the top-level group's) through REST, the admin pages and the
//! policy, and the workflow entity's `mcp_enabled` / `mcp_allowed_servers`
//! (REST) and `mcpEnabled` (GraphQL) that follow them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use monolith::config::Realm;
use monolith::policy::{Policy, Subject, WorkflowMcp, access};
use reqwest::Method;
use serde_json::{Value, json};

use crate::rest_support::{api_tokens, get, put, users};
use crate::support::{Fx, Server};
use crate::web_sign_in::{browser, set_password, sign_in, token_in};
use crate::workflows_support::{World, world};

const SETTINGS: &str = "/application/settings";

/// A form-encoded `method` call to `/api/v4{path}`.
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

async fn stored_servers(fx: &Fx) -> (bool, Vec<String>) {
    let c = fx.pool.get().await.unwrap();
    let row = c
        .query_one(
            "SELECT duo_workflow_mcp_enabled, duo_workflow_mcp_allowed_servers FROM instance_settings",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn application_settings_take_the_mcp_switch_and_allow_list_from_admins_only() {
    let fx = Fx::new().await;
    let root = fx.admin("root").await;
    let [alice] = users(&fx, ["alice"]).await;
    let [root_t, alice_t] = api_tokens(&fx, [root, alice]).await;
    let server = Server::start(&fx).await;

    // Off and empty until an admin says otherwise.
    let (status, shown) = get(&server, SETTINGS, &root_t).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["duo_workflow_mcp_enabled"], false);
    assert_eq!(shown["duo_workflow_mcp_allowed_servers"], json!([]));

    let change = json!({
        "duo_workflow_mcp_enabled": true,
        "duo_workflow_mcp_allowed_servers": ["https://mcp.example.com/", " http://127.0.0.1:8931/mcp "],
    });
    // Not an admin: refused, nothing changes.
    assert_eq!(get(&server, SETTINGS, &alice_t).await.0, 403);
    assert_eq!(
        put(&server, SETTINGS, &alice_t, change.clone()).await.0,
        403
    );
    assert_eq!(stored_servers(&fx).await, (false, vec![]));

    let (status, body) = put(&server, SETTINGS, &root_t, change).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["duo_workflow_mcp_enabled"], true);
    let expected = json!(["https://mcp.example.com/", "http://127.0.0.1:8931/mcp"]);
    assert_eq!(body["duo_workflow_mcp_allowed_servers"], expected);
    assert_eq!(
        get(&server, SETTINGS, &root_t).await.1["duo_workflow_mcp_allowed_servers"],
        expected
    );

    // A comma-separated text, as GitLab takes list settings; other settings stay.
    let (status, body) = put(
        &server,
        SETTINGS,
        &root_t,
        json!({"duo_workflow_mcp_allowed_servers": "https://a.example.com/mcp, *"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["duo_workflow_mcp_allowed_servers"],
        json!(["https://a.example.com/mcp", "*"])
    );
    assert_eq!(body["duo_workflow_mcp_enabled"], true, "not sent: kept");

    // Form encoding too, list and switch.
    let (status, body) = form(
        &server,
        Method::PUT,
        SETTINGS,
        &root_t,
        "duo_workflow_mcp_enabled=false&duo_workflow_mcp_allowed_servers[]=https%3A%2F%2Fb.example.com%2F",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (
            &body["duo_workflow_mcp_enabled"],
            &body["duo_workflow_mcp_allowed_servers"]
        ),
        (&json!(false), &json!(["https://b.example.com/"]))
    );

    // Bad entries: 400 saying which and why, and the stored list stays.
    let too_many: Vec<String> = (0..51)
        .map(|i| format!("https://mcp{i}.example.com/"))
        .collect();
    let too_long = format!("https://mcp.example.com/{}", "a".repeat(500));
    for (list, why) in [
        (json!(["ftp://mcp.example.com/"]), "ftp://mcp.example.com/"),
        (json!(["mcp.example.com"]), "http(s) URL"),
        (json!(["https://mcp.example.com/a b"]), "spaces"),
        (json!(["https://mcp.example.com/\u{7}"]), "control"),
        (json!([too_long]), "too long"),
        (json!(too_many), "too many entries"),
        (json!("https://ok.example.com/,nope"), "\"nope\""),
        (json!([1, 2]), "invalid type"),
    ] {
        let (status, body) = put(
            &server,
            SETTINGS,
            &root_t,
            json!({"duo_workflow_mcp_enabled": true, "duo_workflow_mcp_allowed_servers": list}),
        )
        .await;
        assert_eq!(status, 400, "{list}: {body}");
        let message = body["error"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{list}: {body}");
        if why != "invalid type" {
            assert!(
                message.starts_with("duo_workflow_mcp_allowed_servers "),
                "{body}"
            );
        }
        assert_eq!(
            stored_servers(&fx).await,
            (false, vec!["https://b.example.com/".to_owned()]),
            "{list}: nothing saved"
        );
    }

    // An empty list empties it.
    let (status, body) = put(
        &server,
        SETTINGS,
        &root_t,
        json!({"duo_workflow_mcp_allowed_servers": []}),
    )
    .await;
    assert_eq!(
        (status, &body["duo_workflow_mcp_allowed_servers"]),
        (200, &json!([]))
    );
}

#[tokio::test]
async fn group_ai_settings_are_changed_by_owners_of_top_level_groups_only() {
    let fx = Fx::new().await;
    let [owner, dev] = users(&fx, ["owner", "dev"]).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let sub = fx.group(Some(group), "tools", "private", "ultimate").await;
    fx.group_member(group, owner, access::OWNER).await;
    fx.group_member(group, dev, access::DEVELOPER).await;
    let [owner_t, dev_t] = api_tokens(&fx, [owner, dev]).await;
    let server = Server::start(&fx).await;
    let path = format!("/groups/{group}");

    let (_, shown) = get(&server, &path, &dev_t).await;
    assert_eq!(
        shown["ai_settings"],
        json!({"duo_workflow_mcp_enabled": false})
    );

    let on = json!({"ai_settings_attributes": {"duo_workflow_mcp_enabled": true}});
    let (status, _) = put(&server, &path, &dev_t, on.clone()).await;
    assert_eq!(status, 403);
    assert_eq!(
        get(&server, &path, &owner_t).await.1["ai_settings"]["duo_workflow_mcp_enabled"],
        false
    );

    let (status, body) = put(&server, &path, &owner_t, on.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ai_settings"]["duo_workflow_mcp_enabled"], true);
    assert_eq!(body["name"], "acme", "fields not sent stay");
    assert_eq!(
        get(&server, &path, &dev_t).await.1["ai_settings"]["duo_workflow_mcp_enabled"],
        true
    );

    // Rack's nested form keys, as curl --data sends them.
    let (status, body) = form(
        &server,
        Method::PUT,
        &path,
        &owner_t,
        "ai_settings_attributes%5Bduo_workflow_mcp_enabled%5D=false",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ai_settings"]["duo_workflow_mcp_enabled"], false);
    let (status, body) = form(
        &server,
        Method::PUT,
        &path,
        &owner_t,
        "ai_settings_attributes[duo_workflow_mcp_enabled]=true",
    )
    .await;
    assert_eq!(
        (status, &body["ai_settings"]["duo_workflow_mcp_enabled"]),
        (200, &json!(true))
    );

    // A subgroup takes its top-level group's setting: 400, nothing stored.
    let (status, body) = put(&server, &format!("/groups/{sub}"), &owner_t, on).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]["ai_settings.duo_workflow_mcp_enabled"].is_array(),
        "{body}"
    );
    assert_eq!(
        fx.id(
            "SELECT count(*) FROM groups WHERE duo_workflow_mcp_enabled",
            &[]
        )
        .await,
        1
    );
}

// ---- the workflow entity -----------------------------------------------------------

async fn switches(w: &World, instance: bool, group: bool) {
    w.fx.exec(
        "UPDATE instance_settings SET duo_workflow_mcp_enabled = $1,
            duo_workflow_mcp_allowed_servers = '{https://mcp.example.com/,http://127.0.0.1:8931/mcp}'",
        &[&instance],
    )
    .await;
    w.fx.exec(
        "UPDATE groups SET duo_workflow_mcp_enabled = $2 WHERE id = $1",
        &[&w.group, &group],
    )
    .await;
}

async fn mcp_enabled_in_graphql(w: &World, id: i64) -> Value {
    let res = reqwest::Client::new()
        .post(w.server.url("/api/graphql"))
        .bearer_auth(&w.dev_token)
        .json(&json!({
            "query": "query($id: AiDuoWorkflowsWorkflowID) { duoWorkflowWorkflows(workflowId: $id) { nodes { mcpEnabled } } }",
            "variables": {"id": format!("gid://gitlab/Ai::DuoWorkflows::Workflow/{id}")},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    body["data"]["duoWorkflowWorkflows"]["nodes"][0]["mcpEnabled"].clone()
}

#[tokio::test]
async fn the_workflow_entity_enables_mcp_only_when_instance_and_top_level_group_do() {
    let w = world().await;
    let id = w.workflow(&w.dev_token, json!({})).await;
    let path = format!("/ai/duo_workflows/workflows/{id}");
    let allowed = json!(["https://mcp.example.com/", "http://127.0.0.1:8931/mcp"]);

    for (instance, group) in [(false, false), (true, false), (false, true), (true, true)] {
        switches(&w, instance, group).await;
        let on = instance && group;
        let case = format!("instance {instance}, group {group}");
        // What the workflow service reads on every run (an ai_workflows token).
        let token = w.workflow_token(w.dev).await;
        let (status, entity) = get(&w.server, &path, &token).await;
        assert_eq!(status, 200, "{case}: {entity}");
        assert_eq!(entity["mcp_enabled"], on, "{case}");
        let servers = if on { allowed.clone() } else { json!([]) };
        assert_eq!(entity["mcp_allowed_servers"], servers, "{case}");
        // The list and GraphQL agree.
        let (_, list) = get(&w.server, "/ai/duo_workflows/workflows", &w.dev_token).await;
        assert_eq!(list[0]["id"], id);
        assert_eq!(list[0]["mcp_enabled"], on, "{case}: list");
        assert_eq!(list[0]["mcp_allowed_servers"], servers, "{case}: list");
        assert_eq!(mcp_enabled_in_graphql(&w, id).await, on, "{case}: graphql");
    }

    // A new workflow says so at once, and a status change answers alike.
    let (status, created) = crate::rest_support::post(
        &w.server,
        "/ai/duo_workflows/workflows",
        &w.dev_token,
        json!({"project_id": w.project, "goal": "Use the tools"}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        (&created["mcp_enabled"], &created["mcp_allowed_servers"]),
        (&json!(true), &allowed)
    );

    // Duo switched off for the instance: no MCP (and no workflow at all).
    w.fx.exec(
        "UPDATE instance_settings SET duo_features_enabled = false",
        &[],
    )
    .await;
    let c = w.fx.pool.get().await.unwrap();
    let mcp = Policy::mcp_for_workflow(&**c, Subject::Project(w.project))
        .await
        .unwrap();
    assert_eq!(mcp, WorkflowMcp::default());
}

/// `mcp_enabled` for each container, asked in one call.
async fn enabled(fx: &Fx, containers: &[Subject]) -> Vec<bool> {
    let c = fx.pool.get().await.unwrap();
    Policy::mcp_for_workflows(&**c, containers)
        .await
        .unwrap()
        .iter()
        .map(|m| m.enabled)
        .collect()
}

#[tokio::test]
async fn the_top_level_group_and_every_duo_switch_decide_for_each_container() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let root = fx.group(None, "acme", "private", "ultimate").await;
    let sub = fx.group(Some(root), "tools", "private", "ultimate").await;
    let other = fx.group(None, "other", "private", "ultimate").await;
    let other_sub = fx.group(Some(other), "labs", "private", "ultimate").await;
    let in_root = fx.project(root, "app", "private").await;
    let in_sub = fx.project(sub, "cli", "private").await;
    let in_other_sub = fx.project(other_sub, "web", "private").await;
    let duo_off = fx.project(root, "secret", "private").await;
    fx.project_duo(duo_off, false).await;
    fx.exec(
        "UPDATE instance_settings SET duo_workflow_mcp_enabled = true,
            duo_workflow_mcp_allowed_servers = '{*}'",
        &[],
    )
    .await;
    // Only the top-level group's switch counts: a subgroup's own (off under
    // `acme`, on under `other`) is not asked.
    fx.exec(
        "UPDATE groups SET duo_workflow_mcp_enabled = (id = $1 OR id = $2)",
        &[&root, &other_sub],
    )
    .await;
    let containers = [
        Subject::Project(in_root),
        Subject::Project(in_sub),
        Subject::Project(in_other_sub),
        Subject::Project(duo_off),
        Subject::Group(root),
        Subject::Group(sub),
        Subject::Group(other),
        Subject::Group(other_sub),
        Subject::Global,
        Subject::Project(i64::MAX),
        Subject::Issue(1),
        Subject::Project(in_root),
    ];
    assert_eq!(
        enabled(&fx, &containers).await,
        [
            true, true, false, false, true, true, false, false, true, false, false, true
        ]
    );
    let c = fx.pool.get().await.unwrap();
    let one = Policy::mcp_for_workflow(&**c, Subject::Project(in_sub))
        .await
        .unwrap();
    assert_eq!(one.allowed_servers, ["*"]);
    assert!(enabled(&fx, &[]).await.is_empty());

    // Duo off on the subgroup turns it off below, not beside it.
    fx.group_flag(sub, "duo_features_enabled", false).await;
    assert_eq!(
        enabled(
            &fx,
            &[
                Subject::Project(in_sub),
                Subject::Group(sub),
                Subject::Project(in_root)
            ]
        )
        .await,
        [false, false, true]
    );
    // The instance switch off: nowhere, not even outside any group.
    fx.exec(
        "UPDATE instance_settings SET duo_workflow_mcp_enabled = false",
        &[],
    )
    .await;
    assert_eq!(
        enabled(&fx, &[Subject::Project(in_root), Subject::Global]).await,
        [false, false]
    );
    let off = Policy::mcp_for_workflow(&**c, Subject::Global)
        .await
        .unwrap();
    assert!(off.allowed_servers.is_empty(), "no list when not enabled");
}

// ---- the admin pages -----------------------------------------------------------------

const PASSWORD: &str = "correct horse battery";

#[tokio::test]
async fn the_admin_pages_save_the_mcp_switches_and_refuse_a_bad_allow_list() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let root = fx.admin("root").await;
    set_password(&fx, root.id, PASSWORD).await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    let sub = fx.group(Some(group), "tools", "private", "ultimate").await;
    let server = Server::start(&fx).await;
    let admin = browser();
    assert_eq!(
        sign_in(&admin, &server, "root", PASSWORD).await.status(),
        303
    );
    let page = |path: &'static str| {
        let admin = &admin;
        let server = &server;
        async move {
            let res = admin.get(server.url(path)).send().await.unwrap();
            (res.status().as_u16(), res.text().await.unwrap())
        }
    };
    let (status, html) = page("/admin/gitlab_duo").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("Allow Duo Workflow to use MCP servers"),
        "{html}"
    );
    assert!(html.contains("name=\"duo_workflow_mcp_allowed_servers\""));
    let csrf = token_in(&html, "name=\"authenticity_token\"");
    let post = |path: &'static str, fields: Vec<(&'static str, String)>| {
        let admin = &admin;
        let server = &server;
        let csrf = csrf.clone();
        async move {
            let mut all: Vec<(&str, &str)> = vec![("authenticity_token", csrf.as_str())];
            all.extend(fields.iter().map(|(k, v)| (*k, v.as_str())));
            let res = admin
                .post(server.url(path))
                .form(&all)
                .send()
                .await
                .unwrap();
            (res.status().as_u16(), res.text().await.unwrap())
        }
    };

    // Saved: the switch, and the list one entry a line (blank lines dropped).
    let (status, _) = post(
        "/admin/gitlab_duo",
        vec![
            ("duo_features_enabled", "1".into()),
            ("duo_workflow_mcp_enabled", "1".into()),
            (
                "duo_workflow_mcp_allowed_servers",
                "https://mcp.example.com/\r\n\r\n  *  \r\n".into(),
            ),
        ],
    )
    .await;
    assert_eq!(status, 303);
    let saved = (
        true,
        vec!["https://mcp.example.com/".to_owned(), "*".to_owned()],
    );
    assert_eq!(stored_servers(&fx).await, saved);
    let (_, html) = page("/admin/gitlab_duo").await;
    assert!(
        html.contains("https://mcp.example.com/\n*</textarea>"),
        "{html}"
    );
    assert!(
        html.contains("name=\"duo_workflow_mcp_enabled\" value=\"1\" checked"),
        "{html}"
    );

    // Refused: the reason shown, what was entered kept, nothing saved.
    let (status, html) = post(
        "/admin/gitlab_duo",
        vec![
            ("duo_features_enabled", "1".into()),
            (
                "duo_workflow_mcp_allowed_servers",
                "https://ok.example.com/\nftp://nope.example.com/".into(),
            ),
        ],
    )
    .await;
    assert_eq!(status, 422);
    assert!(html.contains("Allowed MCP servers: entry &quot;ftp://nope.example.com/&quot; must be * or an http(s) URL"), "{html}");
    assert!(
        html.contains("https://ok.example.com/\nftp://nope.example.com/</textarea>"),
        "{html}"
    );
    assert_eq!(stored_servers(&fx).await, saved);

    // A form without the list keeps it; the switch unticked turns it off.
    let (status, _) = post(
        "/admin/gitlab_duo",
        vec![("duo_features_enabled", "1".into())],
    )
    .await;
    assert_eq!(status, 303);
    assert_eq!(stored_servers(&fx).await, (false, saved.1.clone()));

    // A full list fits in the form.
    let full: Vec<String> = (0..50)
        .map(|i| format!("https://mcp{i}.example.com/{}", "p".repeat(470)))
        .collect();
    let (status, html) = post(
        "/admin/gitlab_duo",
        vec![("duo_workflow_mcp_allowed_servers", full.join("\n"))],
    )
    .await;
    assert_eq!(status, 303, "{html}");
    assert_eq!(stored_servers(&fx).await.1, full);

    // The group switch, on the switches page: top-level groups only.
    let (_, html) = page("/admin/gitlab_duo/switches").await;
    assert!(
        html.contains(&format!("id=\"switch-group_mcp-{group}\"")),
        "{html}"
    );
    assert!(!html.contains(&format!("id=\"switch-group_mcp-{sub}\"")));
    let switch = |id: i64, enabled: &str| {
        vec![
            ("kind", "group_mcp".to_owned()),
            ("id", id.to_string()),
            ("enabled", enabled.to_owned()),
        ]
    };
    let (status, _) = post("/admin/gitlab_duo/switches", switch(group, "true")).await;
    assert_eq!(status, 303);
    let (status, html) = post("/admin/gitlab_duo/switches", switch(sub, "true")).await;
    assert_eq!(status, 422);
    assert!(
        html.contains("can only be allowed on a top-level group"),
        "{html}"
    );
    assert_eq!(
        fx.id(
            "SELECT count(*) FROM groups WHERE duo_workflow_mcp_enabled",
            &[]
        )
        .await,
        1
    );
    assert_eq!(
        fx.id(
            "SELECT count(*) FROM groups WHERE duo_workflow_mcp_enabled AND id = $1",
            &[&group]
        )
        .await,
        1
    );
}
