//! The tools a workflow's agents may call, the agent privilege each belongs
//! to, and how each becomes an executor action or a GitLab API call made
//! through the executor (`runHTTPRequest`) with the user's permissions.

use super::link::{ExecutorLink, LinkError};
use super::monolith_api::{MonolithApi, MonolithApiError};
use crate::providers::conversation::ToolCall;
use crate::providers::tool_calling::ToolSchema;
use contracts::duo_workflow::{
    EditFile, FindFiles, Grep, ListDirectory, Mkdir, ReadFile, ReadFiles, RunCommandAction,
    WriteFile, action, action_response,
};
use serde_json::{Value, json};
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::LazyLock;

/// The monolith's agent privileges (`AgentPrivileges` ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Privilege {
    ReadWriteFiles = 1,
    ReadOnlyGitlab = 2,
    ReadWriteGitlab = 3,
    RunCommands = 4,
    UseGit = 5,
    RunMcpTools = 6,
}

/// Where a tool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    /// Reads the executor's workspace: enabled with read_write_files and
    /// never asks (reading the checkout the user handed over has no side
    /// effect; every write, command and GitLab call does ask).
    WorkspaceRead,
    /// Any other executor action.
    Executor,
    /// A GitLab REST call through `runHTTPRequest`.
    GitLab,
    /// Handled by the service itself (planning): always allowed.
    Internal,
    /// A tool of one of the executor's MCP servers (`runMCPTool`): offered
    /// per run, its description and output untrusted.
    Mcp,
}

#[derive(Debug, Clone)]
pub struct ToolSpec {
    pub name: Cow<'static, str>,
    pub description: Cow<'static, str>,
    pub parameters: Value,
    pub privilege: Option<Privilege>,
    pub kind: ToolKind,
}

impl ToolSpec {
    /// Whether running the tool can change anything outside the run: every
    /// tool but reading the workspace, reading GitLab and planning.
    pub fn has_side_effects(&self) -> bool {
        match self.kind {
            ToolKind::WorkspaceRead | ToolKind::Internal => false,
            ToolKind::GitLab => self.privilege != Some(Privilege::ReadOnlyGitlab),
            ToolKind::Executor | ToolKind::Mcp => true,
        }
    }

