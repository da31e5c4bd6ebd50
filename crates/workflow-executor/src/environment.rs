//! The environment of every command the executor runs. It starts empty: the
//! executor's own variables hold its tokens (`DUO_GITLAB_TOKEN`, anything a
//! wrapper script exported), and a command must see none of them. Only the
//! variables below are passed, and git's confinement is added for every
//! command, so a git started by a build tool is confined too.

use crate::git;
use crate::workspace::Workspace;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Variables passed on from the executor's environment when set (`PATH` is
/// passed too, cleaned: see [`clean_path`]).
pub const PASSED: &[&str] = &[
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
    "USER",
    "LOGNAME",
];

/// Passed to `git fetch`, `pull` and `push` only: the ssh agent, for ssh
/// remotes.
pub const PASSED_TO_NETWORK_GIT: &[&str] = &["SSH_AUTH_SOCK"];

/// `PATH` when the executor has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Transports git may use: no `ext::` (runs a command), no `fd::`, no
/// remote helpers of other names.
pub const ALLOWED_PROTOCOLS: &str = "http:https:ssh:git:file";

/// `PATH` without empty or relative entries (they would find programs in the
/// workspace, which the agent writes) and without entries inside the
/// workspace.
pub fn clean_path(path: Option<OsString>, workspace: &Workspace) -> OsString {
    let Some(path) = path else {
        return OsString::from(DEFAULT_PATH);
    };
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|entry| entry.is_absolute())
        .filter(|entry| {
            let real = entry.canonicalize().unwrap_or_else(|_| entry.clone());
            !real.starts_with(workspace.root())
        })
        .collect();
    std::env::join_paths(kept).unwrap_or_else(|_| OsString::from(DEFAULT_PATH))
}

/// Where git stops looking for a repository: the workspace's parent, so a
/// repository around the workspace is never used.
fn ceiling(root: &Path) -> Option<OsString> {
    root.parent().map(|p| p.as_os_str().to_owned())
}

/// The variables of a command: the passed ones (from `source`, the
/// executor's environment) and git's confinement. `network_git` adds
/// [`PASSED_TO_NETWORK_GIT`].
pub fn for_command(
    workspace: &Workspace,
    network_git: bool,
    source: impl Fn(&str) -> Option<OsString>,
) -> Vec<(OsString, OsString)> {
    let mut vars: Vec<(OsString, OsString)> = Vec::new();
    let mut set = |name: &str, value: OsString| vars.push((OsString::from(name), value));
    set("PATH", clean_path(source("PATH"), workspace));
    for name in PASSED {
        if let Some(value) = source(name) {
            set(name, value);
        }
    }
    if network_git {
        for name in PASSED_TO_NETWORK_GIT {
            if let Some(value) = source(name) {
                set(name, value);
            }
        }
    }
    let fixed: &[(&str, &str)] = &[
        // No system or user configuration: only the repository's, checked
        // before git runs, and the overrides below.
        ("GIT_CONFIG_NOSYSTEM", "1"),
        ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ("GIT_ATTR_NOSYSTEM", "1"),
        // Nothing interactive and nothing to page or edit with.
        ("GIT_TERMINAL_PROMPT", "0"),
        ("GIT_ASKPASS", ""),
        ("GIT_PAGER", "cat"),
        ("PAGER", "cat"),
        ("GIT_EDITOR", ":"),
        ("GIT_SEQUENCE_EDITOR", ":"),
        ("GIT_SSH_COMMAND", "ssh"),
        ("GIT_ALLOW_PROTOCOL", ALLOWED_PROTOCOLS),
    ];
    for (name, value) in fixed {
        set(name, OsString::from(value));
    }
    if let Some(ceiling) = ceiling(workspace.root()) {
        set("GIT_CEILING_DIRECTORIES", ceiling);
    }
    set(
        "GIT_CONFIG_COUNT",
        OsString::from(git::OVERRIDES.len().to_string()),
    );
    for (index, (key, value)) in git::OVERRIDES.iter().enumerate() {
        set(&format!("GIT_CONFIG_KEY_{index}"), OsString::from(key));
        set(&format!("GIT_CONFIG_VALUE_{index}"), OsString::from(value));
    }
    vars
}

/// [`for_command`] over the executor's own environment.
pub fn from_process(workspace: &Workspace, network_git: bool) -> Vec<(OsString, OsString)> {
    for_command(workspace, network_git, |name| std::env::var_os(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_variables_pass_and_path_is_cleaned() {
        let root = std::env::temp_dir().join(format!("env-rules-{}", std::process::id()));
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let workspace = Workspace::new(&root).unwrap();
        let inside = workspace.root().join("bin");
        let path = format!("/usr/bin::.:bin:{}:/bin", inside.display());
        let source = |name: &str| -> Option<OsString> {
            match name {
                "PATH" => Some(path.clone().into()),
                "HOME" => Some("/home/u".into()),
                "DUO_GITLAB_TOKEN" | "GITLAB_TOKEN" => Some("secret".into()),
                "SSH_AUTH_SOCK" => Some("/tmp/agent".into()),
                _ => None,
            }
        };
        let vars = for_command(&workspace, false, source);
        let get = |name: &str| {
            vars.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("PATH").as_deref(), Some("/usr/bin:/bin"));
        assert_eq!(get("HOME").as_deref(), Some("/home/u"));
        assert_eq!(get("DUO_GITLAB_TOKEN"), None);
        assert_eq!(get("GITLAB_TOKEN"), None);
        assert_eq!(get("SSH_AUTH_SOCK"), None);
        assert_eq!(get("GIT_CONFIG_GLOBAL").as_deref(), Some("/dev/null"));
        assert_eq!(get("GIT_CONFIG_KEY_1").as_deref(), Some("core.hooksPath"));
        let network = for_command(&workspace, true, source);
        assert!(network.iter().any(|(n, _)| n == "SSH_AUTH_SOCK"));
        let _ = std::fs::remove_dir_all(&root);
    }
}
