//! The release build's flags (`scripts/release-rustflags.sh`): the gateway's
//! recorded profile (`pgo/duo-gateway.profdata.gz`, docs/performance.md) is
//! unpacked and named, and every place that builds release binaries passes
//! those flags: a build without them would compile every crate again (cargo
//! keys its compiled crates on the flags) and lose the profile's speed-up.

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

/// Each shell command (continuation lines joined) that runs a release build.
fn release_builds(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter(|line| {
            (line.contains("cargo build") || line.contains("cargo run"))
                && line.contains("--release")
        })
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn every_release_build_of_the_project_takes_the_release_flags() {
    let root = e2e_tests::repo_root();
    let mut seen = 0;
    for file in [
        "dev",
        "scripts/run-all.sh",
        "scripts/fetch-models.sh",
        "deploy/container/Containerfile",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for build in release_builds(&text) {
            seen += 1;
            assert!(
                build.contains(r#"RUSTFLAGS="$(scripts/release-rustflags.sh)""#),
                "{file}: a release build without the release flags: {build}"
            );
        }
    }
    // dev (bench, eval twice), run-all, fetch-models and the image at least.
    assert!(seen >= 6, "only {seen} release builds found");
}
