//! Configuration of every role, read from the environment in one place.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `DATABASE_URL` | (required) | PostgreSQL connection URL |
//! | `DATABASE_POOL_SIZE` | 16 | connections per process |
//! | `AI_GATEWAY_URL` | `http://127.0.0.1:5052` | base URL of the AI gateway |
//! | `DUO_WEB_ADDR` | `127.0.0.1:3000` | listening address of the `web` role |
//! | `DUO_EXTERNAL_URL` | `http://<DUO_WEB_ADDR>` | this instance's public URL (JWT issuer) |
//! | `DUO_INSTANCE_REALM` | `self-managed` | `saas` or `self-managed`; seeds the instance settings |
//! | `DUO_INSTANCE_ID` | derived from the external URL | instance id sent to the gateway |
//! | `DUO_SIGNING_KEY_DIR` | `.duo/keys` | where the RS256 signing keys live |
//! | `DUO_REPOSITORIES_DIR` | `.duo/repositories` | where the projects' bare git repositories live |
//! | `DUO_REPOSITORY_MAX_BLOB_BYTES` | 10485760 | largest file the repository API returns (and chat tools read) |
//! | `DUO_GIT_MAX_CONCURRENT` | 16 | git processes serving clones and pushes at once (more wait, then 503) |
//! | `DUO_GIT_MAX_PUSH_BYTES` | 1073741824 | largest push body accepted over HTTP (413 above) |
//! | `CLOUD_CONNECTOR_SERVICE_NAME` | `gitlab-ai-gateway` | JWT audience |
//! | `DUO_ADD_ONS_FILE` | `config/duo_add_ons.yml` | unit primitives per add-on (built-in copy if missing) |
//! | `DUO_AI_ACTION_RATE_LIMIT` | 160 | `aiAction` requests per user per window |
//! | `DUO_AI_ACTION_RATE_WINDOW_SECS` | 28800 | length of that window (8 hours; it opens with the first request counted in it) |
//! | `DUO_DOCS_BASE_URL` | `https://docs.gitlab.com` | base of the links in error answers |
//! | `DUO_WORKER_CONCURRENCY` | 4 | completion jobs one `worker` process runs at once |
//! | `DUO_COMPLETION_MAX_ATTEMPTS` | 3 | runs of a completion job before the user gets an A9999 answer |
//! | `DUO_THREAD_RETENTION_INTERVAL_SECS` | 3600 | how often idle threads are deleted |
//! | `DUO_JOB_LEASE_SECS` | 15 | how long a claimed job stays with a worker that stopped renewing it (crash recovery time) |
//! | `DUO_MONITORING_ALLOWLIST` | `127.0.0.0/8,::1/128` | addresses and networks that may read `/-/metrics` |
//! | `DUO_SHUTDOWN_DRAIN_SECS` | 0 | after SIGTERM, keep serving while "not ready" this long |
//! | `DUO_SHUTDOWN_GRACE_SECS` | 30 | then let in-flight requests and jobs finish this long |
//! | `DUO_WORKER_PROBE_ADDR` | (none) | where the `worker` role serves `/-/liveness`, `/-/readiness`, `/-/metrics` |
//! | `DUO_LOG_FORMAT` | `text` | `json` for one JSON object per line on stdout (stderr for `seed` and `rotate-keys`) |
//! | `DUO_GRAPHQL_TIMEOUT_SECS` | 30 | how long one GraphQL request (a whole batch) may run |
//! | `DUO_AI_GATEWAY_TIMEOUT_SECS` | 60 | how long a gateway call may stay silent before the answer is A1000 |
//! | `DUO_WORKFLOW_*` | see [`DuoWorkflowConfig`] | Duo Workflow (service address, limits, jobs) |

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;

/// Which kind of GitLab instance this is: GitLab.com-style or self-managed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Realm {
    Saas,
    SelfManaged,
}

