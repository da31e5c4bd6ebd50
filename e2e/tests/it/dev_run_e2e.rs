//! `./dev run` stops everything it started whichever way it is stopped
//! (SIGTERM, Ctrl-C's SIGINT), and starts again after any kind of stop, also
//! after being killed outright. Runs `scripts/run-all.sh` with the debug
//! binaries of this build (`DUO_RUN_BIN`, no release build), a private database
//! directory and port, and its own ports, so it never touches a developer's
//! running system.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use e2e_tests::{binary, free_port, repo_root};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub(crate) struct Run {
    child: Child,
    pub(crate) run_dir: PathBuf,
    /// What `./dev run` printed, up to "Press Ctrl-C".
    pub(crate) printed: String,
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

pub(crate) fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

pub(crate) struct Env {
    vars: Vec<(String, String)>,
    pg_dir: PathBuf,
    pg_port: u16,
    pub(crate) scratch: PathBuf,
    /// Where the web app listens.
    pub(crate) web: String,
    /// How long `./dev run` may take to say it is ready.
    ready_within: Duration,
}

impl Env {
    /// A run with a provider key: no local model server, ready at once.
    pub(crate) fn new() -> Self {
        Self::with_model(false)
    }

    /// With `bundled`, no provider key: the bundled model server runs (its
    /// weights fetched by `./dev run` itself) and the run waits for the demo
    /// repositories' index before it says it is ready.
    pub(crate) fn with_model(bundled: bool) -> Self {
        let scratch = std::env::temp_dir().join(format!(
            "duo-dev-run-{}-{}",
            std::process::id(),
            if bundled { "bundled" } else { "key" }
        ));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).unwrap();
        let bin = binary("duo-monolith")
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf();
        let pg_port = free_port().unwrap();
        let web = free_port().unwrap();
        let gateway = free_port().unwrap();
        let workflows = free_port().unwrap();
        let pg_dir = scratch.join("pg");
        let vars = vec![
            ("DUO_RUN_BIN".into(), bin.display().to_string()),
            (
                "DUO_RUN_DIR".into(),
                scratch.join("run").display().to_string(),
            ),
            ("DUO_PG_DIR".into(), pg_dir.display().to_string()),
            ("DUO_PG_PORT".into(), pg_port.to_string()),
            ("DUO_WEB_ADDR".into(), format!("127.0.0.1:{web}")),
            (
                "AI_GATEWAY_URL".into(),
                format!("http://127.0.0.1:{gateway}"),
            ),
            (
                "DUO_WORKFLOW_SERVICE_URL".into(),
                format!("http://127.0.0.1:{workflows}"),
            ),
            (
                "DUO_SIGNING_KEY_DIR".into(),
                scratch.join("keys").display().to_string(),
            ),
            (
                "DUO_REPOSITORIES_DIR".into(),
                scratch.join("repositories").display().to_string(),
            ),
        ];
        let mut vars = vars;
        if bundled {
            let model = free_port().unwrap();
            vars.push(("DUO_LOCAL_LLM_ADDR".into(), format!("127.0.0.1:{model}")));
        } else {
            // A provider key: no local model server (it is not what is tested).
            vars.push(("ANTHROPIC_API_KEY".into(), "dev-run-test".into()));
        }
        Self {
            vars,
            pg_dir,
            pg_port,
            scratch,
            web: format!("127.0.0.1:{web}"),
            ready_within: Duration::from_secs(if bundled { 900 } else { 120 }),
        }
    }

    pub(crate) async fn start(&self) -> Run {
        let mut child = Command::new("bash")
            .arg(repo_root().join("scripts/run-all.sh"))
            .current_dir(repo_root())
            .env_remove("DATABASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .envs(self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("run-all: {line}");
            }
        });
        let mut lines = BufReader::new(stdout).lines();
        let mut printed = String::new();
        let ready = tokio::time::timeout(self.ready_within, async {
            while let Ok(Some(line)) = lines.next_line().await {
                printed.push_str(&line);
                printed.push('\n');
                if line.starts_with("Press Ctrl-C") {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        assert!(ready, "./dev run never said it was running");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Run {
            child,
            run_dir: self.scratch.join("run"),
            printed,
        }
    }

    /// Whether the private database answers on its port.
    fn database_running(&self) -> bool {
        std::process::Command::new("bash")
            .arg(repo_root().join("scripts/postgres.sh"))
            .arg("status")
            .env_remove("DATABASE_URL")
            .env("DUO_PG_DIR", &self.pg_dir)
            .env("DUO_PG_PORT", self.pg_port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }
}

impl Run {
    /// The service processes this run started.
    fn services(&self) -> Vec<u32> {
        std::fs::read_to_string(self.run_dir.join("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("service "))
            .filter_map(|p| p.trim().parse().ok())
            .collect()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    pub(crate) async fn exit_code(mut self) -> Option<i32> {
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("./dev run did not stop within 60 s")
            .unwrap()
            .code()
    }
}

/// A test that ends early (a failed assertion) must not leave `./dev run`
/// and its services running: a run still going when dropped gets SIGTERM,
/// which stops everything it started.
impl Drop for Run {
    fn drop(&mut self) {
        if let (Ok(None), Some(pid)) = (self.child.try_wait(), self.child.id()) {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }
}

async fn stops_everything(env: &Env, run: Run, signal_name: &str, code: i32) {
    let services = run.services();
    assert_eq!(services.len(), 3, "gateway, web and worker: {services:?}");
    assert!(services.iter().all(|p| alive(*p)));
    assert!(env.database_running());
    signal(run.pid(), signal_name);
    assert_eq!(run.exit_code().await, Some(code));
    for pid in services {
        assert!(!alive(pid), "service {pid} survived SIG{signal_name}");
    }
    assert!(
        !env.database_running(),
        "the database survived SIG{signal_name}"
    );
}

#[tokio::test]
async fn dev_run_stops_everything_on_any_signal_and_restarts_after_any_stop() {
    let env = Env::new();

    let run = env.start().await;
    stops_everything(&env, run, "TERM", 143).await;

    let run = env.start().await;
    stops_everything(&env, run, "INT", 130).await;

    // Killed outright: its services and database stay behind...
    let run = env.start().await;
    let left = run.services();
    signal(run.pid(), "KILL");
    let _ = run.exit_code().await;
    assert!(left.iter().all(|p| alive(*p)));
    assert!(env.database_running());
    // ...and the next run cleans up first, then starts normally.
    let run = env.start().await;
    for pid in &left {
        assert!(!alive(*pid), "{pid} from the killed run is still running");
    }
    stops_everything(&env, run, "TERM", 143).await;

    // A stale pid file of a database that was killed: the next start copes.
    let run = env.start().await;
    let pid_file = env.pg_dir.join("data/postmaster.pid");
    let pg_pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let services = run.services();
    signal(run.pid(), "KILL");
    let _ = run.exit_code().await;
    for pid in services {
        signal(pid, "KILL");
    }
    signal(pg_pid, "KILL");
    while alive(pg_pid) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pid_file.exists(), "the killed database left its pid file");
    let run = env.start().await;
    stops_everything(&env, run, "TERM", 143).await;

    let _ = std::fs::remove_dir_all(&env.scratch);
}
