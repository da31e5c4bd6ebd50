//! Command-line options, `direct_access`, workflow creation and the terminal
//! approver.

use crate::session::{Approver, Decision, PendingRequest, Reporter, ServiceTarget};
use contracts::duo_workflow::{NewCheckpoint, action};
use serde_json::{Value, json};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
duo-workflow-executor: run a GitLab Duo Workflow in this checkout

USAGE:
  duo-workflow-executor --gitlab-url URL --token TOKEN
      (--workflow-id ID | --goal TEXT --project-id ID) [OPTIONS]

OPTIONS:
  --gitlab-url URL          the GitLab (monolith) base URL [env DUO_GITLAB_URL]
  --token TOKEN             a personal access token (scope api) [env DUO_GITLAB_TOKEN]
  --workflow-id ID          run this existing workflow
  --goal TEXT               create a workflow with this goal (needs --project-id)
  --project-id ID           the project of a new workflow
  --definition NAME         chat or software_development (default chat)
  --privileges LIST         agent privileges of a new workflow (default 1,2)
  --pre-approved LIST       privileges that never ask (default 2)
  --workspace DIR           the only directory actions may touch (default .)
  --approve RULE            answer approvals without asking: all, plan, or a
                            tool name (repeatable); unmatched requests are
                            asked on a terminal, else the run stays paused
  --reject-unmatched        reject what no rule approves instead of pausing
  --decide-first ANSWER     approve or reject (with --reject-message) the
                            first request only, whatever it is: the answer a
                            user gave on the web page; later ones pause
  --reject-message TEXT     the message sent with a rejection
  --allow-command PROGRAM   allow only these programs (repeatable)
  --command-timeout SECS    default command timeout (default 120)
  --max-file-bytes N        largest file read or written (default 2097152)
  --service-url URL         skip direct_access: the workflow service address
  --service-token TOKEN     with --service-url: its token [env DUO_SERVICE_TOKEN]
  --service-headers JSON    with --service-url: request metadata for the
                            service, a JSON object [env DUO_SERVICE_HEADERS]
  --ca-file PEM             CA certificate for the service's TLS
  --mcp-config PATH         the user's MCP servers (default
                            ~/.gitlab/duo/mcp.json); the workspace's
                            .gitlab/duo/mcp.json is read too (HTTP servers
                            only). Used when GitLab enables MCP for the
                            workflow and lists the server as allowed
  --mcp-timeout SECS        longest MCP tool call (default 60)
  --no-mcp                  connect to no MCP server
  --quiet                   print only the outcome

RUNS STARTED IN THE PRODUCT (set by a runner in a sandbox):
  --gitlab-socket PATH      reach GitLab through this unix socket (a loopback
                            relay stands in for --gitlab-url)
  --service-socket PATH     reach the workflow service through this socket
  --clone-project PATH      clone this project (group/project) into the
                            workspace through GitLab's git HTTP first
  --source-ref REF          the branch to clone (default: main)
  --checkpoint-ref REF      continue from this hidden ref if it exists, and
                            commit and push the workspace to it at the end
  --git-author 'NAME <EMAIL>'  who commits the checkpoints

Commands run with a cleared environment (PATH, HOME, LANG and a few more):
no token reaches them. Tokens given as options are moved into the
executor's environment at start, off its command line.

EXIT STATUS: 0 finished, 1 failed, 2 bad options, 3 paused for an approval,
4 finished without changing anything (software development: no edit made).
";

