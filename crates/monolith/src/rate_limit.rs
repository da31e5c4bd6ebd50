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

/// A budget per key per minute counted in this process only: for limits that
/// must cost no query (each MCP request, registrations by address), where one
/// replica refusing a flood is enough.
pub struct PerMinute<K> {
    windows: std::sync::Mutex<std::collections::HashMap<K, (u64, u32)>>,
}

impl<K: std::hash::Hash + Eq> Default for PerMinute<K> {
    fn default() -> Self {
        Self {
            windows: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }
}

impl<K: std::hash::Hash + Eq> PerMinute<K> {
    /// Counts one use of `key`; `Err(seconds until the next minute)` when it
    /// used its `limit` this minute.
    pub fn take(&self, key: K, limit: u32) -> Result<(), u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let minute = now / 60;
        let mut windows = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Forget past minutes before the map grows without bound.
        if windows.len() > 100_000 {
            windows.retain(|_, (m, _)| *m == minute);
        }
        let entry = windows.entry(key).or_insert((minute, 0));
        if entry.0 != minute {
            *entry = (minute, 0);
        }
        if entry.1 >= limit {
            return Err(60 - now % 60);
        }
        entry.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod per_minute_tests {
    use super::PerMinute;

    #[test]
    fn each_key_has_its_own_budget() {
        let limiter = PerMinute::default();
        assert!(limiter.take(1, 2).is_ok());
        assert!(limiter.take(1, 2).is_ok());
        let wait = limiter.take(1, 2).unwrap_err();
        assert!((1..=60).contains(&wait));
        assert!(limiter.take(2, 2).is_ok());
    }
}
