//! Throw-away PostgreSQL databases for tests.
//!
//! Each test gets its own database, cloned with `CREATE DATABASE .. TEMPLATE` from a
//! template that was migrated once (per migration set, across all test processes).
//! Cloning takes tens of milliseconds, so every test can have a clean, fully migrated
//! database of its own.
//!
//! ```no_run
//! # async fn demo() -> Result<(), devdb::DevDbError> {
//! // Plain SQL migrations:
//! let db = devdb::TestDb::with_sql("CREATE TABLE t (id bigint)").await?;
//! let client = db.client().await?;
//! client.execute("INSERT INTO t VALUES (1)", &[]).await?;
//!
//! // Any migration runner (e.g. refinery): the key names the migration set, so a
//! // change of migrations builds a new template.
//! let key = "monolith-migrations-v1 + hash of the files";
//! let db = devdb::TestDb::new(key, |url: String| async move {
//!     // connect to `url` and migrate it
//!     Ok::<(), std::io::Error>(())
//! })
//! .await?;
//! let pool = db.pool(8)?;
//! # let _ = pool; Ok(()) }
//! ```
//!
//! Where the cluster comes from: `DATABASE_URL` when set (any role that may create
//! databases), else `scripts/postgres.sh ensure` of this repository starts the private
//! cluster. There is no silent skip: without a database, [`TestDb::new`] fails.
//!
//! Clean-up: a [`TestDb`] drops its database when dropped (best effort); databases
//! left behind by crashed test processes are dropped by the next run after two hours.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;
use tokio_postgres::{Client, NoTls};

/// Prefix of the per-test databases: `duo_test_<unix secs>_<pid>_<n>`.
const TEST_DB_PREFIX: &str = "duo_test_";
/// Prefix of the migrated templates: `duo_tpl_<hash of the migration set>`.
const TEMPLATE_PREFIX: &str = "duo_tpl_";
/// Leftover test databases older than this are dropped at the next start.
const STALE_AFTER: Duration = Duration::from_secs(2 * 60 * 60);

/// Everything that can go wrong while providing a test database.
#[derive(Debug, thiserror::Error)]
pub enum DevDbError {
    #[error("cannot start the private PostgreSQL ({script}): {reason}")]
    Cluster { script: String, reason: String },
    #[error("PostgreSQL error: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("migrating the template database failed: {0}")]
    Migrate(String),
    #[error("building a connection pool failed: {0}")]
    Pool(String),
    #[error("timed out: {0}")]
    Timeout(&'static str),
}

static CLUSTER_URL: OnceCell<String> = OnceCell::const_new();
static SWEPT: AtomicBool = AtomicBool::new(false);
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// URL of the PostgreSQL cluster tests use: `DATABASE_URL`, else the private cluster
/// started by `scripts/postgres.sh ensure`.
pub async fn cluster_url() -> Result<String, DevDbError> {
    CLUSTER_URL
        .get_or_try_init(|| async {
            if let Ok(url) = std::env::var("DATABASE_URL")
                && !url.trim().is_empty()
            {
                return Ok(url);
            }
            let script = find_script();
            tokio::task::spawn_blocking(move || run_ensure(&script))
                .await
                .map_err(|e| DevDbError::Cluster {
                    script: "scripts/postgres.sh".into(),
                    reason: e.to_string(),
                })?
        })
        .await
        .cloned()
}

fn find_script() -> PathBuf {
    // This crate lives at <repo>/crates/devdb; the script at <repo>/scripts.
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidate = here.join("../../scripts/postgres.sh");
    if candidate.exists() {
        return candidate;
    }
    // Fall back to the running test crate's directory and its parents.
    if let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") {
        let mut dir = PathBuf::from(dir);
        loop {
            let c = dir.join("scripts/postgres.sh");
            if c.exists() {
                return c;
            }
            if !dir.pop() {
                break;
            }
        }
    }
    candidate
}

fn run_ensure(script: &std::path::Path) -> Result<String, DevDbError> {
    let fail = |reason: String| DevDbError::Cluster {
        script: script.display().to_string(),
        reason,
    };
    let out = std::process::Command::new("bash")
        .arg(script)
        .arg("ensure")
        .env_remove("DATABASE_URL")
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("DATABASE_URL=").map(str::to_owned))
        .ok_or_else(|| fail("no DATABASE_URL line in its output".into()))
}

/// The same server as `url`, but database `dbname`.
pub fn url_with_database(url: &str, dbname: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        // key=value form: a later dbname wins.
        return format!("{url} dbname={dbname}");
    };
    let rest_start = scheme_end + 3;
    let (base, query) = match url.find('?') {
        Some(q) => (&url[..q], &url[q..]),
        None => (url, ""),
    };
    let authority_end = base[rest_start..]
        .find('/')
        .map_or(base.len(), |i| rest_start + i);
    format!("{}/{}{}", &base[..authority_end], dbname, query)
}

async fn connect(url: &str) -> Result<Client, DevDbError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "devdb connection closed");
        }
    });
    Ok(client)
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A database of its own for one test, dropped when this value is dropped.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    url: String,
    admin_url: String,
}

impl TestDb {
    /// A database migrated with plain SQL (run as one batch).
    pub async fn with_sql(sql: &str) -> Result<Self, DevDbError> {
        let sql = sql.to_owned();
        Self::new(&format!("sql:{sql}"), |url: String| async move {
            let client = connect(&url).await.map_err(|e| e.to_string())?;
            client.batch_execute(&sql).await.map_err(|e| e.to_string())
        })
        .await
    }

