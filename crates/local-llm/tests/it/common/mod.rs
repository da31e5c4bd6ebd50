//! Shared test helpers: weights come from the project's fetch command, never skipped.

#![allow(dead_code, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use local_llm::config::{Config, default_models_dir};
use local_llm::server::{AppState, bind};

/// Runs `duo-local-llm fetch-models` once per test binary and returns the models dir.
pub fn models_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var("DUO_MODELS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| default_models_dir());
        let output = Command::new(env!("CARGO_BIN_EXE_duo-local-llm"))
            .arg("fetch-models")
            .env("DUO_MODELS_DIR", &dir)
            .output()
            .expect("run duo-local-llm fetch-models");
        assert!(
            output.status.success(),
            "fetch-models failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        dir
    })
    .clone()
}

pub fn test_config() -> Config {
    let mut config = Config::with_models_dir(models_dir());
    config.addr = "127.0.0.1:0".parse().expect("addr");
    config.max_body_bytes = 64 * 1024;
    config.queue_capacity = 4;
    // One thread: llama.cpp's threads spin waiting for each other, which on
    // a shared, busy machine is ten times slower than one thread alone.
    config.threads = 1;
    config
}

/// Starts a real server on a free loopback port; returns its base URL.
pub async fn start_server(config: Config) -> String {
    start_app(AppState::load(config).expect("models load")).await
}

/// Serves any app state (real models or test doubles) on a free loopback port.
pub async fn start_app(state: AppState) -> String {
    let addr = state.config.addr;
    let (server, bound) = bind(state, addr).expect("bind");
    actix_web::rt::spawn(server);
    let base = format!("http://{bound}");
    let client = reqwest::Client::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok(resp) = client.get(format!("{base}/health")).send().await
            && resp.status().is_success()
        {
            return base;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "server did not become ready"
        );
        tokio::task::yield_now().await;
    }
}

/// `GET url`, its body as JSON.
pub async fn get_json(url: &str) -> serde_json::Value {
    reqwest::get(url)
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

/// `POST url` with a JSON body, the response body as text.
pub async fn post_text(url: &str, body: &serde_json::Value) -> String {
    reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body")
}
