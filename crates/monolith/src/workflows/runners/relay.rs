//! The sandbox's two ways out: unix sockets in the leg's private directory
//! that the runner pipes to the monolith and to the workflow service. The
//! sandbox has no network of its own, so what a command run by the agent
//! opens anywhere else fails, and these two addresses are all it can reach.

use std::path::{Path, PathBuf};

use tokio::net::{TcpStream, UnixListener};
use tokio::task::JoinHandle;

/// A listening socket whose connections go to `target` (`host:port`).
#[derive(Debug)]
pub struct SocketRelay {
    pub path: PathBuf,
    task: JoinHandle<()>,
}

impl SocketRelay {
    pub fn start(path: &Path, target: String) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let target = target.clone();
                tokio::spawn(async move {
                    match TcpStream::connect(&target).await {
                        Ok(mut outbound) => {
                            let _ = outbound.set_nodelay(true);
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                        Err(e) => tracing::warn!(%target, error = %e, "run relay: target refused"),
                    }
                });
            }
        });
        Ok(Self {
            path: path.to_path_buf(),
            task,
        })
    }
}

impl Drop for SocketRelay {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `host:port` of a URL (the port its scheme implies when none is given).
pub fn address_of(url: &url::Url) -> Option<String> {
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    Some(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}