    pub fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.name.to_string(),
            description: self.description.to_string(),
            parameters: self.parameters.clone(),
        }
    }

    /// The OpenAI tool schema, for `ListTools`.
    pub fn openai_schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn string(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn integer(description: &str) -> Value {
    json!({"type": "integer", "description": description})
}

/// Every tool the service knows.
pub static CATALOGUE: LazyLock<Vec<ToolSpec>> = LazyLock::new(|| {
    use Privilege as P;
    use ToolKind as K;
    let tool = |name, description, parameters, privilege, kind| ToolSpec {
        name: Cow::Borrowed(name),
        description: Cow::Borrowed(description),
        parameters,
        privilege,
        kind,
    };
    vec![
        tool(
            "read_file",
            "Read a file of the workspace (path relative to the workspace root).",
            object(
                json!({"file_path": string("The file to read")}),
                &["file_path"],
            ),
            Some(P::ReadWriteFiles),
            K::WorkspaceRead,
        ),
        tool(
            "read_files",
            "Read several files of the workspace at once.",
            object(
                json!({"file_paths": {"type": "array", "items": {"type": "string"}, "description": "The files to read"}}),
                &["file_paths"],
            ),
            Some(P::ReadWriteFiles),
            K::WorkspaceRead,
        ),
        tool(
            "list_dir",
            "List the entries of a directory of the workspace.",
            object(
                json!({"directory": string("The directory, `.` for the root")}),
                &["directory"],
            ),
            Some(P::ReadWriteFiles),
            K::WorkspaceRead,
        ),
        tool(
            "find_files",
            "Find files whose path matches a glob pattern such as `src/**/*.rs`.",
            object(
                json!({"name_pattern": string("The glob pattern")}),
                &["name_pattern"],
            ),
            Some(P::ReadWriteFiles),
            K::WorkspaceRead,
        ),
        tool(
            "grep",
            "Search file contents below a directory with a regular expression.",
            object(
                json!({
                    "pattern": string("The regular expression"),
                    "search_directory": string("Where to search, `.` for the whole workspace"),
                    "case_insensitive": {"type": "boolean"},
                }),
                &["pattern"],
            ),
            Some(P::ReadWriteFiles),
            K::WorkspaceRead,
        ),
        tool(
            "create_file_with_contents",
            "Create a file (or replace it) with the given contents.",
            object(
                json!({"file_path": string("The file to write"), "contents": string("The whole new contents")}),
                &["file_path", "contents"],
            ),
            Some(P::ReadWriteFiles),
            K::Executor,
        ),
        tool(
            "edit_file",
            "Replace the first exact occurrence of old_str with new_str in an existing file.",
            object(
                json!({
                    "file_path": string("The file to edit"),
                    "old_str": string("The exact text to replace"),
                    "new_str": string("The replacement"),
                }),
                &["file_path", "old_str", "new_str"],
            ),
            Some(P::ReadWriteFiles),
            K::Executor,
        ),
        tool(
            "mkdir",
            "Create a directory (and missing parents) in the workspace.",
            object(
                json!({"directory_path": string("The directory to create")}),
                &["directory_path"],
            ),
            Some(P::ReadWriteFiles),
            K::Executor,
        ),
        tool(
            "run_command",
            "Run a program with arguments in the workspace (no shell: no pipes, globbing or variables).",
            object(
                json!({
                    "program": string("The program, e.g. `cargo`"),
                    "args": {"type": "array", "items": {"type": "string"}, "description": "Its arguments"},
                    "timeout": integer("Seconds before the command is stopped (default 120)"),
                }),
                &["program"],
            ),
            Some(P::RunCommands),
            K::Executor,
        ),
        tool(
            "run_git_command",
            "Run a git subcommand in the workspace, e.g. command `commit` with args [`-m`, `message`].",
            object(
                json!({
                    "command": string("The git subcommand"),
                    "args": {"type": "array", "items": {"type": "string"}},
                }),
                &["command"],
            ),
            Some(P::UseGit),
            K::Executor,
        ),
        tool(
            "get_issue",
            "Get an issue of the project.",
            object(
                json!({"project_id": integer("The project (default: the workflow's)"), "issue_iid": integer("The issue's IID")}),
                &["issue_iid"],
            ),
            Some(P::ReadOnlyGitlab),
            K::GitLab,
        ),
        tool(
            "list_issue_notes",
            "List the comments of an issue.",
            object(
                json!({"project_id": integer("The project (default: the workflow's)"), "issue_iid": integer("The issue's IID")}),
                &["issue_iid"],
            ),
            Some(P::ReadOnlyGitlab),
            K::GitLab,
        ),
        tool(
            "get_merge_request",
            "Get a merge request of the project.",
            object(
                json!({"project_id": integer("The project (default: the workflow's)"), "merge_request_iid": integer("The merge request's IID")}),
                &["merge_request_iid"],
            ),
            Some(P::ReadOnlyGitlab),
            K::GitLab,
        ),
        tool(
            "get_pipeline_errors",
            "Get the failed jobs of a pipeline.",
            object(
                json!({"project_id": integer("The project (default: the workflow's)"), "pipeline_id": integer("The pipeline")}),
                &["pipeline_id"],
            ),
            Some(P::ReadOnlyGitlab),
            K::GitLab,
        ),
        tool(
            "get_repository_file",
            "Get a file of the project's repository at a ref.",
            object(
                json!({
                    "project_id": integer("The project (default: the workflow's)"),
                    "file_path": string("The file"),
                    "ref": string("Branch, tag or commit (default: the default branch)"),
                }),
                &["file_path"],
            ),
            Some(P::ReadOnlyGitlab),
            K::GitLab,
        ),
        tool(
            "semantic_code_search",
            "Search the project's code by meaning (its code index): returns the closest chunks, each with its path, lines, content and score. Use it to find where something is implemented before reading files.",
            object(
                json!({
                    "project_id": integer("The project (default: the workflow's)"),
                    "semantic_query": string("What the code you look for does, in a sentence"),
                    "directory_path": string("Search only below this directory"),
                    "limit": integer("How many chunks (1 to 20, default 10)"),
                }),
                &["semantic_query"],
            ),
            Some(P::ReadOnlyGitlab),
            K::GitLab,
        ),
        tool(
            "create_issue_note",
            "Add a comment to an issue.",
            object(
                json!({
                    "project_id": integer("The project (default: the workflow's)"),
                    "issue_iid": integer("The issue's IID"),
                    "body": string("The comment (Markdown)"),
                }),
                &["issue_iid", "body"],
            ),
            Some(P::ReadWriteGitlab),
            K::GitLab,
        ),
        tool(
            "create_merge_request",
            "Open a merge request.",
            object(
                json!({
                    "project_id": integer("The project (default: the workflow's)"),
                    "source_branch": string("The branch with the changes"),
                    "target_branch": string("The branch to merge into"),
                    "title": string("The title"),
                    "description": string("The description"),
                }),
                &["source_branch", "target_branch", "title"],
            ),
            Some(P::ReadWriteGitlab),
            K::GitLab,
        ),
        tool(
            "create_plan",
            "Record the plan: the ordered steps that will reach the goal.",
            object(
                json!({"steps": {"type": "array", "items": {"type": "string"}, "description": "One sentence per step"}}),
                &["steps"],
            ),
            None,
            K::Internal,
        ),
    ]
});

/// The unit primitive a tool's feature needs beyond the workflow's own, for
/// the tools that have one (GitLab's codebase search is `codebase_search`).
pub fn unit_primitive(name: &str) -> Option<&'static str> {
    match name {
        "semantic_code_search" => Some("codebase_search"),
        _ => None,
    }
}

