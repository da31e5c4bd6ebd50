//! Gateway configuration, read from the environment in one place.
//!
//! Names follow GitLab's gateway (`AIGW_` prefix, `__` for nesting) where it
//! has a variable for the same thing. `docs/configuration.md` lists them all.

use secrecy::SecretString;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Config {
    /// `AIGW_FASTAPI__API_HOST` (127.0.0.1) and `AIGW_FASTAPI__API_PORT` (5052).
    pub api_host: String,
    pub api_port: u16,
    /// `AIGW_FASTAPI__METRICS_PORT`: serve `/metrics` on its own port too.
    pub metrics_port: Option<u16>,
    /// `AIGW_ENVIRONMENT` (production).
    pub environment: String,
    /// `AIGW_MAX_REQUEST_BODY_BYTES` (32 MiB): larger bodies get 413.
    pub max_body_bytes: usize,
    /// `AIGW_MAX_PROMPT_BYTES` (4 MiB): most text (all messages, context and
    /// scratchpad together, or all prompt inputs) one request may carry;
    /// more is refused with 422 before anything is rendered.
    pub max_prompt_bytes: usize,

    pub auth: AuthConfig,
    pub providers: ProvidersConfig,
    pub prompts: PromptsConfig,
    pub docs: DocsConfig,
    pub code_embeddings: CodeEmbeddingsConfig,
    pub workflow: WorkflowServiceConfig,
    /// `AIGW_LOGGING__LEVEL` (info): a tracing env-filter directive.
    pub log_level: String,
    /// `AIGW_LOGGING__FORMAT_JSON`: log JSON lines.
    pub log_json: bool,
    pub shutdown: ShutdownConfig,
}

/// What happens on SIGTERM: readiness fails at once, the gateway keeps serving
/// for `drain` (so load balancers stop sending it requests), then stops
/// accepting and gives requests in flight (streams included) `grace` to end.
#[derive(Debug, Clone)]
pub struct ShutdownConfig {
    /// `AIGW_SHUTDOWN__DRAIN_SECONDS` (0).
    pub drain: Duration,
    /// `AIGW_SHUTDOWN__GRACE_SECONDS` (30).
    pub grace: Duration,
}

#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// `AIGW_AUTH__BYPASS_EXTERNAL`: every caller is a debug user. Development only.
    pub bypass_external: bool,
    /// `AIGW_AUTH__BYPASS_EXTERNAL_WITH_HEADER`: the same, for requests sending `Bypass-Auth: true`.
    pub bypass_external_with_header: bool,
    /// `AIGW_AUTH__BYPASS_JWT_SIGNATURE`: decode tokens without checking signatures.
    pub bypass_jwt_signature: bool,
    /// `CLOUD_CONNECTOR_SERVICE_NAME` (gitlab-ai-gateway): the required `aud`.
    pub service_name: String,
    /// `AIGW_GITLAB_URL` (http://127.0.0.1:3000): OIDC discovery for JWKS.
    pub gitlab_url: Option<String>,
    /// `AIGW_CUSTOMER_PORTAL_URL`: a second OIDC issuer, if any.
    pub customer_portal_url: Option<String>,
    /// `AIGW_SELF_SIGNED_JWT__SIGNING_KEY` / `__VALIDATION_KEY`: PEM private keys.
    pub signing_key: Option<SecretString>,
    pub validation_key: Option<SecretString>,
    /// `AIGW_AUTH__JWKS_CACHE_SECONDS` (86400).
    pub jwks_cache_ttl: Duration,
    /// `AIGW_AUTH__JWKS_TIMEOUT_SECONDS` (10).
    pub jwks_timeout: Duration,
    /// `AIGW_AUTH__LEEWAY_SECONDS` (30): clock skew allowed on exp/nbf.
    pub leeway: Duration,
}