impl Realm {
    pub fn as_str(self) -> &'static str {
        match self {
            Realm::Saas => "saas",
            Realm::SelfManaged => "self-managed",
        }
    }

    pub(crate) fn parse(s: &str) -> Self {
        if s == "saas" {
            Realm::Saas
        } else {
            Realm::SelfManaged
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("{name} has an invalid value: {reason}")]
    Invalid { name: &'static str, reason: String },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: SecretString,
    pub database_pool_size: usize,
    pub ai_gateway_url: url::Url,
    pub web_addr: SocketAddr,
    pub external_url: url::Url,
    pub realm: Realm,
    pub instance_id: String,
    pub signing_key_dir: PathBuf,
    /// Where the projects' bare git repositories live.
    pub repositories_dir: PathBuf,
    /// Largest file the repository API returns (and the chat tools read).
    pub max_blob_bytes: u64,
    /// git processes serving smart HTTP at once.
    pub git_max_concurrent: usize,
    /// Largest push body accepted.
    pub git_max_push_bytes: u64,
    pub gateway_audience: String,
    pub add_ons_file: PathBuf,
    pub ai_action_rate_limit: u32,
    pub ai_action_rate_window: Duration,
    /// The MCP server at `/api/v4/mcp`: requests per token per minute, the
    /// time one tool call may take, and the largest answer a tool returns.
    pub mcp: McpServerConfig,
    pub docs_base_url: url::Url,
    pub worker_concurrency: usize,
    pub completion_max_attempts: i32,
    pub thread_retention_interval: Duration,
    pub job_lease: Duration,
    pub ai_gateway_timeout: Duration,
    /// The `web` role also runs the queue's jobs in its own process (one
    /// process for development or a small instance).
    pub web_runs_jobs: bool,
    /// How often subscription sockets get a keep-alive message (0: never).
    pub ws_keep_alive: Duration,
    /// How long one GraphQL request (a whole batch) may run.
    pub graphql_timeout: Duration,
    /// Who may read `/-/metrics` (addresses and networks).
    pub monitoring_allowlist: Vec<IpNet>,
    /// After SIGTERM, how long a process keeps serving while reporting "not
    /// ready", so load balancers stop sending it traffic first.
    pub shutdown_drain: Duration,
    /// After the drain, how long in-flight requests and jobs get to finish.
    pub shutdown_grace: Duration,
    /// Where the `worker` role serves its probes and metrics (none when unset).
    pub worker_probe_addr: Option<SocketAddr>,
    /// Duo Workflow's settings.
    pub duo_workflow: DuoWorkflowConfig,
    /// The code index behind codebase search.
    pub code_index: CodeIndexConfig,
}

/// The code index's settings (`DUO_CODE_INDEX_*`, `DUO_CODE_SEARCH_*`).
#[derive(Debug, Clone)]
pub struct CodeIndexConfig {
    /// Larger files are not indexed (`DUO_CODE_INDEX_MAX_FILE_BYTES`, 1 MiB).
    pub max_file_bytes: u64,
    /// Files indexed per project at most (`DUO_CODE_INDEX_MAX_FILES`, 20000).
    pub max_files: usize,
    /// Most chunks in one embedding call to the gateway
    /// (`DUO_CODE_INDEX_EMBED_BATCH`, 64, at most 250).
    pub embed_batch: usize,
    /// Estimated word pieces in one embedding call: batches are cut by
    /// this budget first (`DUO_CODE_INDEX_EMBED_BATCH_TOKENS`, 8192).
    pub embed_batch_tokens: usize,
    /// Embedding calls one indexing run has on their way at once
    /// (`DUO_CODE_INDEX_EMBED_IN_FLIGHT`, 2, at most 16): the next batch
    /// waits at the model server while one is computed, never more.
    pub embed_in_flight: usize,
    /// One indexing run may take this long (`DUO_CODE_INDEX_JOB_TIMEOUT_SECS`, 1800).
    pub job_timeout: Duration,
    /// How often a worker looks for projects whose index is behind their
    /// default branch (`DUO_CODE_INDEX_CATCH_UP_SECS`, 600).
    pub catch_up_interval: Duration,
    /// Attempts of one indexing job before the index is marked failed
    /// (`DUO_CODE_INDEX_MAX_ATTEMPTS`, 3).
    pub max_attempts: i32,
    /// Search results given to chat (`DUO_CODE_SEARCH_RESULTS`, 10).
    pub search_results: usize,
    /// Branches other than the default kept indexed per project
    /// (`DUO_CODE_INDEX_MAX_BRANCHES`, 3, at most 50); the least recently
    /// searched is evicted first.
    pub max_branches: usize,
}

impl CodeIndexConfig {
    fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Ok(Self {
            max_file_bytes: positive(
                parse_or(get, "DUO_CODE_INDEX_MAX_FILE_BYTES", 1024 * 1024)?,
                "DUO_CODE_INDEX_MAX_FILE_BYTES",
            )?,
            max_files: positive(
                parse_or(get, "DUO_CODE_INDEX_MAX_FILES", 20_000)?,
                "DUO_CODE_INDEX_MAX_FILES",
            )?,
            embed_batch: positive(
                parse_or(get, "DUO_CODE_INDEX_EMBED_BATCH", 64)?,
                "DUO_CODE_INDEX_EMBED_BATCH",
            )?
            .min(250),
            embed_batch_tokens: positive(
                parse_or(get, "DUO_CODE_INDEX_EMBED_BATCH_TOKENS", 8192)?,
                "DUO_CODE_INDEX_EMBED_BATCH_TOKENS",
            )?,
            embed_in_flight: positive(
                parse_or(get, "DUO_CODE_INDEX_EMBED_IN_FLIGHT", 2)?,
                "DUO_CODE_INDEX_EMBED_IN_FLIGHT",
            )?
            .min(16),
            job_timeout: Duration::from_secs(positive(
                parse_or(get, "DUO_CODE_INDEX_JOB_TIMEOUT_SECS", 1800)?,
                "DUO_CODE_INDEX_JOB_TIMEOUT_SECS",
            )?),
            catch_up_interval: Duration::from_secs(positive(
                parse_or(get, "DUO_CODE_INDEX_CATCH_UP_SECS", 600)?,
                "DUO_CODE_INDEX_CATCH_UP_SECS",
            )?),
            max_attempts: positive(
                parse_or(get, "DUO_CODE_INDEX_MAX_ATTEMPTS", 3)?,
                "DUO_CODE_INDEX_MAX_ATTEMPTS",
            )?,
            search_results: positive(
                parse_or(get, "DUO_CODE_SEARCH_RESULTS", 10)?,
                "DUO_CODE_SEARCH_RESULTS",
            )?
            .min(50),
            max_branches: positive(
                parse_or(get, "DUO_CODE_INDEX_MAX_BRANCHES", 3)?,
                "DUO_CODE_INDEX_MAX_BRANCHES",
            )?
            .min(50),
        })
    }
}

