//! Failed sign-ins, counted per key (`user:<name>`, `ip:<address>`): after
//! [`MAX_FAILURES`] within [`FAILURE_WINDOW_SECS`] further attempts are
//! refused without checking the password, so passwords cannot be guessed
//! at speed.

use crate::queries::Queries;

/// Failed attempts allowed per username and per address within the window.
pub const MAX_FAILURES: i64 = 5;
pub const FAILURE_WINDOW_SECS: f64 = 600.0;

/// Whether any of `keys` has used up its attempts for now.
pub async fn too_many_failures(
    db: &impl Queries,
    keys: &[String],
) -> Result<bool, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT COALESCE(max(n), 0) FROM (
                 SELECT count(*) AS n FROM sign_in_failures
                 WHERE key = ANY($1) AND occurred_at > now() - make_interval(secs => $2)
                 GROUP BY key) per_key",
            &[&keys, &FAILURE_WINDOW_SECS],
        )
        .await?;
    Ok(row.get::<_, i64>(0) >= MAX_FAILURES)
}

/// Counts a failed attempt against each of `keys`.
pub async fn record_failure(
    db: &impl Queries,
    keys: &[String],
) -> Result<(), tokio_postgres::Error> {
    for key in keys {
        db.execute("INSERT INTO sign_in_failures (key) VALUES ($1)", &[key])
            .await?;
    }
    Ok(())
}

/// Forgets the failures of `key` after a successful sign-in, and every
/// failure older than the window.
pub async fn forget_failures(db: &impl Queries, key: &str) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "DELETE FROM sign_in_failures WHERE key = $1 OR occurred_at < now() - make_interval(secs => $2)",
        &[&key, &FAILURE_WINDOW_SECS],
    )
    .await?;
    Ok(())
}
