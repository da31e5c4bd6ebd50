//! The agent's test bench: a fresh database (via `support::Fx`), the fake
//! model provider, the real AI gateway in-process with its Anthropic base URL
//! pointed at the fake, and a small OIDC server publishing the monolith's
//! signing keys, which the gateway trusts. Everything on 127.0.0.1:0.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::PathBuf;

use actix_web::{App, HttpResponse, HttpServer, web};
use fake_provider::FakeProvider;
use monolith::agent::AgentResponder;
use monolith::chat::CompletionJob;
use monolith::chat::completion::ChatAnswer;
use monolith::config::Realm;
use monolith::identity::jwt::KeyRing;
use monolith::policy::Actor;
use uuid::Uuid;

use crate::support::Fx;

pub struct Bench {
    pub fx: Fx,
    pub fake: FakeProvider,
    pub responder: AgentResponder,
    pub gateway_url: String,
    /// This instance's URL (also the token issuer).
    pub external_url: String,
    pub config: monolith::config::Config,
    servers: Vec<actix_web::dev::ServerHandle>,
}

/// One answered question: the answer and the chunks streamed on the way.
pub struct Answered {
    pub answer: ChatAnswer,
    pub chunks: Vec<String>,
    /// The tools the stream said were running, in order.
    pub tools: Vec<String>,
}

/// A world with one licensed user who is a developer of a private project.
pub struct World {
    pub user: Actor,
    pub group: i64,
    pub project: i64,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// The process's key directory, with its first key created exactly once so
/// that tests running in parallel all sign with and publish the same key.
fn shared_key_dir() -> String {
    static DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = crate::support::test_key_dir();
        KeyRing::load_or_create(std::path::Path::new(&dir)).unwrap();
        dir
    })
    .clone()
}

/// A URL nothing listens on.
pub fn closed_url() -> String {
    let (listener, url) = listener();
    drop(listener);
    url
}

impl Bench {
    pub async fn start() -> Bench {
        Self::start_with_gateway(None).await
    }

    /// `gateway_url`: use this URL instead of starting a gateway.
    pub async fn start_with_gateway(gateway_url: Option<String>) -> Bench {
        Self::start_with(gateway_url, &[]).await
    }

    /// The in-process gateway with `gateway_env` added to its settings.
    pub async fn start_with_gateway_env(gateway_env: &[(&str, &str)]) -> Bench {
        Self::start_with(None, gateway_env).await
    }