/// Duo Workflow's settings (`DUO_WORKFLOW_*`).
#[derive(Debug, Clone)]
pub struct DuoWorkflowConfig {
    /// The workflow service (gRPC): `DUO_WORKFLOW_SERVICE_URL`,
    /// default `http://127.0.0.1:50052`; `https://` means TLS.
    pub service_url: url::Url,
    /// How long one unary call to the service may take
    /// (`DUO_WORKFLOW_SERVICE_TIMEOUT_SECS`, 10).
    pub service_timeout: Duration,
    /// A workflow in `created` or `running` without an update this long is
    /// failed (`DUO_WORKFLOW_STUCK_AFTER_SECS`, 1800).
    pub stuck_after: Duration,
    /// How often workers look for stuck workflows
    /// (`DUO_WORKFLOW_STUCK_CHECK_INTERVAL_SECS`, 300).
    pub stuck_check_interval: Duration,
    /// Checkpoints are kept this many days (`DUO_WORKFLOW_CHECKPOINT_RETENTION_DAYS`, 30).
    pub checkpoint_retention_days: i32,
    /// How often workers delete old checkpoints
    /// (`DUO_WORKFLOW_RETENTION_INTERVAL_SECS`, 3600).
    pub retention_interval: Duration,
    /// Largest checkpoint, inflated JSON (`DUO_WORKFLOW_MAX_CHECKPOINT_BYTES`, 4 MiB).
    pub max_checkpoint_bytes: usize,
    /// `direct_access` calls per user per minute
    /// (`DUO_WORKFLOW_DIRECT_ACCESS_RATE_LIMIT`, 50; GitLab's limit).
    pub direct_access_rate_limit: u32,
    /// The run lease of a workflow lapses this long after its holder stopped
    /// renewing it (`DUO_WORKFLOW_LOCK_LEASE_SECS`, 30).
    pub lock_lease: Duration,
    /// Workflows the product runs itself (`docs/duo-workflow-runs.md`).
    pub runs: WorkflowRunsConfig,
}

