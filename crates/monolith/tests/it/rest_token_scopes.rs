//! What each personal access token scope may read through the REST API, over
//! real HTTP with tokens made by the project's own token code: `api` and
//! `read_api` read everything; `read_repository` reads repositories only,
//! `read_user` users only; `ai_features`, `write_repository` and `sudo` alone
//! read nothing (403 `insufficient_scope`, as GitLab answers), not even what
//! an anonymous visitor may; a Duo Workflow token reads where its tools call.
//! The admin endpoints (settings, seats) need an `api` token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::rest_support;
use crate::support;

use monolith::config::Realm;
use monolith::policy::access;
use reqwest::Method;
use rest_support::{get, post, put, send};
use serde_json::{Value, json};
use support::{Fx, Server};

/// Who may read an endpoint, by the route's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Issues, merge requests, notes, epics, CI, projects, groups: `api` or
    /// `read_api`; anonymous visitors read what is public.
    Resource,
    /// Members: `api` or `read_api`, and a signed-in caller.
    SignedIn,
    /// Repository endpoints: also `read_repository`.
    Repository,
    /// User endpoints: also `read_user`; signed in.
    User,
}

/// The scopes a test token is made with; `anonymous` sends none.
const CALLERS: &[&str] = &[
    "anonymous",
    "api",
    "read_api",
    "read_repository",
    "read_user",
    "ai_features",
    "write_repository",
    "sudo",
    "ai_workflows",
];

/// What `caller` is answered on an endpoint of `kind`; `tool` is whether the
/// workflow service's tools call it.
fn expected(kind: Kind, caller: &str, tool: bool) -> u16 {
    match (caller, kind) {
        ("api" | "read_api", _) => 200,
        ("read_repository", Kind::Repository) | ("read_user", Kind::User) => 200,
        ("ai_workflows", _) if tool => 200,
        ("anonymous", Kind::Resource | Kind::Repository) => 200,
        ("anonymous", Kind::SignedIn | Kind::User) => 401,
        _ => 403,
    }
}

/// The `scope` GitLab's 403 body names for an endpoint of `kind`.
fn wanted_scope(kind: Kind) -> &'static str {
    match kind {
        Kind::Repository => "api read_api read_repository",
        Kind::User => "api read_api read_user",
        Kind::Resource | Kind::SignedIn => "api read_api",
    }
}

