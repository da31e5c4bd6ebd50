//! MCP servers the executor connects to for a workflow, as GitLab's clients
//! configure them: `<workspace>/.gitlab/duo/mcp.json` and the user's
//! `~/.gitlab/duo/mcp.json`, both `{"mcpServers": {name: {...}}}`.
//!
//! Their tools are offered to the workflow service under the server's name
//! (`<server>_<tool>`) and run here on `runMCPTool`. Trust is narrow:
//! - the monolith decides whether the workflow may use MCP at all and which
//!   servers (the instance allow-list); servers not on it are never
//!   contacted;
//! - a workspace file (a repository's content) may name HTTP servers only:
//!   programs (stdio servers) start only from the user's own file, confined
//!   to the workspace with a clean environment;
//! - a server that is down, slow or answers nonsense is reported and left
//!   out, or its call fails with a message: it never ends the run.

use contracts::duo_workflow::{McpTool, PlainTextResponse, action_response};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// Where a workspace keeps its MCP servers (GitLab's path).
pub const WORKSPACE_CONFIG: &str = ".gitlab/duo/mcp.json";
/// The user's file, below the home directory.
pub const USER_CONFIG: &str = ".gitlab/duo/mcp.json";

/// Largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;
/// Most servers one file may name.
const MAX_SERVERS: usize = 20;
/// Most tools taken from one server.
const MAX_TOOLS_PER_SERVER: usize = 64;

/// How one server is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// Streamable HTTP at `url`, with extra request headers.
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
    /// A program speaking MCP on its standard input and output.
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
}

/// Which file named a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Workspace,
    User,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub name: String,
    pub transport: Transport,
    pub source: Source,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigFile {
    #[serde(default)]
    mcp_servers: BTreeMap<String, ServerEntry>,
}

#[derive(Deserialize)]
struct ServerEntry {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The servers of one configuration file; problems with single entries are
/// warnings (the others still count), an unreadable file is an error.
pub fn parse(text: &str, source: Source) -> Result<(Vec<ServerConfig>, Vec<String>), String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("not a valid MCP configuration: {e}"))?;
    if !value.is_object() {
        return Err("not a valid MCP configuration: not a JSON object".to_owned());
    }
    let file: ConfigFile =
        serde_json::from_value(value).map_err(|e| format!("not a valid MCP configuration: {e}"))?;
    let mut servers = Vec::new();
    let mut warnings = Vec::new();
    for (name, entry) in file.mcp_servers {
        if servers.len() == MAX_SERVERS {
            warnings.push(format!(
                "{name}: more than {MAX_SERVERS} servers configured"
            ));
            continue;
        }
        if !valid_server_name(&name) {
            warnings.push(format!(
                "{:?}: server names have 1 to 32 letters, digits, `_` or `-`",
                name.chars().take(40).collect::<String>()
            ));
            continue;
        }
        let kind = entry.kind.as_deref().unwrap_or(if entry.command.is_some() {
            "stdio"
        } else {
            "http"
        });
        let transport = match (kind, entry.url, entry.command) {
            ("http" | "streamable-http" | "streamableHttp", Some(url), _) => {
                match reqwest::Url::parse(&url) {
                    Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => Transport::Http {
                        url,
                        headers: entry.headers.into_iter().collect(),
                    },
                    _ => {
                        warnings.push(format!("{name}: the url is not an http(s) URL"));
                        continue;
                    }
                }
            }
            ("stdio", _, Some(command)) if source == Source::User => Transport::Stdio {
                command,
                args: entry.args,
                env: entry.env.into_iter().collect(),
            },
            ("stdio", _, Some(_)) => {
                warnings.push(format!(
                    "{name}: programs (stdio servers) start only from the user's own {USER_CONFIG}, not from the workspace's"
                ));
                continue;
            }
            (other, _, _) => {
                warnings.push(format!(
                    "{name}: type {other:?} needs a url (http) or a command (stdio)"
                ));
                continue;
            }
        };
        servers.push(ServerConfig {
            name,
            transport,
            source,
        });
    }
    Ok((servers, warnings))
}

