//! Actions as the service sends them: files, edits, searches, commands and
//! bad input, which gets an error reply and never a crash.

use crate::support::{Dir, run, runner};
use contracts::duo_workflow::{
    EditFile, FindFiles, Grep, ListDirectory, Mkdir, ReadFile, RunCommandAction, RunHttpRequest,
    RunMcpTool, RunShellCommand, WriteFile, action,
};
use std::time::{Duration, Instant};
use workflow_executor::Limits;

#[tokio::test]
async fn read_write_and_edit_files() {
    let dir = Dir::new();
    dir.write("notes.txt", "one\ntwo\nthree\n");
    let r = runner(&dir, Limits::default());
    let (text, error) = run(
        &r,
        action::Action::RunReadFile(ReadFile {
            filepath: "notes.txt".into(),
            offset: Some(2),
            limit: Some(1),
        }),
    )
    .await;
    assert_eq!((text.as_str(), error.as_str()), ("two", ""));
    let (_, error) = run(
        &r,
        action::Action::RunWriteFile(WriteFile {
            filepath: "new/dir/file.md".into(),
            contents: "# Title\n".into(),
        }),
    )
    .await;
    assert_eq!(error, "");
    assert_eq!(
        std::fs::read_to_string(dir.path.join("new/dir/file.md")).unwrap(),
        "# Title\n"
    );
    let edit = |old: &str| {
        action::Action::RunEditFile(EditFile {
            filepath: "notes.txt".into(),
            old_string: old.into(),
            new_string: "TWO".into(),
        })
    };
    let (_, error) = run(&r, edit("two")).await;
    assert_eq!(error, "");
    assert_eq!(
        std::fs::read_to_string(dir.path.join("notes.txt")).unwrap(),
        "one\nTWO\nthree\n"
    );
    let (_, error) = run(&r, edit("two")).await;
    assert!(error.contains("does not contain"), "{error}");
    let (_, error) = run(
        &r,
        action::Action::RunEditFile(EditFile {
            filepath: "missing.txt".into(),
            old_string: "a".into(),
            new_string: "b".into(),
        }),
    )
    .await;
    assert!(!error.is_empty());
    let (_, error) = run(
        &r,
        action::Action::Mkdir(Mkdir {
            directory_path: "a/b".into(),
        }),
    )
    .await;
    assert_eq!(error, "");
    let (listing, _) = run(
        &r,
        action::Action::ListDirectory(ListDirectory {
            directory: ".".into(),
        }),
    )
    .await;
    assert_eq!(listing, "a/\nnew/\nnotes.txt");
}

#[tokio::test]
async fn oversized_writes_and_reads_are_refused() {
    let dir = Dir::new();
    let limits = Limits {
        max_file_bytes: 100,
        ..Limits::default()
    };
    let r = runner(&dir, limits);
    let (_, error) = run(
        &r,
        action::Action::RunWriteFile(WriteFile {
            filepath: "big.txt".into(),
            contents: "x".repeat(101),
        }),
    )
    .await;
    assert!(error.contains("refusing to write 101 bytes"), "{error}");
    assert!(!dir.path.join("big.txt").exists());
    dir.write("large.txt", &"y".repeat(500));
    let (_, error) = run(
        &r,
        action::Action::RunReadFile(ReadFile {
            filepath: "large.txt".into(),
            ..ReadFile::default()
        }),
    )
    .await;
    assert!(error.contains("500 bytes"), "{error}");
}

#[tokio::test]
async fn paths_outside_are_error_replies() {
    let dir = Dir::new();
    let r = runner(&dir, Limits::default());
    for action in [
        action::Action::RunReadFile(ReadFile {
            filepath: "../../etc/passwd".into(),
            ..ReadFile::default()
        }),
        action::Action::RunWriteFile(WriteFile {
            filepath: "/tmp/evil".into(),
            contents: "x".into(),
        }),
        action::Action::Mkdir(Mkdir {
            directory_path: "../out".into(),
        }),
        action::Action::Grep(Grep {
            search_directory: "..".into(),
            pattern: "x".into(),
            case_insensitive: false,
        }),
    ] {
        let (_, error) = run(&r, action).await;
        assert!(error.contains("outside the workspace"), "{error}");
    }
}

