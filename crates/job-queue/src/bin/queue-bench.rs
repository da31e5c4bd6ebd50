//! `queue-bench`: throughput of no-op jobs with 1 and 4 workers, and claim
//! latency (enqueue committed → handler started) at a steady enqueue rate, on
//! the project's own PostgreSQL (devdb, started if needed).
//!
//! `cargo run --release -p job-queue --bin queue-bench [-- --jobs N]`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use async_trait::async_trait;
use job_queue::{
    EnqueueOptions, Job, JobContext, JobError, JobHandler, Registry, Worker, WorkerConfig, enqueue,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Notify};
use tokio::time::Instant;

/// A job that does nothing but say when it was enqueued.
#[derive(Serialize, Deserialize)]
struct Noop {
    enqueued_at_us: u128,
}

impl Job for Noop {
    const KIND: &'static str = "bench_noop";
}

#[derive(Default)]
struct Tally {
    done: AtomicUsize,
    target: AtomicUsize,
    all_done: Notify,
    claim_latencies: Mutex<Vec<Duration>>,
}

struct NoopHandler(Arc<Tally>);

#[async_trait]
impl JobHandler for NoopHandler {
    type Job = Noop;
    async fn run(&self, _ctx: JobContext, job: Noop) -> Result<(), JobError> {
        let waited = now_us().saturating_sub(job.enqueued_at_us);
        self.0
            .claim_latencies
            .lock()
            .await
            .push(Duration::from_micros(
                u64::try_from(waited).unwrap_or(u64::MAX),
            ));
        let done = self.0.done.fetch_add(1, Ordering::SeqCst) + 1;
        if done >= self.0.target.load(Ordering::SeqCst) {
            self.0.all_done.notify_one();
        }
        Ok(())
    }
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

fn worker_config(concurrency: usize) -> WorkerConfig {
    WorkerConfig {
        concurrency,
        // Idle workers are woken by NOTIFY; polling is only the fallback.
        poll_interval: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(5),
        ..WorkerConfig::default()
    }
}

fn start_workers(
    pool: &deadpool_postgres::Pool,
    url: &str,
    tally: &Arc<Tally>,
    workers: usize,
    concurrency: usize,
) -> Vec<job_queue::WorkerHandle> {
    (0..workers)
        .map(|_| {
            let mut registry = Registry::new();
            registry.register(NoopHandler(tally.clone()));
            Worker::new(pool.clone(), url, registry, worker_config(concurrency)).spawn()
        })
        .collect()
}

async fn enqueue_many(pool: &deadpool_postgres::Pool, jobs: usize) -> anyhow::Result<()> {
    let writers = 8;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let client = pool.get().await?;
            for _ in (w..jobs).step_by(writers) {
                let job = Noop {
                    enqueued_at_us: now_us(),
                };
                enqueue(&**client, &job, EnqueueOptions::default()).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Jobs/s for `workers` workers draining a backlog of `jobs` no-op jobs.
async fn throughput(
    pool: &deadpool_postgres::Pool,
    url: &str,
    workers: usize,
    concurrency: usize,
    jobs: usize,
) -> anyhow::Result<f64> {
    let tally = Arc::new(Tally::default());
    tally.target.store(jobs, Ordering::SeqCst);
    enqueue_many(pool, jobs).await?;
    let started = Instant::now();
    let handles = start_workers(pool, url, &tally, workers, concurrency);
    let waited = tokio::time::timeout(Duration::from_secs(300), async {
        while tally.done.load(Ordering::SeqCst) < jobs {
            tally.all_done.notified().await;
        }
    })
    .await;
    let elapsed = started.elapsed();
    for handle in handles {
        handle.shutdown().await;
    }
    if waited.is_err() {
        bail!(
            "only {} of {jobs} jobs ran within 300 s",
            tally.done.load(Ordering::SeqCst)
        );
    }
    Ok(jobs as f64 / elapsed.as_secs_f64())
}

/// Claim latency with idle workers and jobs arriving one at a time at `rate`/s.
async fn claim_latency(
    pool: &deadpool_postgres::Pool,
    url: &str,
    jobs: usize,
    rate: u64,
) -> anyhow::Result<Vec<Duration>> {
    let tally = Arc::new(Tally::default());
    tally.target.store(jobs, Ordering::SeqCst);
    let handles = start_workers(pool, url, &tally, 1, 4);
    // Let the workers reach their idle wait (LISTEN registered) before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = pool.get().await?;
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    for _ in 0..jobs {
        ticks.tick().await;
        let job = Noop {
            enqueued_at_us: now_us(),
        };
        enqueue(&**client, &job, EnqueueOptions::default()).await?;
    }
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while tally.done.load(Ordering::SeqCst) < jobs {
            tally.all_done.notified().await;
        }
    })
    .await;
    for handle in handles {
        handle.shutdown().await;
    }
    if waited.is_err() {
        bail!("claim latency run did not finish");
    }
    let mut latencies = tally.claim_latencies.lock().await.clone();
    latencies.sort();
    Ok(latencies)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let jobs: usize = args
        .iter()
        .position(|a| a == "--jobs")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse())
        .transpose()
        .context("--jobs takes a number")?
        .unwrap_or(5000);

    let db = devdb::TestDb::with_sql(job_queue::MIGRATION_SQL)
        .await
        .context("starting PostgreSQL (devdb)")?;
    let pool = db.pool(16)?;
    println!("queue-bench: {jobs} no-op jobs per run, PostgreSQL from devdb");
    println!("{:<34} {:>10}", "workers x concurrency", "jobs/s");
    for (workers, concurrency) in [(1, 1), (1, 4), (4, 4)] {
        let rate = throughput(&pool, db.url(), workers, concurrency, jobs).await?;
        println!(
            "{:<34} {:>10.0}",
            format!("{workers} x {concurrency}"),
            rate
        );
    }
    let claims = (jobs / 5).clamp(200, 2000);
    let rate = 200;
    let latencies = claim_latency(&pool, db.url(), claims, rate).await?;
    println!(
        "claim latency (enqueue -> start, {claims} jobs at {rate}/s, idle worker 1 x 4): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(percentile(&latencies, 100.0)),
    );
    Ok(())
}
