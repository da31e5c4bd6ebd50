//! The release build (`scripts/build-release.sh`, its flags from
//! `scripts/release-rustflags.sh`): the gateway's recorded profile
//! (`pgo/duo-gateway.profdata.gz`, docs/performance.md) is unpacked and
//! named; the gateway is built on its own, as the profile was recorded on
//! it; and every place that builds release binaries goes through it: a
//! build without the flags would compile every crate again (cargo keys its
//! compiled crates on the flags) and lose the profile's speed-up.

use std::path::Path;
use std::process::Command;

/// An indexed LLVM profile starts with this magic number (little-endian).
const INDEXED_PROFILE_MAGIC: [u8; 8] = [0xff, b'l', b'p', b'r', b'o', b'f', b'i', 0x81];

fn release_flags(target_dir: &Path, envs: &[(&str, &str)]) -> String {
    let root = e2e_tests::repo_root();
    let mut command = Command::new(root.join("scripts/release-rustflags.sh"));
    command
        .env("CARGO_TARGET_DIR", target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("DUO_PGO");
    for (name, value) in envs {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn the_release_flags_name_the_recorded_profile_unpacked_under_the_target_directory() {
    let target = std::env::temp_dir().join(format!("duo-release-flags-{}", std::process::id()));
    let flags = release_flags(&target, &[]);
    let path = flags
        .strip_prefix("-Cprofile-use=")
        .unwrap_or_else(|| panic!("no profile in {flags:?}"));
    let path = Path::new(path);
    assert!(path.starts_with(target.join("pgo")), "{flags}");
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    // Named after the packed profile's content, so a new one changes the flags.
    let digest = name
        .strip_prefix("duo-gateway-")
        .and_then(|rest| rest.strip_suffix(".profdata"))
        .unwrap();
    assert!(
        digest.len() == 16 && digest.chars().all(|c| c.is_ascii_hexdigit()),
        "{name}"
    );
    let profile = std::fs::read(path).unwrap();
    assert_eq!(
        profile[..8],
        INDEXED_PROFILE_MAGIC,
        "not an indexed LLVM profile"
    );
    // Asked again: the same flags, the file not unpacked anew.
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    assert_eq!(release_flags(&target, &[]), flags);
    assert_eq!(
        std::fs::metadata(path).unwrap().modified().unwrap(),
        modified
    );
    // The caller's own flags are kept; `DUO_PGO=off` leaves the profile out.
    let with_own = release_flags(&target, &[("RUSTFLAGS", "-Cdebuginfo=1")]);
    assert_eq!(with_own, format!("-Cdebuginfo=1 {flags}"));
    assert_eq!(
        release_flags(
            &target,
            &[("RUSTFLAGS", "-Cdebuginfo=1"), ("DUO_PGO", "off")]
        ),
        "-Cdebuginfo=1"
    );
    let _ = std::fs::remove_dir_all(&target);
}

/// Each shell command (continuation lines joined, comments dropped) that
/// runs a release build.
fn release_builds(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter(|line| {
            line.contains("scripts/build-release.sh")
                || ((line.contains("cargo build") || line.contains("cargo run"))
                    && line.contains("--release"))
        })
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn every_release_build_of_the_project_goes_through_the_release_build() {
    let root = e2e_tests::repo_root();
    let mut through_script = 0;
    for file in [
        "dev",
        "scripts/run-all.sh",
        "scripts/fetch-models.sh",
        "deploy/container/Containerfile",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for build in release_builds(&text) {
            if build.contains("scripts/build-release.sh") {
                through_script += 1;
                continue;
            }
            // Otherwise: the release flags, and never the gateway beside
            // other packages.
            assert!(
                build.contains(r#"RUSTFLAGS="$(scripts/release-rustflags.sh)""#),
                "{file}: a release build without the release flags: {build}"
            );
            assert!(
                !build.contains("gateway"),
                "{file}: the gateway built outside scripts/build-release.sh: {build}"
            );
        }
    }
    // dev (bench, eval twice), run-all and the image.
    assert!(
        through_script >= 5,
        "only {through_script} builds through the script"
    );
}

/// Runs `scripts/build-release.sh args` with a `cargo` that records each
/// call (its arguments and `RUSTFLAGS`) instead of building.
fn recorded_cargo_calls(args: &[&str]) -> Vec<(String, String)> {
    let root = e2e_tests::repo_root();
    let dir = std::env::temp_dir().join(format!(
        "duo-build-release-{}-{}",
        std::process::id(),
        args.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("calls");
    let _ = std::fs::remove_file(&log);
    let fake = dir.join("cargo");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nprintf '%s|%s\\n' \"$*\" \"$RUSTFLAGS\" >> {}\n",
            log.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(root.join("scripts/build-release.sh"))
        .args(args)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .env_remove("DUO_PGO")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    let calls = calls
        .lines()
        .map(|line| {
            let (args, flags) = line.split_once('|').unwrap();
            (args.to_owned(), flags.to_owned())
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    calls
}

#[test]
fn the_release_build_builds_the_gateway_on_its_own_then_the_rest_with_the_same_flags() {
    let calls = recorded_cargo_calls(&[
        "-p",
        "gateway",
        "-p",
        "monolith",
        "-p",
        "bench",
        "--bin",
        "duo-gateway",
        "--bin",
        "duo-monolith",
        "--bin",
        "duo-bench",
    ]);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        calls[0].0,
        "build --release --locked -p gateway --bin duo-gateway"
    );
    assert_eq!(
        calls[1].0,
        "build --release --locked -p monolith -p bench --bin duo-monolith --bin duo-bench"
    );
    for (_, flags) in &calls {
        assert!(
            flags.starts_with("-Cprofile-use=") && flags.ends_with(".profdata"),
            "{flags}"
        );
    }
    // `--bin duo-gateway` alone (as ./dev run names it) is the gateway too;
    // a build without it is one call.
    let calls = recorded_cargo_calls(&["--bin", "duo-gateway", "--bin", "duo-local-llm"]);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[1].0, "build --release --locked --bin duo-local-llm");
    let calls = recorded_cargo_calls(&["-p", "job-queue", "--bin", "queue-bench"]);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].0,
        "build --release --locked -p job-queue --bin queue-bench"
    );
}