/// Which runner carries out workflows started in the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerKind {
    /// A bubblewrap sandbox started by the worker.
    Local,
    /// A Kubernetes Job per leg.
    Kubernetes,
    /// Runs are refused (nothing runs them).
    Disabled,
}

/// Settings of workflows the product runs itself.
#[derive(Debug, Clone)]
pub struct WorkflowRunsConfig {
    /// `DUO_WORKFLOW_RUNNER`: `local` (default), `kubernetes` or `disabled`.
    pub runner: RunnerKind,
    /// `DUO_WORKFLOW_EXECUTOR`: the executor binary for the local runner
    /// (default: `duo-workflow-executor` beside the monolith's binary).
    pub executor: PathBuf,
    /// `DUO_WORKFLOW_SANDBOX_BWRAP` (`bwrap`) and `DUO_WORKFLOW_SANDBOX_PRLIMIT`
    /// (`prlimit`): the sandbox's tools.
    pub bwrap: PathBuf,
    pub prlimit: PathBuf,
    /// `DUO_WORKFLOW_RUNS_DIR`: private directories of running legs (sockets
    /// only; the workspace is a tmpfs inside the sandbox).
    pub work_dir: PathBuf,
    /// `DUO_WORKFLOW_RUNNER_GITLAB_URL`: how a runner reaches this instance
    /// (default: `DUO_EXTERNAL_URL`).
    pub gitlab_url: url::Url,
    /// `DUO_WORKFLOW_RUNS_PER_USER` (2) and `DUO_WORKFLOW_RUNS_PER_INSTANCE`
    /// (4): legs running at once; the rest wait in order.
    pub per_user: i64,
    pub per_instance: i64,
    /// `DUO_WORKFLOW_RUN_MAX_SECONDS` (3600): a leg's wall-clock limit.
    pub max_duration: Duration,
    /// `DUO_WORKFLOW_RUN_MEMORY_MB` (2048): address space per process.
    pub memory_mb: u64,
    /// `DUO_WORKFLOW_RUN_CPU_SECONDS` (1800): CPU time per process.
    pub cpu_seconds: u64,
    /// `DUO_WORKFLOW_RUN_DISK_MB` (1024): the workspace's size.
    pub disk_mb: u64,
    /// `DUO_WORKFLOW_RUN_DISPATCH_INTERVAL_SECS` (30): how often waiting legs
    /// are looked at besides when a leg ends.
    pub dispatch_interval: Duration,
    /// The Kubernetes runner's settings.
    pub kubernetes: KubernetesRunnerSettings,
}

/// `DUO_WORKFLOW_KUBERNETES_*`: where and how legs run as Jobs.
#[derive(Debug, Clone)]
pub struct KubernetesRunnerSettings {
    /// `..._API_URL`: the API server; unset, the in-cluster configuration.
    pub api_url: Option<url::Url>,
    /// `..._NAMESPACE`: unset, the namespace of the worker's own pod (or
    /// the configuration's default).
    pub namespace: Option<String>,
    /// `..._IMAGE`: an image with `duo-workflow-executor` (needed with this runner).
    pub image: String,
    /// `..._GITLAB_URL` and `..._SERVICE_URL`: how pods reach the monolith
    /// and the workflow service (default: the runner's and the monolith's).
    pub gitlab_url: url::Url,
    pub service_url: url::Url,
    /// `..._CPU` (`1`): the executor container's CPU limit.
    pub cpu: String,
}