#[derive(Debug, Clone)]
pub struct ProvidersConfig {
    /// `AIGW_MOCK_MODEL_RESPONSES`: answer "mock" instead of calling models.
    pub mock_model_responses: bool,
    /// `AIGW_CUSTOM_MODELS__ENABLED`: honour `model_metadata` (self-hosted models).
    pub custom_models_enabled: bool,
    /// `AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST`: hosts (`llm.internal`,
    /// `*.example.com`), addresses and CIDR networks that self-hosted model
    /// endpoints may be on; empty: any host except link-local and cloud
    /// metadata addresses (see `providers::egress`).
    pub egress: crate::providers::EgressPolicy,
    /// `ANTHROPIC_API_KEY`.
    pub anthropic_api_key: Option<SecretString>,
    /// `ANTHROPIC_BASE_URL` (https://api.anthropic.com).
    pub anthropic_base_url: String,
    /// `OPENAI_BASE_URL`: an OpenAI-compatible server (vLLM, Ollama, ...).
    pub openai_base_url: Option<String>,
    /// `OPENAI_API_KEY`.
    pub openai_api_key: Option<SecretString>,
    /// `AIGW_LOCAL_LLM__URL` (http://127.0.0.1:5053/v1): the bundled local model server.
    pub local_llm_url: String,
    /// `AIGW_LOCAL_LLM__MODEL` (smollm2-135m-instruct, the local server's default id).
    pub local_llm_model: String,
    /// `AIGW_LOCAL_LLM__EMBEDDING_MODEL` (all-minilm-l6-v2): allowed through
    /// the Vertex AI proxy as an embedding model.
    pub local_embedding_model: String,
    /// `AIGW_VERTEX_TEXT_MODEL__ENDPOINT`: host (or URL) of Vertex AI; the local
    /// model server when unset.
    pub vertex_endpoint: String,
    /// `AIGW_GOOGLE_CLOUD_PLATFORM__PROJECT` / `__LOCATION`.
    pub vertex_project: String,
    pub vertex_location: String,
    /// `AIGW_GOOGLE_CLOUD_PLATFORM__ACCESS_TOKEN`: bearer token for Vertex AI.
    pub vertex_access_token: Option<SecretString>,
    /// `AIGW_PROXY__TIMEOUT_SECONDS` (60).
    pub proxy_timeout: Duration,
    /// `AIGW_MODELS__FIRST_TOKEN_TIMEOUT_SECONDS` (30): the longest wait for
    /// a model's first token (a prompt's own `params.timeout` still caps it).
    pub first_token_timeout: Duration,
    /// `AIGW_MODEL_ENGINE_CONCURRENCY_LIMITS`: JSON `{engine: {model: limit}}`,
    /// exported as `model_inferences_max_concurrent`, not enforced.
    pub concurrency_limits: BTreeMap<String, BTreeMap<String, u32>>,
    /// `AIGW_MODEL_CONTEXT_TOKENS`: JSON `{model id: tokens}`, the context
    /// size of models whose server does not report it. The chat agent trims
    /// its prompt to fit (an OpenAI-compatible server's `/models` entry with
    /// `context_length`, as the bundled model server gives, needs no entry).
    pub model_context_tokens: BTreeMap<String, u32>,
}

impl ProvidersConfig {
    /// The configured concurrency limit of a model (`model_engine` label and
    /// model name), if any.
    pub fn concurrency_limit(&self, engine: &str, model: &str) -> Option<u32> {
        self.concurrency_limits.get(engine)?.get(model).copied()
    }

    /// True when no model provider is configured: calls go to the bundled
    /// local model server.
    pub fn uses_local_default(&self) -> bool {
        !self.mock_model_responses
            && self.anthropic_api_key.is_none()
            && self.openai_base_url.is_none()
    }
}

/// The chat agent's prompt id and the family it uses on the bundled model.
const CHAT_AGENT_PROMPT: &str = "chat/react";
const LOCAL_CHAT_AGENT_FAMILY: &str = "native";

#[derive(Debug, Clone)]
pub struct PromptsConfig {
    /// `AIGW_PROMPTS_DIR`: the prompt definitions (`prompts/`).
    pub dir: PathBuf,
    /// `AIGW_DEFAULT_PROMPTS`: JSON map from prompt id to model family.
    pub default_families: HashMap<String, String>,
    /// The family used for prompts not named in `default_families`:
    /// `base` (Anthropic), or `openai` when running on the local default.
    pub default_family: String,
}

