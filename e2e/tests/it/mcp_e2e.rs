//! The MCP server driven by the official MCP Python SDK
//! (e2e/python/mcp_client_suite.py): discovery, scopes, the session, reads,
//! permissions without leaks, writes and argument errors, and the OAuth flow
//! (dynamic registration, consent, PKCE, refresh, revocation) with the SDK's
//! own OAuth client. The SDK is
//! installed by `scripts/python-env.sh`; without Python this test fails, it
//! never skips.

use e2e_tests::{System, repo_root};
use reqwest::Method;
use serde_json::json;

/// A new personal access token of `username` with `scopes`, made by root.
pub(crate) async fn token_with(system: &System, username: &str, scopes: &[&str]) -> String {
    let root = system.token("root").unwrap();
    let (status, users) = system
        .rest(
            &root,
            Method::GET,
            &format!("/users?username={username}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{users}");
    let id = users[0]["id"].as_i64().unwrap();
    let (status, created) = system
        .rest(
            &root,
            Method::POST,
            &format!("/users/{id}/personal_access_tokens"),
            Some(json!({"name": format!("mcp-{}", scopes.join("-")), "scopes": scopes})),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "{created}");
    created["token"].as_str().unwrap().to_owned()
}

/// The interpreter of the project's cached Python environment.
pub(crate) fn python() -> String {
    let env = std::process::Command::new("bash")
        .arg(repo_root().join("scripts/python-env.sh"))
        .output()
        .unwrap();
    assert!(
        env.status.success(),
        "scripts/python-env.sh failed: {}",
        String::from_utf8_lossy(&env.stderr)
    );
    String::from_utf8(env.stdout).unwrap().trim().to_owned()
}

#[tokio::test]
async fn the_mcp_python_sdk_works_with_the_server_as_each_user_may() {
    let system = System::start().await.unwrap();
    let alice_mcp = token_with(&system, "alice", &["mcp"]).await;
    let carol_mcp = token_with(&system, "carol", &["mcp"]).await;
    let run = tokio::process::Command::new(python())
        .arg(repo_root().join("e2e/python/mcp_client_suite.py"))
        .env("DUO_URL", &system.web_url)
        .env("DUO_ALICE_MCP", &alice_mcp)
        .env("DUO_CAROL_MCP", &carol_mcp)
        .env("DUO_ALICE_API", system.token("alice").unwrap())
        .env("DUO_ALICE_PASSWORD", system.password("alice").unwrap())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "MCP suite failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- web log\n{}",
        system.web.log_tail(40)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok: ")).count(),
        9,
        "{stdout}"
    );
}
