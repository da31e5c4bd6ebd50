//! Steps many end-to-end tests take: running git in a checkout, a scratch
//! directory removed afterwards, and finding a seeded project's id.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use e2e_tests::System;
use std::path::{Path, PathBuf};

/// Runs `git args` in `dir` (never asking for credentials); its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A fresh directory under the system's temporary one, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(prefix: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The id of the project at `full_path` (e.g. `acme/platform/api`), as
/// `token`'s user reads it.
pub async fn project_id(system: &System, token: &str, full_path: &str) -> i64 {
    let (status, project) = system
        .rest(
            token,
            reqwest::Method::GET,
            &format!("/projects/{}", full_path.replace('/', "%2F")),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{project}");
    project["id"].as_i64().unwrap()
}
