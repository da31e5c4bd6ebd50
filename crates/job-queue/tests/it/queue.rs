//! Queue semantics against a real PostgreSQL (devdb).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use devdb::TestDb;
use job_queue::{
    EnqueueOptions, Job, JobContext, JobError, JobHandler, JobState, Periodic, Registry, Worker,
    WorkerConfig, enqueue, job_by_id,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

async fn database() -> (TestDb, deadpool_postgres::Pool) {
    let db = TestDb::with_sql(job_queue::MIGRATION_SQL).await.unwrap();
    let pool = db.pool(8).unwrap();
    (db, pool)
}

fn fast_config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 2,
        lease: Duration::from_secs(10),
        heartbeat: Duration::from_secs(2),
        poll_interval: Duration::from_millis(100),
        shutdown_grace: Duration::from_millis(200),
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(5),
        ..WorkerConfig::default()
    }
}

/// Polls `check` until it holds or 15 s pass.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn state_of(pool: &deadpool_postgres::Pool, id: i64) -> job_queue::JobRow {
    let c = pool.get().await.unwrap();
    job_by_id(&**c, id).await.unwrap().unwrap()
}

#[derive(Serialize, Deserialize)]
struct Count {
    n: i64,
}
impl Job for Count {
    const KIND: &'static str = "count";
}

