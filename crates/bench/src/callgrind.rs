//! Instructions a process runs for a piece of work, counted by valgrind's
//! callgrind: unlike time, the count does not move with what else the
//! machine is doing, so two builds can be compared on a noisy host.
//!
//! The process runs under `valgrind --tool=callgrind` from its start;
//! [`Counted::zero`] and [`Counted::dump`] (`callgrind_control -z` / `-d`)
//! bracket the work measured.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

/// A child process running under callgrind.
pub struct Counted {
    pub child: Child,
    dir: PathBuf,
    dumps: u32,
}

/// What one dump counted.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    /// Every instruction the process ran between the zero and the dump.
    pub total: u64,
    /// Of which in libc's `memset`: valgrind counts a `rep stosb` per byte,
    /// so a large zeroing counts far more than it costs (actix-http zeroes
    /// a 3 KB header array each time it polls a connection).
    pub memset: u64,
}

/// Whether valgrind's callgrind and its tools are installed.
pub fn available() -> bool {
    ["valgrind", "callgrind_control", "callgrind_annotate"]
        .iter()
        .all(|tool| {
            Command::new(tool)
                .arg("--help")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        })
}

impl Counted {
    /// Starts `command` (its program, arguments and environment as set)
    /// under callgrind, writing its counts into `dir`.
    pub fn start(command: &Command, dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut under = Command::new("valgrind");
        under
            .arg("--tool=callgrind")
            .arg(format!(
                "--callgrind-out-file={}/callgrind.out",
                dir.display()
            ))
            .arg(command.get_program())
            .args(command.get_args())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // The measured process sees only what `command` sets (the bench
        // clears the gateway's environment), valgrind its PATH as well.
        under.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            under.env("PATH", path);
        }
        for (key, value) in command.get_envs() {
            if let Some(value) = value {
                under.env(key, value);
            }
        }
        let child = under
            .spawn()
            .context("starting valgrind (is it installed?)")?;
        Ok(Self {
            child,
            dir: dir.to_owned(),
            dumps: 0,
        })
    }

    fn control(&self, flag: &str) -> anyhow::Result<()> {
        let status = Command::new("callgrind_control")
            .arg(flag)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running callgrind_control")?;
        if !status.success() {
            bail!("callgrind_control {flag} failed: {status}");
        }
        Ok(())
    }

    /// Sets the counters to zero.
    pub fn zero(&self) -> anyhow::Result<()> {
        self.control("-z")
    }

    /// Writes the counters out and reads what they counted since the last zero.
    pub fn dump(&mut self) -> anyhow::Result<Counts> {
        self.control("-d")?;
        self.dumps += 1;
        let file = self.dir.join(format!("callgrind.out.{}", self.dumps));
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let total = text
            .lines()
            .find_map(|line| line.strip_prefix("totals:"))
            .and_then(|count| count.trim().parse().ok())
            .context("no totals in the callgrind dump")?;
        Ok(Counts {
            total,
            memset: memset_of(&file).unwrap_or(0),
        })
    }
}

/// The instructions `callgrind_annotate` attributes to libc's memset.
fn memset_of(file: &Path) -> Option<u64> {
    let output = Command::new("callgrind_annotate")
        .arg("--threshold=100")
        .arg(file)
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains(":__memset_") || line.contains(":memset"))
        .filter_map(|line| {
            line.split_whitespace()
                .next()?
                .replace(',', "")
                .parse::<u64>()
                .ok()
        })
        .max()
}

impl Drop for Counted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
