//! Keeping the executor's secrets from the commands it runs. Commands get a
//! cleared environment ([`crate::environment`]), but a command runs as the
//! same user and can still read its parent's `/proc/<ppid>/cmdline` and,
//! for root or when the parent is dumpable, `/proc/<ppid>/environ`. Both show
//! what the process was started with. So at start the executor:
//!
//! 1. marks itself not dumpable (closing `environ`, `mem` and ptrace to the
//!    user's other processes when it does not run as root);
//! 2. restarts itself once (replacing its process image, same pid) with a
//!    command line without `--token`/`--service-token` and an environment
//!    of [`KEPT_FOR_EXECUTOR`] and the variables commands get: the tokens,
//!    from options or from `DUO_GITLAB_TOKEN`/`DUO_SERVICE_TOKEN`, travel
//!    through a pipe that the new image reads to its end (the pipe's read
//!    end, then empty, stays open in it).

use std::ffi::OsString;
use std::io::Read;

/// Options whose value is a secret, with the variable that may carry it
/// instead.
pub const SECRET_OPTIONS: &[(&str, &str)] = &[
    ("--token", "DUO_GITLAB_TOKEN"),
    ("--service-token", "DUO_SERVICE_TOKEN"),
    // May carry a self-hosted model's key (the model header).
    ("--service-headers", "DUO_SERVICE_HEADERS"),
];

/// Set in the restarted image: the descriptor of the pipe holding the
/// secrets (a number, not a secret).
pub const HANDOVER_VARIABLE: &str = "DUO_EXECUTOR_HANDOVER_FD";

/// Variables the restarted executor keeps for itself (its own settings,
/// TLS roots, proxies, the loader's path), besides those commands get
/// ([`crate::environment::PASSED`], `PATH`, `SSH_AUTH_SOCK`). None of these
/// reaches a command.
pub const KEPT_FOR_EXECUTOR: &[&str] = &[
    "DUO_GITLAB_URL",
    "DUO_EXECUTOR_LOG",
    "RUST_BACKTRACE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "LD_LIBRARY_PATH",
];

/// More than this does not fit a pipe's buffer without a reader.
const MAX_HANDOVER_BYTES: usize = 60 * 1024;

/// The secrets handed over to the restarted image, by variable name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets(Vec<(String, String)>);

impl Secrets {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in &self.0 {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            out.extend_from_slice(value.as_bytes());
            out.push(0);
        }
        out
    }

    fn decode(bytes: &[u8]) -> Self {
        let parts: Vec<String> = bytes
            .split(|b| *b == 0)
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        Self(
            parts
                .chunks_exact(2)
                .map(|pair| (pair[0].clone(), pair[1].clone()))
                .collect(),
        )
    }
}

/// Closes `/proc/self/environ`, `/proc/self/mem` and ptrace to the user's
/// other processes (not to root's), the commands the executor runs included.
pub fn forbid_inspection() -> std::io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(std::io::Error::from)
}

/// The arguments without secret options, and the secrets they held (by the
/// variable that may carry them). Walks the arguments as
/// [`crate::cli::Options::parse`] does.
pub fn split_secrets(args: &[String]) -> (Vec<String>, Vec<(&'static str, String)>) {
    let mut kept = Vec::with_capacity(args.len());
    let mut secrets = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if crate::cli::SWITCHES.contains(&arg.as_str()) {
            kept.push(arg.clone());
            continue;
        }
        let value = iter.next();
        match (SECRET_OPTIONS.iter().find(|(flag, _)| flag == arg), value) {
            (Some((_, variable)), Some(value)) => secrets.push((*variable, value.clone())),
            (_, value) => {
                kept.push(arg.clone());
                kept.extend(value.cloned());
            }
        }
    }
    (kept, secrets)
}

