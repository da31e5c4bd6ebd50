//! "Duo off means off" for the code index, end to end: pushes with the real
//! `git` client over HTTP, switches turned through the REST API an admin uses
//! (project, group, instance), the real job worker, the real gateway and the
//! fake provider (every embedding call recorded).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use monolith::code_index::indexer::index_project;
use monolith::code_index::{IndexState, store};
use serde_json::json;
use tokio::sync::{Notify, Semaphore};

use crate::agent_support::{Bench, World};
use crate::git_support::{GitClient, clone_url, write};
use crate::rest_support::put;
use crate::support::Server;

const NEEDLE: &str = "src/billing/refund_window.rs";

/// A bench whose monolith also serves HTTP (git, REST) on the bench's
/// repositories, with a worker running the index jobs.
struct Site {
    bench: Bench,
    world: World,
    server: Server,
    admin: String,
    pusher: String,
    worker: Option<job_queue::WorkerHandle>,
}

async fn site() -> Site {
    site_with(true).await
}

/// `worker`: whether a job worker runs the push and index jobs.
async fn site_with(worker: bool) -> Site {
    let bench = Bench::start().await;
    let world = bench.world().await;
    let repositories = bench.config.repositories_dir.display().to_string();
    let server = Server::start_with_settings(
        &bench.fx,
        bench.fx.pool.clone(),
        &[
            ("DUO_REPOSITORIES_DIR", repositories.as_str()),
            ("AI_GATEWAY_URL", bench.gateway_url.as_str()),
        ],
    )
    .await;
    let root = bench.fx.admin("root").await;
    let admin = bench.fx.token(root, &["api"]).await;
    let pusher = bench
        .fx
        .token(world.user, &["read_repository", "write_repository"])
        .await;
    let worker = worker.then(|| {
        monolith::worker::spawn(
            bench.fx.pool.clone(),
            bench.fx.db.url(),
            Arc::new(monolith::chat::jobs::NotYetAvailableResponder),
            "https://docs.gitlab.com".into(),
            monolith::worker::WorkerSettings {
                queue: job_queue::WorkerConfig {
                    poll_interval: Duration::from_millis(50),
                    backoff_base: Duration::from_millis(50),
                    backoff_max: Duration::from_millis(200),
                    ..Default::default()
                },
                retention_every: Duration::from_secs(3600),
                workflows: None,
                code_index: Some(bench.responder.services().code_index.clone()),
                workflow_runs: None,
                review: None,
            },
        )
        .unwrap()
    });
    Site {
        bench,
        world,
        server,
        admin,
        pusher,
        worker,
    }
}

impl Site {
    /// Pushes a first commit with the needle file and a few others to
    /// `gl/app` with `git push` over HTTP.
    async fn push(&self) {
        let git = GitClient::new();
        git.repo_with(
            "app",
            &[
                (
                    NEEDLE,
                    "/// Refunds within 17 days.\npub const REFUND_WINDOW_DAYS: u32 = 17;\n",
                ),
                (
                    "src/http/throttle.rs",
                    "pub struct Throttle { per_minute: u32 }\n",
                ),
                ("README.md", "# App\nSells things, refunds some.\n"),
            ],
        )
        .await;
        let url = clone_url(&self.server.base, "gl/app", Some(&self.pusher));
        git.ok("app", &["push", "-q", &url, "main"]).await;
    }

    /// Another commit pushed on top (a change to index).
    async fn push_change(&self) {
        let git = GitClient::new();
        let url = clone_url(&self.server.base, "gl/app", Some(&self.pusher));
        git.ok("", &["clone", "-q", &url, "app"]).await;
        write(&git.path("app/src/new.rs"), "pub fn brand_new() {}\n");
        git.ok("app", &["add", "-A"]).await;
        git.ok("app", &["commit", "-q", "-m", "More"]).await;
        git.ok("app", &["push", "-q", "origin", "main"]).await;
    }