struct World {
    fx: Fx,
    server: Server,
    project: i64,
    group: i64,
    pipeline: i64,
    /// An `api` token of the owner.
    owner_api: String,
    /// The owner's token per caller in [`CALLERS`] (none for `anonymous`).
    tokens: Vec<(&'static str, Option<String>)>,
}

/// A public group and project owned by alice, with one of every kind of
/// resource, and a token of each scope for her.
async fn world() -> World {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let alice = fx.user("alice").await;
    let group = fx.group(None, "acme", "public", "ultimate").await;
    fx.group_member(group, alice, access::OWNER).await;
    let project = fx.project(group, "site", "public").await;
    let issue = fx.issue(project, alice, false).await;
    fx.note("Issue", issue, alice, false).await;
    fx.merge_request(project, alice).await;
    fx.epic(group, alice, false).await;
    let build = fx.build(project).await;
    let pipeline = fx
        .id("SELECT pipeline_id FROM ci_builds WHERE id = $1", &[&build])
        .await;
    let server = Server::start(&fx).await;
    let owner_api = fx.token(alice, &["api"]).await;
    let mut tokens = Vec::new();
    for caller in CALLERS {
        let token = match *caller {
            "anonymous" => None,
            "ai_workflows" => {
                let db = fx.pool.get().await.unwrap();
                let minted = monolith::identity::oauth::mint(
                    &**db,
                    alice.id,
                    monolith::identity::oauth::USER_TOKEN_LIFETIME,
                )
                .await
                .unwrap();
                Some(minted.token)
            }
            scope => Some(fx.token(alice, &[scope]).await),
        };
        tokens.push((*caller, token));
    }
    let world = World {
        fx,
        server,
        project,
        group,
        pipeline,
        owner_api,
        tokens,
    };
    // A file, so that repository reads have something to answer.
    let (status, body) = post(
        &world.server,
        &format!("/projects/{project}/repository/files/README.md"),
        &world.owner_api,
        json!({ "branch": "main", "content": "# Site\n", "commit_message": "Start" }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    world
}

#[tokio::test]
async fn each_scope_reads_only_what_it_is_for() {
    let w = world().await;
    let (p, g, pl) = (w.project, w.group, w.pipeline);
    // One representative read per resource kind; `true` marks the endpoints
    // the workflow service's tools call.
    let endpoints: Vec<(String, Kind, bool)> = vec![
        ("/projects".into(), Kind::Resource, false),
        (format!("/projects/{p}"), Kind::Resource, false),
        (format!("/projects/{p}/issues"), Kind::Resource, false),
        (format!("/projects/{p}/issues/1"), Kind::Resource, true),
        (
            format!("/projects/{p}/issues/1/notes"),
            Kind::Resource,
            true,
        ),
        (
            format!("/projects/{p}/merge_requests"),
            Kind::Resource,
            false,
        ),
        (
            format!("/projects/{p}/merge_requests/1"),
            Kind::Resource,
            true,
        ),
        (format!("/groups/{g}/epics"), Kind::Resource, false),
        (format!("/groups/{g}/epics/1"), Kind::Resource, false),
        (format!("/projects/{p}/pipelines"), Kind::Resource, false),
        (
            format!("/projects/{p}/pipelines/{pl}/jobs"),
            Kind::Resource,
            true,
        ),
        (format!("/projects/{p}/jobs"), Kind::Resource, false),
        ("/groups".into(), Kind::Resource, false),
        (format!("/groups/{g}"), Kind::Resource, false),
        (format!("/projects/{p}/members"), Kind::SignedIn, false),
        (format!("/groups/{g}/members"), Kind::SignedIn, false),
        (
            format!("/projects/{p}/repository/tree"),
            Kind::Repository,
            false,
        ),
        (
            format!("/projects/{p}/repository/files/README.md?ref=main"),
            Kind::Repository,
            false,
        ),
        (
            format!("/projects/{p}/repository/files/README.md/raw?ref=main"),
            Kind::Repository,
            true,
        ),
        (
            format!("/projects/{p}/repository/commits"),
            Kind::Repository,
            false,
        ),
        (
            format!("/projects/{p}/repository/branches"),
            Kind::Repository,
            false,
        ),
        ("/user".into(), Kind::User, false),
        ("/users".into(), Kind::User, false),
    ];
    let mut failures = Vec::new();
    for (path, kind, tool) in &endpoints {
        for (caller, token) in &w.tokens {
            let reply = send(&w.server, Method::GET, path, token.as_deref(), None).await;
            let want = expected(*kind, caller, *tool);
            if reply.status != want {
                failures.push(format!(
                    "{caller} GET {path}: {} (wanted {want}) {}",
                    reply.status, reply.body
                ));
                continue;
            }
            if want == 403 {
                let body = json!({
                    "error": "insufficient_scope",
                    "error_description": "The request requires higher privileges than provided by the access token.",
                    "scope": wanted_scope(*kind),
                });
                if reply.body != body {
                    failures.push(format!("{caller} GET {path}: body {}", reply.body));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn write_scopes_are_unchanged_and_a_refused_read_leaves_nothing_behind() {
    let w = world().await;
    let token = |scope: &str| {
        w.tokens
            .iter()
            .find(|(c, _)| *c == scope)
            .and_then(|(_, t)| t.clone())
            .unwrap()
    };
    let p = w.project;
    // Writing needs `api`; `read_api` and `ai_features` are refused.
    for scope in [
        "read_api",
        "ai_features",
        "read_repository",
        "write_repository",
    ] {
        let (status, body) = post(
            &w.server,
            &format!("/projects/{p}/issues"),
            &token(scope),
            json!({ "title": "Not mine to write" }),
        )
        .await;
        assert_eq!(status, 403, "{scope}: {body}");
        assert_eq!(body["error"], "insufficient_scope", "{scope}: {body}");
    }
    let (status, body) = post(
        &w.server,
        &format!("/projects/{p}/issues"),
        &token("api"),
        json!({ "title": "Mine" }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    // A workflow run's token writes a note where its tool does, and nowhere else.
    let (status, body) = post(
        &w.server,
        &format!("/projects/{p}/issues/1/notes"),
        &token("ai_workflows"),
        json!({ "body": "From the agent" }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = post(
        &w.server,
        &format!("/projects/{p}/issues"),
        &token("ai_workflows"),
        json!({ "title": "Not a tool" }),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let titles =
        w.fx.id(
            "SELECT count(*) FROM issues WHERE title IN ('Not mine to write', 'Not a tool')",
            &[],
        )
        .await;
    assert_eq!(titles, 0);
    // `read_api` reads the issue `api` wrote; `ai_features` does not.
    let (status, _) = get(
        &w.server,
        &format!("/projects/{p}/issues/2"),
        &token("read_api"),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = get(
        &w.server,
        &format!("/projects/{p}/issues/2"),
        &token("ai_features"),
    )
    .await;
    assert_eq!(
        (status, &body["error"]),
        (403, &json!("insufficient_scope"))
    );
}

#[tokio::test]
async fn admin_settings_and_seats_need_an_api_token() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let root = fx.admin("root").await;
    let alice = fx.user("alice").await;
    let ai_only = fx.token(root, &["ai_features"]).await;
    let read_api = fx.token(root, &["read_api"]).await;
    let api = fx.token(root, &["api"]).await;
    let server = Server::start(&fx).await;
    let settings =
        json!({ "duo_features_enabled": false, "ai_gateway_url": "http://gateway.evil.example" });
    let seat = json!({ "user_id": alice.id });

    for token in [&ai_only, &read_api] {
        let (status, body) = put(&server, "/application/settings", token, settings.clone()).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["error"], "insufficient_scope", "{body}");
        assert_eq!(body["scope"], "api", "{body}");
        let (status, body) = post(
            &server,
            "/add_on_purchases/duo_pro/assignments",
            token,
            seat.clone(),
        )
        .await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["error"], "insufficient_scope", "{body}");
    }
    // Reading the settings is not for `ai_features` either.
    let (status, body) = get(&server, "/application/settings", &ai_only).await;
    assert_eq!(
        (status, &body["error"]),
        (403, &json!("insufficient_scope"))
    );
    let unchanged = fx
        .id(
            "SELECT count(*) FROM instance_settings WHERE duo_features_enabled AND ai_gateway_url IS DISTINCT FROM 'http://gateway.evil.example'",
            &[],
        )
        .await;
    assert_eq!(unchanged, 1);
    let seats = fx
        .id("SELECT count(*) FROM add_on_seat_assignments", &[])
        .await;
    assert_eq!(seats, 0);

    // The admin's `api` token does both.
    let (status, body) = put(&server, "/application/settings", &api, settings).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["duo_features_enabled"], false);
    let (status, body) = post(&server, "/add_on_purchases/duo_pro/assignments", &api, seat).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["user_id"], Value::from(alice.id));
}