#[tokio::test]
async fn grep_and_find_stay_inside_and_skip_links() {
    let dir = Dir::new();
    let outside = Dir::new();
    outside.write("leak.txt", "needle outside");
    dir.write("src/lib.rs", "// needle here\nfn x() {}\n");
    dir.write("docs/readme.md", "Needle in docs\n");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside.path, dir.path.join("link")).unwrap();
    let r = runner(&dir, Limits::default());
    let (found, _) = run(
        &r,
        action::Action::Grep(Grep {
            search_directory: ".".into(),
            pattern: "needle".into(),
            case_insensitive: true,
        }),
    )
    .await;
    assert_eq!(
        found,
        "docs/readme.md:1:Needle in docs\nsrc/lib.rs:1:// needle here"
    );
    let (found, _) = run(
        &r,
        action::Action::FindFiles(FindFiles {
            name_pattern: "**/*.rs".into(),
        }),
    )
    .await;
    assert_eq!(found, "src/lib.rs");
    let (found, _) = run(
        &r,
        action::Action::FindFiles(FindFiles {
            name_pattern: "*.md".into(),
        }),
    )
    .await;
    assert_eq!(found, "docs/readme.md");
    let (_, error) = run(
        &r,
        action::Action::Grep(Grep {
            search_directory: ".".into(),
            pattern: "(".into(),
            case_insensitive: false,
        }),
    )
    .await;
    assert!(error.contains("bad pattern"));
}

#[tokio::test]
async fn commands_run_without_a_shell_with_limits() {
    let dir = Dir::new();
    let r = runner(
        &dir,
        Limits {
            max_output_bytes: 64,
            ..Limits::default()
        },
    );
    let command = |program: &str, args: &[&str], timeout: Option<i64>| {
        action::Action::RunCommand(RunCommandAction {
            program: program.into(),
            arguments: args.iter().map(|a| (*a).to_owned()).collect(),
            flags: Vec::new(),
            timeout,
        })
    };
    // No shell: the argument is one literal word.
    let (out, error) = run(&r, command("echo", &["$HOME; ls | wc"], None)).await;
    assert_eq!((out.as_str(), error.as_str()), ("$HOME; ls | wc\n", ""));
    let (out, error) = run(&r, command("sh", &["-c", "echo partial; exit 3"], None)).await;
    assert_eq!(out, "partial\n");
    assert!(error.contains("exit"), "{error}");
    let (out, _) = run(&r, command("seq", &["1", "1000"], None)).await;
    assert!(
        out.ends_with("[output truncated]") && out.len() < 100,
        "{out}"
    );
    let started = Instant::now();
    let (_, error) = run(&r, command("sleep", &["30"], Some(1))).await;
    assert!(error.contains("did not finish within 1 seconds"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let (_, error) = run(&r, command("definitely-not-a-program", &[], None)).await;
    assert!(error.contains("could not start"));

    let allow = runner(
        &dir,
        Limits {
            allowed_commands: Some(vec!["echo".into()]),
            ..Limits::default()
        },
    );
    let (_, error) = run(&allow, command("rm", &["-rf", "."], None)).await;
    assert!(error.contains("not allowed"), "{error}");
    let (_, error) = run(&allow, command("echo", &["ok"], None)).await;
    assert_eq!(error, "");
}

#[tokio::test]
async fn actions_this_executor_does_not_do_get_error_replies() {
    let dir = Dir::new();
    let r = runner(&dir, Limits::default());
    let (_, error) = run(
        &r,
        action::Action::RunShellCommand(RunShellCommand {
            command: "rm -rf /".into(),
            timeout: None,
        }),
    )
    .await;
    assert!(error.contains("without a shell"));
    let (_, error) = run(
        &r,
        action::Action::RunMcpTool(RunMcpTool {
            name: "x".into(),
            args: "{}".into(),
        }),
    )
    .await;
    assert!(!error.is_empty());
    let (_, error) = run(
        &r,
        action::Action::RunHttpRequest(RunHttpRequest {
            method: "GET".into(),
            path: "/api/v4/projects".into(),
            body: None,
        }),
    )
    .await;
    assert!(error.contains("no GitLab connection"));
}
