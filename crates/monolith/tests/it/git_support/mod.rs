//! Running the real `git` client against a test server: a private home (no
//! user configuration, no credential helpers, no prompts) and a scratch
//! directory per helper, removed on drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

pub struct GitClient {
    pub dir: PathBuf,
}

/// What a git command did.
pub struct GitRun {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl GitClient {
    pub fn new() -> GitClient {
        let dir = std::env::temp_dir().join(format!("duo-git-client-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("home")).unwrap();
        GitClient { dir }
    }

    /// Runs `git args` in `cwd` (relative to the scratch directory).
    pub async fn run(&self, cwd: &str, args: &[&str]) -> GitRun {
        let cwd = self.dir.join(cwd);
        std::fs::create_dir_all(&cwd).unwrap();
        let out: Output = tokio::process::Command::new("git")
            .args(["-c", "credential.helper=", "-c", "protocol.version=2"])
            .args(args)
            .current_dir(&cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.join("home"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_AUTHOR_NAME", "Test Author")
            .env("GIT_AUTHOR_EMAIL", "author@example.com")
            .env("GIT_COMMITTER_NAME", "Test Author")
            .env("GIT_COMMITTER_EMAIL", "author@example.com")
            .output()
            .await
            .unwrap();
        GitRun {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs and insists it worked.
    pub async fn ok(&self, cwd: &str, args: &[&str]) -> String {
        let run = self.run(cwd, args).await;
        assert!(run.ok, "git {args:?} failed: {}", run.stderr);
        run.stdout
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// A local repository `name` with one commit of `files`, on branch `main`.
    pub async fn repo_with(&self, name: &str, files: &[(&str, &str)]) {
        self.ok("", &["init", "-q", "-b", "main", name]).await;
        for (path, content) in files {
            write(&self.path(name).join(path), content);
        }
        self.ok(name, &["add", "-A"]).await;
        self.ok(name, &["commit", "-q", "-m", "First commit"]).await;
    }
}

impl Drop for GitClient {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn write(path: &Path, content: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, content).unwrap();
}

/// `http://user:token@127.0.0.1:port/<full_path>.git`, or without credentials.
pub fn clone_url(base: &str, full_path: &str, token: Option<&str>) -> String {
    match token {
        Some(token) => {
            base.replacen("http://", &format!("http://someone:{token}@"), 1)
                + &format!("/{full_path}.git")
        }
        None => format!("{base}/{full_path}.git"),
    }
}
