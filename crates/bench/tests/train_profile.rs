//! `duo-bench --train-profile`, the load `./dev pgo` records the gateway's
//! profile with (docs/performance.md, "Profile-guided optimisation"): every
//! call of every bench target must be answered and each gateway must exit
//! cleanly on SIGTERM, since an instrumented build writes its counts only
//! then. Runs the debug `duo-gateway` (not instrumented: it ignores the
//! `LLVM_PROFILE_FILE` the bench gives it), with a few calls per target.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a failed step fails the test"
)]

use std::process::Command;

fn bench() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_duo-bench"));
    command.env(
        "DUO_BENCH_GATEWAY",
        e2e_tests::binary("duo-gateway").unwrap(),
    );
    command
}

#[test]
fn the_training_load_answers_every_call_and_stops_each_gateway_cleanly() {
    let profiles = std::env::temp_dir().join(format!("duo-train-{}", std::process::id()));
    let out = bench()
        .args(["--train-profile", "--calls", "24"])
        .env("DUO_TRAIN_PROFILE_FILE", profiles.join("gw-%p.profraw"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let trained: Vec<&str> = stdout
        .lines()
        .filter(|l| l.ends_with(" 24 calls"))
        .collect();
    // The bench's five targets: both proxies, a prompt, the agent with and
    // without a signed token.
    assert_eq!(trained.len(), 5, "{stdout}");
    for name in [
        "vertex-ai proxy",
        "anthropic proxy",
        "explain_code",
        "/v2/chat/agent, signed token",
    ] {
        assert!(
            trained.iter().any(|l| l.contains(name)),
            "{name} missing:\n{stdout}"
        );
    }
    assert!(stdout.contains("each gateway exited cleanly"), "{stdout}");
}

#[test]
fn without_a_place_for_the_profile_the_training_does_not_start() {
    let out = bench()
        .args(["--train-profile", "--calls", "1"])
        .env_remove("DUO_TRAIN_PROFILE_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DUO_TRAIN_PROFILE_FILE"), "{stderr}");
}