/// Options that take no value (every other option takes the next argument).
pub const SWITCHES: &[&str] = &["--reject-unmatched", "--quiet", "--no-mcp", "--help", "-h"];

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub gitlab_url: String,
    pub token: String,
    pub workflow_id: Option<String>,
    pub goal: Option<String>,
    pub project_id: Option<i64>,
    pub definition: String,
    pub privileges: Vec<i64>,
    pub pre_approved: Vec<i64>,
    pub workspace: PathBuf,
    pub approve: Vec<String>,
    pub reject_unmatched: bool,
    pub reject_message: Option<String>,
    /// `Some(true)`: approve the first request; `Some(false)`: reject it.
    pub decide_first: Option<bool>,
    pub allowed_commands: Vec<String>,
    pub command_timeout: Duration,
    pub max_file_bytes: usize,
    pub service_url: Option<String>,
    pub service_token: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub quiet: bool,
    /// Request metadata for the service (with `--service-url`).
    pub service_headers: Vec<(String, String)>,
    pub gitlab_socket: Option<PathBuf>,
    pub service_socket: Option<PathBuf>,
    pub clone_project: Option<String>,
    pub source_ref: String,
    pub checkpoint_ref: Option<String>,
    /// (name, email) of the checkpoint commits.
    pub git_author: Option<(String, String)>,
    /// The user's MCP configuration file (`None`: no home directory).
    pub mcp_config: Option<PathBuf>,
    pub mcp_timeout: Duration,
    pub no_mcp: bool,
}

/// `{"name": "value", ...}` into header pairs.
fn headers(json: &str) -> Result<Vec<(String, String)>, String> {
    let value: serde_json::Map<String, Value> = serde_json::from_str(json)
        .map_err(|e| format!("--service-headers is not a JSON object: {e}"))?;
    value
        .into_iter()
        .map(|(name, value)| match value {
            Value::String(text) => Ok((name.to_ascii_lowercase(), text)),
            _ => Err(format!("--service-headers: {name} is not a string")),
        })
        .collect()
}

/// `Name <email>`.
fn author(text: &str) -> Result<(String, String), String> {
    let (name, rest) = text
        .split_once('<')
        .ok_or("--git-author must look like \"Name <email>\"")?;
    let email = rest
        .strip_suffix('>')
        .ok_or("--git-author must look like \"Name <email>\"")?;
    if name.trim().is_empty() || email.trim().is_empty() {
        return Err("--git-author needs a name and an email".to_owned());
    }
    Ok((name.trim().to_owned(), email.trim().to_owned()))
}

fn list(value: &str) -> Result<Vec<i64>, String> {
    value
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a number"))
        })
        .collect()
}