    async fn start_with(gateway_url: Option<String>, gateway_env: &[(&str, &str)]) -> Bench {
        let fx = Fx::new().await;
        let fake = FakeProvider::start().await.unwrap();
        let mut servers = Vec::new();

        // The monolith's OIDC discovery and JWKS, from the same key directory
        // the responder signs with.
        let key_dir = shared_key_dir();
        let ring = KeyRing::load_or_create(std::path::Path::new(&key_dir)).unwrap();
        let (oidc_listener, external_url) = listener();
        let issuer = external_url.clone();
        let discovery = monolith::identity::jwt::openid_configuration(&issuer);
        let jwks = ring.jwks();
        let oidc = HttpServer::new(move || {
            let discovery = discovery.clone();
            let jwks = jwks.clone();
            App::new()
                .route(
                    "/.well-known/openid-configuration",
                    web::get().to(move || {
                        let body = discovery.clone();
                        async move { HttpResponse::Ok().json(body) }
                    }),
                )
                .route(
                    "/oauth/discovery/keys",
                    web::get().to(move || {
                        let body = jwks.clone();
                        async move { HttpResponse::Ok().json(body) }
                    }),
                )
        })
        .workers(1)
        .listen(oidc_listener)
        .unwrap()
        .run();
        servers.push(oidc.handle());
        tokio::spawn(oidc);

        let gateway_url = match gateway_url {
            Some(url) => url,
            None => {
                let root = repo_root();
                let prompts = root.join("prompts").display().to_string();
                let docs = root.join("docs").display().to_string();
                let fake_url = fake.url();
                let openai_url = fake.openai_base_url();
                let mut env = vec![
                    ("ANTHROPIC_API_KEY", "test-key"),
                    ("ANTHROPIC_BASE_URL", fake_url.as_str()),
                    // Code embeddings from the fake's bag-of-words model.
                    ("OPENAI_BASE_URL", openai_url.as_str()),
                    ("AIGW_CODE_EMBEDDINGS__PROVIDER", "openai"),
                    ("AIGW_CODE_EMBEDDINGS__MODEL", "fake-bow-minilm"),
                    // Admins' self-hosted models (model selection per feature).
                    ("AIGW_CUSTOM_MODELS__ENABLED", "true"),
                    ("AIGW_GITLAB_URL", external_url.as_str()),
                    ("AIGW_PROMPTS_DIR", prompts.as_str()),
                    ("AIGW_DOCS__DIR", docs.as_str()),
                ];
                env.extend_from_slice(gateway_env);
                let config = gateway::Config::for_tests(&env).unwrap();
                let state = gateway::app::AppState::build(config).unwrap();
                let (gateway_listener, url) = listener();
                let server = gateway::app::build_server(state, gateway_listener).unwrap();
                servers.push(server.handle());
                tokio::spawn(server);
                url
            }
        };

        let db_url = fx.db.url().to_owned();
        let (gw, ext) = (gateway_url.clone(), external_url.clone());
        let repositories =
            std::env::temp_dir().join(format!("duo-agent-repositories-{}", Uuid::new_v4()));
        let repositories_dir = repositories.display().to_string();
        let config = monolith::config::Config::from_lookup(|k| match k {
            "DATABASE_URL" => Some(db_url.clone()),
            "AI_GATEWAY_URL" => Some(gw.clone()),
            "DUO_EXTERNAL_URL" => Some(ext.clone()),
            "DUO_SIGNING_KEY_DIR" => Some(key_dir.clone()),
            "DUO_INSTANCE_ID" => Some("11111111-2222-3333-4444-555555555555".into()),
            "DUO_REPOSITORIES_DIR" => Some(repositories_dir.clone()),
            "DUO_CODE_INDEX_EMBED_BATCH" => Some("8".into()),
            "DUO_CODE_INDEX_MAX_ATTEMPTS" => Some("2".into()),
            _ => None,
        })
        .unwrap();
        let responder = AgentResponder::from_config(&config, fx.pool.clone()).unwrap();
        Bench {
            fx,
            fake,
            responder,
            gateway_url,
            external_url,
            config,
            servers,
        }
    }

    /// The repositories the responder reads.
    pub fn repositories(&self) -> monolith::repositories::Repositories {
        monolith::repositories::Repositories::new(self.config.repositories_dir.clone(), 4)
    }

    /// A self-managed Ultimate instance; a user with a Duo Enterprise seat who
    /// is a developer of the private project `gl/app`.
    pub async fn world(&self) -> World {
        let fx = &self.fx;
        fx.instance(Realm::SelfManaged, "ultimate", true).await;
        let user = fx.user("dev").await;
        fx.seat(user, "duo_enterprise", false).await;
        let group = fx.group(None, "gl", "private", "ultimate").await;
        let project = fx.project(group, "app", "private").await;
        fx.project_member(project, user, 30).await;
        World {
            user,
            group,
            project,
        }
    }

    pub async fn issue(
        &self,
        project: i64,
        author: Actor,
        iid: i32,
        title: &str,
        description: &str,
        confidential: bool,
    ) -> i64 {
        self.fx
            .id(
                "INSERT INTO issues (project_id, iid, title, description, author_id, confidential)
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                &[
                    &project,
                    &iid,
                    &title,
                    &description,
                    &author.id,
                    &confidential,
                ],
            )
            .await
    }

    /// A failed CI job (in a failed pipeline on `main`) with this log.
    pub async fn failed_job(&self, project: i64, log: &str) -> i64 {
        let pipeline = self
            .fx
            .id(
                "INSERT INTO ci_pipelines (project_id, ref, sha, status) VALUES ($1, 'main', 'abc', 'failed') RETURNING id",
                &[&project],
            )
            .await;
        self.fx
            .id(
                "INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status, log)
                 VALUES ($1, $2, 'lint', 'test', 'failed', $3) RETURNING id",
                &[&project, &pipeline, &log],
            )
            .await
    }

    /// Stores the question in a new thread and answers it.
    pub async fn ask(&self, user: Actor, content: &str, resource_id: Option<String>) -> Answered {
        self.ask_with(user, content, resource_id, None, self.responder_ref())
            .await
    }

    pub fn responder_ref(&self) -> &AgentResponder {
        &self.responder
    }

