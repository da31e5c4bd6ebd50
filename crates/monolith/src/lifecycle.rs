//! Where a process is in its life: serving, or stopping. Readiness probes answer
//! "not ready" once stopping begins, so an orchestrator sends no new traffic, and
//! long-lived connections (subscription sockets) are told to reconnect elsewhere.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

#[derive(Clone)]
pub struct Lifecycle {
    inner: Arc<Inner>,
}

struct Inner {
    stopping: AtomicBool,
    changes: watch::Sender<bool>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    pub fn new() -> Self {
        let (changes, _) = watch::channel(false);
        Self {
            inner: Arc::new(Inner {
                stopping: AtomicBool::new(false),
                changes,
            }),
        }
    }

    /// Marks the process as stopping and wakes everyone waiting on [`stopped`].
    ///
    /// [`stopped`]: Lifecycle::stopped
    pub fn begin_stopping(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        self.inner.changes.send_replace(true);
    }

    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// Resolves once stopping has begun (at once if it already has).
    pub async fn stopped(&self) {
        let mut rx = self.inner.changes.subscribe();
        // An error means the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|stopping| *stopping).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_when_stopping_begins_and_late_waiters_do_not_wait() {
        let life = Lifecycle::new();
        assert!(!life.is_stopping());
        let waiter = tokio::spawn({
            let life = life.clone();
            async move { life.stopped().await }
        });
        life.begin_stopping();
        waiter.await.unwrap();
        assert!(life.is_stopping());
        life.stopped().await;
    }
}
