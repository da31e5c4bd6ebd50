//! Handlers, the registry and the worker loop.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::job::Job;
use crate::store::{self, Claimed};
use crate::{JOBS_CHANNEL, JobError, QueueError};

/// What a handler knows about the job it runs.
#[derive(Clone)]
pub struct JobContext {
    pub job_id: i64,
    pub queue: String,
    /// 1 on the first run.
    pub attempt: i32,
    pub max_attempts: i32,
    pub pool: Pool,
}

/// Runs jobs of one kind.
#[async_trait]
pub trait JobHandler: Send + Sync + 'static {
    type Job: Job;
    async fn run(&self, ctx: JobContext, job: Self::Job) -> Result<(), JobError>;
}

#[async_trait]
trait ErasedHandler: Send + Sync {
    async fn run_json(&self, ctx: JobContext, payload: serde_json::Value) -> Result<(), JobError>;
}

#[async_trait]
impl<H: JobHandler> ErasedHandler for H {
    async fn run_json(&self, ctx: JobContext, payload: serde_json::Value) -> Result<(), JobError> {
        let job: H::Job = serde_json::from_value(payload)
            .map_err(|e| JobError::permanent(format!("bad payload for {}: {e}", H::Job::KIND)))?;
        self.run(ctx, job).await
    }
}

/// Handlers by kind.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn ErasedHandler>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register<H: JobHandler>(&mut self, handler: H) -> &mut Self {
        self.handlers
            .insert(H::Job::KIND.to_owned(), Arc::new(handler));
        self
    }

    pub fn kinds(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    /// Inline mode (development): runs the handler now, in this task, without the
    /// table. `Ok(false)` when no handler is registered for the job's kind.
    pub async fn run_inline<J: Job>(&self, pool: Pool, job: &J) -> Result<bool, JobError> {
        let Some(handler) = self.handlers.get(J::KIND) else {
            return Ok(false);
        };
        let payload = serde_json::to_value(job).map_err(JobError::permanent)?;
        let ctx = JobContext {
            job_id: 0,
            queue: "inline".into(),
            attempt: 1,
            max_attempts: 1,
            pool,
        };
        handler.run_json(ctx, payload).await?;
        Ok(true)
    }
}

/// A job enqueued once per `every` (dedupe key `periodic:<kind>:<period number>`).
#[derive(Debug, Clone)]
pub struct Periodic {
    pub kind: String,
    pub queue: String,
    pub payload: serde_json::Value,
    pub every: Duration,
}

impl Periodic {
    pub fn new<J: Job>(job: &J, every: Duration) -> Result<Self, QueueError> {
        Ok(Self {
            kind: J::KIND.to_owned(),
            queue: "default".into(),
            payload: serde_json::to_value(job)?,
            every,
        })
    }
}

/// Worker settings; the defaults suit production.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub queues: Vec<String>,
    /// Jobs run at once by this worker.
    pub concurrency: usize,
    /// How long a claim holds without a heartbeat.
    pub lease: Duration,
    pub heartbeat: Duration,
    /// Fallback when no NOTIFY arrives (also picks up delayed and retried jobs).
    pub poll_interval: Duration,
    /// On shutdown, running jobs get this long to finish before they are released.
    pub shutdown_grace: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub periodic: Vec<Periodic>,
    /// Unique per worker; recorded in `locked_by`.
    pub worker_id: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            queues: vec!["default".into()],
            concurrency: 4,
            lease: Duration::from_secs(60),
            heartbeat: Duration::from_secs(15),
            poll_interval: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(3600),
            periodic: Vec::new(),
            worker_id: format!("worker-{}-{}", std::process::id(), uuid::Uuid::new_v4()),
        }
    }
}

/// A worker: one claim loop running up to `concurrency` jobs at once, a NOTIFY
/// listener and a periodic scheduler.
pub struct Worker {
    pool: Pool,
    database_url: String,
    registry: Arc<Registry>,
    config: Arc<WorkerConfig>,
}

/// A running worker.
pub struct WorkerHandle {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
}

impl WorkerHandle {
    /// Stops claiming, lets running jobs finish within the grace period, releases the
    /// rest, and returns when every slot has stopped.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        for task in self.background {
            task.abort();
        }
    }
}

struct Shared {
    pool: Pool,
    registry: Arc<Registry>,
    config: Arc<WorkerConfig>,
    kinds: Vec<String>,
    wake: Notify,
}

impl Worker {
    pub fn new(pool: Pool, database_url: &str, registry: Registry, config: WorkerConfig) -> Self {
        Self {
            pool,
            database_url: database_url.to_owned(),
            registry: Arc::new(registry),
            config: Arc::new(config),
        }
    }

