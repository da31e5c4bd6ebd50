//! The MCP server driven by the official MCP Python SDK
//! (e2e/python/mcp_client_suite.py): discovery, scopes, the session, reads,
//! permissions without leaks, writes and argument errors, and the OAuth flow
//! (dynamic registration, consent, PKCE, refresh, revocation) with the SDK's
//! own OAuth client. The SDK is
//! installed by `scripts/python-env.sh`; without Python this test fails, it
//! never skips.

use e2e_tests::{System, python, repo_root};

#[tokio::test]
async fn the_mcp_python_sdk_works_with_the_server_as_each_user_may() {
    let system = System::start().await.unwrap();
    let alice_mcp = system.new_token("alice", &["mcp"]).await.unwrap();
    let carol_mcp = system.new_token("carol", &["mcp"]).await.unwrap();
    let run = tokio::process::Command::new(python().unwrap())
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