impl WorkflowRunsConfig {
    fn from_lookup(
        get: &impl Fn(&str) -> Option<String>,
        external_url: &url::Url,
    ) -> Result<Self, ConfigError> {
        let runner = match get("DUO_WORKFLOW_RUNNER").as_deref().map(str::trim) {
            None | Some("local") => RunnerKind::Local,
            Some("kubernetes") => RunnerKind::Kubernetes,
            Some("disabled") => RunnerKind::Disabled,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "DUO_WORKFLOW_RUNNER",
                    reason: format!("{other:?} is not local, kubernetes or disabled"),
                });
            }
        };
        let gitlab_url = match get("DUO_WORKFLOW_RUNNER_GITLAB_URL") {
            Some(url) => parse_url("DUO_WORKFLOW_RUNNER_GITLAB_URL", &url)?,
            None => external_url.clone(),
        };
        let kubernetes = KubernetesRunnerSettings {
            api_url: match get("DUO_WORKFLOW_KUBERNETES_API_URL") {
                Some(url) => Some(parse_url("DUO_WORKFLOW_KUBERNETES_API_URL", &url)?),
                None => None,
            },
            namespace: get("DUO_WORKFLOW_KUBERNETES_NAMESPACE"),
            image: get("DUO_WORKFLOW_KUBERNETES_IMAGE").unwrap_or_default(),
            gitlab_url: match get("DUO_WORKFLOW_KUBERNETES_GITLAB_URL") {
                Some(url) => parse_url("DUO_WORKFLOW_KUBERNETES_GITLAB_URL", &url)?,
                None => gitlab_url.clone(),
            },
            service_url: match get("DUO_WORKFLOW_KUBERNETES_SERVICE_URL") {
                Some(url) => parse_url("DUO_WORKFLOW_KUBERNETES_SERVICE_URL", &url)?,
                None => parse_url(
                    "DUO_WORKFLOW_SERVICE_URL",
                    &get("DUO_WORKFLOW_SERVICE_URL")
                        .unwrap_or_else(|| "http://127.0.0.1:50052".into()),
                )?,
            },
            cpu: get("DUO_WORKFLOW_KUBERNETES_CPU").unwrap_or_else(|| "1".into()),
        };
        if runner == RunnerKind::Kubernetes && kubernetes.image.is_empty() {
            return Err(ConfigError::Missing("DUO_WORKFLOW_KUBERNETES_IMAGE"));
        }
        let beside_us = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("duo-workflow-executor")))
            .unwrap_or_else(|| PathBuf::from("duo-workflow-executor"));
        Ok(Self {
            runner,
            executor: get("DUO_WORKFLOW_EXECUTOR").map_or(beside_us, PathBuf::from),
            bwrap: PathBuf::from(
                get("DUO_WORKFLOW_SANDBOX_BWRAP").unwrap_or_else(|| "bwrap".into()),
            ),
            prlimit: PathBuf::from(
                get("DUO_WORKFLOW_SANDBOX_PRLIMIT").unwrap_or_else(|| "prlimit".into()),
            ),
            work_dir: get("DUO_WORKFLOW_RUNS_DIR").map_or_else(
                || std::env::temp_dir().join("duo-workflow-runs"),
                PathBuf::from,
            ),
            gitlab_url,
            kubernetes,
            per_user: positive(
                parse_or(get, "DUO_WORKFLOW_RUNS_PER_USER", 2)?,
                "DUO_WORKFLOW_RUNS_PER_USER",
            )?,
            per_instance: positive(
                parse_or(get, "DUO_WORKFLOW_RUNS_PER_INSTANCE", 4)?,
                "DUO_WORKFLOW_RUNS_PER_INSTANCE",
            )?,
            max_duration: Duration::from_secs(positive(
                parse_or(get, "DUO_WORKFLOW_RUN_MAX_SECONDS", 3600)?,
                "DUO_WORKFLOW_RUN_MAX_SECONDS",
            )?),
            memory_mb: positive(
                parse_or(get, "DUO_WORKFLOW_RUN_MEMORY_MB", 2048)?,
                "DUO_WORKFLOW_RUN_MEMORY_MB",
            )?,
            cpu_seconds: positive(
                parse_or(get, "DUO_WORKFLOW_RUN_CPU_SECONDS", 1800)?,
                "DUO_WORKFLOW_RUN_CPU_SECONDS",
            )?,
            disk_mb: positive(
                parse_or(get, "DUO_WORKFLOW_RUN_DISK_MB", 1024)?,
                "DUO_WORKFLOW_RUN_DISK_MB",
            )?,
            dispatch_interval: Duration::from_secs(positive(
                parse_or(get, "DUO_WORKFLOW_RUN_DISPATCH_INTERVAL_SECS", 30)?,
                "DUO_WORKFLOW_RUN_DISPATCH_INTERVAL_SECS",
            )?),
        })
    }
}