    pub fn spawn(self) -> WorkerHandle {
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            kinds: self.registry.kinds(),
            pool: self.pool,
            registry: self.registry,
            config: self.config,
            wake: Notify::new(),
        });
        let background = vec![
            tokio::spawn(listen_for_jobs(shared.clone(), self.database_url)),
            tokio::spawn(schedule_periodic(shared.clone())),
        ];
        let tasks = vec![tokio::spawn(dispatch(shared.clone(), stop_rx))];
        WorkerHandle {
            stop,
            tasks,
            background,
        }
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    // A dropped sender also means stop.
    let _ = stop.wait_for(|s| *s).await;
}

/// How a run ended, as its task reports it to the dispatcher.
enum Outcome {
    /// The handler succeeded: the dispatcher marks the job done with its next claim.
    Succeeded(i64),
    /// The slot is free; the outcome (failure, release) is already recorded.
    Freed,
}

/// Reports the run's outcome when dropped, so a slot is given back on every path.
struct SlotGuard {
    outcome: Option<Outcome>,
    tx: mpsc::UnboundedSender<Outcome>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(self.outcome.take().unwrap_or(Outcome::Freed));
    }
}

/// The worker's claim loop. One statement per round trip marks the jobs that
/// finished since the last one done and claims as many jobs as there are free
/// slots; each claimed job runs in a task of its own. When nothing is runnable it
/// sleeps until NOTIFY, a slot frees up with more work likely, or the poll interval.
/// On shutdown it stops claiming and returns once every running job has finished
/// (or been released) and its completion is recorded.
async fn dispatch(shared: Arc<Shared>, stop: watch::Receiver<bool>) {
    let config = &shared.config;
    let slots = config.concurrency.max(1);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut finished: Vec<i64> = Vec::new();
    let mut running = 0usize;
    // Whether a claim may find work: false after a claim came back short, until
    // NOTIFY or the poll interval says otherwise. Completions claim regardless.
    let mut maybe_more = true;
    let mut stopping = false;
    let mut poll = tokio::time::interval(config.poll_interval);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.tick().await;
    loop {
        stopping |= *stop.borrow();
        while let Ok(outcome) = rx.try_recv() {
            running = running.saturating_sub(1);
            if let Outcome::Succeeded(id) = outcome {
                finished.push(id);
            }
        }
        let free = if stopping {
            0
        } else {
            slots.saturating_sub(running)
        };
        // Register interest before claiming so a NOTIFY in between is not lost.
        let woken = shared.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let mut failed = false;
        if (maybe_more && free > 0) || !finished.is_empty() {
            match round(&shared, &finished, free).await {
                Ok(round) => {
                    if round.completed < finished.len() {
                        tracing::warn!(
                            jobs = finished.len() - round.completed,
                            "jobs were taken over before their outcome was recorded"
                        );
                    }
                    finished.clear();
                    if free > 0 {
                        maybe_more = round.claimed.len() == free;
                    }
                    running += round.claimed.len();
                    for job in round.claimed {
                        let guard = SlotGuard {
                            outcome: None,
                            tx: tx.clone(),
                        };
                        tokio::spawn(run_claimed(shared.clone(), job, stop.clone(), guard));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "claiming jobs failed");
                    failed = true;
                }
            }
        }
        if stopping && running == 0 {
            if !finished.is_empty() {
                tracing::warn!(
                    jobs = finished.len(),
                    "stopping without recording finished jobs; their leases will expire"
                );
            }
            return;
        }
        tokio::select! {
            Some(outcome) = rx.recv() => {
                running = running.saturating_sub(1);
                if let Outcome::Succeeded(id) = outcome {
                    finished.push(id);
                }
            }
            _ = &mut woken, if !stopping => maybe_more = true,
            _ = poll.tick(), if !stopping || failed => maybe_more = true,
            _ = stopped(stop.clone()), if !stopping => stopping = true,
        }
    }
}

async fn round(shared: &Shared, finished: &[i64], want: usize) -> Result<store::Round, QueueError> {
    let client = shared.pool.get().await?;
    store::complete_and_claim(
        &client,
        finished,
        want,
        &shared.config.queues,
        &shared.kinds,
        &shared.config.worker_id,
        shared.config.lease,
    )
    .await
}