/// Which model embeds code for the code index (`/v1/embeddings/code_embeddings`).
#[derive(Debug, Clone)]
pub struct CodeEmbeddingsConfig {
    /// `AIGW_CODE_EMBEDDINGS__PROVIDER`: `local` (the bundled model server,
    /// default), `openai` (`OPENAI_BASE_URL`, an OpenAI-compatible
    /// `/embeddings`) or `vertex` (Vertex AI `:predict`).
    pub provider: EmbeddingProvider,
    /// `AIGW_CODE_EMBEDDINGS__MODEL`: `all-minilm-l6-v2` (local),
    /// `text-embedding-3-small` (openai) or `text-embedding-005` (vertex) by default.
    pub model: String,
    /// `AIGW_CODE_EMBEDDINGS__BATCH_SIZE` (32): texts per call to the model;
    /// a batch the model refuses as too long is halved.
    pub batch_size: usize,
    /// `AIGW_CODE_EMBEDDINGS__TIMEOUT_SECONDS` (60): one call to the model.
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddingProvider {
    Local,
    OpenAi,
    Vertex,
}

#[derive(Debug, Clone)]
pub struct DocsConfig {
    /// `AIGW_DOCS__DIR`: the Markdown the documentation search indexes:
    /// `./docs`, else `docs/` next to the prompts directory, else the source
    /// tree's `docs/`.
    pub dir: PathBuf,
    /// `AIGW_DOCS__BASE_URL`: prefix of each result's `source_url`; unset
    /// gives relative links (`docs/error-codes.md#error-a1000`).
    pub base_url: String,
}

/// The Duo Workflow gRPC service (`crates/gateway/src/workflow_service`),
/// served by `duo-gateway` on its own port.
#[derive(Debug, Clone)]
pub struct WorkflowServiceConfig {
    /// `AIGW_WORKFLOW_SERVICE__LISTEN` (127.0.0.1:50052, GitLab's port); set
    /// to an empty string to turn the service off.
    pub listen: Option<String>,
    /// `AIGW_WORKFLOW_SERVICE__TLS_CERT_FILE` / `__TLS_KEY_FILE`: PEM files;
    /// both set means the service speaks TLS only.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// `AIGW_WORKFLOW_SERVICE__SERVICE_NAME` (gitlab-duo-workflow-service):
    /// issuer and audience of the tokens `GenerateToken` mints.
    pub service_name: String,
    /// `AIGW_WORKFLOW_SERVICE__TOKEN_LIFETIME_SECONDS` (3600).
    pub token_lifetime: Duration,
    /// `AIGW_WORKFLOW_SERVICE__MAX_MODEL_CALLS` (50): model calls one
    /// stream may make before the run fails.
    pub max_model_calls: u32,
    /// `AIGW_WORKFLOW_SERVICE__MAX_CONTEXT_TOKENS` (100000): the estimated
    /// size above which the oldest turns are trimmed before a model call.
    pub max_context_tokens: usize,
    /// `AIGW_WORKFLOW_SERVICE__HTTP_RETRY_BASE_MILLISECONDS` (1000): first
    /// back-off of a GitLab call that answered 5xx (then doubled, at most 10 s,
    /// 3 retries).
    pub http_retry_base: Duration,
    /// `AIGW_WORKFLOW_SERVICE__CHECKPOINT_INTERVAL_MILLISECONDS` (25): the
    /// least time between two checkpoints stored behind a run's read-only
    /// steps (durability points never wait for it).
    pub checkpoint_interval: Duration,
    /// `AIGW_WORKFLOW_SERVICE__ACTION_TIMEOUT_SECONDS` (600): the longest the
    /// service waits for the executor's answer to one action.
    pub action_timeout: Duration,
    /// `AIGW_WORKFLOW_SERVICE__SHUTDOWN_GRACE_SECONDS` (10): how long running
    /// streams may go on after SIGTERM (health turns NOT_SERVING at once).
    pub shutdown_grace: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {name}: {reason}")]
pub struct ConfigError {
    pub name: &'static str,
    pub reason: String,
}

fn project_dir(sub: &str) -> PathBuf {
    // Prefer ./<sub> (deployments), else the source tree (cargo run from anywhere).
    let local = PathBuf::from(sub);
    if local.is_dir() {
        return local;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(sub)
}

/// `./docs` when present, else `docs/` beside an explicit prompts directory
/// (an unpacked release), else the source tree's.
fn docs_dir_beside(prompts_dir: Option<String>) -> PathBuf {
    let local = PathBuf::from("docs");
    if local.is_dir() {
        return local;
    }
    if let Some(sibling) = prompts_dir
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(|parent| parent.join("docs")))
        .filter(|d| d.is_dir())
    {
        return sibling;
    }
    project_dir("docs")
}

struct Env<'a>(&'a BTreeMap<String, String>);

impl Env<'_> {
    fn get(&self, name: &str) -> Option<String> {
        self.0
            .get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }
    fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or_else(|| default.to_owned())
    }
    fn secret(&self, name: &str) -> Option<SecretString> {
        self.get(name).map(SecretString::from)
    }
    fn flag(&self, name: &'static str) -> Result<bool, ConfigError> {
        match self.get(name).map(|v| v.to_ascii_lowercase()) {
            None => Ok(false),
            Some(v) if matches!(v.as_str(), "1" | "true" | "yes" | "on") => Ok(true),
            Some(v) if matches!(v.as_str(), "0" | "false" | "no" | "off") => Ok(false),
            Some(v) => Err(ConfigError {
                name,
                reason: format!("expected true or false, got {v:?}"),
            }),
        }
    }
    fn number<T: std::str::FromStr>(
        &self,
        name: &'static str,
        default: T,
    ) -> Result<T, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| ConfigError {
                name,
                reason: format!("expected a number, got {v:?}"),
            }),
        }
    }
    fn seconds(&self, name: &'static str, default: u64) -> Result<Duration, ConfigError> {
        self.number(name, default).map(Duration::from_secs)
    }
    /// Seconds with a fraction (`0.5`); must be positive.
    fn fractional_seconds(
        &self,
        name: &'static str,
        default: f64,
    ) -> Result<Duration, ConfigError> {
        let value: f64 = self.number(name, default)?;
        Duration::try_from_secs_f64(value)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| ConfigError {
                name,
                reason: format!("expected a positive number of seconds, got {value}"),
            })
    }
    fn json<T: serde::de::DeserializeOwned + Default>(
        &self,
        name: &'static str,
        what: &str,
    ) -> Result<T, ConfigError> {
        match self.get(name) {
            None => Ok(T::default()),
            Some(json) => serde_json::from_str(&json).map_err(|e| ConfigError {
                name,
                reason: format!("expected {what}: {e}"),
            }),
        }
    }
}

