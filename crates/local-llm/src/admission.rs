//! Bounded admission for work that runs on the blocking thread pool (the
//! embedder): a few requests run at once, a bounded number wait their turn in
//! arrival order (tokio's semaphore is fair), and the rest are refused at once
//! so a burst cannot pile up unbounded CPU work behind the chat model.
//!
//! Small requests (a chat question embedded to search the code index) have a
//! lane of their own: one more slot that only they may take, with its own
//! waiting line, so a question is never queued behind an indexer's bulk
//! batches; it shares the cores with the batch running for a few milliseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Slots only small requests may take, beyond the shared ones.
const EXPRESS_SLOTS: usize = 1;

/// At most this many inputs and bytes make a request small (a question, not
/// an index batch).
pub const SMALL_MAX_INPUTS: usize = 4;
pub const SMALL_MAX_BYTES: usize = 8 * 1024;

/// Whether a request of these texts may use the small requests' lane.
pub fn is_small(texts: &[String]) -> bool {
    texts.len() <= SMALL_MAX_INPUTS
        && texts.iter().map(String::len).sum::<usize>() <= SMALL_MAX_BYTES
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmitError {
    #[error("too many requests are already waiting")]
    Full,
    #[error("admission has been shut down")]
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AdmissionStats {
    pub running: usize,
    pub waiting: usize,
    pub concurrency: usize,
    pub capacity: usize,
}

pub struct Admission {
    slots: Arc<Semaphore>,
    /// The small requests' own slot.
    express: Arc<Semaphore>,
    concurrency: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
}

/// Holds a running slot; dropping it lets the next waiter in.
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
}

/// Counts a waiter out again however its wait ends, including cancellation
/// when the client goes away.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    pub fn new(concurrency: usize, max_waiting: usize) -> Self {
        let concurrency = concurrency.max(1);
        Self {
            slots: Arc::new(Semaphore::new(concurrency)),
            express: Arc::new(Semaphore::new(EXPRESS_SLOTS)),
            concurrency,
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    /// Takes a free slot, or waits for one if fewer than `max_waiting` wait already.
    pub async fn enter(&self) -> Result<Admitted, AdmitError> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Admitted { _permit: permit });
        }
        self.wait_for(&self.slots).await
    }

    /// For a small request: a free shared slot, else the express slot, else
    /// a wait for the express slot (behind other small requests only).
    pub async fn enter_small(&self) -> Result<Admitted, AdmitError> {
        for lane in [&self.slots, &self.express] {
            if let Ok(permit) = lane.clone().try_acquire_owned() {
                return Ok(Admitted { _permit: permit });
            }
        }
        self.wait_for(&self.express).await
    }

    async fn wait_for(&self, lane: &Arc<Semaphore>) -> Result<Admitted, AdmitError> {
        let mut current = self.waiting.load(Ordering::SeqCst);
        loop {
            if current >= self.max_waiting {
                return Err(AdmitError::Full);
            }
            match self.waiting.compare_exchange(
                current,
                current + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(now) => current = now,
            }
        }
        let _waiting = Waiting(&self.waiting);
        let permit = lane
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| AdmitError::Closed)?;
        Ok(Admitted { _permit: permit })
    }

    pub fn stats(&self) -> AdmissionStats {
        AdmissionStats {
            running: self.concurrency - self.slots.available_permits().min(self.concurrency)
                + EXPRESS_SLOTS
                - self.express.available_permits().min(EXPRESS_SLOTS),
            waiting: self.waiting.load(Ordering::SeqCst),
            concurrency: self.concurrency,
            capacity: self.max_waiting,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::Poll;

    use futures::FutureExt as _;

    use super::*;

    #[tokio::test]
    async fn refuses_beyond_the_waiting_bound_and_admits_waiters_in_order() {
        let admission = Admission::new(1, 2);
        let running = admission.enter().await.expect("a free slot");

        let mut first = pin!(admission.enter());
        let mut second = pin!(admission.enter());
        // Polling once registers each waiter with the semaphore, in this order.
        assert!(first.as_mut().now_or_never().is_none());
        assert!(second.as_mut().now_or_never().is_none());
        assert_eq!(admission.stats().waiting, 2);
        assert_eq!(admission.enter().await.expect_err("full"), AdmitError::Full);

        drop(running);
        let first_in = first.as_mut().await.expect("first waiter admitted");
        // The second still waits: the first holds the only slot.
        assert!(matches!(futures::poll!(second.as_mut()), Poll::Pending));
        assert_eq!(
            admission.stats(),
            AdmissionStats {
                running: 1,
                waiting: 1,
                concurrency: 1,
                capacity: 2
            }
        );
        drop(first_in);
        let _second_in = second.await.expect("second waiter admitted");
        assert_eq!(admission.stats().waiting, 0);
    }

    #[tokio::test]
    async fn a_small_request_is_not_queued_behind_bulk_work() {
        let admission = Admission::new(1, 4);
        let bulk = admission.enter().await.expect("a free slot");
        let mut bulk_waiter = pin!(admission.enter());
        assert!(bulk_waiter.as_mut().now_or_never().is_none());
        // A question gets in at once, on its own slot, while bulk work runs and waits.
        let question = admission
            .enter_small()
            .now_or_never()
            .expect("admitted without waiting")
            .expect("admitted");
        assert_eq!(admission.stats().running, 2);
        // A second question waits for the express slot, not for the bulk one.
        let mut second = pin!(admission.enter_small());
        assert!(second.as_mut().now_or_never().is_none());
        drop(question);
        let _second_in = second.await.expect("second question admitted");
        assert!(matches!(
            futures::poll!(bulk_waiter.as_mut()),
            Poll::Pending
        ));
        drop(bulk);
        let _bulk_in = bulk_waiter.await.expect("bulk admitted");
    }

    #[test]
    fn questions_are_small_and_index_batches_are_not() {
        assert!(is_small(&["how are approvals configured?".to_owned()]));
        assert!(!is_small(&vec!["chunk".to_owned(); 16]));
        assert!(!is_small(&["x".repeat(SMALL_MAX_BYTES + 1)]));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_gives_its_place_back() {
        let admission = Admission::new(1, 1);
        let _running = admission.enter().await.expect("a free slot");
        {
            let mut waiter = pin!(admission.enter());
            assert!(waiter.as_mut().now_or_never().is_none());
            assert_eq!(admission.enter().await.expect_err("full"), AdmitError::Full);
        }
        assert_eq!(admission.stats().waiting, 0);
        let mut again = pin!(admission.enter());
        assert!(again.as_mut().now_or_never().is_none());
        assert_eq!(admission.stats().waiting, 1);
    }
}
