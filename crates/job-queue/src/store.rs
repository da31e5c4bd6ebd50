//! The SQL of the queue: enqueue, claim, heartbeat, complete, fail, release.

use std::time::Duration;

use serde::Serialize;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Statement};

use crate::QueueError;
use crate::job::Job;

/// Options of one enqueue.
#[derive(Debug, Clone)]
pub struct EnqueueOptions {
    pub queue: String,
    /// Higher runs first.
    pub priority: i16,
    /// Run no earlier than this from now.
    pub delay: Duration,
    pub max_attempts: i32,
    /// At most one pending/running job per key.
    pub dedupe_key: Option<String>,
}

impl Default for EnqueueOptions {
    fn default() -> Self {
        Self {
            queue: "default".into(),
            priority: 0,
            delay: Duration::ZERO,
            max_attempts: 5,
            dedupe_key: None,
        }
    }
}

impl EnqueueOptions {
    pub fn dedupe(mut self, key: impl Into<String>) -> Self {
        self.dedupe_key = Some(key.into());
        self
    }
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }
}

/// Result of an enqueue: the job's id, and whether this call created it (false when
/// a live job with the same dedupe key already existed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    pub id: i64,
    pub created: bool,
}

/// Enqueues a typed job.
pub async fn enqueue<C: GenericClient, J: Job>(
    client: &C,
    job: &J,
    options: EnqueueOptions,
) -> Result<Enqueued, QueueError> {
    enqueue_raw(client, J::KIND, &serde_json::to_value(job)?, options).await
}

/// [`enqueue`] with [`ENQUEUE_SQL`] prepared by the caller (a connection that
/// keeps its statements prepared: no parsing and planning per job).
pub async fn enqueue_prepared<C: GenericClient, J: Job>(
    client: &C,
    statement: &Statement,
    job: &J,
    options: EnqueueOptions,
) -> Result<Enqueued, QueueError> {
    insert_job(
        client,
        Some(statement),
        J::KIND,
        serde_json::to_value(job)?,
        options,
    )
    .await
}

/// The statement that inserts a job: `$1` queue, `$2` kind, `$3` payload
/// (jsonb), `$4` priority (int2), `$5` delay in milliseconds (float8), `$6`
/// attempts (int4), `$7` dedupe key, `$8` trace context; the new job's id, or
/// no row when a live job holds the dedupe key.
pub const ENQUEUE_SQL: &str = "INSERT INTO background_jobs
         (queue, kind, payload, priority, run_at, max_attempts, dedupe_key,
          trace_context)
     VALUES ($1, $2, $3, $4, now() + $5 * interval '1 millisecond', $6, $7, $8)
     ON CONFLICT (dedupe_key)
         WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running')
         DO NOTHING
     RETURNING id";

/// Enqueues a job of `kind` with a JSON payload.
pub async fn enqueue_raw<C: GenericClient, P: Serialize + Sync>(
    client: &C,
    kind: &str,
    payload: &P,
    options: EnqueueOptions,
) -> Result<Enqueued, QueueError> {
    insert_job(client, None, kind, serde_json::to_value(payload)?, options).await
}

/// One job's values in [`ENQUEUE_SQL`]'s parameter order, for a statement
/// that stores the job together with rows of its own (see [`insert_job_sql!`]).
#[derive(Debug, Clone)]
pub struct JobValues {
    queue: String,
    kind: String,
    payload: serde_json::Value,
    priority: i16,
    delay_ms: f64,
    max_attempts: i32,
    dedupe_key: Option<String>,
    trace_context: Option<String>,
}

impl JobValues {
    pub fn new<J: Job>(job: &J, options: EnqueueOptions) -> Result<Self, QueueError> {
        Ok(Self::of_kind(J::KIND, serde_json::to_value(job)?, options))
    }

    fn of_kind(kind: &str, payload: serde_json::Value, options: EnqueueOptions) -> Self {
        Self {
            queue: options.queue,
            kind: kind.to_owned(),
            payload,
            priority: options.priority,
            delay_ms: options.delay.as_millis() as f64,
            max_attempts: options.max_attempts,
            dedupe_key: options.dedupe_key,
            // Who enqueued the job, so its run joins their trace (None with traces off).
            trace_context: duo_telemetry::current_traceparent(),
        }
    }

    /// The eight parameters, in [`ENQUEUE_SQL`]'s (and [`insert_job_sql!`]'s) order.
    pub fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 8] {
        [
            &self.queue,
            &self.kind,
            &self.payload,
            &self.priority,
            &self.delay_ms,
            &self.max_attempts,
            &self.dedupe_key,
            &self.trace_context,
        ]
    }
}