    /// Waits until no push or index job is pending or running.
    async fn jobs_settled(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let db = self.bench.fx.pool.get().await.unwrap();
            let live: i64 = db
                .query_one(
                    "SELECT count(*) FROM background_jobs
                     WHERE kind IN ('repository_pushed', 'code_index') AND state IN ('pending', 'running')",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if live == 0 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "index jobs never settled"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn chunks(&self) -> i64 {
        let db = self.bench.fx.pool.get().await.unwrap();
        db.query_one(
            "SELECT count(*) FROM code_chunks WHERE project_id = $1",
            &[&self.world.project],
        )
        .await
        .unwrap()
        .get(0)
    }

    async fn status(&self) -> Option<store::IndexStatus> {
        let db = self.bench.fx.pool.get().await.unwrap();
        store::status(&**db, self.world.project).await.unwrap()
    }

    fn embedding_calls(&self) -> usize {
        self.bench
            .fake
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/embeddings"))
            .count()
    }

    /// Turns a switch as an admin does through the API.
    async fn switch(&self, what: &str, on: bool) {
        let (path, body) = match what {
            "project" => (
                format!("/projects/{}", self.world.project),
                json!({ "duo_features_enabled": on }),
            ),
            "group" => (
                format!("/groups/{}", self.world.group),
                json!({ "duo_features_enabled": on }),
            ),
            _ => (
                "/application/settings".to_owned(),
                json!({ "duo_features_enabled": on }),
            ),
        };
        let (status, body) = put(&self.server, &path, &self.admin, body).await;
        assert_eq!(status, 200, "{what}: {body}");
    }

    async fn stop(self) {
        if let Some(worker) = self.worker {
            worker.shutdown().await;
        }
    }
}

#[tokio::test]
async fn a_push_to_a_project_with_duo_off_embeds_nothing_until_duo_is_turned_on() {
    let site = site().await;
    site.switch("project", false).await;
    site.push().await;
    site.jobs_settled().await;
    assert_eq!(site.chunks().await, 0, "a Duo-off project was indexed");
    assert_eq!(site.embedding_calls(), 0, "its code reached the embedder");
    let status = site.status().await.expect("the push is remembered");
    assert_eq!(
        status.last_error_code.as_deref(),
        Some(store::DUO_OFF_CODE),
        "{status:?}"
    );

    // On again: the project is indexed without another push.
    site.switch("project", true).await;
    site.jobs_settled().await;
    let status = site.status().await.unwrap();
    assert_eq!(status.state, IndexState::Ready, "{status:?}");
    assert!(site.chunks().await > 0);
    assert!(site.embedding_calls() > 0);
    site.stop().await;
}

#[tokio::test]
async fn turning_duo_off_for_the_project_its_group_or_the_instance_drops_the_index() {
    let site = site().await;
    site.push().await;
    site.jobs_settled().await;
    assert!(site.chunks().await > 0, "{:?}", site.status().await);
    for what in ["project", "group", "instance"] {
        site.switch(what, false).await;
        // Gone when the API answers, not at some later point.
        assert_eq!(site.chunks().await, 0, "{what} off left chunks");
        let status = site.status().await.unwrap();
        assert_eq!(status.chunk_count, 0);
        assert_eq!(status.indexed_commit, None);

        // A push while it is off embeds nothing.
        site.bench.fake.reset();
        if what == "group" {
            site.push_change().await;
            site.jobs_settled().await;
            assert_eq!(site.chunks().await, 0);
            assert_eq!(site.embedding_calls(), 0, "{what} off: code was embedded");
        }

        site.switch(what, true).await;
        site.jobs_settled().await;
        let status = site.status().await.unwrap();
        assert_eq!(status.state, IndexState::Ready, "{what}: {status:?}");
        assert!(site.chunks().await > 0, "{what} on again: not re-indexed");
        assert!(site.embedding_calls() > 0);
    }
    // Saving a switch that did not change re-indexes nothing.
    site.bench.fake.reset();
    site.switch("project", true).await;
    site.jobs_settled().await;
    assert_eq!(site.embedding_calls(), 0);
    site.stop().await;
}

/// Sits between the monolith and the gateway: tells when a request
/// arrives, and holds each until the test lets one through.
struct HoldingProxy {
    url: String,
    arrived: Arc<Notify>,
    gate: Arc<Semaphore>,
    seen: Arc<AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

#[derive(Clone)]
struct ProxyState {
    target: String,
    arrived: Arc<Notify>,
    gate: Arc<Semaphore>,
    seen: Arc<AtomicUsize>,
}

async fn forward(req: HttpRequest, body: web::Bytes, st: web::Data<ProxyState>) -> HttpResponse {
    st.seen.fetch_add(1, Ordering::SeqCst);
    st.arrived.notify_one();
    st.gate.acquire().await.unwrap().forget();
    let url = format!(
        "{}{}",
        st.target,
        req.uri().path_and_query().map_or("", |p| p.as_str())
    );
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes()).unwrap();
    let mut out = reqwest::Client::new().request(method, url);
    for (name, value) in req.headers() {
        if name != "host" && name != "content-length" {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    let answer = out.body(body.to_vec()).send().await.unwrap();
    let status = answer.status().as_u16();
    let content_type = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let bytes = answer.bytes().await.unwrap();
    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
        .content_type(content_type)
        .body(bytes.to_vec())
}

async fn holding_proxy(target: &str) -> HoldingProxy {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = ProxyState {
        target: target.trim_end_matches('/').to_owned(),
        arrived: Arc::new(Notify::new()),
        gate: Arc::new(Semaphore::new(0)),
        seen: Arc::new(AtomicUsize::new(0)),
    };
    let shared = state.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(shared.clone()))
            .default_service(web::to(forward))
    })
    .workers(1)
    .listen(listener)
    .unwrap()
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    HoldingProxy {
        url,
        arrived: state.arrived,
        gate: state.gate,
        seen: state.seen,
        handle,
    }
}

