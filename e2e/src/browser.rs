//! A real browser for page tests: Debian's headless Chromium driven through
//! chromedriver (WebDriver), each test with its own driver process and a fresh
//! profile directory. `scripts/install-build-deps.sh` installs both.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::{HarnessError, Result, Service, free_port, repo_root};

/// How long a page condition may take before the test fails.
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(20);

pub struct Browser {
    pub client: Client,
    _driver: Service,
    profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Failed(format!("{what}: {e}"))
}

/// Where screenshots go: `target/screenshots/` of this workspace.
pub fn screenshot_dir() -> PathBuf {
    repo_root().join("target").join("screenshots")
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, with the flags these
    /// machines need (no sandbox as root, no background networking).
    pub async fn start() -> Result<Self> {
        let driver_bin = PathBuf::from(
            std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into()),
        );
        if !driver_bin.exists() {
            return Err(HarnessError::Failed(format!(
                "{} is missing: run scripts/install-build-deps.sh (installs chromium and chromium-driver)",
                driver_bin.display()
            )));
        }
        let port = free_port()?;
        // Its own process group: Chromium and its helpers go with it.
        let mut driver = Service::spawn_group(
            "chromedriver",
            &driver_bin,
            &[&format!("--port={port}")],
            &[],
        )?;
        let http = reqwest::Client::new();
        driver
            .wait_ready(&http, &format!("http://127.0.0.1:{port}/status"))
            .await?;
        let profile =
            std::env::temp_dir().join(format!("duo-chromium-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&profile)?;
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned());
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        });
        let Value::Object(capabilities) = capabilities else {
            return Err(HarnessError::Failed("capabilities".into()));
        };
        let client = ClientBuilder::rustls()?
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .map_err(|e| failed("starting a browser session", e))?;
        Ok(Self {
            client,
            _driver: driver,
            profile,
        })
    }

    /// This browser's own profile directory (Chromium's `--user-data-dir`).
    pub fn profile_dir(&self) -> &std::path::Path {
        &self.profile
    }

    pub async fn goto(&self, url: &str) -> Result<()> {
        self.client
            .goto(url)
            .await
            .map_err(|e| failed(&format!("opening {url}"), e))
    }

    /// Runs a script in the page; its `return` value comes back as JSON.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.client
            .execute(script, args)
            .await
            .map_err(|e| failed("running a script", e))
    }

    /// Waits until `script` (an expression body) returns something truthy;
    /// returns that value. Polls the page, so the test follows the page's pace.
    pub async fn until(&self, what: &str, script: &str) -> Result<Value> {
        let deadline = Instant::now() + PAGE_TIMEOUT;
        loop {
            let value = self.js(script, vec![]).await?;
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
                _ => true,
            };
            if truthy {
                return Ok(value);
            }
            if Instant::now() > deadline {
                let url = self
                    .client
                    .current_url()
                    .await
                    .map(|u| u.to_string())
                    .unwrap_or_default();
                return Err(HarnessError::Failed(format!(
                    "timed out waiting for {what} on {url}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn click(&self, css: &str) -> Result<()> {
        self.client
            .find(Locator::Css(css))
            .await
            .map_err(|e| failed(&format!("finding {css}"), e))?
            .click()
            .await
            .map_err(|e| failed(&format!("clicking {css}"), e))
    }

    pub async fn type_into(&self, css: &str, text: &str) -> Result<()> {
        self.client
            .find(Locator::Css(css))
            .await
            .map_err(|e| failed(&format!("finding {css}"), e))?
            .send_keys(text)
            .await
            .map_err(|e| failed(&format!("typing into {css}"), e))
    }

    pub async fn text(&self, css: &str) -> Result<String> {
        self.client
            .find(Locator::Css(css))
            .await
            .map_err(|e| failed(&format!("finding {css}"), e))?
            .text()
            .await
            .map_err(|e| failed(&format!("reading {css}"), e))
    }

    /// Signs in through the form.
    pub async fn sign_in(&self, web_url: &str, username: &str, password: &str) -> Result<()> {
        self.goto(&format!("{web_url}/users/sign_in")).await?;
        self.type_into("#username", username).await?;
        self.type_into("#password", password).await?;
        self.click("button[type=submit]").await?;
        self.until(
            "the first page after signing in",
            "return !location.pathname.startsWith('/users/sign_in')",
        )
        .await?;
        Ok(())
    }

    /// Saves a PNG of the page under `target/screenshots/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> Result<PathBuf> {
        let png = self
            .client
            .screenshot()
            .await
            .map_err(|e| failed("taking a screenshot", e))?;
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }
}
