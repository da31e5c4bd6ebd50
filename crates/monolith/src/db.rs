//! Connection pool and schema migrations.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use secrecy::ExposeSecret;
use tokio_postgres::NoTls;

use crate::config::Config;
use crate::queries::Queries;

mod embedded {
    refinery::embed_migrations!("migrations");
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("invalid DATABASE_URL: {0}")]
    Url(tokio_postgres::Error),
    #[error("building the connection pool failed: {0}")]
    Pool(String),
    #[error("database unavailable: {0}")]
    Checkout(#[from] deadpool_postgres::PoolError),
    #[error("database error: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] refinery::Error),
}

/// Publishes on the job queue's pub/sub bus (delivered at commit inside a
/// transaction). Messages small enough to travel in the notification itself
/// go out on this connection's prepared statement; larger ones take the job
/// queue's stored path.
pub async fn publish(
    db: &impl Queries,
    topic: &str,
    payload: &serde_json::Value,
) -> Result<(), job_queue::QueueError> {
    publish_to(db, topic, &[], payload).await
}

/// [`publish`] for `topic` and every topic in `also`, as one notification.
pub async fn publish_to(
    db: &impl Queries,
    topic: &str,
    also: &[&str],
    payload: &serde_json::Value,
) -> Result<(), job_queue::QueueError> {
    match job_queue::pubsub::inline_notification_to(topic, also, payload)? {
        Some(text) => {
            db.execute(
                "SELECT pg_notify($1, $2)",
                &[&job_queue::pubsub::PUBSUB_CHANNEL, &text],
            )
            .await?;
            Ok(())
        }
        None => job_queue::pubsub::publish_to(db.plain(), topic, also, payload).await,
    }
}

/// Enqueues `job` with the queue's insert kept prepared on a pooled
/// connection (parsed and planned once per connection, not per job).
pub async fn enqueue<J: job_queue::Job>(
    db: &impl Queries,
    job: &J,
    options: job_queue::EnqueueOptions,
) -> Result<job_queue::Enqueued, job_queue::QueueError> {
    let statement = db.statement(job_queue::ENQUEUE_SQL).await?;
    job_queue::enqueue_prepared(db.plain(), &statement, job, options).await
}

pub fn pool(config: &Config) -> Result<Pool, DbError> {
    pool_for_url(
        config.database_url.expose_secret(),
        config.database_pool_size,
    )
}

pub fn pool_for_url(url: &str, size: usize) -> Result<Pool, DbError> {
    let pg: tokio_postgres::Config = url.parse().map_err(DbError::Url)?;
    let manager = Manager::from_config(
        pg,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .build()
        .map_err(|e| DbError::Pool(e.to_string()))
}

/// Applies every pending migration; returns how many were applied.
pub async fn migrate(pool: &Pool) -> Result<usize, DbError> {
    let mut client = pool.get().await?;
    let report = embedded::migrations::runner()
        .run_async(&mut **client)
        .await?;
    Ok(report.applied_migrations().len())
}

/// Applies pending migrations while holding a database-wide advisory lock, so a
/// `web` and a `worker` starting together on a fresh database do not both try
/// to create the same tables.
pub async fn migrate_exclusively(pool: &Pool) -> Result<usize, DbError> {
    const LOCK: &str = "SELECT pg_advisory_lock(hashtextextended('duo_migrations', 0))";
    const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended('duo_migrations', 0))";
    if pool.status().max_size < 2 {
        // The lock needs a second connection; a one-connection pool migrates unguarded.
        return migrate(pool).await;
    }
    let guard = pool.get().await?;
    guard.execute(LOCK, &[]).await?;
    let applied = migrate(pool).await;
    // Unlock even when migrating failed: the guard goes back to the pool.
    let unlocked = guard.execute(UNLOCK, &[]).await;
    let applied = applied?;
    unlocked?;
    Ok(applied)
}

/// A key that changes whenever the embedded migrations change; test templates use it.
pub fn migrations_fingerprint() -> String {
    let mut parts: Vec<String> = embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| format!("{}:{}:{}", m.version(), m.name(), m.checksum()))
        .collect();
    parts.sort();
    format!("monolith:{}", parts.join(","))
}

/// Whether the database lacks some of the embedded migrations (a release newer
/// than the schema is running, or migrating is still under way).
pub async fn migrations_pending(client: &impl Queries) -> Result<bool, DbError> {
    let latest = embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version())
        .max()
        .unwrap_or_default();
    let applied: Option<i32> = match client
        .query_one("SELECT max(version) FROM refinery_schema_history", &[])
        .await
    {
        Ok(row) => row.get(0),
        // No history table yet: nothing is migrated.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => None,
        Err(e) => return Err(e.into()),
    };
    Ok(applied.is_none_or(|v| i64::from(v) < i64::from(latest)))
}
