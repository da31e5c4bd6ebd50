//! `GET /projects/:id/semantic_code_search`, the code index for Duo Workflow's
//! `semantic_code_search` tool: a real index (the real gateway's embeddings,
//! the fake provider's bag-of-words model), the real REST server, real
//! tokens. Readers get chunks without excluded files; everyone else is
//! refused as GitLab refuses.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on setup errors"
)]

use monolith::code_index::indexer::index_project;
use monolith::repositories::writer::{self, CommitRequest, Signature};
use serde_json::Value;

use crate::agent_support::Bench;
use crate::rest_support::{get, send};
use crate::support::Server;

const NEEDLE: &str = "src/billing/refund_window.rs";
const QUERY: &str = "/semantic_code_search?semantic_query=refund%20window%20days";

async fn seeded(bench: &Bench) -> (i64, monolith::policy::Actor) {
    let world = bench.world().await;
    let path = bench
        .repositories()
        .ensure(world.project, "main")
        .await
        .unwrap();
    let files = [
        (
            NEEDLE,
            "/// Customers may ask for their money back within this many days.\npub const REFUND_WINDOW_DAYS: u32 = 17;\n",
        ),
        (
            "secrets/refund_window.env",
            "REFUND_WINDOW_SECRET=hunter2 refund window days\n",
        ),
        (
            "src/http/throttle.rs",
            "pub struct Throttle { per_minute: u32 }\n",
        ),
    ];
    writer::commit(
        &path,
        &CommitRequest {
            branch: "main".into(),
            start: None,
            message: "Seed".into(),
            author: Signature {
                name: "Dev".into(),
                email: "dev@example.com".into(),
                when: None,
            },
            actions: crate::agent_support::upserts(&files),
        },
    )
    .await
    .unwrap();
    bench
        .fx
        .exec(
            "UPDATE projects SET duo_context_exclusion_rules = '{secrets/}' WHERE id = $1",
            &[&world.project],
        )
        .await;
    index_project(&bench.responder.services().code_index, world.project)
        .await
        .unwrap();
    (world.project, world.user)
}

/// The monolith's REST API over the bench's database, repositories and gateway.
pub(crate) async fn server(bench: &Bench) -> Server {
    let repositories = bench.config.repositories_dir.display().to_string();
    Server::start_with_settings(
        &bench.fx,
        bench.fx.pool.clone(),
        &[
            ("AI_GATEWAY_URL", bench.gateway_url.as_str()),
            ("DUO_EXTERNAL_URL", bench.external_url.as_str()),
            ("DUO_REPOSITORIES_DIR", repositories.as_str()),
            ("DUO_INSTANCE_ID", "11111111-2222-3333-4444-555555555555"),
        ],
    )
    .await
}

/// An `ai_workflows` token for `user`, minted as `direct_access` does.
async fn workflow_token(bench: &Bench, user: monolith::policy::Actor) -> String {
    let c = bench.fx.pool.get().await.unwrap();
    monolith::identity::oauth::mint(
        &**c,
        user.id,
        monolith::identity::oauth::USER_TOKEN_LIFETIME,
    )
    .await
    .unwrap()
    .token
}

fn paths(body: &Value) -> Vec<&str> {
    body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_reader_and_their_workflow_token_get_chunks_without_excluded_files() {
    let bench = Bench::start().await;
    let (project, dev) = seeded(&bench).await;
    let server = server(&bench).await;
    let api = bench.fx.token(dev, &["api"]).await;
    let workflow = workflow_token(&bench, dev).await;

    for token in [&api, &workflow] {
        let (status, body) = get(&server, &format!("/projects/{project}{QUERY}"), token).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "ready", "{body}");
        let found = paths(&body);
        assert_eq!(found.first(), Some(&NEEDLE), "{body}");
        assert!(found.iter().all(|p| !p.starts_with("secrets/")), "{body}");
        assert!(!body.to_string().contains("hunter2"), "{body}");
        let first = &body["results"][0];
        assert!(first["start_line"].as_i64().unwrap() >= 1, "{first}");
        assert!(first["end_line"].as_i64() >= first["start_line"].as_i64());
        assert!(first["score"].is_number(), "{first}");
        assert!(
            first["content"]
                .as_str()
                .unwrap()
                .contains("REFUND_WINDOW_DAYS"),
            "{first}"
        );
    }
    // Bounded: the limit is honoured, and an over-large one refused.
    let (_, one) = get(
        &server,
        &format!("/projects/{project}{QUERY}&limit=1"),
        &api,
    )
    .await;
    assert_eq!(paths(&one).len(), 1, "{one}");
    let (status, _) = get(
        &server,
        &format!("/projects/{project}{QUERY}&limit=500"),
        &api,
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = get(
        &server,
        &format!("/projects/{project}/semantic_code_search"),
        &api,
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn outsiders_guests_anonymous_and_duo_off_are_refused_as_gitlab_refuses() {
    let bench = Bench::start().await;
    let (project, dev) = seeded(&bench).await;
    let server = server(&bench).await;
    let path = format!("/projects/{project}{QUERY}");

    let outsider = bench.fx.user("outsider").await;
    bench.fx.seat(outsider, "duo_enterprise", false).await;
    let outsider_api = bench.fx.token(outsider, &["api"]).await;
    let outsider_workflow = workflow_token(&bench, outsider).await;
    let guest = bench.fx.user("guest").await;
    bench.fx.seat(guest, "duo_enterprise", false).await;
    bench.fx.project_member(project, guest, 10).await;
    let guest_api = bench.fx.token(guest, &["api"]).await;

    for token in [&outsider_api, &outsider_workflow, &guest_api] {
        let (status, body) = get(&server, &path, token).await;
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["message"], "404 Project Not Found", "{body}");
    }
    let anonymous = send(&server, reqwest::Method::GET, &path, None, None).await;
    assert!(
        anonymous.status == 401 || anonymous.status == 404,
        "{}",
        anonymous.status
    );
    assert!(
        anonymous.body.get("results").is_none(),
        "{}",
        anonymous.body
    );

    // A reader while Duo is off: refused saying so.
    let api = bench.fx.token(dev, &["api"]).await;
    bench
        .fx
        .exec(
            "UPDATE instance_settings SET duo_features_enabled = false",
            &[],
        )
        .await;
    let (status, body) = get(&server, &path, &api).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.get("results").is_none(), "{body}");
}
