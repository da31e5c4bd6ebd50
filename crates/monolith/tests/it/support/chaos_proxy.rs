//! A TCP proxy between the monolith and PostgreSQL that can break on purpose:
//! it forwards bytes both ways until the client sends a chosen byte pattern
//! (a piece of SQL), then drops every open connection at once, as a database
//! restart would. New connections are served normally afterwards.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

pub struct ChaosProxy {
    pub port: u16,
    trigger: Arc<Mutex<Option<Vec<u8>>>>,
    /// Bumped on every cut; each connection ends when it changes.
    generation: watch::Sender<u64>,
    cut_done: Arc<Notify>,
}

impl ChaosProxy {
    pub async fn start(upstream_port: u16) -> ChaosProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let trigger: Arc<Mutex<Option<Vec<u8>>>> = Arc::new(Mutex::new(None));
        let (generation, _) = watch::channel(0u64);
        let cut_done = Arc::new(Notify::new());
        let proxy = ChaosProxy {
            port,
            trigger: trigger.clone(),
            generation: generation.clone(),
            cut_done: cut_done.clone(),
        };
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::spawn(pipe(
                    client,
                    server,
                    trigger.clone(),
                    generation.clone(),
                    cut_done.clone(),
                ));
            }
        });
        proxy
    }

    /// Drops every connection when a client next sends `pattern`; the bytes
    /// holding it never reach the server.
    pub fn cut_when_sent(&self, pattern: &[u8]) {
        *self.trigger.lock().unwrap() = Some(pattern.to_vec());
    }

    /// Waits until a cut armed by [`ChaosProxy::cut_when_sent`] happened.
    pub async fn wait_cut(&self) {
        self.cut_done.notified().await;
    }
}

async fn pipe(
    mut client: TcpStream,
    mut server: TcpStream,
    trigger: Arc<Mutex<Option<Vec<u8>>>>,
    generation: watch::Sender<u64>,
    cut_done: Arc<Notify>,
) {
    let mut cut = generation.subscribe();
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    // The end of the previous client read, so a pattern split across two
    // reads is still seen.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        tokio::select! {
            read = client_read.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                let armed = trigger.lock().unwrap().clone();
                if let Some(pattern) = armed {
                    let mut window = std::mem::take(&mut tail);
                    window.extend_from_slice(&up[..n]);
                    if window.windows(pattern.len()).any(|w| w == pattern.as_slice()) {
                        *trigger.lock().unwrap() = None;
                        generation.send_modify(|g| *g += 1);
                        cut_done.notify_one();
                        return;
                    }
                    let keep = pattern.len().saturating_sub(1).min(window.len());
                    tail = window[window.len() - keep..].to_vec();
                }
                if server_write.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            read = server_read.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                if client_write.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
            _ = cut.changed() => return,
        }
    }
}