/// The queue's insert as the body of a data-modifying CTE, one job per row of
/// `$source`, its values taken from the eight parameters named (in
/// [`JobValues::params`]'s order): for a statement that stores a job with the
/// row it is for, so both or neither are stored. Unlike [`ENQUEUE_SQL`] a
/// live job holding the same dedupe key is not skipped: the statement fails
/// with a unique violation, and stores nothing.
#[macro_export]
macro_rules! insert_job_sql {
    ($source:literal, $queue:literal, $kind:literal, $payload:literal, $priority:literal,
     $delay_ms:literal, $max_attempts:literal, $dedupe_key:literal, $trace_context:literal) => {
        concat!(
            "INSERT INTO background_jobs
                 (queue, kind, payload, priority, run_at, max_attempts, dedupe_key, trace_context)
             SELECT ", $queue, "::text, ", $kind, "::text, ", $payload, "::jsonb, ",
            $priority, "::int2, now() + ", $delay_ms, "::float8 * interval '1 millisecond', ",
            $max_attempts, "::int4, ", $dedupe_key, "::text, ", $trace_context, "::text FROM ",
            $source, " RETURNING id"
        )
    };
}

async fn insert_job<C: GenericClient>(
    client: &C,
    statement: Option<&Statement>,
    kind: &str,
    payload: serde_json::Value,
    options: EnqueueOptions,
) -> Result<Enqueued, QueueError> {
    let values = JobValues::of_kind(kind, payload, options);
    // A duplicate may finish between the insert and the lookup: then insert again.
    for _ in 0..3 {
        let inserted = match statement {
            Some(statement) => client.query_opt(statement, &values.params()).await?,
            // Typed parameters: one round trip (no separate prepare), whatever the client.
            None => {
                let types = [
                    Type::TEXT,
                    Type::TEXT,
                    Type::JSONB,
                    Type::INT2,
                    Type::FLOAT8,
                    Type::INT4,
                    Type::TEXT,
                    Type::TEXT,
                ];
                let params = values.params();
                let typed: Vec<_> = params.iter().copied().zip(types).collect();
                client.query_typed_opt(ENQUEUE_SQL, &typed).await?
            }
        };
        if let Some(row) = inserted {
            return Ok(Enqueued {
                id: row.get(0),
                created: true,
            });
        }
        let existing = client
            .query_typed_opt(
                "SELECT id FROM background_jobs
                 WHERE dedupe_key = $1 AND state IN ('pending', 'running')",
                &[(&values.dedupe_key, Type::TEXT)],
            )
            .await?;
        if let Some(row) = existing {
            return Ok(Enqueued {
                id: row.get(0),
                created: false,
            });
        }
    }
    Err(QueueError::Payload(serde::de::Error::custom(
        "dedupe key kept changing hands",
    )))
}

/// Enqueues unless a job with this dedupe key exists in any state (periodic jobs:
/// one per period even after it finished).
pub(crate) async fn enqueue_once<C: GenericClient>(
    client: &C,
    kind: &str,
    queue: &str,
    payload: &serde_json::Value,
    key: &str,
) -> Result<bool, QueueError> {
    let n = client
        .execute(
            "INSERT INTO background_jobs (queue, kind, payload, dedupe_key)
             SELECT $1, $2, $3, $4
             WHERE NOT EXISTS (SELECT 1 FROM background_jobs WHERE dedupe_key = $4)
             ON CONFLICT (dedupe_key)
                 WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running')
                 DO NOTHING",
            &[&queue, &kind, payload, &key],
        )
        .await?;
    Ok(n == 1)
}

/// Lifecycle of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Pending,
    Running,
    Done,
    Dead,
}

impl JobState {
    fn parse(s: &str) -> Self {
        match s {
            "running" => Self::Running,
            "done" => Self::Done,
            "dead" => Self::Dead,
            _ => Self::Pending,
        }
    }
}

/// A job as stored (for inspection and tests).
#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: i64,
    pub queue: String,
    pub kind: String,
    pub payload: serde_json::Value,
    pub state: JobState,
    pub attempts: i32,
    pub max_attempts: i32,
    pub last_error: Option<String>,
    pub locked_by: Option<String>,
    /// Seconds from now until `run_at` (negative: in the past).
    pub run_in_secs: f64,
}