impl DuoWorkflowConfig {
    fn from_lookup(
        get: &impl Fn(&str) -> Option<String>,
        external_url: &url::Url,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            runs: WorkflowRunsConfig::from_lookup(get, external_url)?,
            service_url: parse_url(
                "DUO_WORKFLOW_SERVICE_URL",
                &get("DUO_WORKFLOW_SERVICE_URL").unwrap_or_else(|| "http://127.0.0.1:50052".into()),
            )?,
            service_timeout: Duration::from_secs(positive(
                parse_or(get, "DUO_WORKFLOW_SERVICE_TIMEOUT_SECS", 10)?,
                "DUO_WORKFLOW_SERVICE_TIMEOUT_SECS",
            )?),
            stuck_after: Duration::from_secs(positive(
                parse_or(get, "DUO_WORKFLOW_STUCK_AFTER_SECS", 1800)?,
                "DUO_WORKFLOW_STUCK_AFTER_SECS",
            )?),
            stuck_check_interval: Duration::from_secs(positive(
                parse_or(get, "DUO_WORKFLOW_STUCK_CHECK_INTERVAL_SECS", 300)?,
                "DUO_WORKFLOW_STUCK_CHECK_INTERVAL_SECS",
            )?),
            checkpoint_retention_days: positive(
                parse_or(get, "DUO_WORKFLOW_CHECKPOINT_RETENTION_DAYS", 30)?,
                "DUO_WORKFLOW_CHECKPOINT_RETENTION_DAYS",
            )?,
            retention_interval: Duration::from_secs(positive(
                parse_or(get, "DUO_WORKFLOW_RETENTION_INTERVAL_SECS", 3600)?,
                "DUO_WORKFLOW_RETENTION_INTERVAL_SECS",
            )?),
            max_checkpoint_bytes: positive(
                parse_or(get, "DUO_WORKFLOW_MAX_CHECKPOINT_BYTES", 4 * 1024 * 1024)?,
                "DUO_WORKFLOW_MAX_CHECKPOINT_BYTES",
            )?,
            direct_access_rate_limit: positive(
                parse_or(get, "DUO_WORKFLOW_DIRECT_ACCESS_RATE_LIMIT", 50)?,
                "DUO_WORKFLOW_DIRECT_ACCESS_RATE_LIMIT",
            )?,
            lock_lease: Duration::from_secs(positive(
                parse_or(get, "DUO_WORKFLOW_LOCK_LEASE_SECS", 30)?,
                "DUO_WORKFLOW_LOCK_LEASE_SECS",
            )?),
        })
    }
}