impl Options {
    /// Parses arguments (without the program name); environment variables
    /// fill in the URL and tokens.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        Self::parse_with(args, |name| std::env::var(name).ok())
    }

    /// [`Options::parse`] with `variable` looking up the variables (the
    /// tokens handed over at start come from there).
    pub fn parse_with(
        args: &[String],
        variable: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let mut options = Self {
            gitlab_url: variable("DUO_GITLAB_URL").unwrap_or_default(),
            token: variable("DUO_GITLAB_TOKEN").unwrap_or_default(),
            service_token: variable("DUO_SERVICE_TOKEN").filter(|t| !t.is_empty()),
            service_headers: match variable("DUO_SERVICE_HEADERS").filter(|t| !t.is_empty()) {
                Some(json) => headers(&json)?,
                None => Vec::new(),
            },
            source_ref: "main".to_owned(),
            definition: "chat".to_owned(),
            privileges: vec![1, 2],
            pre_approved: vec![2],
            workspace: PathBuf::from("."),
            command_timeout: Duration::from_secs(120),
            max_file_bytes: 2 * 1024 * 1024,
            mcp_config: variable("HOME")
                .filter(|home| !home.is_empty())
                .map(|home| PathBuf::from(home).join(crate::mcp::USER_CONFIG)),
            mcp_timeout: Duration::from_secs(60),
            ..Self::default()
        };
        let mut iter = args.iter();
        while let Some(flag) = iter.next() {
            let mut value = || {
                iter.next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag.as_str() {
                "--gitlab-url" => options.gitlab_url = value()?,
                "--token" => options.token = value()?,
                "--workflow-id" => options.workflow_id = Some(value()?),
                "--goal" => options.goal = Some(value()?),
                "--project-id" => {
                    options.project_id = Some(
                        value()?
                            .parse()
                            .map_err(|_| "--project-id must be a number")?,
                    )
                }
                "--definition" => options.definition = value()?,
                "--privileges" => options.privileges = list(&value()?)?,
                "--pre-approved" => options.pre_approved = list(&value()?)?,
                "--workspace" => options.workspace = PathBuf::from(value()?),
                "--approve" => options.approve.push(value()?),
                "--reject-unmatched" => options.reject_unmatched = true,
                "--reject-message" => options.reject_message = Some(value()?),
                "--decide-first" => {
                    options.decide_first = Some(match value()?.as_str() {
                        "approve" => true,
                        "reject" => false,
                        other => {
                            return Err(format!(
                                "--decide-first takes approve or reject, not {other:?}"
                            ));
                        }
                    })
                }
                "--allow-command" => options.allowed_commands.push(value()?),
                "--command-timeout" => {
                    options.command_timeout = Duration::from_secs(
                        value()?
                            .parse()
                            .map_err(|_| "--command-timeout must be seconds")?,
                    )
                }
                "--max-file-bytes" => {
                    options.max_file_bytes = value()?
                        .parse()
                        .map_err(|_| "--max-file-bytes must be a number")?
                }
                "--service-url" => options.service_url = Some(value()?),
                "--service-token" => options.service_token = Some(value()?),
                "--ca-file" => options.ca_file = Some(PathBuf::from(value()?)),
                "--quiet" => options.quiet = true,
                "--service-headers" => options.service_headers = headers(&value()?)?,
                "--gitlab-socket" => options.gitlab_socket = Some(PathBuf::from(value()?)),
                "--service-socket" => options.service_socket = Some(PathBuf::from(value()?)),
                "--clone-project" => options.clone_project = Some(value()?),
                "--source-ref" => options.source_ref = value()?,
                "--checkpoint-ref" => options.checkpoint_ref = Some(value()?),
                "--git-author" => options.git_author = Some(author(&value()?)?),
                "--mcp-config" => options.mcp_config = Some(PathBuf::from(value()?)),
                "--mcp-timeout" => {
                    options.mcp_timeout = Duration::from_secs(
                        value()?
                            .parse()
                            .map_err(|_| "--mcp-timeout must be seconds")?,
                    )
                }
                "--no-mcp" => options.no_mcp = true,
                other => return Err(format!("unknown option {other}")),
            }
        }
        if (options.gitlab_url.is_empty() && options.gitlab_socket.is_none())
            || options.token.is_empty()
        {
            return Err("--gitlab-url (or --gitlab-socket) and --token are required".to_owned());
        }
        if options.service_socket.is_some() && options.service_token.is_none() {
            return Err("--service-socket needs --service-token".to_owned());
        }
        if options.checkpoint_ref.is_some() && options.clone_project.is_none() {
            return Err("--checkpoint-ref goes with --clone-project".to_owned());
        }
        if options.workflow_id.is_none() && (options.goal.is_none() || options.project_id.is_none())
        {
            return Err("give --workflow-id, or --goal with --project-id".to_owned());
        }
        if options.service_url.is_some() && options.service_token.is_none() {
            return Err("--service-url and --service-token go together".to_owned());
        }
        if options.service_token.is_some()
            && options.service_url.is_none()
            && options.service_socket.is_none()
        {
            return Err("--service-url and --service-token go together".to_owned());
        }
        Ok(options)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{what}: {reason}")]
    Http { what: &'static str, reason: String },
    #[error("{what}: GitLab answered {status}: {body}")]
    Status {
        what: &'static str,
        status: u16,
        body: String,
    },
}

/// Calls GitLab with the user's token.
pub async fn gitlab_post(
    client: &reqwest::Client,
    options: &Options,
    what: &'static str,
    path: &str,
    body: &Value,
) -> Result<Value, SetupError> {
    let response = client
        .post(format!(
            "{}{path}",
            options.gitlab_url.trim_end_matches('/')
        ))
        .bearer_auth(&options.token)
        .headers(duo_telemetry::outgoing_headers())
        .json(body)
        .send()
        .await
        .map_err(|e| SetupError::Http {
            what,
            reason: e.to_string(),
        })?;
    json_answer(response, what).await
}

/// GitLab's JSON answer, or the status and the start of the body.
async fn json_answer(response: reqwest::Response, what: &'static str) -> Result<Value, SetupError> {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    if !(200..300).contains(&status) {
        return Err(SetupError::Status {
            what,
            status,
            body: text.chars().take(500).collect(),
        });
    }
    serde_json::from_str(&text).map_err(|e| SetupError::Http {
        what,
        reason: e.to_string(),
    })
}

/// `GET /api/v4/ai/duo_workflows/workflows/:id` with `token`: the workflow
/// entity (what the executor learns about MCP from).
pub async fn workflow_entity(
    client: &reqwest::Client,
    gitlab_url: &str,
    token: &str,
    workflow_id: &str,
) -> Result<Value, SetupError> {
    let what = "reading the workflow";
    let response = client
        .get(format!(
            "{}/api/v4/ai/duo_workflows/workflows/{workflow_id}",
            gitlab_url.trim_end_matches('/')
        ))
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| SetupError::Http {
            what,
            reason: e.to_string(),
        })?;
    json_answer(response, what).await
}

