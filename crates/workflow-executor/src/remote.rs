//! What a run started in the product needs around its session, when a runner
//! starts the executor in a sandbox:
//!
//! - **relays**: the sandbox has no network but its loopback; the runner
//!   hands in unix sockets that lead to the monolith and to the workflow
//!   service, and the executor listens on loopback ports that lead to them,
//!   so its own HTTP, gRPC and git traffic (and nothing a command opens to
//!   another host) gets out;
//! - **the workspace**: a clone of the project at the source ref, through
//!   the monolith's git HTTP with the run's token, continued from the run's
//!   hidden checkpoint ref when an earlier leg stored one;
//! - **code checkpoints**: at the end of each leg (finished, paused or
//!   failed) the workspace is committed and pushed to the run's hidden ref
//!   (`refs/workloads/<workflow id>`), which the monolith reads to open the
//!   merge request, and the next leg continues from.
//!
//! The token travels to git in its environment (an `http.extraHeader`
//! through `GIT_CONFIG_*`), never in `.git/config` or a URL, and git runs
//! under the same confinement as the agent's git commands (no hooks, no
//! system or global configuration).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;

use crate::environment;
use crate::workspace::Workspace;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("relay to {socket}: {source}")]
    Relay {
        socket: String,
        source: std::io::Error,
    },
    #[error("git {step} failed: {detail}")]
    Git { step: &'static str, detail: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("workspace: {0}")]
    Workspace(#[from] crate::workspace::PathError),
}

/// A loopback port inside the sandbox that leads to a unix socket outside.
#[derive(Debug)]
pub struct Relay {
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on `127.0.0.1:0`; every connection is piped to `socket`.
    pub async fn start(socket: &Path) -> Result<Self, RemoteError> {
        let error = |source| RemoteError::Relay {
            socket: socket.display().to_string(),
            source,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(error)?;
        let address = listener.local_addr().map_err(error)?;
        let socket = socket.to_path_buf();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let socket = socket.clone();
                tokio::spawn(async move {
                    match tokio::net::UnixStream::connect(&socket).await {
                        Ok(mut outbound) => {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                        Err(e) => tracing::warn!(error = %e, "relay: the runner's socket refused"),
                    }
                });
            }
        });
        Ok(Self { address, task })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The project a run works on and where its code is checkpointed.
#[derive(Clone)]
pub struct RunRepository {
    /// The monolith's base URL (a relay's inside the sandbox).
    pub gitlab_url: String,
    /// `group/project`.
    pub project_path: String,
    /// The run's `ai_workflows` token.
    pub token: String,
    /// The branch the run starts from.
    pub source_ref: String,
    /// `refs/workloads/<workflow id>`.
    pub checkpoint_ref: String,
    /// Who commits the checkpoints (the Duo service account).
    pub author_name: String,
    pub author_email: String,
}

impl std::fmt::Debug for RunRepository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRepository")
            .field("gitlab_url", &self.gitlab_url)
            .field("project_path", &self.project_path)
            .field("source_ref", &self.source_ref)
            .field("checkpoint_ref", &self.checkpoint_ref)
            .finish_non_exhaustive()
    }
}

impl RunRepository {
    fn remote_url(&self) -> String {
        format!(
            "{}/{}.git",
            self.gitlab_url.trim_end_matches('/'),
            self.project_path.trim_matches('/')
        )
    }

