//! The executor binary's confinement, driven through a scripted workflow
//! service: what its commands can see, what git may do, which files are out
//! of reach and which GitLab paths it relays. Each refusal is shown to be one
//! (a planted hook or configuration that plain git does run stays unrun).
#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use crate::service::{GITLAB_TOKEN, GitLab, Run, SERVICE_TOKEN, command, run_executor};
use crate::support::Dir;
use contracts::duo_workflow::{
    FindFiles, Grep, ListDirectory, Mkdir, ReadFile, ReadFiles, RunGitCommand, RunHttpRequest,
    WriteFile, action,
};
use std::path::Path;

/// Runs the test's own git (not the executor) in `dir`.
fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .unwrap()
}

/// A repository with one commit and a local identity.
fn repository(dir: &Dir) {
    dir.write("README.md", "# Hello\n");
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["config", "user.name", "Test User"],
        &["config", "user.email", "test@example.com"],
        &["add", "README.md"],
        &["commit", "-q", "-m", "first"],
    ] {
        let output = git(&dir.path, args);
        assert!(output.status.success(), "git {args:?}: {output:?}");
    }
}

/// Where planted programs leave their marks (outside every workspace).
struct Marks(Dir);

impl Marks {
    fn new() -> Self {
        Self(Dir::new())
    }