pub fn find(name: &str) -> Option<&'static ToolSpec> {
    CATALOGUE.iter().find(|t| t.name == name)
}

/// What one workflow may use: its agent privileges, its pre-approved ones,
/// tools the user pre-approved for the session, the MCP tools its executor
/// offers (empty unless the workflow may use them), and the unit primitives
/// its caller's token carries (a tool whose feature needs one the caller
/// lacks is neither offered nor run, as chat's tool catalogue filters its
/// tools).
#[derive(Debug, Clone, Default)]
pub struct ToolPolicy {
    pub privileges: BTreeSet<i64>,
    pub pre_approved: BTreeSet<i64>,
    pub session_approved: BTreeSet<String>,
    pub mcp_tools: Vec<ToolSpec>,
    pub unit_primitives: UnitPrimitives,
}

/// The unit primitives a run's caller holds: none by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitPrimitives {
    /// Those of the caller's token.
    pub held: BTreeSet<String>,
    /// Every one: the service runs without authentication (development).
    pub all: bool,
}

impl UnitPrimitives {
    pub fn allows(&self, unit_primitive: &str) -> bool {
        self.all || self.held.contains(unit_primitive)
    }
}

/// Why a workflow may not use a tool it has by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolRefusal {
    /// The workflow's agent privileges do not include the tool's.
    Privilege,
    /// The caller lacks the unit primitive of the tool's feature.
    UnitPrimitive(&'static str),
}

impl ToolRefusal {
    /// The tool error the model is sent for a call to `tool`.
    pub fn message(&self, tool: &str) -> String {
        match self {
            Self::Privilege => format!("the tool {tool} is not available to this workflow"),
            Self::UnitPrimitive(needed) => format!(
                "the tool {tool} is not available to this workflow: it needs the unit primitive {needed}, which the user's GitLab Duo seat does not grant"
            ),
        }
    }
}

impl ToolPolicy {
    pub fn enabled(&self, spec: &ToolSpec) -> bool {
        self.refusal(spec).is_none()
    }

    /// Why `spec` may not be used by this workflow, if it may not.
    pub fn refusal(&self, spec: &ToolSpec) -> Option<ToolRefusal> {
        if spec
            .privilege
            .is_some_and(|p| !self.privileges.contains(&(p as i64)))
        {
            return Some(ToolRefusal::Privilege);
        }
        // MCP tools never take a catalogue name, so only catalogue tools
        // have a unit primitive here.
        match (spec.kind, unit_primitive(&spec.name)) {
            (ToolKind::Mcp, _) | (_, None) => None,
            (_, Some(needed)) if self.unit_primitives.allows(needed) => None,
            (_, Some(needed)) => Some(ToolRefusal::UnitPrimitive(needed)),
        }
    }

