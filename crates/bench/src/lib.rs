//! Measuring helpers the bench programs share: percentiles, process memory
//! and CPU time read from `/proc`, and the machine's load.

use std::time::Duration;

pub mod callgrind;
pub mod eval;
pub mod gateway_token;
pub mod grounding;
pub mod tcp_relay;

/// The `p` quantile (0..=1) of an ascending slice, by the nearest-rank method.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Latencies collected in one run, summarised on demand.
#[derive(Debug, Default, Clone)]
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub fn extend(&mut self, other: &Latencies) {
        self.0.extend_from_slice(&other.0);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn quantile(&self, p: f64) -> Duration {
        let mut sorted = self.0.clone();
        sorted.sort();
        percentile(&sorted, p)
    }

    pub fn sum(&self) -> Duration {
        self.0.iter().sum()
    }
}

/// A duration in milliseconds with `decimals` places.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// KiB as megabytes, one decimal.
pub fn mb(kib: u64) -> String {
    format!("{:.1} MB", kib as f64 / 1024.0)
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`).
pub fn read_status_kib(path: &str, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Peak resident set size (VmHWM) of a process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    read_status_kib(&format!("/proc/{pid}/status"), "VmHWM:")
}

/// The kernel's clock ticks per second for `/proc/<pid>/stat` times. Linux
/// reports them in USER_HZ, which is 100 on every architecture it exports.
const USER_HZ: f64 = 100.0;

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields are
    // counted after the last ')'. utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64((utime + stime) / USER_HZ))
}

/// Runs a bench until it ends or the process is asked to stop (SIGINT or
/// SIGTERM, e.g. `kill` from a profiling script). On a stop the bench's
/// future is dropped, so the servers it started (their processes are killed
/// on drop) and its scratch directories go with it instead of outliving it;
/// `Err` names the signal. If the signals cannot be watched, the bench just
/// runs.
pub async fn until_stopped<T>(
    bench: impl std::future::Future<Output = T>,
) -> Result<T, &'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return Ok(bench.await);
    };
    tokio::select! {
        done = bench => Ok(done),
        _ = interrupt.recv() => Err("SIGINT"),
        _ = terminate.recv() => Err("SIGTERM"),
    }
}

/// [`until_stopped`] for a bench's `main`: a stop fails the bench.
pub async fn run_until_stopped(
    bench: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    until_stopped(bench).await.unwrap_or_else(|signal| {
        Err(anyhow::anyhow!(
            "stopped by {signal}; the servers it started are stopped too"
        ))
    })
}

/// What the whole machine's CPUs did so far, from `/proc/stat`: to tell a
/// bench's figures from other work running beside it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineCpu {
    /// Time any CPU spent running something (processes and the kernel's
    /// interrupt work), idle and I/O wait excluded.
    pub busy: Duration,
    /// Time the hypervisor gave this machine's virtual CPUs to others.
    pub stolen: Duration,
}

impl MachineCpu {
    pub fn now() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The summary `cpu` line: user, nice, system, idle, iowait, irq,
    /// softirq, steal, guest, guest_nice, in USER_HZ ticks. Guest time is
    /// counted in user already.
    fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|field| field.parse().ok())
            .collect::<Option<_>>()?;
        let field = |i: usize| ticks.get(i).copied().unwrap_or(0);
        let busy = field(0) + field(1) + field(2) + field(5) + field(6);
        let time = |t: u64| Duration::from_secs_f64(t as f64 / USER_HZ);
        (ticks.len() >= 4).then(|| Self {
            busy: time(busy),
            stolen: time(field(7)),
        })
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            busy: self.busy.saturating_sub(before.busy),
            stolen: self.stolen.saturating_sub(before.stolen),
        }
    }
}

/// The ids of every process whose command name is `comm` (e.g. `postgres`,
/// whose server forks one process per connection).
pub fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|name| name.trim_end() == comm)
        })
        .collect()
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` prints them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| {
            let parts: Vec<&str> = l.split_whitespace().take(3).collect();
            (parts.len() == 3).then(|| parts.join(" "))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop drops the running bench (and so what it owns) and says why.
    #[tokio::test]
    async fn a_stop_signal_drops_the_running_bench() {
        struct Owned(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Owned {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (running, is_running) = tokio::sync::oneshot::channel();
        let owned = Owned(dropped.clone());
        let bench = async move {
            let _owned = owned;
            let _ = running.send(());
            std::future::pending::<()>().await
        };
        let stopper = tokio::spawn(async move {
            // The bench runs once `until_stopped` watches the signals.
            let _ = is_running.await;
            let status = tokio::process::Command::new("kill")
                .args(["-TERM", &std::process::id().to_string()])
                .status()
                .await
                .unwrap();
            assert!(status.success());
        });
        assert_eq!(until_stopped(bench).await, Err("SIGTERM"));
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
        stopper.await.unwrap();
        // A bench that ends on its own gives its result.
        assert_eq!(until_stopped(async { 7 }).await, Ok(7));
    }

    #[test]
    fn machine_cpu_counts_busy_and_stolen_ticks() {
        let stat = "cpu  100 5 40 9000 7 3 2 11 50 0\ncpu0 50 2 20 4500 3 1 1 5 25 0\nintr 1 2 3\n";
        let cpu = MachineCpu::parse(stat).unwrap();
        // user + nice + system + irq + softirq; guest is inside user.
        assert_eq!(cpu.busy, Duration::from_millis(1500));
        assert_eq!(cpu.stolen, Duration::from_millis(110));
        let later = MachineCpu::parse("cpu  200 5 60 9100 7 3 2 31 50 0\n").unwrap();
        assert_eq!(
            later.since(&cpu),
            MachineCpu {
                busy: Duration::from_millis(1200),
                stolen: Duration::from_millis(200),
            }
        );
        assert_eq!(MachineCpu::parse("intr 1 2\n"), None);
        assert_eq!(MachineCpu::parse("cpu  1 x 3 4\n"), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let pid = std::process::id();
        assert!(peak_rss_kib(pid).is_some_and(|kib| kib > 0));
        assert!(cpu_time(pid).is_some());
    }
}