impl Config {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// Builds the configuration from any variable source, so tests need not touch
    /// the process environment.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let database_url = get("DATABASE_URL").ok_or(ConfigError::Missing("DATABASE_URL"))?;
        let web_addr: SocketAddr = parse_or(
            &get,
            "DUO_WEB_ADDR",
            "127.0.0.1:3000".parse().map_err(invalid("DUO_WEB_ADDR"))?,
        )?;
        let external_url = match get("DUO_EXTERNAL_URL") {
            Some(v) => parse_url("DUO_EXTERNAL_URL", &v)?,
            None => parse_url("DUO_EXTERNAL_URL", &format!("http://{web_addr}"))?,
        };
        let realm = match get("DUO_INSTANCE_REALM").as_deref() {
            None | Some("self-managed") => Realm::SelfManaged,
            Some("saas") => Realm::Saas,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "DUO_INSTANCE_REALM",
                    reason: format!("{other:?} (expected saas or self-managed)"),
                });
            }
        };
        let instance_id = get("DUO_INSTANCE_ID")
            .unwrap_or_else(|| crate::gid::stable_uuid(external_url.as_str()).to_string());
        let duo_workflow = DuoWorkflowConfig::from_lookup(&get, &external_url)?;
        Ok(Self {
            database_url: SecretString::from(database_url),
            database_pool_size: parse_or(&get, "DATABASE_POOL_SIZE", 16)?,
            ai_gateway_url: parse_url(
                "AI_GATEWAY_URL",
                &get("AI_GATEWAY_URL").unwrap_or_else(|| "http://127.0.0.1:5052".into()),
            )?,
            web_addr,
            external_url,
            realm,
            instance_id,
            repositories_dir: get("DUO_REPOSITORIES_DIR")
                .filter(|v| !v.trim().is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(".duo/repositories")),
            max_blob_bytes: parse_or(&get, "DUO_REPOSITORY_MAX_BLOB_BYTES", 10 * 1024 * 1024)?,
            git_max_concurrent: parse_or(&get, "DUO_GIT_MAX_CONCURRENT", 16)?,
            git_max_push_bytes: parse_or(&get, "DUO_GIT_MAX_PUSH_BYTES", 1024 * 1024 * 1024)?,
            signing_key_dir: get("DUO_SIGNING_KEY_DIR")
                .unwrap_or_else(|| ".duo/keys".into())
                .into(),
            gateway_audience: get("CLOUD_CONNECTOR_SERVICE_NAME")
                .unwrap_or_else(|| "gitlab-ai-gateway".into()),
            add_ons_file: get("DUO_ADD_ONS_FILE")
                .unwrap_or_else(|| "config/duo_add_ons.yml".into())
                .into(),
            ai_action_rate_limit: parse_or(&get, "DUO_AI_ACTION_RATE_LIMIT", 160)?,
            mcp: McpServerConfig {
                requests_per_minute: parse_or(&get, "DUO_MCP_REQUESTS_PER_MINUTE", 600)?,
                tool_timeout: Duration::from_secs(parse_or(&get, "DUO_MCP_TOOL_TIMEOUT_SECS", 30)?),
                max_answer_bytes: parse_or(&get, "DUO_MCP_MAX_ANSWER_BYTES", 256 * 1024)?,
                max_request_bytes: parse_or(&get, "DUO_MCP_MAX_REQUEST_BYTES", 1024 * 1024)?,
            },
            ai_action_rate_window: Duration::from_secs(parse_or(
                &get,
                "DUO_AI_ACTION_RATE_WINDOW_SECS",
                8 * 3600,
            )?),
            docs_base_url: parse_url(
                "DUO_DOCS_BASE_URL",
                &get("DUO_DOCS_BASE_URL").unwrap_or_else(|| "https://docs.gitlab.com".into()),
            )?,
            worker_concurrency: parse_or(&get, "DUO_WORKER_CONCURRENCY", 4)?,
            completion_max_attempts: positive(
                parse_or(&get, "DUO_COMPLETION_MAX_ATTEMPTS", 3)?,
                "DUO_COMPLETION_MAX_ATTEMPTS",
            )?,
            thread_retention_interval: Duration::from_secs(positive(
                parse_or(&get, "DUO_THREAD_RETENTION_INTERVAL_SECS", 3600)?,
                "DUO_THREAD_RETENTION_INTERVAL_SECS",
            )?),
            job_lease: Duration::from_secs(positive(
                parse_or(&get, "DUO_JOB_LEASE_SECS", 15)?,
                "DUO_JOB_LEASE_SECS",
            )?),
            ai_gateway_timeout: Duration::from_secs(positive(
                parse_or(&get, "DUO_AI_GATEWAY_TIMEOUT_SECS", 60)?,
                "DUO_AI_GATEWAY_TIMEOUT_SECS",
            )?),
            web_runs_jobs: parse_or(&get, "DUO_WEB_RUNS_JOBS", false)?,
            ws_keep_alive: Duration::from_secs(parse_or(&get, "DUO_WS_KEEP_ALIVE_SECS", 15)?),
            graphql_timeout: Duration::from_secs(
                parse_or(&get, "DUO_GRAPHQL_TIMEOUT_SECS", 30)?.max(1),
            ),
            monitoring_allowlist: get("DUO_MONITORING_ALLOWLIST")
                .unwrap_or_else(|| "127.0.0.0/8,::1/128".into())
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().map_err(invalid("DUO_MONITORING_ALLOWLIST")))
                .collect::<Result<_, _>>()?,
            shutdown_drain: Duration::from_secs(parse_or(&get, "DUO_SHUTDOWN_DRAIN_SECS", 0)?),
            shutdown_grace: Duration::from_secs(parse_or(&get, "DUO_SHUTDOWN_GRACE_SECS", 30)?),
            worker_probe_addr: get("DUO_WORKER_PROBE_ADDR")
                .filter(|v| !v.trim().is_empty())
                .map(|v| v.trim().parse().map_err(invalid("DUO_WORKER_PROBE_ADDR")))
                .transpose()?,
            duo_workflow,
            code_index: CodeIndexConfig::from_lookup(&get)?,
        })
    }
}

