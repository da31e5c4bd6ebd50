//! Carrying out one action. Every failure becomes an error reply: nothing
//! the service sends can crash the executor.

use crate::workspace::{Workspace, is_git_dir_name};
use crate::{environment, git};
use contracts::api_request;
use contracts::duo_workflow::{
    ActionResponse, HttpResponse, PlainTextResponse, ScheduleNotificationResponse, action,
    action_response,
};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Bounds on what actions may do.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest file written, read or edited (bytes).
    pub max_file_bytes: usize,
    /// Most command output kept (bytes, stdout and stderr together).
    pub max_output_bytes: usize,
    /// Command timeout when the action sets none.
    pub default_command_timeout: Duration,
    /// The longest timeout a command may ask for.
    pub max_command_timeout: Duration,
    /// Programs that may run; `None` allows any.
    pub allowed_commands: Option<Vec<String>>,
    /// Most entries a listing, search or find returns.
    pub max_results: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_file_bytes: 2 * 1024 * 1024,
            max_output_bytes: 256 * 1024,
            default_command_timeout: Duration::from_secs(120),
            max_command_timeout: Duration::from_secs(1800),
            allowed_commands: None,
            max_results: 500,
        }
    }
}

/// Where `runHTTPRequest` goes: the GitLab instance, with the workflow's token.
#[derive(Debug, Clone)]
pub struct GitLabTarget {
    pub base_url: String,
    pub token: String,
    pub client: reqwest::Client,
}

/// Runs actions in a workspace.
#[derive(Debug, Clone)]
pub struct ActionRunner {
    pub workspace: Workspace,
    pub limits: Limits,
    pub gitlab: Option<GitLabTarget>,
    /// The MCP servers connected for this workflow.
    pub mcp: Option<std::sync::Arc<crate::mcp::McpHub>>,
}

fn plain(response: String, error: String) -> action_response::ResponseType {
    action_response::ResponseType::PlainTextResponse(PlainTextResponse { response, error })
}

fn ok(text: impl Into<String>) -> action_response::ResponseType {
    plain(text.into(), String::new())
}

fn err(text: impl Into<String>) -> action_response::ResponseType {
    plain(String::new(), text.into())
}

fn http_error(text: impl Into<String>) -> action_response::ResponseType {
    action_response::ResponseType::HttpResponse(HttpResponse {
        error: text.into(),
        ..HttpResponse::default()
    })
}

impl ActionRunner {
    /// The reply to `action` (`None` for checkpoint notifications, which
    /// need none).
    pub async fn perform(
        &self,
        request_id: &str,
        action: &action::Action,
    ) -> Option<ActionResponse> {
        use action::Action as A;
        let response_type = match action {
            A::NewCheckpoint(_) => return None,
            A::RunReadFile(read) => {
                self.read_file(&read.filepath, read.offset, read.limit)
                    .await
            }
            A::RunReadFiles(read) => self.read_files(&read.filepaths).await,
            A::RunWriteFile(write) => self.write_file(&write.filepath, &write.contents).await,
            A::RunEditFile(edit) => {
                self.edit_file(&edit.filepath, &edit.old_string, &edit.new_string)
                    .await
            }
            A::ListDirectory(list) => self.list_directory(&list.directory).await,
            A::FindFiles(find) => self.find_files(&find.name_pattern).await,
            A::Grep(grep) => {
                self.grep(&grep.search_directory, &grep.pattern, grep.case_insensitive)
                    .await
            }
            A::Mkdir(mkdir) => self.mkdir(&mkdir.directory_path).await,
            A::RunCommand(command) => {
                let mut arguments = command.flags.clone();
                arguments.extend(command.arguments.iter().cloned());
                self.run_command(&command.program, &arguments, command.timeout)
                    .await
            }
            A::RunGitCommand(git) => {
                let mut arguments = vec![git.command.clone()];
                arguments.extend(
                    git.arguments
                        .as_deref()
                        .unwrap_or_default()
                        .split_whitespace()
                        .map(str::to_owned),
                );
                self.run_command("git", &arguments, None).await
            }
            A::RunHttpRequest(request) => {
                self.http(&request.method, &request.path, request.body.as_deref())
                    .await
            }
            A::RunShellCommand(_) => {
                err("this executor runs programs without a shell and did not declare shell_command")
            }
            A::RunMcpTool(tool) => match &self.mcp {
                Some(hub) => hub.call(&tool.name, &tool.args).await,
                None => err(format!(
                    "the MCP tool {} is unavailable: no MCP server is connected to this executor",
                    tool.name
                )),
            },
            A::ScheduleNotification(_) => {
                action_response::ResponseType::ScheduleNotificationResponse(
                    ScheduleNotificationResponse {
                        accepted: false,
                        reason: "this executor does not schedule notifications".to_owned(),
                        fires_at: String::new(),
                    },
                )
            }
            A::TrackLlmCallForSelfHosted(_) => err("not a self-hosted billing bridge"),
        };
        Some(ActionResponse {
            request_id: request_id.to_owned(),
            response_type: Some(response_type),
        })
    }