/// In the restarted image, the secrets handed over; `None` in the original.
pub fn received() -> std::io::Result<Option<Secrets>> {
    let Some(fd) = std::env::var_os(HANDOVER_VARIABLE) else {
        return Ok(None);
    };
    let fd: u32 = fd
        .to_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("{HANDOVER_VARIABLE} is not a number")))?;
    // Opening the descriptor through /proc gives a file of our own to read.
    let pipe = std::fs::File::open(format!("/proc/self/fd/{fd}"))?;
    let mut bytes = Vec::new();
    pipe.take(MAX_HANDOVER_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(Some(Secrets::decode(&bytes)))
}

/// Whether a variable stays in the restarted executor's environment.
fn kept(name: &str) -> bool {
    name == "PATH"
        || KEPT_FOR_EXECUTOR.contains(&name)
        || crate::environment::PASSED.contains(&name)
        || crate::environment::PASSED_TO_NETWORK_GIT.contains(&name)
}

/// Replaces this process with the executor restarted as described in the
/// module's documentation. Returns only when that fails.
pub fn restart(args: &[String]) -> std::io::Error {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let (kept_args, from_options) = split_secrets(args);
    // Options win over variables, as when parsing.
    let mut secrets = Secrets::default();
    for (_, variable) in SECRET_OPTIONS {
        if let Ok(value) = std::env::var(variable) {
            secrets.0.push(((*variable).to_owned(), value));
        }
    }
    for (variable, value) in from_options {
        secrets.0.push((variable.to_owned(), value));
    }
    let payload = secrets.encode();
    if payload.len() > MAX_HANDOVER_BYTES {
        return std::io::Error::other("the tokens are too long to hand over");
    }
    let (reader, mut writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(e) => return e,
    };
    if let Err(e) = writer.write_all(&payload) {
        return e;
    }
    drop(writer);
    // The read end must survive the exec (std opens it close-on-exec).
    if let Err(e) = rustix::io::fcntl_setfd(&reader, rustix::io::FdFlags::empty()) {
        return e.into();
    }
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(e) => return e,
    };
    let name = std::env::args_os()
        .next()
        .unwrap_or_else(|| OsString::from("duo-workflow-executor"));
    let environment: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(name, _)| name.to_str().is_some_and(kept))
        .collect();
    std::process::Command::new(program)
        .arg0(name)
        .args(kept_args)
        .env_clear()
        .envs(environment)
        .env(HANDOVER_VARIABLE, reader.as_raw_fd().to_string())
        .exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &[&str]) -> Vec<String> {
        text.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn secrets_move_off_the_command_line() {
        let (kept, secrets) = split_secrets(&args(&[
            "--gitlab-url",
            "http://x",
            "--token",
            "glpat-1",
            "--quiet",
            "--service-token",
            "svc-2",
            "--goal",
            "--token",
        ]));
        assert_eq!(
            kept,
            args(&["--gitlab-url", "http://x", "--quiet", "--goal", "--token"])
        );
        assert_eq!(
            secrets,
            [
                ("DUO_GITLAB_TOKEN", "glpat-1".to_owned()),
                ("DUO_SERVICE_TOKEN", "svc-2".to_owned())
            ]
        );
        assert!(split_secrets(&args(&["--workflow-id", "7"])).1.is_empty());
    }

    #[test]
    fn secrets_survive_the_handover_format_and_the_last_wins() {
        let secrets = Secrets(vec![
            ("DUO_GITLAB_TOKEN".into(), "from-env".into()),
            ("DUO_GITLAB_TOKEN".into(), "from-option".into()),
            ("DUO_SERVICE_TOKEN".into(), String::new()),
        ]);
        let decoded = Secrets::decode(&secrets.encode());
        assert_eq!(decoded.get("DUO_GITLAB_TOKEN"), Some("from-option"));
        assert_eq!(decoded.get("DUO_SERVICE_TOKEN"), Some(""));
        assert_eq!(decoded.get("OTHER"), None);
    }
}