/// Reads one job.
pub async fn job_by_id<C: GenericClient>(
    client: &C,
    id: i64,
) -> Result<Option<JobRow>, QueueError> {
    let row = client
        .query_opt(
            "SELECT id, queue, kind, payload, state, attempts, max_attempts, last_error,
                    locked_by, EXTRACT(EPOCH FROM (run_at - now()))::float8
             FROM background_jobs WHERE id = $1",
            &[&id],
        )
        .await?;
    Ok(row.map(|r| JobRow {
        id: r.get(0),
        queue: r.get(1),
        kind: r.get(2),
        payload: r.get(3),
        state: JobState::parse(r.get(4)),
        attempts: r.get(5),
        max_attempts: r.get(6),
        last_error: r.get(7),
        locked_by: r.get(8),
        run_in_secs: r.get(9),
    }))
}

/// Deletes done and dead jobs finished more than `older_than` ago; returns how many.
pub async fn purge_finished<C: GenericClient>(
    client: &C,
    older_than: Duration,
) -> Result<u64, QueueError> {
    Ok(client
        .execute(
            "DELETE FROM background_jobs WHERE state IN ('done', 'dead')
             AND finished_at < now() - $1 * interval '1 second'",
            &[&older_than.as_secs_f64()],
        )
        .await?)
}

/// A job claimed by a worker.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub id: i64,
    pub kind: String,
    pub queue: String,
    pub payload: serde_json::Value,
    pub attempt: i32,
    pub max_attempts: i32,
    /// The enqueuer's `traceparent`.
    pub trace_context: Option<String>,
}

/// What one [`complete_and_claim`] round trip did.
#[derive(Debug, Default)]
pub(crate) struct Round {
    /// How many of the finished jobs were marked done (fewer when a lease was lost).
    pub completed: usize,
    pub claimed: Vec<Claimed>,
}

/// Marks this worker's `finished` jobs done and claims up to `limit` of the most
/// urgent runnable jobs of these queues and kinds, in one statement (one round
/// trip): first running jobs whose lease expired (their worker died), oldest lease
/// first, then pending and due jobs by priority, `run_at`, id. Rows another worker
/// holds are skipped (`FOR UPDATE SKIP LOCKED`), so no job is claimed twice.
pub(crate) async fn complete_and_claim(
    client: &deadpool_postgres::Client,
    finished: &[i64],
    limit: usize,
    queues: &[String],
    kinds: &[String],
    worker_id: &str,
    lease: Duration,
) -> Result<Round, QueueError> {
    // Two index-backed lookups instead of one `OR`, which made every claim scan the
    // whole table (finished jobs included). A job finished in this statement is not
    // taken as expired even if its lease ran out meanwhile: one row, one update.
    const SQL: &str = "WITH finished AS (
             UPDATE background_jobs
             SET state = 'done', locked_by = NULL, lease_expires_at = NULL,
                 finished_at = now(), updated_at = now()
             WHERE id = ANY($5) AND locked_by = $3 AND state = 'running'
             RETURNING id),
         expired AS (
             SELECT id FROM background_jobs
             WHERE state = 'running' AND lease_expires_at < now()
               AND queue = ANY($1) AND kind = ANY($2) AND id <> ALL($5)
             ORDER BY lease_expires_at
             LIMIT $6
             FOR UPDATE SKIP LOCKED),
         pending AS (
             SELECT id FROM background_jobs
             WHERE state = 'pending' AND run_at <= now()
               AND queue = ANY($1) AND kind = ANY($2)
             ORDER BY priority DESC, run_at, id
             LIMIT GREATEST($6 - (SELECT count(*) FROM expired), 0)
             FOR UPDATE SKIP LOCKED),
         claimed AS (
             UPDATE background_jobs j
             SET state = 'running', locked_by = $3, attempts = j.attempts + 1,
                 lease_expires_at = now() + $4 * interval '1 millisecond', updated_at = now()
             WHERE j.id = ANY(ARRAY(SELECT id FROM expired UNION ALL SELECT id FROM pending))
             RETURNING j.id, j.kind, j.queue, j.payload, j.attempts, j.max_attempts,
                       j.trace_context)
         SELECT f.n, c.id, c.kind, c.queue, c.payload, c.attempts, c.max_attempts,
                c.trace_context
         FROM (SELECT count(*) AS n FROM finished) f LEFT JOIN claimed c ON true";
    let statement = client.prepare_cached(SQL).await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            &statement,
            &[
                &queues,
                &kinds,
                &worker_id,
                &(lease.as_millis() as f64),
                &finished,
                &limit,
            ],
        )
        .await?;
    let mut round = Round::default();
    for r in rows {
        round.completed = usize::try_from(r.get::<_, i64>(0)).unwrap_or(0);
        let Some(id) = r.get::<_, Option<i64>>(1) else {
            continue;
        };
        round.claimed.push(Claimed {
            id,
            kind: r.get(2),
            queue: r.get(3),
            payload: r.get(4),
            attempt: r.get(5),
            max_attempts: r.get(6),
            trace_context: r.get(7),
        });
    }
    Ok(round)
}