    pub async fn ask_with(
        &self,
        user: Actor,
        content: &str,
        resource_id: Option<String>,
        current_file: Option<monolith::chat::CurrentFile>,
        responder: &AgentResponder,
    ) -> Answered {
        let thread_id = self.new_thread(user).await;
        self.ask_in_thread(
            user,
            thread_id,
            content,
            resource_id,
            current_file,
            responder,
        )
        .await
    }

    pub async fn ask_in_thread(
        &self,
        user: Actor,
        thread_id: i64,
        content: &str,
        resource_id: Option<String>,
        current_file: Option<monolith::chat::CurrentFile>,
        responder: &AgentResponder,
    ) -> Answered {
        let job = self
            .store_question(user, thread_id, content, resource_id, current_file)
            .await;
        self.answer(&job, responder, false).await
    }

    /// Asks with the model's answer scripted as [`fake_provider::Scripted::Held`]:
    /// the held part is released once the first piece of text has reached
    /// the chat stream, so the answer arrives in at least two chunks however
    /// the gateway joins what is ready together.
    pub async fn ask_streamed(
        &self,
        user: Actor,
        content: &str,
        current_file: Option<monolith::chat::CurrentFile>,
    ) -> Answered {
        let thread_id = self.new_thread(user).await;
        let job = self
            .store_question(user, thread_id, content, None, current_file)
            .await;
        self.answer(&job, &self.responder, true).await
    }

    async fn new_thread(&self, user: Actor) -> i64 {
        self.fx
            .id(
                "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, 1) RETURNING id",
                &[&user.id],
            )
            .await
    }

    async fn store_question(
        &self,
        user: Actor,
        thread_id: i64,
        content: &str,
        resource_id: Option<String>,
        current_file: Option<monolith::chat::CurrentFile>,
    ) -> CompletionJob {
        let request_id = Uuid::new_v4();
        self.fx
            .exec(
                "INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid)
                 VALUES ($1, 1, $2, $3, $4)",
                &[&thread_id, &content, &Uuid::new_v4(), &request_id],
            )
            .await;
        CompletionJob {
            request_id,
            user_id: user.id,
            thread_id,
            content: content.to_owned(),
            resource_id,
            current_file,
            additional_context: Vec::new(),
            ..Default::default()
        }
    }

    /// Answers the job, collecting the stream's events as they arrive.
    async fn answer(
        &self,
        job: &CompletionJob,
        responder: &AgentResponder,
        release_on_first_text: bool,
    ) -> Answered {
        let (tx, mut rx) = monolith::chat::completion::ChunkSender::channel();
        let answering = responder.answer(job, tx);
        tokio::pin!(answering);
        let (mut chunks, mut tools) = (Vec::new(), Vec::new());
        let mut collect = |event, chunks: &mut Vec<String>| match event {
            monolith::chat::completion::StreamEvent::Text(text) => {
                if release_on_first_text && chunks.is_empty() {
                    self.fake.release();
                }
                chunks.push(text);
            }
            monolith::chat::completion::StreamEvent::Tool(tool) => tools.push(tool),
        };
        let answer = loop {
            tokio::select! {
                answer = &mut answering => break answer.expect("no transient failure"),
                Some(event) = rx.recv() => collect(event, &mut chunks),
            }
        };
        while let Ok(event) = rx.try_recv() {
            collect(event, &mut chunks);
        }
        Answered {
            answer,
            chunks,
            tools,
        }
    }

    /// Every request body the fake provider received, as one string each.
    pub fn provider_bodies(&self) -> Vec<String> {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.method == "POST")
            .map(|r| r.body.to_string())
            .collect()
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.config.repositories_dir);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            for handle in self.servers.drain(..) {
                rt.spawn(async move { handle.stop(false).await });
            }
        }
    }
}

pub fn gid(model: &str, id: i64) -> String {
    monolith::gid::format(model, id)
}

/// Files to write in one commit (`(path, content)`), as the repository
/// writer takes them.
pub fn upserts(files: &[(&str, &str)]) -> Vec<monolith::repositories::writer::FileAction> {
    files
        .iter()
        .map(
            |(path, content)| monolith::repositories::writer::FileAction::Upsert {
                path: (*path).into(),
                content: content.as_bytes().to_vec(),
            },
        )
        .collect()
}