/// An address with a prefix length (`10.0.0.0/8`, `::1/128`); a bare address
/// means that one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl IpNet {
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        // An IPv4 client seen through an IPv6 socket is matched as IPv4.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = addr.parse().map_err(|e| format!("{s}: {e}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().map_err(|e| format!("{s}: {e}"))?,
            None => max,
        };
        if prefix > max {
            return Err(format!("{s}: prefix longer than {max}"));
        }
        Ok(Self { addr, prefix })
    }
}

fn invalid<E: std::fmt::Display>(name: &'static str) -> impl Fn(E) -> ConfigError {
    move |e| ConfigError::Invalid {
        name,
        reason: e.to_string(),
    }
}

fn positive<T: PartialOrd + Default>(value: T, name: &'static str) -> Result<T, ConfigError> {
    if value > T::default() {
        Ok(value)
    } else {
        Err(ConfigError::Invalid {
            name,
            reason: "must be greater than zero".into(),
        })
    }
}

/// Limits of the MCP server (see `docs/mcp.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerConfig {
    pub requests_per_minute: u32,
    pub tool_timeout: Duration,
    pub max_answer_bytes: usize,
    pub max_request_bytes: usize,
}

fn parse_url(name: &'static str, value: &str) -> Result<url::Url, ConfigError> {
    url::Url::parse(value).map_err(invalid(name))
}

fn parse_or<T>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: T,
) -> Result<T, ConfigError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match get(name) {
        Some(v) => v.trim().parse().map_err(invalid(name)),
        None => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_match_their_addresses_only() {
        let net: IpNet = "10.1.0.0/16".parse().unwrap();
        assert!(net.contains("10.1.200.3".parse().unwrap()));
        assert!(!net.contains("10.2.0.1".parse().unwrap()));
        let one: IpNet = "::1".parse().unwrap();
        assert!(one.contains("::1".parse().unwrap()));
        assert!(!one.contains("::2".parse().unwrap()));
        let all: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        assert!(all.contains("::ffff:192.0.2.1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("nonsense".parse::<IpNet>().is_err());
    }
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_apply() {
        let c = from(&[("DATABASE_URL", "postgres://x/y")]).unwrap();
        assert_eq!(c.web_addr.to_string(), "127.0.0.1:3000");
        assert_eq!(c.ai_gateway_url.as_str(), "http://127.0.0.1:5052/");
        assert_eq!(c.realm, Realm::SelfManaged);
        assert_eq!(c.gateway_audience, "gitlab-ai-gateway");
        assert_eq!(c.ai_action_rate_limit, 160);
        assert_eq!(c.ai_action_rate_window, Duration::from_secs(28800));
        assert_eq!(c.external_url.as_str(), "http://127.0.0.1:3000/");
        assert_eq!(c.worker_concurrency, 4);
        assert_eq!(c.completion_max_attempts, 3);
        assert_eq!(c.thread_retention_interval, Duration::from_secs(3600));
        assert_eq!(c.job_lease, Duration::from_secs(15));
        assert_eq!(c.ai_gateway_timeout, Duration::from_secs(60));
    }

    #[test]
    fn zero_attempts_are_refused() {
        let err = from(&[
            ("DATABASE_URL", "postgres://x/y"),
            ("DUO_COMPLETION_MAX_ATTEMPTS", "0"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("DUO_COMPLETION_MAX_ATTEMPTS"));
    }

    #[test]
    fn database_url_is_required_and_bad_values_are_named() {
        assert!(matches!(
            from(&[]),
            Err(ConfigError::Missing("DATABASE_URL"))
        ));
        let err = from(&[
            ("DATABASE_URL", "postgres://x/y"),
            ("DUO_INSTANCE_REALM", "cloud"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("DUO_INSTANCE_REALM"));
        let err = from(&[
            ("DATABASE_URL", "postgres://x/y"),
            ("DUO_AI_ACTION_RATE_LIMIT", "many"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("DUO_AI_ACTION_RATE_LIMIT"));
    }

    #[test]
    fn saas_realm_is_read() {
        let c = from(&[
            ("DATABASE_URL", "postgres://x/y"),
            ("DUO_INSTANCE_REALM", "saas"),
        ])
        .unwrap();
        assert_eq!(c.realm, Realm::Saas);
    }
}