    /// A database cloned from the template of the migration set named by
    /// `migrations_key` (hashed). `migrate` receives the URL of the database to
    /// migrate and runs only when that template does not exist yet.
    pub async fn new<F, Fut, E>(migrations_key: &str, migrate: F) -> Result<Self, DevDbError>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let admin_url = cluster_url().await?;
        let admin = connect(&admin_url).await?;
        let digest = Sha256::digest(migrations_key.as_bytes());
        let template = format!("{TEMPLATE_PREFIX}{}", hex::encode(&digest[..8]));
        let lock_key = i64::from_be_bytes([
            digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7],
        ]);

        ensure_template(&admin, &admin_url, &template, lock_key, migrate).await?;

        let name = format!(
            "{TEST_DB_PREFIX}{}_{}_{}",
            unix_secs(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let create = format!(
            "CREATE DATABASE {} TEMPLATE {}",
            quote_ident(&name),
            quote_ident(&template)
        );
        retry_in_use(|| admin.batch_execute(&create)).await?;
        let url = url_with_database(&admin_url, &name);
        Ok(Self {
            name,
            url,
            admin_url,
        })
    }

    /// Connection URL of this test's database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Name of this test's database.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new connection to this test's database (its driver task is spawned).
    pub async fn client(&self) -> Result<Client, DevDbError> {
        connect(&self.url).await
    }

    /// A connection pool on this test's database.
    pub fn pool(&self, max_size: usize) -> Result<Pool, DevDbError> {
        pool_for_url(&self.url, max_size)
    }
}

/// A deadpool-postgres pool (no TLS) for `url`.
pub fn pool_for_url(url: &str, max_size: usize) -> Result<Pool, DevDbError> {
    let config: tokio_postgres::Config = url.parse()?;
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .build()
        .map_err(|e| DevDbError::Pool(e.to_string()))
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Dropping needs async I/O; do it on a thread with its own small runtime so
        // it works from inside or outside a tokio runtime.
        let handle = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(admin) = connect(&admin_url).await {
                    let sql = format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        quote_ident(&name)
                    );
                    if let Err(e) = admin.batch_execute(&sql).await {
                        tracing::debug!(error = %e, db = %name, "could not drop test database");
                    }
                }
            });
        });
        let _ = handle.join();
    }
}

async fn ensure_template<F, Fut, E>(
    admin: &Client,
    admin_url: &str,
    template: &str,
    lock_key: i64,
    migrate: F,
) -> Result<(), DevDbError>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    if database_exists(admin, template).await? && SWEPT.load(Ordering::Relaxed) {
        return Ok(());
    }
    // One process builds the template; the others wait on this session lock.
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&lock_key])
        .await?;
    let result: Result<(), DevDbError> = async {
        sweep_stale(admin).await?;
        if database_exists(admin, template).await? {
            return Ok(());
        }
        let building = format!("{template}_build");
        // Separate statements: DROP/CREATE DATABASE refuse to run in a transaction.
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_ident(&building)
            ))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {}", quote_ident(&building)))
            .await?;
        migrate(url_with_database(admin_url, &building))
            .await
            .map_err(|e| DevDbError::Migrate(e.to_string()))?;
        // The migration's connections may still be closing: end them, then rename
        // (a renamed, complete template is what other processes look for).
        let rename = format!(
            "ALTER DATABASE {} RENAME TO {}",
            quote_ident(&building),
            quote_ident(template)
        );
        retry_in_use(|| async {
            admin
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&building],
                )
                .await?;
            admin.batch_execute(&rename).await
        })
        .await?;
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {} WITH IS_TEMPLATE true",
                quote_ident(template)
            ))
            .await?;
        Ok(())
    }
    .await;
    let unlock = admin
        .execute("SELECT pg_advisory_unlock($1)", &[&lock_key])
        .await;
    result?;
    unlock?;
    Ok(())
}

async fn database_exists(admin: &Client, name: &str) -> Result<bool, DevDbError> {
    Ok(admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some())
}

/// Drops test databases left behind by crashed processes (once per process).
async fn sweep_stale(admin: &Client) -> Result<(), DevDbError> {
    if SWEPT.swap(true, Ordering::Relaxed) {
        return Ok(());
    }
    let cutoff = unix_secs().saturating_sub(STALE_AFTER.as_secs());
    let rows = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE $1",
            &[&format!("{TEST_DB_PREFIX}%")],
        )
        .await?;
    for row in rows {
        let name: String = row.get(0);
        let created = name
            .strip_prefix(TEST_DB_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        if created.is_some_and(|secs| secs < cutoff) {
            let sql = format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_ident(&name)
            );
            if let Err(e) = admin.batch_execute(&sql).await {
                tracing::debug!(error = %e, db = %name, "could not drop stale test database");
            }
        }
    }
    Ok(())
}

/// Retries an operation that fails with "object in use" (55006), which CREATE
/// DATABASE .. TEMPLATE and RENAME report while another session touches the source.
async fn retry_in_use<F, Fut, T>(mut op: F) -> Result<T, DevDbError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tokio_postgres::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE)
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE) => {
                return Err(DevDbError::Timeout("database in use by another session"));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database_in_urls() {
        assert_eq!(
            url_with_database("postgres://postgres@127.0.0.1:54329/postgres", "x"),
            "postgres://postgres@127.0.0.1:54329/x"
        );
        assert_eq!(
            url_with_database("postgresql://u:p@h/db?sslmode=disable", "y"),
            "postgresql://u:p@h/y?sslmode=disable"
        );
        assert_eq!(url_with_database("postgres://h:1", "z"), "postgres://h:1/z");
        assert_eq!(
            url_with_database("host=h user=u", "z"),
            "host=h user=u dbname=z"
        );
    }
}
