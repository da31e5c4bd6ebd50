//! The local runner: each leg runs `duo-workflow-executor` in a bubblewrap
//! sandbox started by the worker (`docs/duo-workflow-runs.md` lists what is
//! confined and what is not):
//!
//! - **namespaces** (`--unshare-all`): its own user (an unprivileged uid, no
//!   capabilities), process, network, IPC, UTS and cgroup namespaces; it sees
//!   none of the host's processes, and its network is a loopback only;
//! - **files**: `/usr` read-only (programs and libraries), a fresh `/proc`,
//!   `/dev` and `/tmp`, the executor binary, and a workspace on a tmpfs of a
//!   bounded size; nothing of the host's home, the repositories, other runs
//!   or the monolith's configuration is mounted;
//! - **ways out**: two unix sockets relayed to the monolith and the workflow
//!   service ([`super::relay`]);
//! - **limits**: address space, CPU time and file size per process
//!   (`prlimit`), the workspace's size (tmpfs), the leg's wall-clock time
//!   (killed after it); the number of processes is not limited here (the
//!   process limit counts the worker's own user everywhere), which the
//!   Kubernetes runner's pod limits cover;
//! - **secrets**: an environment with the run's tokens only, which the
//!   executor moves off at start; commands it runs get none of it;
//! - **lifetime**: `--die-with-parent` and the process namespace: when the
//!   leg ends, is cancelled or the worker dies, every process of the sandbox
//!   goes, and the leg's directory (sockets only) is removed.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;
use secrecy::ExposeSecret;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::relay::SocketRelay;
use super::{LegEnd, LegOutcome, LegSpec, Reach, Runner, RunnerError, end_of, tail};

/// Where the executor sits inside the sandbox.
const EXECUTOR_INSIDE: &str = "/opt/duo/duo-workflow-executor";
/// The sockets' directory inside the sandbox.
const SOCKETS_INSIDE: &str = "/run/duo";
/// The workspace inside the sandbox.
const WORKSPACE_INSIDE: &str = "/workspace";
/// How much of the executor's output is kept for the workflow's log.
const LOG_TAIL_BYTES: usize = 16 * 1024;
/// The uid and gid the sandboxed processes have.
const SANDBOX_ID: &str = "1000";

/// How the local runner is set up.
#[derive(Debug, Clone)]
pub struct LocalRunnerConfig {
    /// `duo-workflow-executor` on the host.
    pub executor: PathBuf,
    /// `bwrap`.
    pub bwrap: PathBuf,
    /// `prlimit` (util-linux).
    pub prlimit: PathBuf,
    /// Where legs get their private directories.
    pub work_dir: PathBuf,
    /// The monolith, `host:port`.
    pub gitlab_address: String,
    /// The workflow service, `host:port`.
    pub service_address: String,
}

pub struct LocalRunner {
    config: LocalRunnerConfig,
}

impl LocalRunner {
    pub fn new(config: LocalRunnerConfig) -> Self {
        Self { config }
    }

    /// The sandbox's command line (without the executor's secrets, which
    /// travel in the environment).
    pub fn command_line(&self, spec: &LegSpec, sockets: &Path) -> Vec<String> {
        let limits = &spec.limits;
        let mut line = vec![
            self.config.prlimit.display().to_string(),
            format!("--as={}", limits.memory_bytes),
            format!("--cpu={}", limits.cpu_seconds),
            format!("--fsize={}", limits.disk_bytes),
            "--nofile=4096".to_owned(),
            "--".to_owned(),
            self.config.bwrap.display().to_string(),
            "--unshare-all".to_owned(),
            "--unshare-user".to_owned(),
            "--uid".to_owned(),
            SANDBOX_ID.to_owned(),
            "--gid".to_owned(),
            SANDBOX_ID.to_owned(),
            "--die-with-parent".to_owned(),
            "--new-session".to_owned(),
            "--hostname".to_owned(),
            "duo-run".to_owned(),
            "--ro-bind".to_owned(),
            "/usr".to_owned(),
            "/usr".to_owned(),
        ];
        for (link, target) in [
            ("/bin", "usr/bin"),
            ("/sbin", "usr/sbin"),
            ("/lib", "usr/lib"),
            ("/lib64", "usr/lib64"),
        ] {
            line.extend(["--symlink".to_owned(), target.to_owned(), link.to_owned()]);
        }
        // The public CA bundle: the executor's HTTP clients refuse to start
        // without one, even though the sandbox has no network to use it on.
        for dir in ["/etc/ssl", "/etc/ca-certificates"] {
            line.extend(["--ro-bind-try".to_owned(), dir.to_owned(), dir.to_owned()]);
        }
        line.extend(
            [
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--size",
            ]
            .map(str::to_owned),
        );
        line.push(limits.disk_bytes.to_string());
        line.extend(["--tmpfs".to_owned(), WORKSPACE_INSIDE.to_owned()]);
        line.extend([
            "--ro-bind".to_owned(),
            self.config.executor.display().to_string(),
            EXECUTOR_INSIDE.to_owned(),
            "--bind".to_owned(),
            sockets.display().to_string(),
            SOCKETS_INSIDE.to_owned(),
            "--chdir".to_owned(),
            WORKSPACE_INSIDE.to_owned(),
            "--".to_owned(),
            EXECUTOR_INSIDE.to_owned(),
        ]);
        let reach = Reach::Sockets {
            gitlab: format!("{SOCKETS_INSIDE}/gitlab.sock"),
            service: format!("{SOCKETS_INSIDE}/service.sock"),
        };
        line.extend(spec.executor_args(&reach, WORKSPACE_INSIDE));
        line
    }