    async fn read_file(
        &self,
        path: &str,
        offset: Option<i64>,
        limit: Option<i64>,
    ) -> action_response::ResponseType {
        let resolved = match self.workspace.resolve(path) {
            Ok(p) => p,
            Err(e) => return err(e.to_string()),
        };
        let text = match self.read_text(&resolved).await {
            Ok(text) => text,
            Err(e) => return err(e),
        };
        if offset.is_none() && limit.is_none() {
            return ok(text);
        }
        let start = offset.unwrap_or(1).max(1) as usize - 1;
        let count = limit.map_or(usize::MAX, |l| l.max(0) as usize);
        ok(text
            .lines()
            .skip(start)
            .take(count)
            .collect::<Vec<_>>()
            .join("\n"))
    }

    async fn read_text(&self, path: &Path) -> Result<String, String> {
        let metadata = tokio::fs::metadata(path)
            .await
            .map_err(|e| format!("{}: {e}", self.workspace.display(path)))?;
        if !metadata.is_file() {
            return Err(format!("{} is not a file", self.workspace.display(path)));
        }
        if metadata.len() > self.limits.max_file_bytes as u64 {
            return Err(format!(
                "{} is {} bytes, more than the {} this executor reads",
                self.workspace.display(path),
                metadata.len(),
                self.limits.max_file_bytes
            ));
        }
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|e| format!("{}: {e}", self.workspace.display(path)))?;
        String::from_utf8(bytes)
            .map_err(|_| format!("{} is not UTF-8 text", self.workspace.display(path)))
    }

    async fn read_files(&self, paths: &[String]) -> action_response::ResponseType {
        if paths.len() > self.limits.max_results {
            return err(format!("at most {} files at once", self.limits.max_results));
        }
        let mut out = serde_json::Map::new();
        let mut total = 0;
        for path in paths {
            let value = match self.workspace.resolve(path) {
                Ok(resolved) => match self.read_text(&resolved).await {
                    Ok(text) => serde_json::json!({"content": text}),
                    Err(e) => serde_json::json!({"error": e}),
                },
                Err(e) => serde_json::json!({"error": e.to_string()}),
            };
            total += value.to_string().len();
            if total > self.limits.max_file_bytes {
                return err("the files together are larger than this executor sends");
            }
            out.insert(path.clone(), value);
        }
        ok(serde_json::Value::Object(out).to_string())
    }

    async fn write_file(&self, path: &str, contents: &str) -> action_response::ResponseType {
        if contents.len() > self.limits.max_file_bytes {
            return err(format!(
                "refusing to write {} bytes: the limit is {}",
                contents.len(),
                self.limits.max_file_bytes
            ));
        }
        let resolved = match self.workspace.resolve(path) {
            Ok(p) => p,
            Err(e) => return err(e.to_string()),
        };
        if let Some(parent) = resolved.parent()
            && let Err(e) = tokio::fs::create_dir_all(parent).await
        {
            return err(format!("{path}: {e}"));
        }
        match write_no_follow(&resolved, contents.as_bytes()).await {
            Ok(()) => ok(format!("wrote {} bytes to {path}", contents.len())),
            Err(e) => err(format!("{path}: {e}")),
        }
    }

    async fn edit_file(&self, path: &str, old: &str, new: &str) -> action_response::ResponseType {
        if old.is_empty() {
            return err("oldString is empty");
        }
        let resolved = match self.workspace.resolve(path) {
            Ok(p) => p,
            Err(e) => return err(e.to_string()),
        };
        let text = match self.read_text(&resolved).await {
            Ok(text) => text,
            Err(e) => return err(e),
        };
        let Some(at) = text.find(old) else {
            return err(format!("{path} does not contain the text to replace"));
        };
        let edited = format!("{}{new}{}", &text[..at], &text[at + old.len()..]);
        if edited.len() > self.limits.max_file_bytes {
            return err("the edited file would be larger than this executor writes");
        }
        match write_no_follow(&resolved, edited.as_bytes()).await {
            Ok(()) => ok(format!("edited {path}")),
            Err(e) => err(format!("{path}: {e}")),
        }
    }

    async fn mkdir(&self, path: &str) -> action_response::ResponseType {
        let resolved = match self.workspace.resolve(path) {
            Ok(p) => p,
            Err(e) => return err(e.to_string()),
        };
        match tokio::fs::create_dir_all(&resolved).await {
            Ok(()) => ok(format!("created {path}")),
            Err(e) => err(format!("{path}: {e}")),
        }
    }

    async fn list_directory(&self, path: &str) -> action_response::ResponseType {
        let path = if path.trim().is_empty() { "." } else { path };
        let resolved = match self.workspace.resolve(path) {
            Ok(p) => p,
            Err(e) => return err(e.to_string()),
        };
        let mut entries = match tokio::fs::read_dir(&resolved).await {
            Ok(entries) => entries,
            Err(e) => return err(format!("{path}: {e}")),
        };
        let mut names = Vec::new();
        while let Ok(Some(entry)) = entries.next_entry().await {
            let mut name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
                name.push('/');
            }
            names.push(name);
            if names.len() >= self.limits.max_results {
                break;
            }
        }
        names.sort();
        ok(names.join("\n"))
    }

    /// Files below the root, depth first, skipping `.git` and symbolic
    /// links (which could lead out of the workspace).
    fn walk(&self, start: &Path, limit: usize) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        let mut stack = vec![start.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut entries: Vec<_> = entries.flatten().collect();
            entries.sort_by_key(|e| e.file_name());
            for entry in entries.into_iter().rev() {
                let Ok(file_type) = entry.file_type() else {
                    continue;
                };
                if file_type.is_symlink() || is_git_dir_name(&entry.file_name()) {
                    continue;
                }
                if file_type.is_dir() {
                    stack.push(entry.path());
                } else if file_type.is_file() {
                    files.push(entry.path());
                    if files.len() >= limit {
                        return files;
                    }
                }
            }
        }
        files
    }

    async fn find_files(&self, pattern: &str) -> action_response::ResponseType {
        let Some(matcher) = glob_to_regex(pattern) else {
            return err(format!("bad pattern {pattern:?}"));
        };
        let root = self.workspace.root().to_path_buf();
        let runner = self.clone();
        let found = tokio::task::spawn_blocking(move || {
            runner
                .walk(&root, 100_000)
                .into_iter()
                .map(|p| runner.workspace.display(&p))
                .filter(|p| {
                    let name = p.rsplit('/').next().unwrap_or(p);
                    matcher.is_match(p) || matcher.is_match(name)
                })
                .take(runner.limits.max_results)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        ok(found.join("\n"))
    }

    async fn grep(
        &self,
        directory: &str,
        pattern: &str,
        case_insensitive: bool,
    ) -> action_response::ResponseType {
        let regex = match regex::RegexBuilder::new(pattern)
            .case_insensitive(case_insensitive)
            .size_limit(1 << 20)
            .build()
        {
            Ok(regex) => regex,
            Err(e) => return err(format!("bad pattern: {e}")),
        };
        let directory = if directory.trim().is_empty() {
            "."
        } else {
            directory
        };
        let start = match self.workspace.resolve(directory) {
            Ok(p) => p,
            Err(e) => return err(e.to_string()),
        };
        let runner = self.clone();
        let lines = tokio::task::spawn_blocking(move || {
            let mut lines = Vec::new();
            for file in runner.walk(&start, 100_000) {
                let Ok(metadata) = file.metadata() else {
                    continue;
                };
                if metadata.len() > runner.limits.max_file_bytes as u64 {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(&file) else {
                    continue;
                };
                for (number, line) in text.lines().enumerate() {
                    if regex.is_match(line) {
                        let line: String = line.chars().take(300).collect();
                        lines.push(format!(
                            "{}:{}:{line}",
                            runner.workspace.display(&file),
                            number + 1
                        ));
                        if lines.len() >= runner.limits.max_results {
                            return lines;
                        }
                    }
                }
            }
            lines
        })
        .await
        .unwrap_or_default();
        if lines.is_empty() {
            return ok("no matches");
        }
        ok(lines.join("\n"))
    }

    /// `runCommand` (and `runGitCommand`): a program with arguments, no
    /// shell, in the workspace, with the cleared environment. git, by name
    /// or by path, goes through the git rules.
    async fn run_command(
        &self,
        program: &str,
        arguments: &[String],
        timeout_seconds: Option<i64>,
    ) -> action_response::ResponseType {
        if program.trim().is_empty()
            || program.contains('\0')
            || arguments.iter().any(|a| a.contains('\0'))
        {
            return err("bad command");
        }
        if let Some(allowed) = &self.limits.allowed_commands
            && !allowed.iter().any(|a| a == program)
        {
            return err(format!(
                "the command {program} is not allowed (allowed: {})",
                allowed.join(", ")
            ));
        }
        let timeout = match timeout_seconds {
            Some(seconds) if seconds > 0 => Duration::from_secs(seconds as u64),
            _ => self.limits.default_command_timeout,
        }
        .min(self.limits.max_command_timeout);
        match git::classify_program(program, arguments) {
            Err(refusal) => err(refusal.to_string()),
            Ok(git::ProgramKind::Git) => self.run_git(arguments, timeout).await,
            Ok(git::ProgramKind::Other) => {
                // A program named by path must be inside the workspace too.
                if program.contains('/')
                    && let Err(e) = self.workspace.resolve(program)
                {
                    return err(e.to_string());
                }
                let env = environment::from_process(&self.workspace, false);
                self.execute(program, arguments, env, timeout).await
            }
        }
    }

    /// git under its rules: the arguments are checked, then the
    /// configuration git would read (with the overrides in force), then git
    /// runs with paging off.
    async fn run_git(
        &self,
        arguments: &[String],
        timeout: Duration,
    ) -> action_response::ResponseType {
        let command = match git::check_arguments(arguments, &self.workspace) {
            Ok(command) => command,
            Err(refusal) => return err(refusal.to_string()),
        };
        let mut env = environment::from_process(&self.workspace, command.is_network());
        let listing = match self.git_output(&["config", "--list", "-z"], &env).await {
            Ok(listing) => listing,
            Err(e) => return err(git::GitRefusal::ConfigUnreadable(e).to_string()),
        };
        let facts = match git::check_config(&listing) {
            Ok(facts) => facts,
            Err(refusal) => return err(refusal.to_string()),
        };
        if command.is_network()
            && let Err(refusal) = git::check_remote(&command, &facts)
        {
            return err(refusal.to_string());
        }
        if command.commits() && !(facts.has_user_name && facts.has_user_email) {
            env.extend(self.global_identity(&env, &facts).await);
        }
        let mut full = vec!["--no-pager".to_owned()];
        full.extend(command.arguments);
        self.execute("git", &full, env, timeout).await
    }

    /// A quick git query (its standard output), bounded in time.
    async fn git_output(
        &self,
        arguments: &[&str],
        env: &[(OsString, OsString)],
    ) -> Result<Vec<u8>, String> {
        let mut command = tokio::process::Command::new("git");
        command
            .args(arguments)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(self.workspace.root())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(30), command.output())
            .await
            .map_err(|_| "git config did not answer in time".to_owned())?
            .map_err(|e| format!("could not start git: {e}"))?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
        }
        Ok(output.stdout)
    }

    /// The user's name and e-mail from their own git configuration (which
    /// commands do not read) when the repository sets none: a commit needs
    /// them. Only these two values are taken.
    async fn global_identity(
        &self,
        env: &[(OsString, OsString)],
        facts: &git::ConfigFacts,
    ) -> Vec<(OsString, OsString)> {
        let user_env: Vec<(OsString, OsString)> = env
            .iter()
            .filter(|(name, _)| name != "GIT_CONFIG_GLOBAL")
            .cloned()
            .collect();
        let mut identity = Vec::new();
        let wanted = [
            (
                "user.name",
                facts.has_user_name,
                ["GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"],
            ),
            (
                "user.email",
                facts.has_user_email,
                ["GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"],
            ),
        ];
        for (key, present, names) in wanted {
            if present {
                continue;
            }
            let Ok(value) = self
                .git_output(&["config", "--global", "--get", key], &user_env)
                .await
            else {
                continue;
            };
            let value = String::from_utf8_lossy(&value).trim().to_owned();
            if value.is_empty() {
                continue;
            }
            for name in names {
                identity.push((OsString::from(name), OsString::from(&value)));
            }
        }
        identity
    }

    /// Runs a program and collects its output within `timeout`.
    async fn execute(
        &self,
        program: &str,
        arguments: &[String],
        env: Vec<(OsString, OsString)>,
        timeout: Duration,
    ) -> action_response::ResponseType {
        let mut command = tokio::process::Command::new(program);
        command
            .args(arguments)
            .env_clear()
            .envs(env)
            .current_dir(self.workspace.root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return err(format!("could not start {program}: {e}")),
        };
        let limit = self.limits.max_output_bytes;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let read = async {
            let (mut out, mut errs) = (Vec::new(), Vec::new());
            let out_task = async {
                if let Some(s) = stdout {
                    let _ = s.take(limit as u64 + 1).read_to_end(&mut out).await;
                }
            };
            let err_task = async {
                if let Some(s) = stderr {
                    let _ = s.take(limit as u64 + 1).read_to_end(&mut errs).await;
                }
            };
            tokio::join!(out_task, err_task);
            (out, errs)
        };
        let outcome = tokio::time::timeout(timeout, async {
            let (out, errs) = read.await;
            let status = child.wait().await;
            (out, errs, status)
        })
        .await;
        let Ok((out, errs, status)) = outcome else {
            // kill_on_drop ends the child when `child` goes out of scope.
            return plain(
                String::new(),
                format!(
                    "{program} did not finish within {} seconds and was stopped",
                    timeout.as_secs()
                ),
            );
        };
        let mut text = String::from_utf8_lossy(&out).into_owned();
        let errs = String::from_utf8_lossy(&errs);
        if !errs.is_empty() {
            text.push_str(&errs);
        }
        if text.len() > limit {
            let mut cut = limit;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("\n[output truncated]");
        }
        match status {
            Ok(status) if status.success() => ok(text),
            Ok(status) => plain(text, format!("{program} exited with {status}")),
            Err(e) => plain(text, format!("{program}: {e}")),
        }
    }

    async fn http(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> action_response::ResponseType {
        let Some(gitlab) = &self.gitlab else {
            return http_error("this executor has no GitLab connection");
        };
        // Only GitLab's APIs, never another host or an odd path: the same
        // check as the monolith's socket bridge.
        let path = match api_request::normalize_path(path) {
            Ok(path) => path,
            Err(e) => return http_error(format!("refusing the request path {path:?}: {e}")),
        };
        let method = match api_request::allowed_method(method) {
            Ok(method) => method,
            Err(e) => return http_error(e.to_string()),
        };
        let method = match reqwest::Method::from_bytes(method.as_bytes()) {
            Ok(method) => method,
            Err(e) => return http_error(e.to_string()),
        };
        let url = format!("{}{path}", gitlab.base_url.trim_end_matches('/'));
        let mut request = gitlab
            .client
            .request(method, url)
            .headers(duo_telemetry::outgoing_headers())
            .bearer_auth(&gitlab.token)
            .timeout(Duration::from_secs(60));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        match request.send().await {
            Ok(response) => {
                let status = i32::from(response.status().as_u16());
                let headers: HashMap<String, String> = response
                    .headers()
                    .iter()
                    .filter(|(name, _)| {
                        matches!(
                            name.as_str(),
                            "content-type" | "x-total" | "x-next-page" | "link"
                        )
                    })
                    .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                    .collect();
                let limit = 4 * 1024 * 1024 - 64 * 1024;
                match response.bytes().await {
                    Ok(bytes) if bytes.len() > limit => http_error(format!(
                        "the answer is {} bytes, too large to relay",
                        bytes.len()
                    )),
                    Ok(bytes) => action_response::ResponseType::HttpResponse(HttpResponse {
                        headers,
                        status_code: status,
                        body: String::from_utf8_lossy(&bytes).into_owned(),
                        error: String::new(),
                    }),
                    Err(e) => http_error(e.to_string()),
                }
            }
            Err(e) => http_error(e.to_string()),
        }
    }
}

/// Writes `bytes` to `path` (created or truncated) without following a
/// symbolic link in its last step: the path was resolved just before, and a
/// link appearing since (a git checkout) must not redirect the write.
async fn write_no_follow(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .await?;
    file.write_all(bytes).await?;
    file.flush().await
}

/// A glob (`*`, `**`, `?`) as an anchored regular expression.
pub fn glob_to_regex(pattern: &str) -> Option<regex::Regex> {
    if pattern.is_empty() || pattern.len() > 1000 {
        return None;
    }
    let mut out = String::from("^");
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' if chars.peek() == Some(&'*') => {
                chars.next();
                if chars.peek() == Some(&'/') {
                    chars.next();
                    out.push_str("(?:.*/)?");
                } else {
                    out.push_str(".*");
                }
            }
            '*' => out.push_str("[^/]*"),
            '?' => out.push_str("[^/]"),
            other => out.push_str(&regex::escape(&other.to_string())),
        }
    }
    out.push('$');
    regex::Regex::new(&out).ok()
}
