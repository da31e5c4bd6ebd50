//! Per-user request budgets shared by every replica (the
//! `rate_limit_counters` table): `aiAction` (chat), mentions of the review bot
//! and Duo Workflow's `direct_access` each count their requests under their
//! own action name, with their own limit and window from the configuration.
//! As GitLab's `ApplicationRateLimiter` does, a window opens with the first
//! request counted in it and lasts its length; then the count starts again.

use std::time::Duration;

/// Counts one request of `action` for the user; `false` (and nothing counted)
/// when `limit` requests were already counted in the user's current window.
pub async fn take(
    client: &impl crate::queries::Queries,
    user_id: i64,
    action: &str,
    limit: u32,
    window: Duration,
) -> Result<bool, tokio_postgres::Error> {
    // One statement on one row (migration V71): the row lock of the upsert
    // serializes one user's checks for one action, so two replicas never both
    // take the last request of a budget. No row back: the budget is spent.
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let row = client
        .query_opt(
            "INSERT INTO rate_limit_counters AS c (user_id, action, window_ends_at, used)
             SELECT $1, $2, now() + make_interval(secs => $4), 1 WHERE $3 > 0
             ON CONFLICT (user_id, action) DO UPDATE SET
                 used = CASE WHEN c.window_ends_at <= now() THEN 1 ELSE c.used + 1 END,
                 window_ends_at = CASE WHEN c.window_ends_at <= now()
                                       THEN excluded.window_ends_at ELSE c.window_ends_at END
             WHERE c.window_ends_at <= now() OR c.used < $3
             RETURNING used",
            &[&user_id, &action, &limit, &window.as_secs_f64()],
        )
        .await?;
    Ok(row.is_some())
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
