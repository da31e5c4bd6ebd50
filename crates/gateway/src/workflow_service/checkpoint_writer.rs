//! Checkpoints stored behind the run instead of in its path (LangGraph's
//! "async" durability): a step hands its checkpoint over and goes on while a
//! writer task posts it to the monolith through the executor.
//!
//! The writer posts one checkpoint at a time, in order, each continuing the
//! chain of the one stored before it. When steps come faster than the
//! monolith stores them, a checkpoint still waiting is replaced by the newer
//! one: the newest state is what a resume needs, and a long run no longer
//! waits on writes that grow with its history. The run makes its state
//! durable ([`CheckpointWriter::flush`]) wherever that matters: before and
//! after any tool with side effects, before every status change, and before
//! a stream ends, so a crash can only lose read-only steps, which are simply
//! taken again on resume.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::monolith_api::{MonolithApi, MonolithApiError};
use super::state::CheckpointPost;

/// Checkpoints handed over and not yet stored.
#[derive(Default)]
struct Queue {
    /// The newest checkpoint not yet sent: its sequence number, `thread_ts`
    /// and body.
    next: Option<(u64, String, CheckpointPost)>,
    /// Sequence number of the newest checkpoint handed over.
    submitted: u64,
}

/// What the writer has done so far.
#[derive(Debug, Clone, Default)]
struct Progress {
    /// Sequence number of the newest checkpoint stored (every older one is
    /// stored or replaced by a newer one).
    stored: u64,
    /// The failure that stopped the writer.
    error: Option<MonolithApiError>,
}

/// What the run and its writer task share.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// A checkpoint was handed over.
    wake: Notify,
    /// Someone waits for the writer: cut the pause between writes short.
    hurry: Notify,
}

/// The run's checkpoint writer; dropping it stops the writer.
pub struct CheckpointWriter {
    shared: Arc<Shared>,
    progress: watch::Receiver<Progress>,
    task: tokio::task::JoinHandle<()>,
}

impl CheckpointWriter {
    /// A writer for workflow `workflow_id` whose chain continues after
    /// `parent_ts` (the newest stored checkpoint, none for a new workflow),
    /// pausing at least `interval` between writes nobody waits for: a run of
    /// quick read-only steps then costs the monolith a write per interval,
    /// not one per step, and leaves the machine to the steps themselves.
    pub fn start(
        monolith: MonolithApi,
        workflow_id: String,
        parent_ts: Option<String>,
        interval: Duration,
    ) -> Self {
        let shared = Arc::new(Shared::default());
        let (report, progress) = watch::channel(Progress::default());
        let task = tokio::spawn(write_in_order(
            monolith,
            workflow_id,
            parent_ts,
            interval,
            shared.clone(),
            report,
        ));
        Self {
            shared,
            progress,
            task,
        }
    }

    /// Hands over the newest checkpoint (`parent_ts` is filled in when it is
    /// sent). Fails with the error that stopped an earlier write.
    pub fn submit(&self, thread_ts: String, post: CheckpointPost) -> Result<(), MonolithApiError> {
        if let Some(err) = self.progress.borrow().error.clone() {
            return Err(err);
        }
        {
            let mut queue = self
                .shared
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            queue.submitted += 1;
            let sequence = queue.submitted;
            queue.next = Some((sequence, thread_ts, post));
        }
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Waits until everything handed over is stored.
    pub async fn flush(&mut self) -> Result<(), MonolithApiError> {
        let target = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .submitted;
        self.shared.hurry.notify_one();
        let progress = self
            .progress
            .wait_for(|p| p.stored >= target || p.error.is_some())
            .await
            .map_err(|_| MonolithApiError::Action("the checkpoint writer stopped".to_owned()))?;
        match &progress.error {
            Some(err) => Err(err.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for CheckpointWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn write_in_order(
    monolith: MonolithApi,
    workflow_id: String,
    mut parent_ts: Option<String>,
    interval: Duration,
    shared: Arc<Shared>,
    report: watch::Sender<Progress>,
) {
    loop {
        shared.wake.notified().await;
        loop {
            let next = shared
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .next
                .take();
            let Some((sequence, thread_ts, post)) = next else {
                break;
            };
            let body = post.with_parent(parent_ts.as_deref());
            match monolith.save_checkpoint(&workflow_id, &body).await {
                Ok(()) => {
                    parent_ts = Some(thread_ts);
                    report.send_modify(|p| p.stored = sequence);
                    // A flush may already wait on what comes next; its
                    // permit (or a later one) ends the pause at once.
                    if !interval.is_zero() {
                        tokio::select! {
                            () = tokio::time::sleep(interval) => {}
                            () = shared.hurry.notified() => {}
                        }
                    }
                }
                Err(err) => {
                    report.send_modify(|p| p.error = Some(err));
                    return;
                }
            }
        }
    }
}