impl Config {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_map(&std::env::vars().collect())
    }

    pub fn from_map(vars: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let env = Env(vars);
        let default_families: HashMap<String, String> = env.json(
            "AIGW_DEFAULT_PROMPTS",
            "a JSON object of prompt id to family",
        )?;
        let local_llm_url = env.string("AIGW_LOCAL_LLM__URL", "http://127.0.0.1:5053/v1");
        let providers = ProvidersConfig {
            mock_model_responses: env.flag("AIGW_MOCK_MODEL_RESPONSES")?,
            custom_models_enabled: env.flag("AIGW_CUSTOM_MODELS__ENABLED")?,
            egress: crate::providers::EgressPolicy::parse(
                &env.string("AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST", ""),
            )
            .map_err(|e| ConfigError {
                name: "AIGW_CUSTOM_MODELS__EGRESS_ALLOW_LIST",
                reason: e.to_string(),
            })?,
            anthropic_api_key: env.secret("ANTHROPIC_API_KEY"),
            anthropic_base_url: env.string("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
            openai_base_url: env.get("OPENAI_BASE_URL"),
            openai_api_key: env.secret("OPENAI_API_KEY"),
            vertex_endpoint: env
                .get("AIGW_VERTEX_TEXT_MODEL__ENDPOINT")
                .unwrap_or_else(|| {
                    local_llm_url
                        .trim_end_matches('/')
                        .trim_end_matches("/v1")
                        .to_owned()
                }),
            local_llm_url,
            local_llm_model: env.string("AIGW_LOCAL_LLM__MODEL", "smollm2-135m-instruct"),
            local_embedding_model: env
                .string("AIGW_LOCAL_LLM__EMBEDDING_MODEL", "all-minilm-l6-v2"),
            vertex_project: env.string("AIGW_GOOGLE_CLOUD_PLATFORM__PROJECT", "local"),
            vertex_location: env.string("AIGW_GOOGLE_CLOUD_PLATFORM__LOCATION", "us-central1"),
            vertex_access_token: env.secret("AIGW_GOOGLE_CLOUD_PLATFORM__ACCESS_TOKEN"),
            proxy_timeout: env.seconds("AIGW_PROXY__TIMEOUT_SECONDS", 60)?,
            first_token_timeout: env
                .fractional_seconds("AIGW_MODELS__FIRST_TOKEN_TIMEOUT_SECONDS", 30.0)?,
            concurrency_limits: env.json(
                "AIGW_MODEL_ENGINE_CONCURRENCY_LIMITS",
                "a JSON object of model engine to {model name: limit}",
            )?,
            model_context_tokens: env.json(
                "AIGW_MODEL_CONTEXT_TOKENS",
                "a JSON object of model id to its context size in tokens",
            )?,
        };
        let mut default_families = default_families;
        if providers.uses_local_default() {
            // The bundled model cannot be trusted with ReAct text; its server
            // constrains tool calls, so the chat agent asks it natively.
            default_families
                .entry(CHAT_AGENT_PROMPT.to_owned())
                .or_insert_with(|| LOCAL_CHAT_AGENT_FAMILY.to_owned());
        }
        let default_family = if providers.uses_local_default()
            || (providers.anthropic_api_key.is_none() && providers.openai_base_url.is_some())
        {
            "openai"
        } else {
            "base"
        };
        Ok(Self {
            api_host: env.string("AIGW_FASTAPI__API_HOST", "127.0.0.1"),
            api_port: env.number("AIGW_FASTAPI__API_PORT", 5052)?,
            metrics_port: match env.get("AIGW_FASTAPI__METRICS_PORT") {
                None => None,
                Some(_) => Some(env.number("AIGW_FASTAPI__METRICS_PORT", 0)?),
            },
            environment: env.string("AIGW_ENVIRONMENT", "production"),
            max_body_bytes: env.number("AIGW_MAX_REQUEST_BODY_BYTES", 32 * 1024 * 1024)?,
            max_prompt_bytes: env.number("AIGW_MAX_PROMPT_BYTES", 4 * 1024 * 1024)?,
            auth: AuthConfig {
                bypass_external: env.flag("AIGW_AUTH__BYPASS_EXTERNAL")?,
                bypass_external_with_header: env.flag("AIGW_AUTH__BYPASS_EXTERNAL_WITH_HEADER")?,
                bypass_jwt_signature: env.flag("AIGW_AUTH__BYPASS_JWT_SIGNATURE")?,
                service_name: env.string("CLOUD_CONNECTOR_SERVICE_NAME", "gitlab-ai-gateway"),
                gitlab_url: Some(env.string("AIGW_GITLAB_URL", "http://127.0.0.1:3000")),
                customer_portal_url: env.get("AIGW_CUSTOMER_PORTAL_URL"),
                signing_key: env.secret("AIGW_SELF_SIGNED_JWT__SIGNING_KEY"),
                validation_key: env.secret("AIGW_SELF_SIGNED_JWT__VALIDATION_KEY"),
                jwks_cache_ttl: env.seconds("AIGW_AUTH__JWKS_CACHE_SECONDS", 86_400)?,
                jwks_timeout: env.seconds("AIGW_AUTH__JWKS_TIMEOUT_SECONDS", 10)?,
                leeway: env.seconds("AIGW_AUTH__LEEWAY_SECONDS", 30)?,
            },
            prompts: PromptsConfig {
                dir: env
                    .get("AIGW_PROMPTS_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| project_dir("prompts")),
                default_families,
                default_family: env.string("AIGW_PROMPTS__DEFAULT_FAMILY", default_family),
            },
            docs: DocsConfig {
                dir: env
                    .get("AIGW_DOCS__DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| docs_dir_beside(env.get("AIGW_PROMPTS_DIR"))),
                base_url: env.string("AIGW_DOCS__BASE_URL", ""),
            },
            code_embeddings: {
                let provider = match env
                    .string("AIGW_CODE_EMBEDDINGS__PROVIDER", "local")
                    .as_str()
                {
                    "local" => EmbeddingProvider::Local,
                    "openai" => EmbeddingProvider::OpenAi,
                    "vertex" => EmbeddingProvider::Vertex,
                    other => {
                        return Err(ConfigError {
                            name: "AIGW_CODE_EMBEDDINGS__PROVIDER",
                            reason: format!("{other:?} is not one of local, openai, vertex"),
                        });
                    }
                };
                let default_model = match provider {
                    EmbeddingProvider::Local => providers.local_embedding_model.clone(),
                    EmbeddingProvider::OpenAi => "text-embedding-3-small".to_owned(),
                    EmbeddingProvider::Vertex => "text-embedding-005".to_owned(),
                };
                CodeEmbeddingsConfig {
                    provider,
                    model: env.string("AIGW_CODE_EMBEDDINGS__MODEL", &default_model),
                    batch_size: env
                        .number("AIGW_CODE_EMBEDDINGS__BATCH_SIZE", 32usize)?
                        .clamp(1, 250),
                    timeout: env.seconds("AIGW_CODE_EMBEDDINGS__TIMEOUT_SECONDS", 60)?,
                }
            },
            workflow: WorkflowServiceConfig {
                // Unset means the default port; an empty value turns it off.
                listen: match vars.get("AIGW_WORKFLOW_SERVICE__LISTEN") {
                    None => Some("127.0.0.1:50052".to_owned()),
                    Some(v) if v.trim().is_empty() => None,
                    Some(v) => Some(v.trim().to_owned()),
                },
                tls_cert_file: env
                    .get("AIGW_WORKFLOW_SERVICE__TLS_CERT_FILE")
                    .map(PathBuf::from),
                tls_key_file: env
                    .get("AIGW_WORKFLOW_SERVICE__TLS_KEY_FILE")
                    .map(PathBuf::from),
                service_name: env.string(
                    "AIGW_WORKFLOW_SERVICE__SERVICE_NAME",
                    "gitlab-duo-workflow-service",
                ),
                token_lifetime: env
                    .seconds("AIGW_WORKFLOW_SERVICE__TOKEN_LIFETIME_SECONDS", 3600)?,
                max_model_calls: env.number("AIGW_WORKFLOW_SERVICE__MAX_MODEL_CALLS", 50)?,
                max_context_tokens: env
                    .number("AIGW_WORKFLOW_SERVICE__MAX_CONTEXT_TOKENS", 100_000)?,
                http_retry_base: Duration::from_millis(
                    env.number("AIGW_WORKFLOW_SERVICE__HTTP_RETRY_BASE_MILLISECONDS", 1000)?,
                ),
                checkpoint_interval: Duration::from_millis(env.number(
                    "AIGW_WORKFLOW_SERVICE__CHECKPOINT_INTERVAL_MILLISECONDS",
                    25,
                )?),
                action_timeout: env
                    .seconds("AIGW_WORKFLOW_SERVICE__ACTION_TIMEOUT_SECONDS", 600)?,
                shutdown_grace: env.seconds("AIGW_WORKFLOW_SERVICE__SHUTDOWN_GRACE_SECONDS", 10)?,
            },
            log_level: env.string("AIGW_LOGGING__LEVEL", "info"),
            log_json: env.flag("AIGW_LOGGING__FORMAT_JSON")?,
            shutdown: ShutdownConfig {
                drain: env.seconds("AIGW_SHUTDOWN__DRAIN_SECONDS", 0)?,
                grace: env.seconds("AIGW_SHUTDOWN__GRACE_SECONDS", 30)?,
            },
            providers,
        })
    }

    /// A configuration for tests: defaults with the given overrides.
    pub fn for_tests(overrides: &[(&str, &str)]) -> Result<Self, ConfigError> {
        let vars = overrides
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::from_map(&vars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_safe() {
        let c = Config::for_tests(&[]).unwrap();
        assert_eq!((c.api_host.as_str(), c.api_port), ("127.0.0.1", 5052));
        assert!(!c.auth.bypass_external);
        assert!(!c.providers.custom_models_enabled);
        assert!(c.providers.uses_local_default());
        assert_eq!(c.prompts.default_family, "openai");
        assert_eq!(c.auth.service_name, "gitlab-ai-gateway");
        assert_eq!(c.providers.vertex_endpoint, "http://127.0.0.1:5053");
    }

    #[test]
    fn the_workflow_service_listens_on_gitlabs_port_unless_turned_off() {
        let c = Config::for_tests(&[]).unwrap();
        assert_eq!(c.workflow.listen.as_deref(), Some("127.0.0.1:50052"));
        assert_eq!(c.workflow.service_name, "gitlab-duo-workflow-service");
        let c = Config::for_tests(&[("AIGW_WORKFLOW_SERVICE__LISTEN", "")]).unwrap();
        assert_eq!(c.workflow.listen, None);
        let err =
            Config::for_tests(&[("AIGW_WORKFLOW_SERVICE__MAX_MODEL_CALLS", "many")]).unwrap_err();
        assert_eq!(err.name, "AIGW_WORKFLOW_SERVICE__MAX_MODEL_CALLS");
    }

    #[test]
    fn anthropic_key_switches_the_default_family() {
        let c = Config::for_tests(&[("ANTHROPIC_API_KEY", "k")]).unwrap();
        assert!(!c.providers.uses_local_default());
        assert_eq!(c.prompts.default_family, "base");
    }

    #[test]
    fn docs_search_settings() {
        let c = Config::for_tests(&[]).unwrap();
        assert!(c.docs.dir.ends_with("docs") && c.docs.dir.is_dir());
        assert_eq!(c.docs.base_url, "");
        let c = Config::for_tests(&[
            ("AIGW_DOCS__DIR", "/srv/docs"),
            ("AIGW_DOCS__BASE_URL", "https://gitlab.example"),
        ])
        .unwrap();
        assert_eq!(c.docs.dir, PathBuf::from("/srv/docs"));
        assert_eq!(c.docs.base_url, "https://gitlab.example");
    }

    #[test]
    fn docs_sit_beside_an_explicit_prompts_dir() {
        let root = std::env::temp_dir().join(format!("aigw-docs-beside-{}", std::process::id()));
        std::fs::create_dir_all(root.join("docs")).unwrap();
        let prompts = root.join("prompts").display().to_string();
        let found = docs_dir_beside(Some(prompts));
        std::fs::remove_dir_all(&root).unwrap();
        // `./docs` wins when the tests run from a directory that has one.
        if !PathBuf::from("docs").is_dir() {
            assert_eq!(found, root.join("docs"));
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        let err = Config::for_tests(&[("AIGW_AUTH__BYPASS_EXTERNAL", "maybe")]).unwrap_err();
        assert_eq!(err.name, "AIGW_AUTH__BYPASS_EXTERNAL");
        let err = Config::for_tests(&[("AIGW_DEFAULT_PROMPTS", "[1]")]).unwrap_err();
        assert_eq!(err.name, "AIGW_DEFAULT_PROMPTS");
        for bad in ["0", "-1", "soon"] {
            let err = Config::for_tests(&[("AIGW_MODELS__FIRST_TOKEN_TIMEOUT_SECONDS", bad)])
                .unwrap_err();
            assert_eq!(
                err.name, "AIGW_MODELS__FIRST_TOKEN_TIMEOUT_SECONDS",
                "{bad}"
            );
        }
        let err = Config::for_tests(&[("AIGW_MODEL_ENGINE_CONCURRENCY_LIMITS", r#"{"a": 1}"#)])
            .unwrap_err();
        assert_eq!(err.name, "AIGW_MODEL_ENGINE_CONCURRENCY_LIMITS");
    }

    #[test]
    fn model_limits_and_first_token_timeout() {
        let c = Config::for_tests(&[]).unwrap();
        assert_eq!(c.providers.first_token_timeout, Duration::from_secs(30));
        assert_eq!(c.providers.concurrency_limit("anthropic", "m"), None);
        let c = Config::for_tests(&[
            ("AIGW_MODELS__FIRST_TOKEN_TIMEOUT_SECONDS", "0.25"),
            (
                "AIGW_MODEL_ENGINE_CONCURRENCY_LIMITS",
                r#"{"anthropic": {"claude-3-5-sonnet-20241022": 40}}"#,
            ),
        ])
        .unwrap();
        assert_eq!(c.providers.first_token_timeout, Duration::from_millis(250));
        assert_eq!(
            c.providers
                .concurrency_limit("anthropic", "claude-3-5-sonnet-20241022"),
            Some(40)
        );
        assert_eq!(
            c.providers
                .concurrency_limit("vertex_ai", "claude-3-5-sonnet-20241022"),
            None
        );
    }
}
