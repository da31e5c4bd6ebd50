//! Per-user request budgets shared by every replica (the `rate_limit_events`
//! table): `aiAction` (chat) and Duo Workflow's `direct_access` both count
//! their requests here, each under its own action name and with its own
//! limit and window from the configuration.

use std::time::Duration;

/// Counts one request of `action` for the user; `false` (and nothing counted)
/// when `limit` requests were already made within `window`. Events older
/// than the window are dropped on the way.
pub async fn take(
    client: &mut deadpool_postgres::Client,
    user_id: i64,
    action: &str,
    limit: u32,
    window: Duration,
) -> Result<bool, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    // One user's requests of one action are counted one at a time across
    // replicas.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($2 || ':' || $1::bigint::text, 0))",
        &[&user_id, &action],
    )
    .await?;
    let secs = window.as_secs_f64();
    let used: i64 = tx
        .query_one(
            "SELECT count(*) FROM rate_limit_events
             WHERE user_id = $1 AND action = $2 AND occurred_at > now() - make_interval(secs => $3)",
            &[&user_id, &action, &secs],
        )
        .await?
        .get(0);
    if used >= i64::from(limit) {
        return Ok(false);
    }
    tx.execute(
        "INSERT INTO rate_limit_events (user_id, action) VALUES ($1, $2)",
        &[&user_id, &action],
    )
    .await?;
    tx.execute(
        "DELETE FROM rate_limit_events WHERE user_id = $1 AND action = $2
           AND occurred_at <= now() - make_interval(secs => $3)",
        &[&user_id, &action, &secs],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}