    /// An executable script that creates the mark `name` when run.
    fn script(&self, name: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let script = self.0.path.join(format!("{name}.sh"));
        let mark = self.0.path.join(name);
        std::fs::write(
            &script,
            format!("#!/bin/sh\ntouch '{}'\nexit 1\n", mark.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script.display().to_string()
    }

    fn made(&self, name: &str) -> bool {
        self.0.path.join(name).exists()
    }

    fn clear(&self, name: &str) {
        let _ = std::fs::remove_file(self.0.path.join(name));
    }

    fn path(&self, name: &str) -> String {
        self.0.path.join(name).display().to_string()
    }
}

fn git_action(command: &str, arguments: &str) -> action::Action {
    action::Action::RunGitCommand(RunGitCommand {
        command: command.into(),
        arguments: Some(arguments.into()),
        repository_url: String::new(),
    })
}

fn assert_finished(run: &Run) {
    assert_eq!(run.exit_code, Some(0), "{}", run.stderr);
}

const NO_GITLAB: &str = "http://127.0.0.1:9";

#[tokio::test]
async fn commands_see_no_token_and_cannot_read_the_executor() {
    let dir = Dir::new();
    let secrets = [
        GITLAB_TOKEN,
        SERVICE_TOKEN,
        "env-gitlab-token-77aa",
        "env-workflow-secret-88bb",
        "env-oauth-token-99cc",
    ];
    let run = run_executor(
        &dir.path,
        NO_GITLAB,
        &[
            ("GITLAB_TOKEN", secrets[2]),
            ("DUO_WORKFLOW_SECRET", secrets[3]),
            ("CI_JOB_TOKEN", secrets[4]),
            ("LANG", "C.UTF-8"),
        ],
        |pid| {
            vec![
                command("env", &[]),
                command("printenv", &[]),
                command("cat", &[&format!("/proc/{pid}/environ")]),
                command("cat", &[&format!("/proc/{pid}/cmdline")]),
                command("sh", &["-c", "cat /proc/$PPID/environ"]),
            ]
        },
    )
    .await;
    assert_finished(&run);
    let (env, error) = run.reply(0);
    assert_eq!(error, "");
    let names: Vec<&str> = env
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .collect();
    for name in &names {
        assert!(executor_passes(name), "{name} reached a command:\n{env}");
    }
    assert!(names.contains(&"PATH") && names.contains(&"LANG"), "{env}");
    for index in 0..run.replies.len() {
        let (out, error) = run.reply(index);
        for secret in secrets {
            assert!(
                !out.contains(secret) && !error.contains(secret),
                "reply {index} shows a token: {out} {error}"
            );
        }
    }
    // The executor's environment is closed to its commands (not dumpable),
    // or, to root, readable and without a secret (the restart left them
    // out; checked above).
    for index in [2, 4] {
        let (out, error) = run.reply(index);
        let closed = out.contains("Permission denied");
        let clean = out.contains("PATH=") && !out.contains("TOKEN") && !out.contains("SECRET");
        assert!(closed || clean, "{out} {error}");
    }
    // Its command line is readable, and holds no token.
    let (cmdline, _) = run.reply(3);
    assert!(cmdline.contains("--workflow-id"), "{cmdline}");
}

/// The variables `SECURITY-sec-exec.md` lists as passed or set.
fn executor_passes(name: &str) -> bool {
    const PASSED: &[&str] = &[
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "LC_MESSAGES",
        "TZ",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "PAGER",
    ];
    PASSED.contains(&name) || name.starts_with("GIT_")
}

#[tokio::test]
async fn git_refuses_options_and_commands_that_run_programs() {
    let dir = Dir::new();
    repository(&dir);
    let marks = Marks::new();
    let touch = format!("touch {}", marks.path("ran"));
    let outside = marks.path("written");
    let run = run_executor(&dir.path, NO_GITLAB, &[], |_| {
        vec![
            // 0-1: allowed, through both actions.
            git_action("status", "--porcelain"),
            command("git", &["log", "--oneline"]),
            // 2-: refused.
            git_action("-c", &format!("core.pager={touch} log")),
            command("git", &["-c", &format!("core.fsmonitor={touch}"), "status"]),
            command("/usr/bin/git", &["--exec-path=/tmp", "status"]),
            command("git", &["--git-dir=/tmp/x", "status"]),
            command("git", &["config", "core.hooksPath", "/tmp"]),
            command("git", &["submodule", "update"]),
            command(
                "git",
                &["fetch", &format!("--upload-pack={touch}"), "origin"],
            ),
            command(
                "git",
                &["push", &format!("--receive-pack={touch}"), "origin"],
            ),
            command("git", &["fetch", "ext::sh -c touch% /tmp/x"]),
            command("git", &["push", "/tmp/elsewhere.git", "HEAD"]),
            command("git", &["diff", "--ext-diff"]),
            command("git", &["log", "-p", "--textconv"]),
            command("git", &["grep", "-O", "touch", "Hello"]),
            command("git", &["log", &format!("--output={outside}")]),
            command("git", &["commit", "-F", "/etc/passwd"]),
            command("git", &["diff", "--no-index", "/etc/passwd", "README.md"]),
            command("env", &["git", "-c", "core.pager=x", "log"]),
            command("sh", &["-c", &format!("git -c core.pager='{touch}' log")]),
            command("git-upload-pack", &["."]),
        ]
    })
    .await;
    assert_finished(&run);
    let (status, error) = run.reply(0);
    assert_eq!((status.as_str(), error.as_str()), ("", ""));
    let (log, error) = run.reply(1);
    assert!(log.contains("first") && error.is_empty(), "{log} {error}");
    let expected = [
        "options before the subcommand",
        "options before the subcommand",
        "options before the subcommand",
        "options before the subcommand",
        "git config is not allowed",
        "git submodule is not allowed",
        "--upload-pack is not allowed",
        "--receive-pack is not allowed",
        "talks only to a remote configured",
        "talks only to a remote configured",
        "--ext-diff is not allowed",
        "--textconv is not allowed",
        "-O is not allowed",
        "--output must name a file inside the workspace",
        "-F must name a file inside the workspace",
        "--no-index is not allowed",
        "env would run git around its rules",
        "sh would run git around its rules",
        "git-upload-pack is one of git's helper programs",
    ];
    for (offset, wanted) in expected.iter().enumerate() {
        let (out, error) = run.reply(offset + 2);
        assert!(
            error.contains(wanted) && out.is_empty(),
            "action {}: wanted {wanted:?}, got {out:?} {error:?}",
            offset + 2
        );
    }
    assert!(!marks.made("ran") && !marks.made("written"));
}

#[tokio::test]
async fn git_ignores_the_repositorys_hooks_fsmonitor_and_ssh_command() {
    let dir = Dir::new();
    repository(&dir);
    let marks = Marks::new();
    let hook = dir.path.join(".git/hooks/pre-commit");
    std::fs::copy(marks.script("hook"), &hook).unwrap();
    let transport = format!("ext::{}", marks.script("transport"));
    for args in [
        &["config", "core.fsmonitor", &marks.script("fsmonitor")][..],
        &["config", "core.sshCommand", &marks.script("ssh")],
        &["remote", "add", "origin", "ssh://git.example.invalid/x.git"],
        &["config", "protocol.ext.allow", "always"],
        &["remote", "add", "helper", &transport],
    ] {
        assert!(git(&dir.path, args).status.success());
    }
    // Plain git does run all four.
    git(&dir.path, &["status"]);
    git(
        &dir.path,
        &["commit", "-q", "--allow-empty", "-m", "control"],
    );
    git(&dir.path, &["fetch", "-q", "origin"]);
    git(&dir.path, &["fetch", "-q", "helper"]);
    for mark in ["fsmonitor", "hook", "ssh", "transport"] {
        assert!(marks.made(mark), "the planted {mark} did not run");
        marks.clear(mark);
    }

    let run = run_executor(&dir.path, NO_GITLAB, &[], |_| {
        vec![
            git_action("status", ""),
            command(
                "git",
                &["commit", "-q", "--allow-empty", "-m", "by the agent"],
            ),
            command("git", &["fetch", "-q", "origin"]),
            command("git", &["fetch", "-q", "helper"]),
        ]
    })
    .await;
    assert_finished(&run);
    assert_eq!(run.reply(0).1, "");
    assert_eq!(run.reply(1).1, "", "{:?}", run.reply(1));
    // The fetches fail (no such host; a transport not allowed), but not
    // through the planted programs.
    assert!(!run.reply(2).1.is_empty());
    let (out, _) = run.reply(3);
    assert!(
        out.contains("transport 'ext' not allowed"),
        "{:?}",
        run.reply(3)
    );
    for mark in ["fsmonitor", "hook", "ssh", "transport"] {
        assert!(
            !marks.made(mark),
            "the planted {mark} ran under the executor"
        );
    }
    let log = git(&dir.path, &["log", "--format=%s", "-1"]);
    assert_eq!(String::from_utf8_lossy(&log.stdout), "by the agent\n");
}

#[tokio::test]
async fn git_commits_with_the_users_identity_and_nothing_else_of_their_configuration() {
    let dir = Dir::new();
    repository(&dir);
    for key in ["user.name", "user.email"] {
        assert!(git(&dir.path, &["config", "--unset", key]).status.success());
    }
    let home = Dir::new();
    let marks = Marks::new();
    home.write(
        ".gitconfig",
        &format!(
            "[user]\n\tname = Global User\n\temail = global@example.com\n[core]\n\tfsmonitor = {}\n",
            marks.script("fsmonitor")
        ),
    );
    let home_path = home.path.display().to_string();
    // Plain git with that home runs the user's fsmonitor.
    std::process::Command::new("git")
        .arg("status")
        .current_dir(&dir.path)
        .env("HOME", &home.path)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("GIT_CONFIG_GLOBAL")
        .output()
        .unwrap();
    assert!(marks.made("fsmonitor"));
    marks.clear("fsmonitor");
    let run = run_executor(&dir.path, NO_GITLAB, &[("HOME", &home_path)], |_| {
        vec![
            command(
                "git",
                &["commit", "-q", "--allow-empty", "-m", "with identity"],
            ),
            git_action("status", ""),
        ]
    })
    .await;
    assert_finished(&run);
    assert_eq!(run.reply(0).1, "", "{:?}", run.reply(0));
    assert_eq!(run.reply(1).1, "");
    let author = git(&dir.path, &["log", "-1", "--format=%an <%ae>|%cn <%ce>"]);
    assert_eq!(
        String::from_utf8_lossy(&author.stdout),
        "Global User <global@example.com>|Global User <global@example.com>\n"
    );
    // The user's own fsmonitor (global configuration) never ran.
    assert!(!marks.made("fsmonitor"));
}

#[tokio::test]
async fn git_does_not_run_while_the_repository_sets_a_filter() {
    let dir = Dir::new();
    repository(&dir);
    let marks = Marks::new();
    dir.write(".gitattributes", "*.txt filter=evil\n");
    dir.write("notes.txt", "notes\n");
    assert!(
        git(
            &dir.path,
            &["config", "filter.evil.clean", &marks.script("filter")]
        )
        .status
        .success()
    );
    // Plain git runs the filter when it adds the file.
    git(&dir.path, &["add", "notes.txt"]);
    assert!(marks.made("filter"));
    git(&dir.path, &["reset", "-q"]);
    marks.clear("filter");

    let run = run_executor(&dir.path, NO_GITLAB, &[], |_| {
        vec![
            command("git", &["add", "notes.txt"]),
            git_action("status", ""),
        ]
    })
    .await;
    assert_finished(&run);
    for index in 0..2 {
        let (_, error) = run.reply(index);
        assert!(
            error.contains("configuration sets filter.evil.clean"),
            "{error}"
        );
    }
    assert!(!marks.made("filter"));
}

#[tokio::test]
async fn git_never_uses_a_repository_around_the_workspace() {
    let outer = Dir::new();
    repository(&outer);
    let marks = Marks::new();
    assert!(
        git(
            &outer.path,
            &["config", "core.fsmonitor", &marks.script("fsmonitor")]
        )
        .status
        .success()
    );
    std::fs::create_dir_all(outer.path.join("sub")).unwrap();
    let workspace = outer.path.join("sub");
    // Plain git finds the outer repository from the subdirectory.
    git(&workspace, &["status"]);
    assert!(marks.made("fsmonitor"));
    marks.clear("fsmonitor");

    let run = run_executor(&workspace, NO_GITLAB, &[], |_| {
        vec![git_action("status", ""), git_action("log", "-1")]
    })
    .await;
    assert_finished(&run);
    for index in 0..2 {
        let (out, error) = run.reply(index);
        assert!(out.contains("not a git repository"), "{out} {error}");
        assert!(error.contains("git exited"), "{error}");
    }
    assert!(!marks.made("fsmonitor"));
}

#[tokio::test]
async fn file_actions_refuse_git_directories_links_and_escapes() {
    use std::os::unix::fs::symlink;
    let dir = Dir::new();
    repository(&dir);
    let outside = Dir::new();
    outside.write("secret.txt", "secret");
    symlink(dir.path.join(".git/hooks"), dir.path.join("hooks")).unwrap();
    symlink(dir.path.join(".git/config"), dir.path.join("cfg")).unwrap();
    symlink(".git", dir.path.join("gitdir")).unwrap();
    symlink(&outside.path, dir.path.join("out")).unwrap();
    let config_before = std::fs::read_to_string(dir.path.join(".git/config")).unwrap();
    let write = |path: &str| {
        action::Action::RunWriteFile(WriteFile {
            filepath: path.into(),
            contents: "#!/bin/sh\ntouch /tmp/pwned\n".into(),
        })
    };
    let read = |path: &str| {
        action::Action::RunReadFile(ReadFile {
            filepath: path.into(),
            ..ReadFile::default()
        })
    };
    let run = run_executor(&dir.path, NO_GITLAB, &[], |_| {
        vec![
            // 0-12: in .git, by name or through a link.
            write(".git/hooks/pre-commit"),
            write("hooks/pre-commit"),
            write("gitdir/config"),
            write("nested/.GIT/config"),
            write("sub/../.git/config"),
            read(".git/config"),
            read("cfg"),
            action::Action::RunEditFile(contracts::duo_workflow::EditFile {
                filepath: "cfg".into(),
                old_string: "[core]".into(),
                new_string: "[core]\n\tfsmonitor = /tmp/x".into(),
            }),
            action::Action::ListDirectory(ListDirectory {
                directory: ".git".into(),
            }),
            action::Action::ListDirectory(ListDirectory {
                directory: "hooks".into(),
            }),
            action::Action::Mkdir(Mkdir {
                directory_path: ".git/hooks/new".into(),
            }),
            action::Action::Grep(Grep {
                search_directory: "gitdir".into(),
                pattern: "core".into(),
                case_insensitive: false,
            }),
            command(".git/hooks/pre-commit.sample", &[]),
            // 13-15: outside the workspace.
            read("out/secret.txt"),
            write("out/new.txt"),
            read("../secret.txt"),
            // 16-18: searches skip .git; a batch read refuses per file.
            action::Action::FindFiles(FindFiles {
                name_pattern: "**/config".into(),
            }),
            action::Action::RunReadFiles(ReadFiles {
                filepaths: vec![".git/config".into(), "README.md".into()],
            }),
            write("docs/guide.md"),
        ]
    })
    .await;
    assert_finished(&run);
    for index in 0..13 {
        let (out, error) = run.reply(index);
        assert!(
            error.contains("in a .git directory") && out.is_empty(),
            "action {index}: {out:?} {error:?}"
        );
    }
    for index in 13..16 {
        let (out, error) = run.reply(index);
        assert!(
            error.contains("outside the workspace") && out.is_empty(),
            "action {index}: {out:?} {error:?}"
        );
    }
    assert_eq!(run.reply(16), (String::new(), String::new()));
    let batch: serde_json::Value = serde_json::from_str(&run.reply(17).0).unwrap();
    assert!(
        batch[".git/config"]["error"]
            .as_str()
            .unwrap()
            .contains("in a .git directory")
    );
    assert_eq!(batch["README.md"]["content"], "# Hello\n");
    assert_eq!(run.reply(18).1, "");
    // Nothing changed in .git or outside.
    assert!(!dir.path.join(".git/hooks/pre-commit").exists());
    assert!(!dir.path.join(".git/hooks/new").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!outside.path.join("new.txt").exists());
    assert!(dir.path.join("docs/guide.md").exists());
}

#[tokio::test]
async fn http_requests_outside_the_api_are_refused_before_they_leave() {
    let dir = Dir::new();
    let gitlab = GitLab::start().await;
    let refused = [
        "/api/v4/../../admin",
        "/api/v4/%2e%2e/admin",
        "/api/v4/..%2f..%2fadmin",
        "/api/v4/%252e%252e/admin",
        "//evil.example/api/v4/projects",
        "http://evil.example/api/v4/projects",
        "/api/v4/..\\..\\admin",
        "/api/v4//projects",
        "/api/v4/projects\0",
        "/api/v4/x%0d%0aX-Injected:%201",
        "/admin",
        "/api/v4",
    ];
    let request = |method: &str, path: &str| {
        action::Action::RunHttpRequest(RunHttpRequest {
            method: method.into(),
            path: path.into(),
            body: None,
        })
    };
    let run = run_executor(&dir.path, &gitlab.url, &[], |_| {
        let mut actions: Vec<_> = refused.iter().map(|p| request("GET", p)).collect();
        actions.push(request("TRACE", "/api/v4/projects"));
        actions.push(request("GET", "/api/v4/projects/group%2Fproject?ref=main"));
        actions.push(request("GET", "/api/v4/redirect"));
        actions
    })
    .await;
    assert_finished(&run);
    for (index, path) in refused.iter().enumerate() {
        let http = run.http(index);
        assert!(
            http.error.starts_with("refusing the request path") && http.status_code == 0,
            "{path:?}: {http:?}"
        );
    }
    let method = run.http(refused.len());
    assert!(method.error.contains("TRACE"), "{method:?}");
    let allowed = run.http(refused.len() + 1);
    assert_eq!(
        (allowed.status_code, allowed.body.as_str()),
        (200, r#"{"ok":true}"#)
    );
    // A redirect is handed back, not followed with the token.
    let redirect = run.http(refused.len() + 2);
    assert_eq!(redirect.status_code, 302);
    let received = gitlab.received();
    let lines: Vec<&str> = received.iter().map(|r| r.line.as_str()).collect();
    assert_eq!(
        lines,
        [
            "GET /api/v4/projects/group%2Fproject?ref=main",
            "GET /api/v4/redirect"
        ]
    );
    assert_eq!(
        received[0].authorization.as_deref(),
        Some(format!("Bearer {GITLAB_TOKEN}").as_str())
    );
}
