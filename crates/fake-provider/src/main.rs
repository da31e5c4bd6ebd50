//! `fake-provider [--addr 127.0.0.1:5099] [--workers 2] [--text "answer"] [--no-record]`
//!
//! Runs the fake model provider until interrupted, printing its address.

use anyhow::Context;
use fake_provider::{FakeProvider, FakeProviderOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();

    let mut options = FakeProviderOptions {
        workers: 2,
        ..FakeProviderOptions::default()
    };
    let mut text = None;
    let mut record = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => {
                let value = args.next().context("--addr needs a value")?;
                options.addr = value
                    .parse()
                    .with_context(|| format!("--addr: not an address: {value}"))?;
            }
            "--workers" => {
                let value = args.next().context("--workers needs a value")?;
                options.workers = value
                    .parse()
                    .with_context(|| format!("--workers: not a number: {value}"))?;
            }
            "--text" => text = Some(args.next().context("--text needs a value")?),
            "--no-record" => record = false,
            "-h" | "--help" => {
                eprintln!(
                    "usage: fake-provider [--addr HOST:PORT] [--workers N] [--text ANSWER] [--no-record]"
                );
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?} (try --help)"),
        }
    }

    let provider = FakeProvider::start_with(options)
        .await
        .context("starting the fake provider")?;
    if let Some(text) = text {
        provider.set_default_text(text);
    }
    // Recording is unbounded work for a long-running process; the binary
    // serves benchmarks and manual runs, so it can be switched off.
    provider.set_recording(record);
    eprintln!("fake-provider listening on {}", provider.url());
    tokio::signal::ctrl_c()
        .await
        .context("waiting for interrupt")?;
    provider.stop().await;
    Ok(())
}
