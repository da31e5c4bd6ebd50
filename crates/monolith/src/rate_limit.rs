//! Per-user request budgets shared by every replica (the `rate_limit_events`
//! table): `aiAction` (chat) and Duo Workflow's `direct_access` both count
//! their requests here, each under its own action name and with its own
//! limit and window from the configuration.

use std::time::Duration;

/// Counts one request of `action` for the user; `false` (and nothing counted)
/// when `limit` requests were already made within `window`. Events older
/// than the window are dropped on the way.
pub async fn take(
    client: &impl crate::queries::Queries,
    user_id: i64,
    action: &str,
    limit: u32,
    window: Duration,
) -> Result<bool, tokio_postgres::Error> {
    // One statement (migration V70): the lock, the count, the event and the
    // clean-up in one round trip, atomic per user and action.
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let row = client
        .query_one(
            "SELECT duo_rate_limit_take($1, $2, $3, $4)",
            &[&user_id, &action, &limit, &window.as_secs_f64()],
        )
        .await?;
    Ok(row.get(0))
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