#[tokio::test]
async fn an_index_run_in_flight_stops_when_duo_is_turned_off() {
    // No worker: the test runs the index itself.
    let site = site_with(false).await;
    // Enough files for several embedding calls (8 chunks a call here).
    let git = GitClient::new();
    let files: Vec<(String, String)> = (0..20)
        .map(|i| {
            (
                format!("src/part_{i}.rs"),
                format!("pub fn part_{i}() -> u32 {{ {i} }}\n"),
            )
        })
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    git.repo_with("app", &refs).await;
    let url = clone_url(&site.server.base, "gl/app", Some(&site.pusher));
    git.ok("app", &["push", "-q", &url, "main"]).await;

    let proxy = holding_proxy(&site.bench.gateway_url).await;
    site.bench
        .fx
        .exec(
            "UPDATE instance_settings SET ai_gateway_url = $1",
            &[&proxy.url],
        )
        .await;
    let index = site.bench.responder.services().code_index.clone();
    let in_flight = index.settings.embed_in_flight;
    let project = site.world.project;
    let run = tokio::spawn(async move { index_project(&index, project).await });
    // The first batch is on its way to the embedder: turn Duo off now.
    proxy.arrived.notified().await;
    site.switch("project", false).await;
    proxy.gate.add_permits(100);
    run.await.unwrap().unwrap();
    // Calls already out (the indexer keeps up to `in_flight` out) go through;
    // none is sent after the switch.
    let seen = proxy.seen.load(Ordering::SeqCst);
    assert!(
        (1..=in_flight).contains(&seen),
        "the run went on embedding after Duo was turned off: {seen} calls"
    );
    assert_eq!(
        site.chunks().await,
        0,
        "the batch in flight was stored anyway"
    );
    let status = site.status().await.unwrap();
    assert_eq!(status.last_error_code.as_deref(), Some(store::DUO_OFF_CODE));
    proxy.handle.stop(false).await;
    site.stop().await;
}
