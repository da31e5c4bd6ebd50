//! Harness for the end-to-end tests: starts the real `duo-gateway` and
//! `duo-monolith` (web and worker) processes on a database of their own, with
//! the fake model provider (in this process, so tests can script answers and
//! read the requests the gateway made) standing in for Anthropic.
//!
//! Everything is driven through public interfaces only: GraphQL over HTTP and
//! WebSocket ([`live`]), and the REST API for fixtures.

pub mod browser;
pub mod live;

use fake_provider::FakeProvider;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a service may take to start, and an answer to arrive.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("database: {0}")]
    Db(#[from] devdb::DevDbError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Failed(String),
}

pub type Result<T> = std::result::Result<T, HarnessError>;

/// The interpreter of the project's cached Python environment
/// (`scripts/python-env.sh`, which installs it when missing).
pub fn python() -> Result<String> {
    let env = std::process::Command::new("bash")
        .arg(repo_root().join("scripts/python-env.sh"))
        .output()?;
    if !env.status.success() {
        return Err(HarnessError::Failed(format!(
            "scripts/python-env.sh failed: {}",
            String::from_utf8_lossy(&env.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&env.stdout).trim().to_owned())
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The path of a workspace executable in the profile directory this program
/// runs from (`target/<profile>`). `./dev test` builds every package's binaries
/// (each has integration tests); a missing one is built here.
pub fn binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // Test binaries live in `target/<profile>/deps`, programs (the benches)
    // in `target/<profile>` itself.
    let profile_dir = exe
        .parent()
        .and_then(|dir| {
            if dir.file_name().is_some_and(|n| n == "deps") {
                dir.parent()
            } else {
                Some(dir)
            }
        })
        .ok_or_else(|| HarnessError::Failed("test binary has no target directory".into()))?;
    let path = profile_dir.join(name);
    if !path.exists() {
        let package = match name {
            "duo-gateway" => "gateway",
            "duo-monolith" => "monolith",
            "duo-local-llm" => "local-llm",
            "duo-workflow-executor" => "workflow-executor",
            other => other,
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        // Build into the profile this program runs from (a release bench
        // needs release services).
        let mut args = vec!["build", "-p", package, "--bin", name];
        let mut command = std::process::Command::new(cargo);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            args.push("--release");
            // The flags of every release build (the gateway's profile), so
            // that this build shares the crates `./dev` compiled.
            let flags =
                std::process::Command::new(repo_root().join("scripts/release-rustflags.sh"))
                    .output()?;
            if flags.status.success() {
                command.env("RUSTFLAGS", String::from_utf8_lossy(&flags.stdout).trim());
            }
        }
        let status = command.args(&args).current_dir(repo_root()).status()?;
        if !status.success() || !path.exists() {
            return Err(HarnessError::Failed(format!(
                "{name} is not built and `cargo build -p {package}` failed"
            )));
        }
    }
    Ok(path)
}

/// The local model server's binary and its models directory (the
/// repository's `.models/`), the weights fetched first if missing.
pub async fn local_model_server() -> Result<(PathBuf, PathBuf)> {
    let binary = binary("duo-local-llm")?;
    let models = repo_root().join(".models");
    let fetched = tokio::process::Command::new(&binary)
        .arg("fetch-models")
        .env("DUO_MODELS_DIR", &models)
        .current_dir(repo_root())
        .output()
        .await?;
    if !fetched.status.success() {
        return Err(HarnessError::Failed(format!(
            "fetching the model weights failed: {}",
            String::from_utf8_lossy(&fetched.stderr)
        )));
    }
    Ok((binary, models))
}

/// A free loopback port (bound, read, released).
/// The `grpc.health.v1.Health/Check` status of a whole gRPC server at `base`
/// (`http://host:port`, plaintext HTTP/2): 1 is SERVING, 2 NOT_SERVING.
/// Spoken by hand (one empty request message, one small answer) so the tests
/// need no gRPC client.
pub async fn grpc_health(base: &str) -> Result<u8> {
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(5))
        .build()?;
    let response = client
        .post(format!("{base}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        // Not compressed, length 0: HealthCheckRequest { service: "" }.
        .body(vec![0u8; 5])
        .send()
        .await?;
    let body = response.bytes().await?;
    // The 5-byte frame header, then field 1 (status) as a one-byte varint.
    match body.get(5..) {
        Some([0x08, status]) => Ok(*status),
        _ => Err(HarnessError::Failed(format!(
            "not a health answer from {base}: {body:?}"
        ))),
    }
}

/// A port free right now for a server of the system under test. Taken
/// below the kernel's ephemeral range when it can be: a port the kernel
/// handed out for `bind(0)` and that was released goes back into the pool
/// outgoing connections draw from (the web role's PostgreSQL connections,
/// say), so the server meant to listen on it could find it taken.
pub fn free_port() -> Result<u16> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    const LOWEST: u16 = 10_000;
    if ephemeral_low > LOWEST + 1_000 {
        let span = u64::from(ephemeral_low - LOWEST);
        // Spread by process and call, so parallel harnesses rarely try the same.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::from(d.subsec_nanos()))
            .unwrap_or(0);
        let seed = u64::from(std::process::id()).wrapping_mul(7_919) ^ nanos;
        for _ in 0..64 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let offset = seed.wrapping_add(n.wrapping_mul(104_729)) % span;
            let Ok(port) = u16::try_from(u64::from(LOWEST) + offset) else {
                continue;
            };
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// One running child process, its output kept for diagnostics.
pub struct Service {
    pub name: &'static str,
    child: Child,
    /// Lines from stderr and stdout, in arrival order.
    log: Arc<Mutex<Vec<String>>>,
    /// Lines from stdout alone (where JSON logs go).
    stdout: Arc<Mutex<Vec<String>>>,
    /// The tasks copying stdout and stderr into the logs: awaited after the
    /// process exits, so its last lines are in before anyone reads them.
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// Started as the leader of its own process group, which is killed
    /// whole when this is dropped.
    group_leader: bool,
}

impl Drop for Service {
    fn drop(&mut self) {
        // A process that starts others (chromedriver starts Chromium) is
        // killed with everything it started: killed alone, its children
        // would live on, adopted by init (a test run once left 289
        // Chromium processes behind, slowing every later benchmark).
        if self.group_leader
            && let Some(pid) = self.child.id()
        {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Service {
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[&str],
        env: &[(String, String)],
    ) -> Result<Self> {
        Self::spawn_in(name, program, args, env, &repo_root())
    }

    /// Like [`Service::spawn`], as the leader of a process group of its
    /// own: dropped, it is killed with every process it started.
    pub fn spawn_group(
        name: &'static str,
        program: &Path,
        args: &[&str],
        env: &[(String, String)],
    ) -> Result<Self> {
        Self::start(name, program, args, env, &repo_root(), true)
    }

    /// [`Service::spawn_group`] in the working directory `cwd`.
    pub fn spawn_group_in(
        name: &'static str,
        program: &Path,
        args: &[&str],
        env: &[(String, String)],
        cwd: &Path,
    ) -> Result<Self> {
        Self::start(name, program, args, env, cwd, true)
    }

    /// Like [`Service::spawn`], in the working directory `cwd`.
    pub fn spawn_in(
        name: &'static str,
        program: &Path,
        args: &[&str],
        env: &[(String, String)],
        cwd: &Path,
    ) -> Result<Self> {
        Self::start(name, program, args, env, cwd, false)
    }

    fn start(
        name: &'static str,
        program: &Path,
        args: &[&str],
        env: &[(String, String)],
        cwd: &Path,
        group_leader: bool,
    ) -> Result<Self> {
        let mut command = Command::new(program);
        if group_leader {
            command.process_group(0);
        }
        command
            .args(args)
            .current_dir(cwd)
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(stderr) = child.stderr.take() {
            readers.push(keep_lines(stderr, vec![log.clone()]));
        }
        if let Some(out) = child.stdout.take() {
            readers.push(keep_lines(out, vec![log.clone(), stdout.clone()]));
        }
        Ok(Self {
            name,
            child,
            log,
            stdout,
            readers,
            group_leader,
        })
    }

    /// Every line this process wrote to stdout so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The last lines this process wrote (stderr and stdout).
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log.lock().map(|l| l.clone()).unwrap_or_default();
        log[log.len().saturating_sub(lines)..].join("\n")
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log
            .lock()
            .map(|l| l.iter().any(|line| line.contains(needle)))
            .unwrap_or(false)
    }

    /// The operating system's id of the process (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Polls `url` until it answers 2xx; fails early if the process exits.
    pub async fn wait_ready(&mut self, http: &reqwest::Client, url: &str) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(resp) = http.get(url).send().await
                && resp.status().is_success()
            {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(HarnessError::Failed(format!(
                    "{} exited ({status}) before it was ready:\n{}",
                    self.name,
                    self.log_tail(30)
                )));
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Failed(format!(
                    "{} not ready at {url}:\n{}",
                    self.name,
                    self.log_tail(30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the process at once, as a crash would (SIGKILL).
    pub async fn kill(&mut self) -> Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// Asks the process to stop, as an orchestrator does (SIGTERM).
    pub fn terminate(&self) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| HarnessError::Failed(format!("{} is not running", self.name)))?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        if !status.success() {
            return Err(HarnessError::Failed(format!("kill -TERM {pid} failed")));
        }
        Ok(())
    }

    /// Waits for the process to exit on its own; fails after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Result<std::process::ExitStatus> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                // The pipes close at exit; read what is still in them. (A
                // process it started and left running could hold them open:
                // bounded, then the lines read so far.)
                let readers = std::mem::take(&mut self.readers);
                let _ = tokio::time::timeout(
                    READERS_DRAIN_LIMIT,
                    futures_util::future::join_all(readers),
                )
                .await;
                Ok(status)
            }
            Err(_) => Err(HarnessError::Failed(format!(
                "{} still running after {limit:?}:\n{}",
                self.name,
                self.log_tail(30)
            ))),
        }
    }
}

/// How long [`Service::wait_exit`] waits for an exited process's last lines.
const READERS_DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// Reads `stream` line by line into each of `sinks` until it ends.
fn keep_lines(
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    sinks: Vec<Arc<Mutex<Vec<String>>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            for sink in &sinks {
                if let Ok(mut sink) = sink.lock() {
                    sink.push(line.clone());
                }
            }
        }
    })
}

/// A seeded demo user (`duo-monolith seed --json`).
#[derive(Debug, Clone)]
pub struct DemoUser {
    pub username: String,
    pub token: String,
    /// Password for the web pages.
    pub password: String,
}

/// The whole system for one test.
pub struct System {
    pub db: devdb::TestDb,
    pub fake: FakeProvider,
    pub gateway: Service,
    pub web: Service,
    /// The `worker` process; `None` when the web process runs the jobs
    /// ([`Options::web_runs_jobs`]).
    pub worker: Option<Service>,
    pub gateway_url: String,
    /// The Duo Workflow gRPC service inside the gateway.
    pub workflow_url: String,
    pub web_url: String,
    /// The extra `web` replicas and their URLs ([`Options::extra_web_replicas`]).
    pub replicas: Vec<(Service, String)>,
    /// The `worker` processes beyond the first ([`Options::extra_workers`]).
    pub extra_workers: Vec<Service>,
    pub users: Vec<DemoUser>,
    pub http: reqwest::Client,
    /// Where the monolith keeps this system's repositories.
    pub repositories: PathBuf,
    monolith_env: Vec<(String, String)>,
    gateway_env: Vec<(String, String)>,
    _scratch: ScratchDir,
}

/// A directory removed on drop (signing keys of one system).
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

static SYSTEM_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Extra settings for one system.
#[derive(Debug, Default, Clone)]
pub struct Options {
    pub gateway_env: Vec<(String, String)>,
    pub monolith_env: Vec<(String, String)>,
    /// `web` processes beyond the first, each on its own port, one database.
    pub extra_web_replicas: usize,
    /// `worker` processes beyond the first, claiming from the same queue.
    pub extra_workers: usize,
    /// Point the gateway at this OpenAI-compatible base URL (the real local
    /// model server) instead of the fake provider's Anthropic endpoint.
    pub local_model_url: Option<String>,
    /// No `worker` process: the `web` process runs the jobs itself
    /// (`DUO_WEB_RUNS_JOBS`).
    pub web_runs_jobs: bool,
    /// Categorise each chat question (a second model call per answer). Off
    /// by default: a test's scripted model answers must go to the answers.
    pub categorize_questions: bool,
}

impl System {
    pub async fn start() -> Result<Self> {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> Result<Self> {
        let gateway_bin = binary("duo-gateway")?;
        let monolith_bin = binary("duo-monolith")?;
        let db = devdb::TestDb::with_sql("SELECT 1").await?;
        let fake = FakeProvider::start().await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?;

        let scratch = std::env::temp_dir().join(format!(
            "duo-e2e-{}-{}",
            std::process::id(),
            SYSTEM_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&scratch)?;
        let scratch = ScratchDir(scratch);

        let web_port = free_port()?;
        let gateway_port = free_port()?;
        let workflow_port = free_port()?;
        let web_url = format!("http://127.0.0.1:{web_port}");
        let gateway_url = format!("http://127.0.0.1:{gateway_port}");
        let root = repo_root();

        let mut gateway_env: Vec<(String, String)> = vec![
            ("AIGW_FASTAPI__API_HOST".into(), "127.0.0.1".into()),
            ("AIGW_FASTAPI__API_PORT".into(), gateway_port.to_string()),
            ("AIGW_GITLAB_URL".into(), web_url.clone()),
            (
                "AIGW_WORKFLOW_SERVICE__LISTEN".into(),
                format!("127.0.0.1:{workflow_port}"),
            ),
            (
                "AIGW_PROMPTS_DIR".into(),
                root.join("prompts").display().to_string(),
            ),
            (
                "AIGW_DOCS__DIR".into(),
                root.join("docs").display().to_string(),
            ),
            ("AIGW_LOGGING__LEVEL".into(), "debug".into()),
        ];
        match &options.local_model_url {
            // No provider configured: the gateway's local default.
            Some(url) => gateway_env.push(("AIGW_LOCAL_LLM__URL".into(), url.clone())),
            None => gateway_env.extend([
                ("ANTHROPIC_API_KEY".into(), "e2e-test-key".into()),
                ("ANTHROPIC_BASE_URL".into(), fake.url()),
            ]),
        }
        gateway_env.extend(options.gateway_env);

        let mut monolith_env: Vec<(String, String)> = vec![
            ("DATABASE_URL".into(), db.url().to_owned()),
            ("DUO_WEB_ADDR".into(), format!("127.0.0.1:{web_port}")),
            ("AI_GATEWAY_URL".into(), gateway_url.clone()),
            (
                "DUO_WORKFLOW_SERVICE_URL".into(),
                format!("http://127.0.0.1:{workflow_port}"),
            ),
            (
                "DUO_SIGNING_KEY_DIR".into(),
                scratch.0.join("keys").display().to_string(),
            ),
            (
                "DUO_REPOSITORIES_DIR".into(),
                scratch.0.join("repositories").display().to_string(),
            ),
            ("RUST_LOG".into(), "info,monolith=debug".into()),
            // A killed worker's job is picked up again quickly in the crash test.
            ("DUO_JOB_LEASE_SECS".into(), "2".into()),
        ];
        if options.web_runs_jobs {
            monolith_env.push(("DUO_WEB_RUNS_JOBS".into(), "true".into()));
        }
        monolith_env.extend(options.monolith_env);

        // Seed first (it migrates): the web and worker roles start on a ready schema.
        let seed = tokio::process::Command::new(&monolith_bin)
            .args(["seed", "--json"])
            .current_dir(&root)
            .envs(monolith_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .await?;
        if !seed.status.success() {
            return Err(HarnessError::Failed(format!(
                "seed failed: {}",
                String::from_utf8_lossy(&seed.stderr)
            )));
        }
        let report: Value = serde_json::from_slice(&seed.stdout)?;
        let users = report["users"]
            .as_array()
            .map(|users| {
                users
                    .iter()
                    .filter_map(|u| {
                        Some(DemoUser {
                            username: u["username"].as_str()?.to_owned(),
                            token: u["token"].as_str()?.to_owned(),
                            password: u["password"].as_str()?.to_owned(),
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();

        let mut gateway = Service::spawn("gateway", &gateway_bin, &[], &gateway_env)?;
        let mut web = Service::spawn("web", &monolith_bin, &["web"], &monolith_env)?;
        let worker = if options.web_runs_jobs {
            None
        } else {
            Some(Service::spawn(
                "worker",
                &monolith_bin,
                &["worker"],
                &monolith_env,
            )?)
        };
        gateway
            .wait_ready(&http, &format!("{gateway_url}/monitoring/healthz"))
            .await?;
        web.wait_ready(
            &http,
            &format!("{web_url}/.well-known/openid-configuration"),
        )
        .await?;
        if !options.categorize_questions {
            let root = users
                .iter()
                .find(|u| u.username == "root")
                .ok_or_else(|| HarnessError::Failed("no seeded root user".into()))?;
            let status = http
                .post(format!(
                    "{web_url}/api/v4/features/duo_chat_categorize_question"
                ))
                .header("PRIVATE-TOKEN", &root.token)
                .json(&json!({ "value": false }))
                .send()
                .await?
                .status();
            if status.as_u16() != 201 {
                return Err(HarnessError::Failed(format!(
                    "turning categorisation off answered {status}"
                )));
            }
        }
        let mut replicas = Vec::new();
        for _ in 0..options.extra_web_replicas {
            let port = free_port()?;
            let url = format!("http://127.0.0.1:{port}");
            let mut env = monolith_env.clone();
            env.push(("DUO_WEB_ADDR".into(), format!("127.0.0.1:{port}")));
            // One instance: tokens keep the first replica's issuer.
            env.push(("DUO_EXTERNAL_URL".into(), web_url.clone()));
            let mut replica = Service::spawn("web-replica", &monolith_bin, &["web"], &env)?;
            replica
                .wait_ready(&http, &format!("{url}/.well-known/openid-configuration"))
                .await?;
            replicas.push((replica, url));
        }

        let mut extra_workers = Vec::new();
        if !options.web_runs_jobs {
            for _ in 0..options.extra_workers {
                extra_workers.push(Service::spawn(
                    "worker-replica",
                    &monolith_bin,
                    &["worker"],
                    &monolith_env,
                )?);
            }
        }

        Ok(Self {
            db,
            fake,
            gateway,
            web,
            worker,
            extra_workers,
            gateway_url,
            workflow_url: format!("http://127.0.0.1:{workflow_port}"),
            web_url,
            replicas,
            users,
            http,
            repositories: scratch.0.join("repositories"),
            monolith_env,
            gateway_env,
            _scratch: scratch,
        })
    }

    /// A seeded user's token.
    pub fn token(&self, username: &str) -> Result<String> {
        self.users
            .iter()
            .find(|u| u.username == username)
            .map(|u| u.token.clone())
            .ok_or_else(|| HarnessError::Failed(format!("no seeded user {username}")))
    }

    /// A seeded user's web password.
    pub fn password(&self, username: &str) -> Result<String> {
        self.users
            .iter()
            .find(|u| u.username == username)
            .map(|u| u.password.clone())
            .ok_or_else(|| HarnessError::Failed(format!("no seeded user {username}")))
    }

    /// A new personal access token of a seeded user with `scopes`, made by
    /// root through the REST API.
    pub async fn new_token(&self, username: &str, scopes: &[&str]) -> Result<String> {
        let root = self.token("root")?;
        let (status, users) = self
            .rest(
                &root,
                reqwest::Method::GET,
                &format!("/users?username={username}"),
                None,
            )
            .await?;
        let id = users[0]["id"]
            .as_i64()
            .ok_or_else(|| HarnessError::Failed(format!("user {username}: {status} {users}")))?;
        let (status, created) = self
            .rest(
                &root,
                reqwest::Method::POST,
                &format!("/users/{id}/personal_access_tokens"),
                Some(serde_json::json!({"name": format!("{}-token", scopes.join("-")), "scopes": scopes})),
            )
            .await?;
        created["token"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| HarnessError::Failed(format!("token: {status} {created}")))
    }

    /// Starts the gateway again, on the same ports and settings (after
    /// killing it, say), and waits until it is healthy.
    pub async fn restart_gateway(&mut self) -> Result<()> {
        let gateway_bin = binary("duo-gateway")?;
        self.gateway = Service::spawn("gateway", &gateway_bin, &[], &self.gateway_env)?;
        self.gateway
            .wait_ready(
                &self.http,
                &format!("{}/monitoring/healthz", self.gateway_url),
            )
            .await
    }

    /// Starts another worker process (after killing one, say).
    pub async fn restart_worker(&mut self) -> Result<()> {
        let monolith_bin = binary("duo-monolith")?;
        self.worker = Some(Service::spawn(
            "worker",
            &monolith_bin,
            &["worker"],
            &self.monolith_env,
        )?);
        Ok(())
    }

    /// Runs a GraphQL operation; returns the whole response body.
    pub async fn graphql(&self, token: &str, query: &str, variables: Value) -> Result<Value> {
        self.graphql_at(&self.web_url, token, query, variables)
            .await
    }

    /// A GraphQL request to one web replica (`web_url` or one of
    /// [`System::replicas`]).
    pub async fn graphql_at(
        &self,
        web_url: &str,
        token: &str,
        query: &str,
        variables: Value,
    ) -> Result<Value> {
        let resp = self
            .http
            .post(format!("{web_url}/api/graphql"))
            .bearer_auth(token)
            .json(&json!({ "query": query, "variables": variables }))
            .send()
            .await?;
        Ok(resp.json().await?)
    }

    /// The caller's global id (`gid://gitlab/User/N`).
    pub async fn user_gid(&self, token: &str) -> Result<String> {
        let body = self
            .graphql(token, "{ currentUser { id } }", json!({}))
            .await?;
        body["data"]["currentUser"]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| HarnessError::Failed(format!("no currentUser: {body}")))
    }

    /// A REST call under `/api/v4` as the token's owner; returns status and JSON body.
    pub async fn rest(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method, format!("{}/api/v4{path}", self.web_url))
            .header("PRIVATE-TOKEN", token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    /// Opens one subscription to `client_subscription_id` on each web URL and
    /// returns once every one of them is live: subscribing has no
    /// acknowledgement, so `/help` (answered without a model) is asked with
    /// that id until each socket has seen an answer.
    pub async fn subscribe_everywhere(
        &self,
        token: &str,
        client_subscription_id: &str,
        web_urls: &[&str],
    ) -> Result<Vec<live::Subscription>> {
        let gid = self.user_gid(token).await?;
        let mut subscriptions = Vec::new();
        for url in web_urls {
            subscriptions.push(
                live::Subscription::open(
                    url,
                    token,
                    &gid,
                    live::Topic::Client(client_subscription_id.to_owned()),
                )
                .await?,
            );
        }
        let mut live = vec![false; subscriptions.len()];
        let deadline = Instant::now() + READY_TIMEOUT;
        while live.contains(&false) {
            if Instant::now() > deadline {
                return Err(HarnessError::Failed("subscriptions never went live".into()));
            }
            let accepted = self
                .ask_with_subscription(token, json!({ "content": "/help" }), client_subscription_id)
                .await?;
            let request_id = accepted["requestId"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            for (subscription, seen) in subscriptions.iter_mut().zip(live.iter_mut()) {
                if !*seen {
                    *seen = subscription
                        .collect_answer(&request_id, Duration::from_secs(3))
                        .await
                        .is_ok();
                }
            }
        }
        Ok(subscriptions)
    }

    /// Sends a chat question whose chunks go to `client_subscription_id`.
    pub async fn ask_with_subscription(
        &self,
        token: &str,
        chat: Value,
        client_subscription_id: &str,
    ) -> Result<Value> {
        self.ask_with_subscription_at(&self.web_url, token, chat, client_subscription_id)
            .await
    }

    /// [`System::ask_with_subscription`] through one web replica.
    pub async fn ask_with_subscription_at(
        &self,
        web_url: &str,
        token: &str,
        chat: Value,
        client_subscription_id: &str,
    ) -> Result<Value> {
        let body = self
            .graphql_at(
                web_url,
                token,
                "mutation($input: AiActionInput!) { aiAction(input: $input) { requestId threadId errors } }",
                json!({ "input": { "chat": chat, "clientSubscriptionId": client_subscription_id } }),
            )
            .await?;
        Ok(body["data"]["aiAction"].clone())
    }

    /// Sends a chat question; returns `aiAction`'s payload.
    pub async fn ask(&self, token: &str, chat: Value) -> Result<Value> {
        let body = self
            .graphql(
                token,
                "mutation($input: AiActionInput!) { aiAction(input: $input) { requestId threadId errors } }",
                json!({ "input": { "chat": chat } }),
            )
            .await?;
        Ok(body["data"]["aiAction"].clone())
    }

    /// The messages of the user's chat (default thread), oldest first.
    pub async fn messages(&self, token: &str) -> Result<Vec<Value>> {
        let body = self
            .graphql(
                token,
                "{ aiMessages { nodes { id requestId content errors role extras { sources } } } }",
                json!({}),
            )
            .await?;
        Ok(body["data"]["aiMessages"]["nodes"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Waits for the assistant's answer to `request_id`.
    pub async fn answer(&self, token: &str, request_id: &str) -> Result<Value> {
        self.answer_within(token, request_id, ANSWER_TIMEOUT).await
    }

    /// Waits up to `within` for the assistant's answer to `request_id`.
    pub async fn answer_within(
        &self,
        token: &str,
        request_id: &str,
        within: Duration,
    ) -> Result<Value> {
        let deadline = Instant::now() + within;
        loop {
            let messages = self.messages(token).await?;
            if let Some(answer) = messages
                .iter()
                .find(|m| m["requestId"] == request_id && m["role"] == "ASSISTANT")
            {
                return Ok(answer.clone());
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Failed(format!(
                    "no answer to {request_id} within {within:?}\nworker:\n{}\nweb:\n{}\ngateway:\n{}",
                    self.worker
                        .as_ref()
                        .map(|w| w.log_tail(30))
                        .unwrap_or_default(),
                    self.web.log_tail(30),
                    self.gateway.log_tail(30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asks and waits for the answer in one go.
    pub async fn ask_and_wait(&self, token: &str, chat: Value) -> Result<Value> {
        let accepted = self.ask(token, chat).await?;
        let request_id = accepted["requestId"]
            .as_str()
            .ok_or_else(|| HarnessError::Failed(format!("aiAction refused: {accepted}")))?
            .to_owned();
        self.answer(token, &request_id).await
    }

    /// Every request body the fake provider received, as one string each.
    pub fn provider_bodies(&self) -> Vec<String> {
        self.fake
            .requests()
            .iter()
            .map(|r| r.body.to_string())
            .collect()
    }
}