    pub fn needs_approval(&self, spec: &ToolSpec) -> bool {
        match spec.kind {
            ToolKind::WorkspaceRead | ToolKind::Internal => false,
            ToolKind::Executor | ToolKind::GitLab | ToolKind::Mcp => {
                let pre_approved = spec
                    .privilege
                    .is_some_and(|p| self.pre_approved.contains(&(p as i64)));
                !pre_approved && !self.session_approved.contains(spec.name.as_ref())
            }
        }
    }

    /// The tool called `name`: the catalogue's, else one of the run's MCP
    /// tools (their names never shadow the catalogue's).
    pub fn find(&self, name: &str) -> Option<&ToolSpec> {
        find(name).or_else(|| self.mcp_tools.iter().find(|t| t.name == name))
    }

    /// The tools of `names` this workflow has, in catalogue order, then the
    /// MCP tools when `with_mcp`.
    pub fn tools(&self, names: &[&str], with_mcp: bool) -> Vec<&ToolSpec> {
        let mcp = self.mcp_tools.iter().filter(|_| with_mcp);
        CATALOGUE
            .iter()
            .filter(|t| names.contains(&t.name.as_ref()))
            .chain(mcp)
            .filter(|t| self.enabled(t))
            .collect()
    }
}

/// Checks arguments against a tool's schema (required keys and their JSON
/// types); the message goes back to the model. MCP schemas are the server's
/// own: extra keys pass unless the schema closes the object, and only the
/// top-level types are checked (the server checks the rest).
pub fn validate_args(spec: &ToolSpec, args: &Value) -> Result<(), String> {
    let Some(args) = args.as_object() else {
        return Err("the arguments must be a JSON object".to_owned());
    };
    let properties = spec.parameters["properties"].as_object();
    for required in spec.parameters["required"].as_array().into_iter().flatten() {
        let key = required.as_str().unwrap_or_default();
        if !args.contains_key(key) {
            return Err(format!("missing required argument `{key}`"));
        }
    }
    let open = spec.kind == ToolKind::Mcp && spec.parameters["additionalProperties"] != false;
    for (key, value) in args {
        let Some(expected) = properties.and_then(|p| p.get(key)) else {
            if open {
                continue;
            }
            return Err(format!("unknown argument `{key}`"));
        };
        let ok = match expected["type"].as_str() {
            Some("string") => value.is_string(),
            Some("integer") => value.is_i64() || value.is_u64(),
            Some("number") => value.is_number(),
            Some("boolean") => value.is_boolean(),
            Some("object") => value.is_object(),
            Some("array") if spec.kind == ToolKind::Mcp => value.is_array(),
            Some("array") => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
            _ => true,
        };
        if !ok {
            return Err(format!(
                "argument `{key}` must be of type {}",
                expected["type"].as_str().unwrap_or("?")
            ));
        }
    }
    Ok(())
}

/// A tool's result for the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub content: String,
    pub is_error: bool,
}

impl ToolResult {
    pub(super) fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
        }
    }
    pub(super) fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
        }
    }
}

/// Tool results longer than this are cut (the model sees that they were).
const MAX_RESULT_BYTES: usize = 64 * 1024;

fn truncate(text: String) -> String {
    truncate_to(text, MAX_RESULT_BYTES)
}

/// `text` without NUL characters and cut to `max` bytes (saying so).
pub(super) fn truncate_to(mut text: String, max: usize) -> String {
    // PostgreSQL's jsonb refuses NUL characters, and checkpoints carry results.
    if text.contains('\0') {
        text = text.replace('\0', "\u{fffd}");
    }
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n[output truncated]");
    }
    text
}

fn str_arg<'a>(args: &'a Value, key: &str) -> &'a str {
    args[key].as_str().unwrap_or_default()
}

