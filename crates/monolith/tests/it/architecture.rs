//! The monolith's layering, checked: a module uses only modules ranked below it
//! (see the table in `src/lib.rs`), so there are no import cycles between
//! domains and the HTTP layer sits on top. Also: the gateway never reaches the
//! database.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Rank of each top-level module; a module may use only modules of a lower rank.
/// A new module must be added here, which is the point: its place is decided.
const RANKS: &[(&str, u32)] = &[
    ("gid", 0),
    ("lifecycle", 0),
    ("percent", 0),
    ("queries", 0),
    ("config", 1),
    ("db", 2),
    ("instance", 3),
    ("identity", 4),
    ("policy", 5),
    ("ai_models", 6),
    ("chat", 6),
    ("gateway_client", 6),
    ("namespaces", 6),
    ("repositories", 6),
    // Issues, merge requests, epics, notes and CI jobs: above the policy
    // they ask and the namespaces they live in, below the agent and the
    // edges that show them.
    ("work_items", 7),
    ("code_index", 7),
    ("agent", 8),
    // Turning a Duo switch brings the code index in line with it.
    ("duo_settings", 8),
    ("workflows", 8),
    ("app_state", 9),
    ("rest", 10),
    ("git_http", 10),
    ("worker", 10),
    ("probes", 10),
    ("web", 10),
    ("graphql", 11),
    ("server", 12),
    ("seed", 12),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/chat/live.rs` → `chat`).
fn owner(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    Some(first.trim_end_matches(".rs").to_owned())
}

/// Every `crate::<module>` a file's code mentions (comments skipped).
fn used_modules(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn modules_use_only_modules_below_them() {
    let ranks: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut problems = Vec::new();
    for file in &files {
        let Some(module) = owner(&src, file) else {
            continue;
        };
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(&own) = ranks.get(module.as_str()) else {
            problems.push(format!(
                "src/{module}: not in RANKS (give the new module its layer)"
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (line, used) in used_modules(&text) {
            if used == module {
                continue;
            }
            match ranks.get(used.as_str()) {
                Some(&theirs) if theirs < own => {}
                Some(&theirs) => problems.push(format!(
                    "{}:{line}: `{module}` (rank {own}) uses `{used}` (rank {theirs})",
                    file.strip_prefix(&src).unwrap().display()
                )),
                None => problems.push(format!(
                    "{}:{line}: uses unknown module `{used}`",
                    file.strip_prefix(&src).unwrap().display()
                )),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_module_in_lib_rs_has_a_rank() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let ranks: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    for line in lib.lines() {
        if let Some(name) = line.strip_prefix("pub mod ") {
            let name = name.trim_end_matches(';');
            assert!(ranks.contains_key(name), "{name} has no rank");
        }
    }
}

#[test]
fn the_gateway_never_depends_on_the_database() {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/Cargo.toml"),
    )
    .unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .unwrap_or("")
        .split("\n[")
        .next()
        .unwrap_or("");
    for forbidden in [
        "tokio-postgres",
        "deadpool-postgres",
        "job-queue",
        "devdb",
        "monolith",
    ] {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(forbidden)),
            "the gateway depends on {forbidden}"
        );
    }
}