/// `POST /api/v4/ai/duo_workflows/workflows`: the new workflow's id.
pub async fn create_workflow(
    client: &reqwest::Client,
    options: &Options,
) -> Result<String, SetupError> {
    let body = json!({
        "project_id": options.project_id,
        "goal": options.goal,
        "workflow_definition": options.definition,
        "agent_privileges": options.privileges,
        "pre_approved_agent_privileges": options.pre_approved,
        "environment": "ide",
    });
    let created = gitlab_post(
        client,
        options,
        "creating the workflow",
        "/api/v4/ai/duo_workflows/workflows",
        &body,
    )
    .await?;
    match &created["id"] {
        Value::Number(n) => Ok(n.to_string()),
        Value::String(s) => Ok(s.clone()),
        _ => Err(SetupError::Http {
            what: "creating the workflow",
            reason: "the answer has no id".to_owned(),
        }),
    }
}

/// What `direct_access` hands out.
#[derive(Debug, Clone)]
pub struct Access {
    pub gitlab_token: String,
    pub service: ServiceTarget,
}

/// `POST /api/v4/ai/duo_workflows/direct_access`.
pub async fn direct_access(
    client: &reqwest::Client,
    options: &Options,
    workflow_id: &str,
) -> Result<Access, SetupError> {
    let body = json!({
        "workflow_definition": options.definition,
        "project_id": options.project_id,
        "workflow_id": workflow_id.parse::<i64>().ok(),
    });
    let access = gitlab_post(
        client,
        options,
        "direct_access",
        "/api/v4/ai/duo_workflows/direct_access",
        &body,
    )
    .await?;
    let service = &access["duo_workflow_service"];
    let base = service["base_url"].as_str().unwrap_or_default();
    let secure = service["secure"].as_bool().unwrap_or(false);
    let url = if base.contains("://") {
        base.to_owned()
    } else if secure {
        format!("https://{base}")
    } else {
        format!("http://{base}")
    };
    let headers = service["headers"]
        .as_object()
        .map(|h| {
            h.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    Ok(Access {
        gitlab_token: access["gitlab_rails"]["token"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        service: ServiceTarget {
            url,
            token: service["token"].as_str().unwrap_or_default().to_owned(),
            headers,
            ca_pem: None,
        },
    })
}

/// `--approve` rules, then the terminal, then pause (or reject).
pub struct RuleApprover {
    pub rules: Vec<String>,
    pub reject_unmatched: bool,
    pub reject_message: Option<String>,
    pub interactive: bool,
    /// The answer to the first request only (`--decide-first`).
    pub first: Option<bool>,
}

impl RuleApprover {
    pub fn new(options: &Options) -> Self {
        Self {
            rules: options.approve.clone(),
            reject_unmatched: options.reject_unmatched,
            reject_message: options.reject_message.clone(),
            interactive: std::io::stdin().is_terminal(),
            first: options.decide_first,
        }
    }

    fn covered(&self, status: &str, request: &PendingRequest) -> bool {
        if self.rules.iter().any(|r| r == "all") {
            return true;
        }
        if status == "PLAN_APPROVAL_REQUIRED" {
            return self.rules.iter().any(|r| r == "plan");
        }
        !request.tool_calls.is_empty()
            && request
                .tool_calls
                .iter()
                .all(|(name, _)| self.rules.iter().any(|r| r == name))
    }
}

impl Approver for RuleApprover {
    fn decide(&mut self, status: &str, request: &PendingRequest) -> Decision {
        match self.first.take() {
            Some(true) => return Decision::Approve,
            Some(false) => return Decision::Reject(self.reject_message.clone()),
            None => {}
        }
        if self.covered(status, request) {
            return Decision::Approve;
        }
        if self.interactive {
            let mut stderr = std::io::stderr();
            if status == "PLAN_APPROVAL_REQUIRED" {
                let _ = writeln!(stderr, "\nThe agent proposes this plan:");
                for (n, step) in request.plan.iter().enumerate() {
                    let _ = writeln!(stderr, "  {}. {step}", n + 1);
                }
            } else {
                let _ = writeln!(stderr, "\nThe agent wants to run:");
                for (name, args) in &request.tool_calls {
                    let _ = writeln!(stderr, "  {name} {args}");
                }
            }
            let _ = write!(stderr, "Approve? [y/N, or type what to do instead] ");
            let _ = stderr.flush();
            let mut answer = String::new();
            if std::io::stdin().lock().read_line(&mut answer).is_ok() {
                let answer = answer.trim();
                return match answer {
                    "y" | "Y" | "yes" => Decision::Approve,
                    "" | "n" | "N" | "no" => Decision::Reject(self.reject_message.clone()),
                    text => Decision::Reject(Some(text.to_owned())),
                };
            }
        }
        if self.reject_unmatched {
            return Decision::Reject(self.reject_message.clone());
        }
        Decision::Unanswered
    }
}

/// Prints steps and checkpoints to stderr.
pub struct TerminalReporter {
    pub quiet: bool,
    shown: usize,
}

impl TerminalReporter {
    pub fn new(quiet: bool) -> Self {
        Self { quiet, shown: 0 }
    }
}

impl Reporter for TerminalReporter {
    fn checkpoint(&mut self, checkpoint: &NewCheckpoint) {
        if self.quiet {
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(&checkpoint.checkpoint) else {
            return;
        };
        let log = value["channel_values"]["ui_chat_log"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // A resumed session starts over at the first entry of the log.
        if log.len() < self.shown {
            self.shown = 0;
        }
        for entry in log.iter().skip(self.shown) {
            let kind = entry["message_type"].as_str().unwrap_or("?");
            let content = entry["content"].as_str().unwrap_or_default();
            eprintln!("[{kind}] {content}");
        }
        self.shown = log.len();
        eprintln!("-- {}", checkpoint.status);
    }

    fn action(&mut self, action: &action::Action) {
        if self.quiet {
            return;
        }
        use action::Action as A;
        let what = match action {
            A::RunReadFile(a) => format!("read {}", a.filepath),
            A::RunReadFiles(a) => format!("read {}", a.filepaths.join(", ")),
            A::RunWriteFile(a) => format!("write {}", a.filepath),
            A::RunEditFile(a) => format!("edit {}", a.filepath),
            A::RunCommand(a) => format!("run {} {}", a.program, a.arguments.join(" ")),
            A::ListDirectory(a) => format!("list {}", a.directory),
            A::FindFiles(a) => format!("find {}", a.name_pattern),
            A::Grep(a) => format!("grep {}", a.pattern),
            A::Mkdir(a) => format!("mkdir {}", a.directory_path),
            A::RunHttpRequest(a) => format!("{} {}", a.method, a.path),
            _ => "other action".to_owned(),
        };
        eprintln!("  > {what}");
    }
}
