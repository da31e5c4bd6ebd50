//! A process that only copies bytes between a client and one upstream
//! address: the floor under any proxy's added latency on this machine.
//!
//! The gateway bench runs it as a child process (its own binary started
//! with `--tcp-relay`) and measures it like the gateway: what it adds over
//! going to the provider directly is the price of one more process on the
//! path — two more loopback hops and two more wake-ups per exchange — with no
//! HTTP parsing, no routing and no logic at all. What the gateway adds beyond
//! that is its own.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};

/// The argument that makes the bench binary a relay: `--tcp-relay
/// <listen port> <upstream host:port>`.
pub const RELAY_ARG: &str = "--tcp-relay";

/// Relays every connection accepted on `listener` to `upstream`, one
/// upstream connection per client connection (a keep-alive client therefore
/// reuses both), until the process is killed. One thread, like each of the
/// gateway's workers: no hand-off between threads on the way.
pub fn serve(port: u16, upstream: SocketAddr) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        loop {
            let (client, _) = listener.accept().await?;
            tokio::spawn(async move {
                if let Ok(server) = TcpStream::connect(upstream).await {
                    relay(client, server).await;
                }
            });
        }
    })
}

async fn relay(mut client: TcpStream, mut server: TcpStream) {
    // As the gateway does: small streamed writes must not wait for ACKs.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