fn strings(args: &Value, key: &str) -> Vec<String> {
    args[key]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The executor action for an executor tool call.
pub fn executor_action(call: &ToolCall, command_timeout: bool) -> Option<action::Action> {
    let args = &call.args;
    Some(match call.name.as_str() {
        "read_file" => action::Action::RunReadFile(ReadFile {
            filepath: str_arg(args, "file_path").to_owned(),
            ..ReadFile::default()
        }),
        "read_files" => action::Action::RunReadFiles(ReadFiles {
            filepaths: strings(args, "file_paths"),
        }),
        "list_dir" => action::Action::ListDirectory(ListDirectory {
            directory: str_arg(args, "directory").to_owned(),
        }),
        "find_files" => action::Action::FindFiles(FindFiles {
            name_pattern: str_arg(args, "name_pattern").to_owned(),
        }),
        "grep" => action::Action::Grep(Grep {
            search_directory: args["search_directory"].as_str().unwrap_or(".").to_owned(),
            pattern: str_arg(args, "pattern").to_owned(),
            case_insensitive: args["case_insensitive"].as_bool().unwrap_or(false),
        }),
        "create_file_with_contents" => action::Action::RunWriteFile(WriteFile {
            filepath: str_arg(args, "file_path").to_owned(),
            contents: str_arg(args, "contents").to_owned(),
        }),
        "edit_file" => action::Action::RunEditFile(EditFile {
            filepath: str_arg(args, "file_path").to_owned(),
            old_string: str_arg(args, "old_str").to_owned(),
            new_string: str_arg(args, "new_str").to_owned(),
        }),
        "mkdir" => action::Action::Mkdir(Mkdir {
            directory_path: str_arg(args, "directory_path").to_owned(),
        }),
        "run_command" => action::Action::RunCommand(RunCommandAction {
            program: str_arg(args, "program").to_owned(),
            arguments: strings(args, "args"),
            flags: Vec::new(),
            // GitLab's service sends seconds, and only to executors that
            // declare they understand the field.
            timeout: command_timeout.then(|| args["timeout"].as_i64().unwrap_or(120)),
        }),
        "run_git_command" => {
            let mut arguments = vec![str_arg(args, "command").to_owned()];
            arguments.extend(strings(args, "args"));
            action::Action::RunCommand(RunCommandAction {
                program: "git".to_owned(),
                arguments,
                flags: Vec::new(),
                timeout: command_timeout.then_some(120),
            })
        }
        _ => return None,
    })
}

/// Runs an executor tool: the action's plain-text reply, errors included,
/// goes back to the model. Only a broken link fails the run.
pub async fn run_executor_tool(
    link: &ExecutorLink,
    call: &ToolCall,
    command_timeout: bool,
) -> Result<ToolResult, LinkError> {
    let Some(action) = executor_action(call, command_timeout) else {
        return Ok(ToolResult::error(format!("unknown tool {}", call.name)));
    };
    let response = link.call(action).await?;
    Ok(match response.response_type {
        Some(action_response::ResponseType::PlainTextResponse(text)) => {
            if text.error.is_empty() {
                ToolResult::ok(truncate(text.response))
            } else if text.response.is_empty() {
                ToolResult::error(format!("Action error: {}", text.error))
            } else {
                ToolResult::error(truncate(format!(
                    "{}\nAction error: {}",
                    text.response, text.error
                )))
            }
        }
        Some(action_response::ResponseType::HttpResponse(http)) => {
            ToolResult::error(format!("unexpected HTTP reply: {}", http.error))
        }
        _ => ToolResult::error("the executor sent no result"),
    })
}

/// A path segment for GitLab's file API.
fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The REST request of a GitLab tool.
pub fn gitlab_request(
    call: &ToolCall,
    default_project: Option<i64>,
) -> Result<(&'static str, String, Option<Value>), String> {
    let args = &call.args;
    let project = args["project_id"]
        .as_i64()
        .or(default_project)
        .ok_or("no project_id given and the workflow has no project")?;
    let base = format!("/api/v4/projects/{project}");
    let number = |key: &str| {
        args[key]
            .as_i64()
            .ok_or_else(|| format!("argument `{key}` must be an integer"))
    };
    Ok(match call.name.as_str() {
        "get_issue" => (
            "GET",
            format!("{base}/issues/{}", number("issue_iid")?),
            None,
        ),
        "list_issue_notes" => (
            "GET",
            format!("{base}/issues/{}/notes", number("issue_iid")?),
            None,
        ),
        "get_merge_request" => (
            "GET",
            format!("{base}/merge_requests/{}", number("merge_request_iid")?),
            None,
        ),
        "get_pipeline_errors" => (
            "GET",
            format!(
                "{base}/pipelines/{}/jobs?scope[]=failed",
                number("pipeline_id")?
            ),
            None,
        ),
        "get_repository_file" => {
            let mut path = format!(
                "{base}/repository/files/{}/raw",
                encode_segment(str_arg(args, "file_path"))
            );
            if let Some(reference) = args["ref"].as_str() {
                path.push_str(&format!("?ref={}", encode_segment(reference)));
            }
            ("GET", path, None)
        }
        "semantic_code_search" => {
            let mut path = format!(
                "{base}/semantic_code_search?semantic_query={}",
                encode_segment(str_arg(args, "semantic_query"))
            );
            if let Some(directory) = args["directory_path"].as_str() {
                path.push_str(&format!("&directory_path={}", encode_segment(directory)));
            }
            if let Some(limit) = args["limit"].as_i64() {
                path.push_str(&format!("&limit={limit}"));
            }
            ("GET", path, None)
        }
        "create_issue_note" => (
            "POST",
            format!("{base}/issues/{}/notes", number("issue_iid")?),
            Some(json!({"body": str_arg(args, "body")})),
        ),
        "create_merge_request" => (
            "POST",
            format!("{base}/merge_requests"),
            Some(json!({
                "source_branch": str_arg(args, "source_branch"),
                "target_branch": str_arg(args, "target_branch"),
                "title": str_arg(args, "title"),
                "description": args["description"].as_str().unwrap_or_default(),
            })),
        ),
        other => return Err(format!("unknown GitLab tool {other}")),
    })
}

/// Runs a GitLab tool through the executor with the user's token; GitLab's
/// refusals go back to the model.
pub async fn run_gitlab_tool(
    monolith: &MonolithApi,
    call: &ToolCall,
    default_project: Option<i64>,
) -> Result<ToolResult, LinkError> {
    let (method, path, body) = match gitlab_request(call, default_project) {
        Ok(request) => request,
        Err(reason) => return Ok(ToolResult::error(reason)),
    };
    let body = body.as_ref().map(Value::to_string);
    match monolith.request(method, &path, body.as_deref()).await {
        Ok(reply) if (200..300).contains(&reply.status) => Ok(ToolResult::ok(truncate(reply.body))),
        Ok(reply) => Ok(ToolResult::error(truncate(format!(
            "GitLab answered {}: {}",
            reply.status, reply.body
        )))),
        Err(MonolithApiError::Link(err)) => Err(err),
        Err(err) => Ok(ToolResult::error(err.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall {
            id: "c".into(),
            name: name.into(),
            args,
        }
    }

    #[test]
    fn privileges_decide_what_is_enabled_and_what_asks() {
        let policy = ToolPolicy {
            privileges: [1, 2].into(),
            pre_approved: [2].into(),
            ..ToolPolicy::default()
        };
        let edit = find("edit_file").unwrap();
        let read = find("read_file").unwrap();
        let issue = find("get_issue").unwrap();
        let command = find("run_command").unwrap();
        assert!(policy.enabled(edit) && policy.needs_approval(edit));
        assert!(policy.enabled(read) && !policy.needs_approval(read));
        assert!(policy.enabled(issue) && !policy.needs_approval(issue));
        assert!(!policy.enabled(command));
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let edit = find("edit_file").unwrap();
        assert!(
            validate_args(
                edit,
                &json!({"file_path": "a", "old_str": "x", "new_str": "y"})
            )
            .is_ok()
        );
        assert!(
            validate_args(edit, &json!({"file_path": "a"}))
                .unwrap_err()
                .contains("old_str")
        );
        assert!(
            validate_args(
                edit,
                &json!({"file_path": 1, "old_str": "x", "new_str": "y"})
            )
            .is_err()
        );
        assert!(
            validate_args(
                edit,
                &json!({"file_path": "a", "old_str": "x", "new_str": "y", "z": 1})
            )
            .is_err()
        );
    }

    #[test]
    fn commands_carry_seconds_only_for_capable_executors() {
        let c = call("run_command", json!({"program": "ls", "args": ["-l"]}));
        let Some(action::Action::RunCommand(run)) = executor_action(&c, true) else {
            panic!("not a command");
        };
        assert_eq!((run.program.as_str(), run.timeout), ("ls", Some(120)));
        let Some(action::Action::RunCommand(run)) = executor_action(&c, false) else {
            panic!("not a command");
        };
        assert_eq!(run.timeout, None);
        let git = call(
            "run_git_command",
            json!({"command": "commit", "args": ["-m", "x"]}),
        );
        let Some(action::Action::RunCommand(run)) = executor_action(&git, false) else {
            panic!("not a command");
        };
        assert_eq!(run.program, "git");
        assert_eq!(run.arguments, ["commit", "-m", "x"]);
    }

    #[test]
    fn codebase_search_is_a_read_only_gitlab_call_to_the_code_index() {
        let spec = find("semantic_code_search").unwrap();
        assert_eq!(spec.kind, ToolKind::GitLab);
        assert!(!spec.has_side_effects());
        assert_eq!(
            unit_primitive("semantic_code_search"),
            Some("codebase_search")
        );
        let held = |primitives: &[&str]| UnitPrimitives {
            held: primitives.iter().map(|p| (*p).to_owned()).collect(),
            all: false,
        };
        let policy = ToolPolicy {
            privileges: [Privilege::ReadOnlyGitlab as i64].into_iter().collect(),
            unit_primitives: held(&["duo_agent_platform", "codebase_search"]),
            ..ToolPolicy::default()
        };
        let offered = |policy: &ToolPolicy| -> Vec<String> {
            policy
                .tools(&["semantic_code_search", "read_file"], false)
                .iter()
                .map(|t| t.name.to_string())
                .collect()
        };
        assert_eq!(offered(&policy), ["semantic_code_search"]);
        // Without the unit primitive: not offered, and a call is refused
        // saying which one is missing.
        let without = ToolPolicy {
            unit_primitives: held(&["duo_agent_platform"]),
            ..policy.clone()
        };
        assert!(offered(&without).is_empty());
        let refusal = without.refusal(spec).unwrap();
        assert_eq!(refusal, ToolRefusal::UnitPrimitive("codebase_search"));
        assert!(
            refusal
                .message("semantic_code_search")
                .contains("needs the unit primitive codebase_search")
        );
        // A service without authentication allows every unit primitive.
        let open = ToolPolicy {
            unit_primitives: UnitPrimitives {
                held: Default::default(),
                all: true,
            },
            ..without
        };
        assert!(open.enabled(spec));

        let (method, path, body) = gitlab_request(
            &call(
                "semantic_code_search",
                json!({"semantic_query": "where are refunds checked?", "directory_path": "src/billing", "limit": 5}),
            ),
            Some(7),
        )
        .unwrap();
        assert_eq!(method, "GET");
        assert_eq!(
            path,
            "/api/v4/projects/7/semantic_code_search?semantic_query=where%20are%20refunds%20checked%3F&directory_path=src%2Fbilling&limit=5"
        );
        assert_eq!(body, None);
        let args = json!({"semantic_query": "x", "limit": "many"});
        assert!(validate_args(spec, &args).is_err());
    }

    #[test]
    fn minted_tokens_may_carry_every_tool_unit_primitive() {
        for tool in CATALOGUE.iter() {
            if let Some(needed) = unit_primitive(&tool.name) {
                assert!(
                    crate::workflow_service::auth::SERVICE_UNIT_PRIMITIVES.contains(&needed),
                    "{} needs {needed}, which GenerateToken drops",
                    tool.name
                );
            }
        }
    }

    #[test]
    fn results_lose_nul_characters_and_are_capped() {
        assert_eq!(truncate("a\0b".into()), "a\u{fffd}b");
        let long = truncate("x".repeat(MAX_RESULT_BYTES + 10));
        assert!(long.ends_with("[output truncated]"));
        assert!(long.len() < MAX_RESULT_BYTES + 40);
    }

    #[test]
    fn gitlab_tools_build_api_paths() {
        let (method, path, _) = gitlab_request(
            &call(
                "get_repository_file",
                json!({"file_path": "a/b c.md", "ref": "main"}),
            ),
            Some(7),
        )
        .unwrap();
        assert_eq!(method, "GET");
        assert_eq!(
            path,
            "/api/v4/projects/7/repository/files/a%2Fb%20c.md/raw?ref=main"
        );
        assert!(gitlab_request(&call("get_issue", json!({"issue_iid": 1})), None).is_err());
    }
}