    /// The confined git environment, with the token as a request header.
    fn git_env(&self, workspace: &Workspace) -> Vec<(OsString, OsString)> {
        let mut vars = environment::from_process(workspace, true);
        let count_at = vars.iter().position(|(k, _)| k == "GIT_CONFIG_COUNT");
        let mut count: usize = count_at
            .and_then(|i| vars[i].1.to_str().and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        let credentials = base64_encode(format!("oauth2:{}", self.token).as_bytes());
        let extra = [
            (
                "http.extraHeader".to_owned(),
                format!("Authorization: Basic {credentials}"),
            ),
            ("user.name".to_owned(), self.author_name.clone()),
            ("user.email".to_owned(), self.author_email.clone()),
            ("commit.gpgSign".to_owned(), "false".to_owned()),
        ];
        for (key, value) in extra {
            vars.push((
                OsString::from(format!("GIT_CONFIG_KEY_{count}")),
                OsString::from(key),
            ));
            vars.push((
                OsString::from(format!("GIT_CONFIG_VALUE_{count}")),
                OsString::from(value),
            ));
            count += 1;
        }
        match count_at {
            Some(i) => vars[i].1 = OsString::from(count.to_string()),
            None => vars.push((
                OsString::from("GIT_CONFIG_COUNT"),
                OsString::from(count.to_string()),
            )),
        }
        vars
    }

    async fn git(
        &self,
        workspace: &Workspace,
        dir: &Path,
        step: &'static str,
        args: &[&str],
    ) -> Result<String, RemoteError> {
        let output = tokio::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env_clear()
            .envs(self.git_env(workspace))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned());
        }
        let detail = String::from_utf8_lossy(&output.stderr);
        Err(RemoteError::Git {
            step,
            detail: redact(detail.trim(), &self.token),
        })
    }

    /// Clones the source ref into `dir` (which must be empty) and, when an
    /// earlier leg checkpointed the run, continues from its hidden ref.
    /// Returns whether a checkpoint was found.
    pub async fn prepare(&self, dir: &Path) -> Result<bool, RemoteError> {
        std::fs::create_dir_all(dir)?;
        let workspace = Workspace::new(dir)?;
        let root = workspace.root().to_path_buf();
        let remote = self.remote_url();
        self.git(
            &workspace,
            &root,
            "clone",
            &[
                "clone",
                "--quiet",
                "--no-tags",
                "--single-branch",
                "--branch",
                &self.source_ref,
                &remote,
                ".",
            ],
        )
        .await?;
        let fetched = self
            .git(
                &workspace,
                &root,
                "fetch of the checkpoint",
                &[
                    "fetch",
                    "--quiet",
                    "origin",
                    &format!(
                        "+{}:refs/remotes/origin/duo-checkpoint",
                        self.checkpoint_ref
                    ),
                ],
            )
            .await
            .is_ok();
        if fetched {
            self.git(
                &workspace,
                &root,
                "checkout of the checkpoint",
                &[
                    "checkout",
                    "--quiet",
                    "-B",
                    "duo-workflow",
                    "origin/duo-checkpoint",
                ],
            )
            .await?;
        } else {
            self.git(
                &workspace,
                &root,
                "checkout",
                &["checkout", "--quiet", "-B", "duo-workflow"],
            )
            .await?;
        }
        Ok(fetched)
    }

    /// Commits whatever the workspace holds and pushes it to the hidden
    /// ref; returns the commit pushed.
    pub async fn checkpoint(&self, dir: &Path, message: &str) -> Result<String, RemoteError> {
        let workspace = Workspace::new(dir)?;
        let root = workspace.root().to_path_buf();
        self.git(&workspace, &root, "add", &["add", "--all"])
            .await?;
        let changed = self
            .git(
                &workspace,
                &root,
                "status",
                &["status", "--porcelain", "--untracked-files=no"],
            )
            .await?;
        if !changed.is_empty() {
            self.git(
                &workspace,
                &root,
                "commit",
                &["commit", "--quiet", "--no-verify", "-m", message],
            )
            .await?;
        }
        let head = self
            .git(&workspace, &root, "rev-parse", &["rev-parse", "HEAD"])
            .await?;
        self.git(
            &workspace,
            &root,
            "push of the checkpoint",
            &[
                "push",
                "--quiet",
                "--no-verify",
                "origin",
                &format!("+HEAD:{}", self.checkpoint_ref),
            ],
        )
        .await?;
        Ok(head)
    }
}

fn redact(text: &str, token: &str) -> String {
    if token.is_empty() {
        return text.to_owned();
    }
    text.replace(token, "[token]")
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_standard_base64() {
        assert_eq!(base64_encode(b"oauth2:abc"), "b2F1dGgyOmFiYw==");
        assert_eq!(base64_encode(b"ab"), "YWI=");
        assert_eq!(base64_encode(b"abc"), "YWJj");
    }

    #[tokio::test]
    async fn a_relay_pipes_loopback_connections_to_the_socket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = std::env::temp_dir().join(format!("relay-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("echo.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buffer = [0u8; 5];
            stream.read_exact(&mut buffer).await.unwrap();
            stream.write_all(&buffer).await.unwrap();
        });
        let relay = Relay::start(&path).await.unwrap();
        let mut client = tokio::net::TcpStream::connect(relay.address).await.unwrap();
        client.write_all(b"hello").await.unwrap();
        let mut back = [0u8; 5];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"hello");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