async fn run_claimed(
    shared: Arc<Shared>,
    job: Claimed,
    stop: watch::Receiver<bool>,
    mut guard: SlotGuard,
) {
    let config = &shared.config;
    let Some(handler) = shared.registry.handlers.get(&job.kind).cloned() else {
        return;
    };
    let ctx = JobContext {
        job_id: job.id,
        queue: job.queue.clone(),
        attempt: job.attempt,
        max_attempts: job.max_attempts,
        pool: shared.pool.clone(),
    };
    tracing::debug!(job_id = job.id, kind = %job.kind, attempt = job.attempt, "running job");
    // One span per run, a child of the span that enqueued the job.
    let span = if duo_telemetry::traces_enabled() {
        let span = tracing::info_span!(
            "job.run",
            otel.name = %format!("job {}", job.kind),
            otel.kind = "consumer",
            messaging.system = "postgresql",
            messaging.destination.name = %job.queue,
            duo.job.id = job.id,
            duo.job.attempt = job.attempt,
        );
        duo_telemetry::continue_from_traceparent(&span, job.trace_context.as_deref());
        span
    } else {
        tracing::Span::none()
    };
    // A task of its own, so a panicking handler is a failed job, not a dead slot.
    let mut running = tokio::spawn(tracing::Instrument::instrument(
        async move { handler.run_json(ctx, job.payload).await },
        span,
    ));
    let mut heartbeat = tokio::time::interval(config.heartbeat);
    heartbeat.tick().await;
    let mut release_at: Option<Instant> = None;
    let stop_signal = stopped(stop);
    tokio::pin!(stop_signal);
    let outcome = loop {
        tokio::select! {
            result = &mut running => break Some(result),
            _ = heartbeat.tick() => {
                match shared.pool.get().await {
                    Ok(c) => {
                        if let Ok(false) = store::heartbeat(&c, job.id, &config.worker_id, config.lease).await {
                            tracing::warn!(job_id = job.id, "lost the lease on a running job");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                }
            }
            _ = &mut stop_signal, if release_at.is_none() => {
                release_at = Some(Instant::now() + config.shutdown_grace);
            }
            _ = sleep_until_opt(release_at) => break None,
        }
    };
    if let Some(Ok(Ok(()))) = outcome {
        // Recorded by the dispatcher together with its next claim.
        guard.outcome = Some(Outcome::Succeeded(job.id));
        return;
    }
    let Ok(client) = shared.pool.get().await else {
        tracing::warn!(
            job_id = job.id,
            "no connection to record the outcome; the lease will expire"
        );
        return;
    };
    let recorded = match outcome {
        None => {
            running.abort();
            tracing::info!(job_id = job.id, "releasing a job at shutdown");
            store::release(&client, job.id, &config.worker_id).await
        }
        Some(Ok(Ok(()))) => Ok(true),
        Some(Ok(Err(e))) => {
            let permanent = matches!(e, JobError::Permanent(_));
            tracing::info!(job_id = job.id, kind = %job.kind, attempt = job.attempt, error = %e, "job failed");
            store::fail(
                &client,
                job.id,
                &config.worker_id,
                &e.to_string(),
                permanent,
                config.backoff_base,
                config.backoff_max,
            )
            .await
        }
        Some(Err(join_error)) => {
            let message = if join_error.is_panic() {
                "handler panicked"
            } else {
                "handler cancelled"
            };
            store::fail(
                &client,
                job.id,
                &config.worker_id,
                message,
                false,
                config.backoff_base,
                config.backoff_max,
            )
            .await
        }
    };
    match recorded {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            job_id = job.id,
            "job was taken over before its outcome was recorded"
        ),
        Err(e) => tracing::warn!(job_id = job.id, error = %e, "recording a job outcome failed"),
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Wakes idle slots on `NOTIFY background_jobs`; reconnects when the connection drops.
async fn listen_for_jobs(shared: Arc<Shared>, url: String) {
    let mut delay = Duration::from_millis(50);
    loop {
        match crate::listener::listen(&url, &[JOBS_CHANNEL]).await {
            Ok((_client, mut notifications)) => {
                delay = Duration::from_millis(50);
                // Jobs may have arrived while we were not listening.
                shared.wake.notify_waiters();
                while notifications.recv().await.is_some() {
                    shared.wake.notify_waiters();
                }
                tracing::warn!("job listener connection lost; reconnecting");
            }
            Err(e) => tracing::warn!(error = %e, "job listener cannot connect"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Enqueues each periodic job once per period (all workers try; the key dedupes).
async fn schedule_periodic(shared: Arc<Shared>) {
    if shared.config.periodic.is_empty() {
        return;
    }
    let tick = shared
        .config
        .periodic
        .iter()
        .map(|p| p.every)
        .min()
        .unwrap_or(shared.config.poll_interval)
        .min(shared.config.poll_interval)
        .max(Duration::from_millis(10));
    let mut interval = tokio::time::interval(tick);
    loop {
        interval.tick().await;
        let Ok(client) = shared.pool.get().await else {
            continue;
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        for p in &shared.config.periodic {
            let period = now_ms / p.every.as_millis().max(1);
            let key = format!("periodic:{}:{period}", p.kind);
            if let Err(e) =
                store::enqueue_once(&**client, &p.kind, &p.queue, &p.payload, &key).await
            {
                tracing::warn!(error = %e, kind = %p.kind, "enqueueing a periodic job failed");
            }
        }
    }
}