    fn leg_dir(&self, spec: &LegSpec) -> PathBuf {
        self.config.work_dir.join(format!(
            "leg-{}-{}",
            spec.workload_id,
            uuid::Uuid::new_v4().simple()
        ))
    }
}

/// Removes a leg's directory however the leg ends.
struct LegDir(PathBuf);

impl Drop for LegDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
}

/// Lets the sandbox's uid use the sockets (the directory stays private to
/// the worker's user otherwise).
fn socket_dir_for_sandbox(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o711))
}

fn open_socket(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

#[async_trait]
impl Runner for LocalRunner {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn run_leg(
        &self,
        spec: &LegSpec,
        cancel: CancellationToken,
    ) -> Result<LegOutcome, RunnerError> {
        let start = |e: std::io::Error| RunnerError::Start(e.to_string());
        private_dir(&self.config.work_dir).map_err(start)?;
        let dir = LegDir(self.leg_dir(spec));
        private_dir(&dir.0).map_err(start)?;
        let sockets = dir.0.join("sockets");
        socket_dir_for_sandbox(&sockets).map_err(start)?;
        // The leg's directory is 0700 but the sandbox's uid must traverse it.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711))
                .map_err(start)?;
        }
        let gitlab = SocketRelay::start(
            &sockets.join("gitlab.sock"),
            self.config.gitlab_address.clone(),
        )
        .map_err(start)?;
        let service = SocketRelay::start(
            &sockets.join("service.sock"),
            self.config.service_address.clone(),
        )
        .map_err(start)?;
        open_socket(&gitlab.path).map_err(start)?;
        open_socket(&service.path).map_err(start)?;

        let line = self.command_line(spec, &sockets);
        let (program, args) = line
            .split_first()
            .ok_or_else(|| RunnerError::Start("empty command line".into()))?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", "/tmp")
            .env("LANG", "C.UTF-8")
            .env("DUO_GITLAB_TOKEN", spec.gitlab_token.expose_secret())
            .env("DUO_SERVICE_TOKEN", spec.service_token.expose_secret())
            .env("DUO_SERVICE_HEADERS", spec.service_headers.expose_secret())
            // The run joins the trace of the job that started it.
            .envs(duo_telemetry::current_traceparent().map(|tp| ("TRACEPARENT", tp)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| RunnerError::Start(format!("{}: {e}", program)))?;
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        // Both pipes at once: a full pipe must never stall the executor.
        let output = tokio::spawn(async move {
            let read = |pipe: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>| async move {
                let mut buffer = Vec::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_end(&mut buffer).await;
                }
                buffer
            };
            let (err, out) = tokio::join!(
                read(stderr.take().map(|p| Box::new(p) as _)),
                read(stdout.take().map(|p| Box::new(p) as _)),
            );
            let mut text = String::from_utf8_lossy(&err).into_owned();
            text.push_str(&String::from_utf8_lossy(&out));
            tail(&text, LOG_TAIL_BYTES)
        });
        let end = tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| RunnerError::Backend(e.to_string()))?;
                let log = output.await.unwrap_or_default();
                return Ok(LegOutcome { end: end_of(status.code(), &log), log_tail: log });
            }
            () = tokio::time::sleep(spec.limits.max_duration) => LegEnd::TimedOut,
            () = cancel.cancelled() => LegEnd::Cancelled,
        };
        // Killing bwrap kills the sandbox's init, and with it every process
        // of the leg (`--die-with-parent`, the process namespace).
        let _ = child.kill().await;
        let log = output.await.unwrap_or_default();
        drop(gitlab);
        drop(service);
        Ok(LegOutcome { end, log_tail: log })
    }
}