/// Extends the lease; false when the job is no longer ours.
pub(crate) async fn heartbeat(
    client: &deadpool_postgres::Client,
    id: i64,
    worker_id: &str,
    lease: Duration,
) -> Result<bool, QueueError> {
    let statement = client
        .prepare_cached(
            "UPDATE background_jobs
             SET lease_expires_at = now() + $3 * interval '1 millisecond', updated_at = now()
             WHERE id = $1 AND locked_by = $2 AND state = 'running'",
        )
        .await?;
    let n = client
        .execute(&statement, &[&id, &worker_id, &(lease.as_millis() as f64)])
        .await?;
    Ok(n == 1)
}

/// Records a failure: back to pending with `run_at = now() + min(base * 2^(attempts-1),
/// max)`, or dead when attempts are used up or the failure is permanent.
pub(crate) async fn fail(
    client: &deadpool_postgres::Client,
    id: i64,
    worker_id: &str,
    error: &str,
    permanent: bool,
    backoff_base: Duration,
    backoff_max: Duration,
) -> Result<bool, QueueError> {
    let statement = client
        .prepare_cached(
            "UPDATE background_jobs
             SET state = CASE WHEN $4 OR attempts >= max_attempts THEN 'dead' ELSE 'pending' END,
                 run_at = CASE WHEN $4 OR attempts >= max_attempts THEN run_at
                          ELSE now() + LEAST($5 * power(2, attempts - 1), $6)
                                       * interval '1 millisecond' END,
                 finished_at = CASE WHEN $4 OR attempts >= max_attempts THEN now() END,
                 last_error = $3, locked_by = NULL, lease_expires_at = NULL, updated_at = now()
             WHERE id = $1 AND locked_by = $2 AND state = 'running'",
        )
        .await?;
    let n = client
        .execute(
            &statement,
            &[
                &id,
                &worker_id,
                &error,
                &permanent,
                &(backoff_base.as_millis() as f64),
                &(backoff_max.as_millis() as f64),
            ],
        )
        .await?;
    Ok(n == 1)
}

/// Gives a claimed job back without counting the attempt (graceful shutdown).
pub(crate) async fn release(
    client: &deadpool_postgres::Client,
    id: i64,
    worker_id: &str,
) -> Result<bool, QueueError> {
    let statement = client
        .prepare_cached(
            "UPDATE background_jobs
             SET state = 'pending', attempts = GREATEST(attempts - 1, 0), locked_by = NULL,
                 lease_expires_at = NULL, updated_at = now()
             WHERE id = $1 AND locked_by = $2 AND state = 'running'",
        )
        .await?;
    let n = client.execute(&statement, &[&id, &worker_id]).await?;
    Ok(n == 1)
}

/// How full one queue is: what an autoscaler and an operator watch.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStats {
    pub queue: String,
    /// Jobs waiting, due now or later.
    pub pending: i64,
    /// Jobs waiting and due now.
    pub due: i64,
    /// Jobs held by a worker.
    pub running: i64,
    /// Jobs that used all their attempts.
    pub dead: i64,
    /// How long the oldest due job has waited, in seconds (0 when none).
    pub oldest_due_age_secs: f64,
}

/// Depth and age per queue, one row per queue that has live or dead jobs.
pub async fn queue_stats<C: GenericClient>(client: &C) -> Result<Vec<QueueStats>, QueueError> {
    let rows = client
        .query(
            "SELECT queue,
                    count(*) FILTER (WHERE state = 'pending'),
                    count(*) FILTER (WHERE state = 'pending' AND run_at <= now()),
                    count(*) FILTER (WHERE state = 'running'),
                    count(*) FILTER (WHERE state = 'dead'),
                    COALESCE(EXTRACT(EPOCH FROM now() - min(run_at) FILTER
                        (WHERE state = 'pending' AND run_at <= now())), 0)::float8
             FROM background_jobs
             WHERE state IN ('pending', 'running', 'dead')
             GROUP BY queue ORDER BY queue",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| QueueStats {
            queue: r.get(0),
            pending: r.get(1),
            due: r.get(2),
            running: r.get(3),
            dead: r.get(4),
            oldest_due_age_secs: r.get(5),
        })
        .collect())
}