struct CountHandler {
    runs: Arc<Mutex<HashMap<i64, u32>>>,
}
#[async_trait]
impl JobHandler for CountHandler {
    type Job = Count;
    async fn run(&self, ctx: JobContext, job: Count) -> Result<(), JobError> {
        assert_eq!(job.n, ctx.job_id);
        *self.runs.lock().unwrap().entry(ctx.job_id).or_default() += 1;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_workers_in_two_processes_never_run_a_job_twice() {
    let (db, pool) = database().await;
    let total = 300;
    {
        let c = pool.get().await.unwrap();
        // The payload repeats the id so the handler can check it got the right row.
        // currval() inside the same INSERT is not defined before the first
        // nextval() of the session, so the ids are copied in a second statement.
        c.execute(
            "INSERT INTO background_jobs (kind, payload, run_at)
             SELECT 'count', '{}'::jsonb, now() + interval '1 hour' FROM generate_series(1, $1)",
            &[&(total as i32)],
        )
        .await
        .unwrap();
        c.execute(
            "UPDATE background_jobs SET payload = jsonb_build_object('n', id), run_at = now()
             WHERE kind = 'count'",
            &[],
        )
        .await
        .unwrap();
    }
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let mut workers = Vec::new();
    for _ in 0..2 {
        // Two pools stand for two processes.
        let mut registry = Registry::new();
        registry.register(CountHandler { runs: runs.clone() });
        let pool = db.pool(4).unwrap();
        workers.push(Worker::new(pool, db.url(), registry, fast_config()).spawn());
    }
    eventually("all jobs done", || async {
        let c = pool.get().await.unwrap();
        let done: i64 = c
            .query_one(
                "SELECT count(*) FROM background_jobs WHERE state = 'done'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        done == total
    })
    .await;
    for w in workers {
        w.shutdown().await;
    }
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), total as usize);
    assert!(runs.values().all(|&n| n == 1), "a job ran twice");
}

#[tokio::test]
async fn enqueueing_a_duplicate_returns_the_live_job() {
    let (_db, pool) = database().await;
    let c = pool.get().await.unwrap();
    // The same whether the insert is sent with its text or kept prepared.
    let prepared = c.prepare(job_queue::ENQUEUE_SQL).await.unwrap();
    for keep_prepared in [false, true] {
        let add = |n: i64| {
            let opts = EnqueueOptions::default().dedupe("completion:req-1");
            let (c, prepared) = (&c, &prepared);
            async move {
                if keep_prepared {
                    job_queue::enqueue_prepared(&***c, prepared, &Count { n }, opts).await
                } else {
                    enqueue(&***c, &Count { n }, opts).await
                }
                .unwrap()
            }
        };
        c.execute("DELETE FROM background_jobs", &[]).await.unwrap();
        let first = add(1).await;
        let second = add(2).await;
        assert!(first.created);
        assert_eq!(second.id, first.id);
        assert!(!second.created);
        let n: i64 = c
            .query_one("SELECT count(*) FROM background_jobs", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1);
        // Once finished, the key is free again.
        c.execute("UPDATE background_jobs SET state = 'done'", &[])
            .await
            .unwrap();
        let third = add(3).await;
        assert!(third.created);
        assert_ne!(third.id, first.id);
    }
}

#[derive(Serialize, Deserialize)]
struct Block;
impl Job for Block {
    const KIND: &'static str = "block";
}

/// Reports each start (job id, attempt), then waits until released (or forever).
struct BlockHandler {
    started: mpsc::UnboundedSender<(i64, i32)>,
    release: Arc<tokio::sync::Notify>,
}
#[async_trait]
impl JobHandler for BlockHandler {
    type Job = Block;
    async fn run(&self, ctx: JobContext, _job: Block) -> Result<(), JobError> {
        let _ = self.started.send((ctx.job_id, ctx.attempt));
        self.release.notified().await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_worker_stops_heartbeating_is_claimed_again_after_its_lease() {
    let (db, pool) = database().await;
    let id = {
        let c = pool.get().await.unwrap();
        enqueue(&**c, &Block, EnqueueOptions::default())
            .await
            .unwrap()
            .id
    };
    let (tx_a, mut started_a) = mpsc::unbounded_channel();
    let mut reg_a = Registry::new();
    reg_a.register(BlockHandler {
        started: tx_a,
        release: Arc::new(tokio::sync::Notify::new()),
    });
    // Worker A: short lease, heartbeat far beyond it (as if it hung or died).
    let crashed = Worker::new(
        db.pool(2).unwrap(),
        db.url(),
        reg_a,
        WorkerConfig {
            concurrency: 1,
            lease: Duration::from_millis(300),
            heartbeat: Duration::from_secs(600),
            shutdown_grace: Duration::ZERO,
            ..fast_config()
        },
    )
    .spawn();
    assert_eq!(started_a.recv().await.unwrap(), (id, 1));

    let (tx_b, mut started_b) = mpsc::unbounded_channel();
    let release_b = Arc::new(tokio::sync::Notify::new());
    let mut reg_b = Registry::new();
    reg_b.register(BlockHandler {
        started: tx_b,
        release: release_b.clone(),
    });
    let rescuer = Worker::new(db.pool(2).unwrap(), db.url(), reg_b, fast_config()).spawn();
    let (got, attempt) = timeout(Duration::from_secs(10), started_b.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got, attempt), (id, 2));
    release_b.notify_one();
    eventually("job done", || async {
        state_of(&pool, id).await.state == JobState::Done
    })
    .await;
    // The stale worker cannot touch a job that is no longer its own.
    crashed.shutdown().await;
    assert_eq!(state_of(&pool, id).await.state, JobState::Done);
    rescuer.shutdown().await;
}

#[derive(Serialize, Deserialize)]
struct Flaky {
    permanent: bool,
}
impl Job for Flaky {
    const KIND: &'static str = "flaky";
}
struct FlakyHandler {
    attempts: mpsc::UnboundedSender<i32>,
}
#[async_trait]
impl JobHandler for FlakyHandler {
    type Job = Flaky;
    async fn run(&self, ctx: JobContext, job: Flaky) -> Result<(), JobError> {
        let _ = self.attempts.send(ctx.attempt);
        if job.permanent {
            Err(JobError::permanent("no point retrying"))
        } else {
            Err(JobError::retryable(format!("boom {}", ctx.attempt)))
        }
    }
}

#[tokio::test]
async fn failures_back_off_exponentially_then_die() {
    let (db, pool) = database().await;
    let id = {
        let c = pool.get().await.unwrap();
        let opts = EnqueueOptions {
            max_attempts: 3,
            ..EnqueueOptions::default()
        };
        enqueue(&**c, &Flaky { permanent: false }, opts)
            .await
            .unwrap()
            .id
    };
    let (tx, mut attempts) = mpsc::unbounded_channel();
    let mut registry = Registry::new();
    registry.register(FlakyHandler { attempts: tx });
    let config = WorkerConfig {
        concurrency: 1,
        backoff_base: Duration::from_millis(400),
        ..fast_config()
    };
    let worker = Worker::new(pool.clone(), db.url(), registry, config).spawn();

    assert_eq!(attempts.recv().await.unwrap(), 1);
    eventually("first failure recorded", || async {
        state_of(&pool, id).await.state == JobState::Pending
    })
    .await;
    let after_first = state_of(&pool, id).await;
    assert_eq!(after_first.attempts, 1);
    assert!(
        (0.2..=0.41).contains(&after_first.run_in_secs),
        "first retry in {} s, want about 0.4",
        after_first.run_in_secs
    );
    assert_eq!(after_first.last_error.as_deref(), Some("boom 1"));

    assert_eq!(attempts.recv().await.unwrap(), 2);
    eventually("second failure recorded", || async {
        let row = state_of(&pool, id).await;
        row.state == JobState::Pending && row.attempts == 2
    })
    .await;
    let after_second = state_of(&pool, id).await;
    assert!(
        (0.6..=0.81).contains(&after_second.run_in_secs),
        "second retry in {} s, want about 0.8",
        after_second.run_in_secs
    );

    assert_eq!(attempts.recv().await.unwrap(), 3);
    eventually("dead", || async {
        state_of(&pool, id).await.state == JobState::Dead
    })
    .await;
    let dead = state_of(&pool, id).await;
    assert_eq!(dead.attempts, 3);
    assert_eq!(dead.last_error.as_deref(), Some("boom 3"));
    worker.shutdown().await;
    assert!(attempts.try_recv().is_err(), "a dead job ran again");
}

#[tokio::test]
async fn a_permanent_failure_goes_to_the_dead_set_at_once() {
    let (db, pool) = database().await;
    let id = {
        let c = pool.get().await.unwrap();
        enqueue(&**c, &Flaky { permanent: true }, EnqueueOptions::default())
            .await
            .unwrap()
            .id
    };
    let (tx, mut attempts) = mpsc::unbounded_channel();
    let mut registry = Registry::new();
    registry.register(FlakyHandler { attempts: tx });
    let worker = Worker::new(pool.clone(), db.url(), registry, fast_config()).spawn();
    assert_eq!(attempts.recv().await.unwrap(), 1);
    eventually("dead", || async {
        state_of(&pool, id).await.state == JobState::Dead
    })
    .await;
    worker.shutdown().await;
    assert_eq!(state_of(&pool, id).await.attempts, 1);
}

#[tokio::test]
async fn shutdown_finishes_quick_jobs_and_releases_slow_ones() {
    let (db, pool) = database().await;
    let (quick, slow) = {
        let c = pool.get().await.unwrap();
        let a = enqueue(&**c, &Block, EnqueueOptions::default())
            .await
            .unwrap()
            .id;
        let b = enqueue(&**c, &Block, EnqueueOptions::default())
            .await
            .unwrap()
            .id;
        (a, b)
    };
    let (tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let mut registry = Registry::new();
    registry.register(BlockHandler {
        started: tx,
        release: release.clone(),
    });
    let config = WorkerConfig {
        concurrency: 2,
        shutdown_grace: Duration::from_millis(500),
        ..fast_config()
    };
    let worker = Worker::new(pool.clone(), db.url(), registry, config).spawn();
    let mut ids = vec![
        started.recv().await.unwrap().0,
        started.recv().await.unwrap().0,
    ];
    ids.sort();
    assert_eq!(ids, vec![quick, slow]);

    let shutting_down = tokio::spawn(worker.shutdown());
    // Let exactly one of the two finish within the grace period.
    release.notify_one();
    shutting_down.await.unwrap();

    let rows = [state_of(&pool, quick).await, state_of(&pool, slow).await];
    let done = rows.iter().filter(|r| r.state == JobState::Done).count();
    let released: Vec<_> = rows
        .iter()
        .filter(|r| r.state == JobState::Pending)
        .collect();
    assert_eq!(done, 1);
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].attempts, 0, "a release is not an attempt");
    assert!(released[0].locked_by.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_an_idle_worker_long_before_the_poll_interval() {
    let (db, pool) = database().await;
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let mut registry = Registry::new();
    registry.register(CountHandler { runs: runs.clone() });
    let config = WorkerConfig {
        poll_interval: Duration::from_secs(120),
        ..fast_config()
    };
    let worker = Worker::new(pool.clone(), db.url(), registry, config).spawn();
    for _ in 0..3 {
        let c = pool.get().await.unwrap();
        let row = c
            .query_one(
                "INSERT INTO background_jobs (kind, payload)
                 VALUES ('count', jsonb_build_object('n', currval('background_jobs_id_seq')))
                 RETURNING id",
                &[],
            )
            .await
            .unwrap();
        let id: i64 = row.get(0);
        let start = Instant::now();
        eventually("job ran", || async {
            runs.lock().unwrap().contains_key(&id)
        })
        .await;
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "woken after {:?}",
            start.elapsed()
        );
    }
    worker.shutdown().await;
}

#[tokio::test]
async fn periodic_jobs_are_enqueued_once_per_period_across_workers() {
    let (db, pool) = database().await;
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let periodic = Periodic::new(&Count { n: 0 }, Duration::from_millis(300)).unwrap();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let mut registry = Registry::new();
        // Count's handler checks n == job id; use a handler that accepts anything.
        registry.register(AnyCount { runs: runs.clone() });
        let config = WorkerConfig {
            periodic: vec![periodic.clone()],
            poll_interval: Duration::from_millis(50),
            ..fast_config()
        };
        workers.push(Worker::new(db.pool(3).unwrap(), db.url(), registry, config).spawn());
    }
    eventually("three periodic runs", || async {
        runs.lock().unwrap().len() >= 3
    })
    .await;
    for w in workers {
        w.shutdown().await;
    }
    let c = pool.get().await.unwrap();
    let row = c
        .query_one(
            "SELECT count(*), count(DISTINCT dedupe_key) FROM background_jobs",
            &[],
        )
        .await
        .unwrap();
    let (all, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(all, distinct, "a period was enqueued twice");
}

struct AnyCount {
    runs: Arc<Mutex<HashMap<i64, u32>>>,
}
#[async_trait]
impl JobHandler for AnyCount {
    type Job = Count;
    async fn run(&self, ctx: JobContext, _job: Count) -> Result<(), JobError> {
        *self.runs.lock().unwrap().entry(ctx.job_id).or_default() += 1;
        Ok(())
    }
}

#[tokio::test]
async fn inline_mode_runs_the_handler_at_once_without_the_table() {
    let (_db, pool) = database().await;
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let mut registry = Registry::new();
    registry.register(AnyCount { runs: runs.clone() });
    assert!(
        registry
            .run_inline(pool.clone(), &Count { n: 7 })
            .await
            .unwrap()
    );
    assert_eq!(runs.lock().unwrap().get(&0), Some(&1));
    assert!(!registry.run_inline(pool.clone(), &Block).await.unwrap());
    let c = pool.get().await.unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM background_jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_claims_expired_leases_first_then_by_priority() {
    let (db, pool) = database().await;
    let c = pool.get().await.unwrap();
    let expired: i64 = c
        .query_one(
            "INSERT INTO background_jobs (kind, payload, state, locked_by, lease_expires_at,
                                          attempts)
             VALUES ('block', 'null', 'running', 'a-dead-worker', now() - interval '1 second', 1)
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let mut by_priority = HashMap::new();
    for priority in [0i16, 5, 1] {
        let id: i64 = c
            .query_one(
                "INSERT INTO background_jobs (kind, payload, priority)
                 VALUES ('block', 'null', $1) RETURNING id",
                &[&priority],
            )
            .await
            .unwrap()
            .get(0);
        by_priority.insert(priority, id);
    }
    let (tx, mut started) = mpsc::unbounded_channel();
    let mut registry = Registry::new();
    registry.register(BlockHandler {
        started: tx,
        release: Arc::new(tokio::sync::Notify::new()),
    });
    let config = WorkerConfig {
        concurrency: 2,
        ..fast_config()
    };
    let worker = Worker::new(pool.clone(), db.url(), registry, config).spawn();
    let mut first = vec![started.recv().await.unwrap(), started.recv().await.unwrap()];
    first.sort();
    let mut want = vec![(expired, 2), (by_priority[&5], 1)];
    want.sort();
    assert_eq!(first, want);
    worker.shutdown().await;
    assert!(started.try_recv().is_err(), "a third job started");
    for id in [by_priority[&0], by_priority[&1]] {
        assert_eq!(state_of(&pool, id).await.state, JobState::Pending);
    }
}