fn read_config(path: &Path, source: Source) -> Result<(Vec<ServerConfig>, Vec<String>), String> {
    let shown = path.display();
    let metadata = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if metadata.len() > MAX_CONFIG_BYTES {
        return Err(format!("{shown} has more than {MAX_CONFIG_BYTES} bytes"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    parse(&text, source).map_err(|e| format!("{shown}: {e}"))
}

/// The servers of the workspace's and the user's files (the user's win on
/// a shared name), with warnings about what was left out. Missing files
/// are no warning.
pub fn load(
    workspace: &crate::Workspace,
    user_file: Option<&Path>,
) -> (Vec<ServerConfig>, Vec<String>) {
    let mut servers: Vec<ServerConfig> = Vec::new();
    let mut warnings = Vec::new();
    let workspace_file = workspace.root().join(WORKSPACE_CONFIG);
    let files = [
        (
            workspace
                .resolve(WORKSPACE_CONFIG)
                .map_err(|e| e.to_string()),
            Source::Workspace,
        ),
        (
            user_file.map(Path::to_path_buf).ok_or_else(String::new),
            Source::User,
        ),
    ];
    for (path, source) in files {
        let path = match path {
            Ok(path) if path.exists() => path,
            Ok(_) => continue,
            Err(e) if e.is_empty() => continue,
            Err(e) if source == Source::Workspace && workspace_file.exists() => {
                warnings.push(e);
                continue;
            }
            Err(_) => continue,
        };
        match read_config(&path, source) {
            Ok((found, mut more)) => {
                for server in found {
                    servers.retain(|s| s.name != server.name);
                    servers.push(server);
                }
                warnings.append(&mut more);
            }
            Err(e) => warnings.push(e),
        }
    }
    (servers, warnings)
}

/// What the monolith allows for the workflow (`mcp_enabled`,
/// `mcp_allowed_servers` of the workflow entity).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Permission {
    pub enabled: bool,
    /// `*` (any server, programs included) or URL prefixes.
    pub allowed: Vec<String>,
}

impl Permission {
    /// From the workflow entity (`GET …/workflows/:id`).
    pub fn from_workflow(entity: &Value) -> Self {
        Self {
            enabled: entity["mcp_enabled"].as_bool().unwrap_or(false),
            allowed: entity["mcp_allowed_servers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        }
    }

    /// Whether the executor may contact `server`.
    pub fn allows(&self, server: &ServerConfig) -> bool {
        if !self.enabled {
            return false;
        }
        if self.allowed.iter().any(|entry| entry == "*") {
            return true;
        }
        match &server.transport {
            Transport::Stdio { .. } => false,
            Transport::Http { url, .. } => self.allowed.iter().any(|entry| url_within(url, entry)),
        }
    }
}

/// Whether `url` lies under the allow-list entry `prefix`: same scheme, host
/// and port, and a path below the entry's at a segment boundary (so
/// `https://a.example` does not admit `https://a.example.evil.org`, nor
/// `/mcp` admit `/mcp-admin`).
pub fn url_within(url: &str, prefix: &str) -> bool {
    let (Ok(url), Ok(prefix)) = (reqwest::Url::parse(url), reqwest::Url::parse(prefix)) else {
        return false;
    };
    if url.scheme() != prefix.scheme()
        || url.host_str() != prefix.host_str()
        || url.port_or_known_default() != prefix.port_or_known_default()
    {
        return false;
    }
    let base = prefix.path();
    let path = url.path();
    base == "/"
        || path == base
        || (path.starts_with(base) && (base.ends_with('/') || path[base.len()..].starts_with('/')))
}

/// Bounds on talking to servers.
#[derive(Debug, Clone)]
pub struct McpLimits {
    /// Connecting, initializing and listing the tools of one server.
    pub connect_timeout: Duration,
    /// One tool call.
    pub call_timeout: Duration,
    /// Most bytes of one result passed on.
    pub max_result_bytes: usize,
}

impl Default for McpLimits {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(60),
            max_result_bytes: 64 * 1024,
        }
    }
}

type Client = RunningService<RoleClient, ()>;

struct Connected {
    client: Client,
    /// Kept so the program ends with the executor (kill on drop).
    _child: Option<tokio::process::Child>,
}

/// The connected servers and the tools they offer.
#[derive(Default)]
pub struct McpHub {
    servers: HashMap<String, Connected>,
    /// Offered name → (server, the server's own tool name).
    routes: BTreeMap<String, (String, String)>,
    offered: Vec<McpTool>,
    limits: McpLimits,
    /// What happened while connecting, for the user.
    pub reports: Vec<String>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHub")
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .field("tools", &self.routes.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `<server>_<tool>`, with what a model provider refuses in a name made `_`.
pub fn offered_name(server: &str, tool: &str) -> String {
    format!("{server}_{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

async fn spawn(
    command: &str,
    args: &[String],
    env: &[(String, String)],
    workspace: &Path,
) -> Result<
    (
        tokio::process::Child,
        tokio::process::ChildStdout,
        tokio::process::ChildStdin,
    ),
    String,
> {
    let mut program = tokio::process::Command::new(command);
    program
        .args(args)
        // The executor's environment may hold the workflow's tokens.
        .env_clear()
        .current_dir(workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for name in ["PATH", "HOME", "LANG", "TMPDIR"] {
        if let Some(value) = std::env::var_os(name) {
            program.env(name, value);
        }
    }
    program.envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = program
        .spawn()
        .map_err(|e| format!("cannot start {command}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no standard output")?;
    let stdin = child.stdin.take().ok_or("no standard input")?;
    Ok((child, stdout, stdin))
}

async fn open(server: &ServerConfig, workspace: &Path) -> Result<Connected, String> {
    match &server.transport {
        Transport::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (name, value) in headers {
                let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("header {name:?} is not a valid name"))?;
                let value = reqwest::header::HeaderValue::from_str(value)
                    .map_err(|_| format!("header {name} has an invalid value"))?;
                custom.insert(name, value);
            }
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
            config.custom_headers = custom;
            // No redirects: a server on the allow-list must not send the
            // executor elsewhere.
            let http = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| e.to_string())?;
            let transport = StreamableHttpClientTransport::with_client(http, config);
            let client = ().serve(transport).await.map_err(|e| e.to_string())?;
            Ok(Connected {
                client,
                _child: None,
            })
        }
        Transport::Stdio { command, args, env } => {
            let (child, stdout, stdin) = spawn(command, args, env, workspace).await?;
            let client = ().serve((stdout, stdin)).await.map_err(|e| e.to_string())?;
            Ok(Connected {
                client,
                _child: Some(child),
            })
        }
    }
}

impl McpHub {
    /// Connects to every allowed server at once (each within the connect
    /// timeout) and collects their tools; the others are reported.
    pub async fn connect(
        servers: Vec<ServerConfig>,
        permission: &Permission,
        workspace: &Path,
        limits: McpLimits,
    ) -> Self {
        let mut hub = Self {
            limits,
            ..Self::default()
        };
        let mut allowed = Vec::new();
        for server in servers {
            if !permission.enabled {
                hub.reports.push(format!(
                    "MCP server {} not used: MCP is not enabled for this workflow (instance or group setting, or the run_mcp_tools privilege)",
                    server.name
                ));
            } else if permission.allows(&server) {
                allowed.push(server);
            } else {
                hub.reports.push(format!(
                    "MCP server {} not used: it is not on the instance's allow-list",
                    server.name
                ));
            }
        }
        let timeout = hub.limits.connect_timeout;
        let attempts = allowed.into_iter().map(|server| async move {
            let result = tokio::time::timeout(timeout, async {
                let connected = open(&server, workspace).await?;
                let tools = connected
                    .client
                    .list_all_tools()
                    .await
                    .map_err(|e| format!("listing its tools failed: {e}"))?;
                Ok::<_, String>((connected, tools))
            })
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {}s", timeout.as_secs())));
            (server.name, result)
        });
        for (name, result) in futures::future::join_all(attempts).await {
            match result {
                Ok((connected, tools)) => hub.add(name, connected, tools),
                Err(reason) => hub
                    .reports
                    .push(format!("MCP server {name} is unavailable: {reason}")),
            }
        }
        hub
    }

    /// Adds a server already connected over any transport (tests, and
    /// embedders with their own servers).
    pub async fn attach(&mut self, name: &str, client: Client) -> Result<(), String> {
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| format!("listing its tools failed: {e}"))?;
        self.add(
            name.to_owned(),
            Connected {
                client,
                _child: None,
            },
            tools,
        );
        Ok(())
    }

    fn add(&mut self, server: String, connected: Connected, tools: Vec<rmcp::model::Tool>) {
        let mut taken = 0;
        for tool in tools {
            if taken == MAX_TOOLS_PER_SERVER {
                self.reports.push(format!(
                    "MCP server {server}: only its first {MAX_TOOLS_PER_SERVER} tools are offered"
                ));
                break;
            }
            let name = offered_name(&server, &tool.name);
            if self.routes.contains_key(&name) {
                self.reports.push(format!(
                    "MCP tool {name} is offered twice; the first is kept"
                ));
                continue;
            }
            let schema = Value::Object((*tool.input_schema).clone()).to_string();
            self.offered.push(McpTool {
                name: name.clone(),
                description: tool
                    .description
                    .as_deref()
                    .unwrap_or_default()
                    .chars()
                    .take(1024)
                    .collect(),
                input_schema: schema,
                ..McpTool::default()
            });
            self.routes
                .insert(name, (server.clone(), tool.name.to_string()));
            taken += 1;
        }
        self.reports.push(format!(
            "MCP server {server}: {taken} tool(s) offered to the workflow"
        ));
        self.servers.insert(server, connected);
    }

    /// The tools for the start request.
    pub fn offered(&self) -> Vec<McpTool> {
        self.offered.clone()
    }

    /// Runs `runMCPTool`: the server's text, or an error saying why the
    /// tool is unavailable.
    pub async fn call(&self, name: &str, args: &str) -> action_response::ResponseType {
        let failed = |error: String| {
            action_response::ResponseType::PlainTextResponse(PlainTextResponse {
                response: String::new(),
                error,
            })
        };
        let Some((server, tool)) = self.routes.get(name) else {
            return failed(format!(
                "the MCP tool {name} is unavailable: no connected server offers it"
            ));
        };
        let Some(connected) = self.servers.get(server) else {
            return failed(format!("the MCP server {server} is not connected"));
        };
        let arguments =
            match serde_json::from_str::<Value>(if args.trim().is_empty() { "{}" } else { args }) {
                Ok(Value::Object(map)) => map,
                _ => return failed("the arguments are not a JSON object".to_owned()),
            };
        let call = connected
            .client
            .call_tool(CallToolRequestParams::new(tool.clone()).with_arguments(arguments));
        match tokio::time::timeout(self.limits.call_timeout, call).await {
            Err(_) => failed(format!(
                "the MCP server {server} did not answer within {}s",
                self.limits.call_timeout.as_secs()
            )),
            Ok(Err(e)) => failed(format!("the MCP server {server} is unavailable: {e}")),
            Ok(Ok(result)) => {
                let text = self.result_text(&result);
                if result.is_error == Some(true) {
                    action_response::ResponseType::PlainTextResponse(PlainTextResponse {
                        response: text,
                        error: format!("the MCP tool {name} reported an error"),
                    })
                } else {
                    action_response::ResponseType::PlainTextResponse(PlainTextResponse {
                        response: text,
                        error: String::new(),
                    })
                }
            }
        }
    }

    fn result_text(&self, result: &CallToolResult) -> String {
        let mut parts: Vec<String> = result
            .content
            .iter()
            .map(|block| match block.as_text() {
                Some(text) => text.text.clone(),
                None => "[non-text content omitted]".to_owned(),
            })
            .collect();
        if parts.is_empty()
            && let Some(structured) = &result.structured_content
        {
            parts.push(structured.to_string());
        }
        let mut text = parts.join("\n").replace('\0', "\u{fffd}");
        let max = self.limits.max_result_bytes;
        if text.len() > max {
            let mut cut = max;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("\n[MCP result truncated]");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_names_http_servers_and_only_the_user_starts_programs() {
        let text = r#"{"mcpServers": {
            "tickets": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"X-Team": "a"}},
            "local": {"command": "my-mcp", "args": ["--stdio"]},
            "bad name": {"url": "https://x.example"},
            "ftp": {"type": "http", "url": "ftp://x.example"},
            "odd": {"type": "sse"}
        }}"#;
        let (servers, warnings) = parse(text, Source::Workspace).unwrap();
        assert_eq!(servers.len(), 1);
        assert_eq!(servers[0].name, "tickets");
        assert_eq!(
            servers[0].transport,
            Transport::Http {
                url: "https://mcp.example.com/mcp".into(),
                headers: vec![("X-Team".into(), "a".into())]
            }
        );
        assert_eq!(warnings.len(), 4, "{warnings:?}");
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("only from the user's own"))
        );
        let (servers, _) = parse(text, Source::User).unwrap();
        assert!(servers.iter().any(|s| matches!(
            &s.transport,
            Transport::Stdio { command, .. } if command == "my-mcp"
        )));
        assert!(parse("[]", Source::User).is_err());
    }

    #[test]
    fn the_allow_list_matches_whole_origins_and_path_segments() {
        assert!(url_within("https://a.example/mcp", "https://a.example"));
        assert!(url_within("https://a.example/mcp", "https://a.example/mcp"));
        assert!(url_within(
            "https://a.example/mcp/x",
            "https://a.example/mcp"
        ));
        assert!(!url_within(
            "https://a.example/mcp-admin",
            "https://a.example/mcp"
        ));
        assert!(!url_within(
            "https://a.example.evil.org/mcp",
            "https://a.example"
        ));
        assert!(!url_within("http://a.example/mcp", "https://a.example"));
        assert!(!url_within(
            "https://a.example:8443/mcp",
            "https://a.example"
        ));
        assert!(url_within(
            "https://a.example:443/mcp",
            "https://a.example/"
        ));
        let http = ServerConfig {
            name: "t".into(),
            transport: Transport::Http {
                url: "http://127.0.0.1:9/mcp".into(),
                headers: vec![],
            },
            source: Source::Workspace,
        };
        let stdio = ServerConfig {
            name: "p".into(),
            transport: Transport::Stdio {
                command: "x".into(),
                args: vec![],
                env: vec![],
            },
            source: Source::User,
        };
        let listed = Permission {
            enabled: true,
            allowed: vec!["http://127.0.0.1:9/".into()],
        };
        assert!(listed.allows(&http) && !listed.allows(&stdio));
        let any = Permission {
            enabled: true,
            allowed: vec!["*".into()],
        };
        assert!(any.allows(&http) && any.allows(&stdio));
        let off = Permission {
            enabled: false,
            allowed: vec!["*".into()],
        };
        assert!(!off.allows(&http));
        let entity = serde_json::json!({"mcp_enabled": true, "mcp_allowed_servers": ["*"]});
        assert_eq!(Permission::from_workflow(&entity), any);
    }

    #[test]
    fn offered_names_carry_the_server_and_suit_model_providers() {
        assert_eq!(offered_name("tickets", "lookup"), "tickets_lookup");
        assert_eq!(offered_name("t", "a.b/c d"), "t_a_b_c_d");
        assert_eq!(offered_name("t", &"x".repeat(100)).len(), 64);
    }
}
