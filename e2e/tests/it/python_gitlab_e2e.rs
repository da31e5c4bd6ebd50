//! python-gitlab, GitLab's own REST client, against a running monolith: the
//! common operations of each of its managers (e2e/python/gitlab_client_suite.py).
//! The client is installed by `scripts/python-env.sh` into a cached virtual
//! environment; without Python this test fails, it never skips.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use e2e_tests::{System, python, repo_root};

#[tokio::test]
async fn python_gitlab_works_unchanged() {
    let system = System::start().await.unwrap();
    let root = repo_root();
    let python = python().unwrap();
    let run = tokio::process::Command::new(&python)
        .arg(root.join("e2e/python/gitlab_client_suite.py"))
        .env("DUO_URL", &system.web_url)
        .env("DUO_ADMIN_TOKEN", system.token("root").unwrap())
        .env("DUO_USER_TOKEN", system.token("alice").unwrap())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "python-gitlab suite failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- web log\n{}",
        system.web.log_tail(40)
    );
    // Every step reported itself.
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok: ")).count(),
        10,
        "{stdout}"
    );
}
