//! One generator thread owns the chat engine; requests wait in a bounded FIFO
//! queue (fair: first come, first served) and stream their events back over a
//! channel. A closed channel means the client went away, which halts decoding.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::engine::{ChatEngine, EngineError, EngineFinish, Flow, ModelInfo, SamplingParams};
use crate::stop::StopScanner;

#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub prompt: String,
    pub params: SamplingParams,
    pub stop: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

#[derive(Debug)]
pub enum GenerationEvent {
    /// The prompt was accepted and processed; text follows.
    Started {
        prompt_tokens: usize,
    },
    Delta(String),
    Finished {
        reason: FinishReason,
        completion_tokens: usize,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
    },
    Failed(EngineError),
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the generation queue is full")]
    QueueFull,
    #[error("the generator has stopped")]
    Stopped,
}

struct Job {
    request: GenerationRequest,
    events: mpsc::UnboundedSender<GenerationEvent>,
}

impl Job {
    /// The receiver is dropped when the client goes away (or the handler is cancelled).
    fn abandoned(&self) -> bool {
        self.events.is_closed()
    }
}

/// A snapshot of the queue, for `/health` and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// A generation is in progress.
    pub running: bool,
    /// Jobs waiting whose client is still there.
    pub waiting: usize,
    pub capacity: usize,
    /// Jobs dropped unrun because their client left while they waited.
    pub skipped: u64,
    pub completed: u64,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    running: bool,
    /// The generator is gone (all handles dropped, or its thread ended).
    stopped: bool,
    /// The generator thread has ended and its engine is freed.
    exited: bool,
    skipped: u64,
    completed: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// Tokens processed since start, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenTotals {
    pub prompt: u64,
    pub completion: u64,
}

struct Shared {
    state: Mutex<QueueState>,
    wake: Condvar,
    capacity: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // The state stays consistent across a panic (no half-done updates), so
        // a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stop(&self) {
        let mut state = self.lock();
        state.stopped = true;
        // Dropping the waiting jobs closes their channels: their handlers answer at once.
        state.jobs.clear();
        drop(state);
        self.wake.notify_all();
    }

    /// Blocks until a live job is waiting; `None` once the queue has stopped.
    fn next_job(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.stopped {
                return None;
            }
            while let Some(job) = state.jobs.pop_front() {
                if job.abandoned() {
                    state.skipped += 1;
                    continue;
                }
                state.running = true;
                return Some(job);
            }
            state = self
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn job_done(&self, tokens: TokenTotals) {
        let mut state = self.lock();
        state.running = false;
        state.completed += 1;
        state.prompt_tokens += tokens.prompt;
        state.completion_tokens += tokens.completion;
    }
}

/// Stops the generator when the last queue handle goes away.
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Marks the queue stopped however the generator thread ends, a panic included,
/// so requests get an error instead of waiting forever.
struct GeneratorExit(Arc<Shared>);

impl Drop for GeneratorExit {
    fn drop(&mut self) {
        self.0.stop();
        self.0.lock().exited = true;
        self.0.wake.notify_all();
    }
}

#[derive(Clone)]
pub struct GenerationQueue {
    owner: Arc<Owner>,
    info: Arc<ModelInfo>,
}

impl GenerationQueue {
    /// Starts the generator thread. `make_engine` runs on that thread, so an
    /// engine that is slow to load (or tied to its thread) stays there.
    /// `capacity` counts waiting jobs, not the running one.
    /// Text decoded within `pieces_every` of the last piece sent waits and
    /// leaves with the next one (see [`PieceBatcher`]); zero sends every piece.
    pub fn start<E, F>(
        capacity: usize,
        pieces_every: Duration,
        make_engine: F,
    ) -> Result<Self, EngineError>
    where
        E: ChatEngine + 'static,
        F: FnOnce() -> Result<E, EngineError> + Send + 'static,
    {
        let shared = Arc::new(Shared {
            state: Mutex::new(QueueState::default()),
            wake: Condvar::new(),
            capacity: capacity.max(1),
        });
        let worker = shared.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        thread::Builder::new()
            .name("chat-generator".into())
            .spawn(move || {
                let _exit = GeneratorExit(worker.clone());
                let mut engine = match make_engine() {
                    Ok(engine) => {
                        let _ = ready_tx.send(Ok(engine.model_info()));
                        engine
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                while let Some(job) = worker.next_job() {
                    let (events, last, tokens) = run_job(&mut engine, job, pieces_every);
                    // Counted before the client hears the end, so `/health`
                    // never lags behind what a client has seen.
                    worker.job_done(tokens);
                    let _ = events.send(last);
                }
            })
            .map_err(|e| {
                EngineError::Inference(format!("cannot start the generator thread: {e}"))
            })?;
        let info = ready_rx.recv().map_err(|_| {
            EngineError::Inference("the generator thread exited while loading".into())
        })??;
        Ok(Self {
            owner: Arc::new(Owner(shared)),
            info: Arc::new(info),
        })
    }

    /// Stops taking jobs and waits up to `within` for the generator thread to
    /// end (the running job ends at its next token once its client is gone)
    /// and free its engine. The process must not exit before that: the
    /// native inference library's globals are torn down at exit while its
    /// thread may still be decoding. Returns whether the thread ended.
    pub fn stop_and_wait(&self, within: std::time::Duration) -> bool {
        let shared = &self.owner.0;
        shared.stop();
        let state = shared.lock();
        let (state, _) = shared
            .wake
            .wait_timeout_while(state, within, |s| !s.exited)
            .unwrap_or_else(PoisonError::into_inner);
        state.exited
    }

    /// What the loaded model file says about itself (chat template, special tokens).
    pub fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    /// Queues a request, or refuses it at once when the queue is full. Jobs
    /// whose client already left are dropped first: they hold no place.
    pub fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<mpsc::UnboundedReceiver<GenerationEvent>, SubmitError> {
        let shared = &self.owner.0;
        let mut state = shared.lock();
        if state.stopped {
            return Err(SubmitError::Stopped);
        }
        let before = state.jobs.len();
        state.jobs.retain(|job| !job.abandoned());
        state.skipped += (before - state.jobs.len()) as u64;
        if state.jobs.len() >= shared.capacity {
            return Err(SubmitError::QueueFull);
        }
        let (events, receiver) = mpsc::unbounded_channel();
        state.jobs.push_back(Job { request, events });
        drop(state);
        shared.wake.notify_one();
        Ok(receiver)
    }

    pub fn token_totals(&self) -> TokenTotals {
        let state = self.owner.0.lock();
        TokenTotals {
            prompt: state.prompt_tokens,
            completion: state.completion_tokens,
        }
    }

    pub fn stats(&self) -> QueueStats {
        let shared = &self.owner.0;
        let state = shared.lock();
        QueueStats {
            running: state.running,
            waiting: state.jobs.iter().filter(|job| !job.abandoned()).count(),
            capacity: shared.capacity,
            skipped: state.skipped,
            completed: state.completed,
        }
    }
}

/// Runs one job, streaming its text; returns the channel with the final event
/// still to send, and the tokens the run processed.
fn run_job<E: ChatEngine>(
    engine: &mut E,
    job: Job,
    pieces_every: Duration,
) -> (
    mpsc::UnboundedSender<GenerationEvent>,
    GenerationEvent,
    TokenTotals,
) {
    let Job { request, events } = job;
    let prompt = engine.tokenize(&request.prompt);
    let mut stops = request.stop;
    // The end-of-turn marker may also come out spelled in ordinary tokens.
    stops.extend(engine.model_info().end_of_turn_texts);
    let mut scanner = StopScanner::new(stops);
    let mut batcher = PieceBatcher::new(pieces_every);
    let mut started = false;
    let mut hit_stop = false;
    let prompt_len = prompt.len();
    let result = engine.generate(&prompt, &request.params, &mut |piece| {
        if events.is_closed() {
            return Flow::Halt;
        }
        if !started {
            started = true;
            if events
                .send(GenerationEvent::Started {
                    prompt_tokens: prompt_len,
                })
                .is_err()
            {
                return Flow::Halt;
            }
        }
        let step = scanner.push(piece);
        if let Some(text) = batcher.push(step.emit, Instant::now())
            && events.send(GenerationEvent::Delta(text)).is_err()
        {
            return Flow::Halt;
        }
        if step.stopped {
            hit_stop = true;
            return Flow::Halt;
        }
        Flow::Continue
    });
    let mut tokens = TokenTotals {
        prompt: 0,
        completion: 0,
    };
    // What the batcher still holds goes out before the end, even a failure.
    let mut held = batcher.take();
    let event = match result {
        Ok(run) => {
            tokens = TokenTotals {
                prompt: prompt_len as u64,
                completion: run.completion_tokens as u64,
            };
            if !started {
                let _ = events.send(GenerationEvent::Started {
                    prompt_tokens: prompt_len,
                });
            }
            held.push_str(&scanner.finish());
            if !held.is_empty() {
                let _ = events.send(GenerationEvent::Delta(held));
            }
            let reason = match run.finish {
                EngineFinish::Length if !hit_stop => FinishReason::Length,
                _ => FinishReason::Stop,
            };
            GenerationEvent::Finished {
                reason,
                completion_tokens: run.completion_tokens,
                cached_tokens: run.cached_tokens,
            }
        }
        Err(err) => {
            if !held.is_empty() {
                let _ = events.send(GenerationEvent::Delta(held));
            }
            GenerationEvent::Failed(err)
        }
    };
    (events, event, tokens)
}

/// Gathers the decoded text of a fast model into fewer pieces.
///
/// Every piece sent wakes the HTTP side, which then competes for the cores
/// with the engine's compute threads; when both cores decode, the thread it
/// pre-empts holds the other one up at the next barrier (measured: streaming
/// cost our decode 7% where llama-server lost 3%). The first piece leaves at
/// once (time to first token is unchanged); later text leaves when
/// `every` has passed since the last piece sent, so a model slower than that
/// still streams token by token and nothing waits longer than `every` plus
/// one token's decode.
struct PieceBatcher {
    every: Duration,
    held: String,
    last_sent: Option<Instant>,
}

impl PieceBatcher {
    fn new(every: Duration) -> Self {
        Self {
            every,
            held: String::new(),
            last_sent: None,
        }
    }

    /// Takes the text a step released; returns what to send now, if anything.
    fn push(&mut self, text: String, now: Instant) -> Option<String> {
        if text.is_empty() {
            return None;
        }
        if self.held.is_empty() {
            self.held = text;
        } else {
            self.held.push_str(&text);
        }
        let due = self
            .last_sent
            .is_none_or(|at| now.saturating_duration_since(at) >= self.every);
        if !due {
            return None;
        }
        self.last_sent = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// The text still held back.
    fn take(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{EngineGate, GateReport, gated_engine};

    fn request(prompt: &str, stop: &[&str]) -> GenerationRequest {
        GenerationRequest {
            prompt: prompt.into(),
            params: SamplingParams {
                max_tokens: 100,
                ..SamplingParams::default()
            },
            stop: stop.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn start(pieces: &[&str], capacity: usize) -> (GenerationQueue, EngineGate) {
        start_batching(pieces, capacity, Duration::ZERO)
    }

    fn start_batching(
        pieces: &[&str],
        capacity: usize,
        every: Duration,
    ) -> (GenerationQueue, EngineGate) {
        let (engine, gate) = gated_engine(pieces);
        let queue =
            GenerationQueue::start(capacity, every, move || Ok(engine)).expect("queue starts");
        (queue, gate)
    }

    /// Every event up to the end, in order.
    async fn events_of(mut events: mpsc::UnboundedReceiver<GenerationEvent>) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some(event) = events.recv().await {
            seen.push(match event {
                GenerationEvent::Started { .. } => "started".to_owned(),
                GenerationEvent::Delta(text) => format!("delta {text}"),
                GenerationEvent::Finished { .. } => "finished".to_owned(),
                GenerationEvent::Failed(_) => "failed".to_owned(),
            });
        }
        seen
    }

    #[test]
    fn the_first_piece_leaves_at_once_and_later_ones_once_the_interval_has_passed() {
        let every = Duration::from_millis(20);
        let mut batcher = PieceBatcher::new(every);
        let t0 = Instant::now();
        assert_eq!(batcher.push("Once".into(), t0), Some("Once".into()));
        assert_eq!(batcher.push(" upon".into(), t0 + every / 2), None);
        // Empty text neither sends nor restarts the interval.
        assert_eq!(batcher.push(String::new(), t0 + every), None);
        assert_eq!(
            batcher.push(" a".into(), t0 + every - Duration::from_millis(1)),
            None
        );
        assert_eq!(
            batcher.push(" time".into(), t0 + every),
            Some(" upon a time".into())
        );
        // The interval counts from the last piece sent.
        assert_eq!(batcher.push(",".into(), t0 + every + every / 2), None);
        assert_eq!(batcher.take(), ",");
        assert_eq!(batcher.take(), "");
    }

    #[test]
    fn without_an_interval_every_piece_leaves_alone() {
        let mut batcher = PieceBatcher::new(Duration::ZERO);
        let t0 = Instant::now();
        for piece in ["a", "b", "c"] {
            assert_eq!(batcher.push(piece.into(), t0), Some(piece.into()));
        }
        assert_eq!(batcher.take(), "");
    }

    #[tokio::test]
    async fn held_text_leaves_before_the_end_and_nothing_is_lost() {
        // An interval no run reaches: the first piece alone, the rest with the end.
        let (queue, gate) = start_batching(&["a", "b", "c", "d"], 1, Duration::from_secs(3600));
        gate.allow(4);
        let events = events_of(queue.submit(request("hi", &[])).expect("accepted")).await;
        assert_eq!(events, ["started", "delta a", "delta bcd", "finished"]);
        // A stop string found in held text: what precedes it still arrives.
        let (queue, gate) = start_batching(
            &["x", "y", "Obs", "ervation:", "z"],
            1,
            Duration::from_secs(3600),
        );
        gate.allow(5);
        let events = events_of(
            queue
                .submit(request("hi", &["Observation:"]))
                .expect("accepted"),
        )
        .await;
        assert_eq!(events, ["started", "delta x", "delta y", "finished"]);
    }

    async fn collect(
        mut events: mpsc::UnboundedReceiver<GenerationEvent>,
    ) -> (String, Option<FinishReason>) {
        let mut text = String::new();
        let mut reason = None;
        while let Some(event) = events.recv().await {
            match event {
                GenerationEvent::Delta(t) => text.push_str(&t),
                GenerationEvent::Finished { reason: r, .. } => reason = Some(r),
                GenerationEvent::Started { .. } | GenerationEvent::Failed(_) => {}
            }
        }
        (text, reason)
    }

    /// Waits until the engine has begun generating `prompt`.
    async fn started(gate: &mut EngineGate, prompt: &str) {
        let report = gate.next().await.expect("a report");
        assert_eq!(
            report,
            GateReport::Started {
                prompt: prompt.to_owned()
            }
        );
    }

    #[tokio::test]
    async fn stop_string_split_over_pieces_ends_generation_and_is_not_emitted() {
        let (queue, gate) = start(&["Thought", ": go\nObs", "ervation", ": 1"], 4);
        gate.allow(4);
        let events = queue
            .submit(request("hi", &["Observation:"]))
            .expect("accepted");
        let (text, reason) = collect(events).await;
        assert_eq!(text, "Thought: go\n");
        assert_eq!(reason, Some(FinishReason::Stop));
    }

    #[tokio::test]
    async fn end_of_turn_text_is_a_stop_too() {
        let (queue, gate) = start(&["Hi", "<|im_", "end|>", "junk"], 4);
        gate.allow(4);
        let (text, reason) = collect(queue.submit(request("hi", &[])).expect("accepted")).await;
        assert_eq!(text, "Hi");
        assert_eq!(reason, Some(FinishReason::Stop));
    }

    #[tokio::test]
    async fn reaching_max_tokens_finishes_with_length() {
        let (queue, gate) = start(&["a", "b", "c", "d"], 1);
        gate.allow(4);
        let mut short = request("hi", &[]);
        short.params.max_tokens = 2;
        let (text, reason) = collect(queue.submit(short).expect("accepted")).await;
        assert_eq!(text, "ab");
        assert_eq!(reason, Some(FinishReason::Length));
    }

    #[tokio::test]
    async fn full_queue_is_refused_until_a_place_frees() {
        let (queue, mut gate) = start(&["a", "b"], 1);
        let first = queue.submit(request("first", &[])).expect("first runs");
        started(&mut gate, "first").await;
        let second = queue
            .submit(request("second", &[]))
            .expect("second waits in the queue");
        assert!(matches!(
            queue.submit(request("third", &[])),
            Err(SubmitError::QueueFull)
        ));
        assert_eq!(queue.stats().waiting, 1);
        assert!(queue.stats().running);
        gate.allow(4);
        assert_eq!(collect(first).await.0, "ab");
        assert_eq!(collect(second).await.0, "ab");
        assert_eq!(queue.stats().completed, 2);
        // The gated engine's tokens are the prompt's bytes: "first" and "second".
        assert_eq!(
            queue.token_totals(),
            TokenTotals {
                prompt: 11,
                completion: 4
            }
        );
    }

    #[tokio::test]
    async fn several_waiting_jobs_run_in_arrival_order() {
        let (queue, mut gate) = start(&["x"], 8);
        let running = queue.submit(request("job-0", &[])).expect("accepted");
        started(&mut gate, "job-0").await;
        let waiting: Vec<_> = (1..=5)
            .map(|i| {
                queue
                    .submit(request(&format!("job-{i}"), &[]))
                    .expect("accepted")
            })
            .collect();
        assert_eq!(queue.stats().waiting, 5);
        gate.allow(6);
        let mut order = Vec::new();
        for _ in 0..6 {
            order.push(gate.finished().await.expect("a run finishes").0);
        }
        let expected: Vec<String> = (0..=5).map(|i| format!("job-{i}")).collect();
        assert_eq!(order, expected);
        drop((running, waiting));
    }

    #[tokio::test]
    async fn dropping_the_receiver_halts_generation() {
        let (queue, mut gate) = start(&["a", "b", "c", "d"], 1);
        let mut events = queue.submit(request("hi", &[])).expect("accepted");
        gate.allow(1);
        assert!(matches!(
            events.recv().await,
            Some(GenerationEvent::Started { .. })
        ));
        // The first piece is fully handed over before the client leaves.
        while gate.next().await.expect("report") != (GateReport::Piece { count: 1 }) {}
        drop(events);
        gate.allow(3);
        // The engine sees the closed channel at the next piece and stops there.
        let (_, run) = gate.finished().await.expect("the run ends");
        assert_eq!(run.finish, EngineFinish::Halted);
        assert_eq!(run.completion_tokens, 2);
    }

    #[tokio::test]
    async fn a_waiting_job_whose_client_left_is_skipped_and_frees_its_place() {
        let (queue, mut gate) = start(&["a"], 1);
        let running = queue.submit(request("running", &[])).expect("accepted");
        started(&mut gate, "running").await;
        let gone = queue.submit(request("gone", &[])).expect("accepted");
        drop(gone);
        assert_eq!(queue.stats().waiting, 0);
        // The abandoned job holds no place: another request still fits.
        let next = queue.submit(request("next", &[])).expect("accepted");
        gate.allow(2);
        assert_eq!(collect(running).await.0, "a");
        assert_eq!(collect(next).await.0, "a");
        assert_eq!(gate.finished().await.expect("finished").0, "running");
        assert_eq!(gate.finished().await.expect("finished").0, "next");
        assert_eq!(queue.stats().skipped, 1);
        assert_eq!(queue.stats().completed, 2);
    }

    #[tokio::test]
    async fn stopping_waits_until_the_running_job_has_ended_and_the_engine_is_freed() {
        let (queue, mut gate) = start(&["a", "b", "c"], 2);
        let running = queue.submit(request("running", &[])).expect("accepted");
        started(&mut gate, "running").await;
        // The engine is inside the job, held by the gate: the thread goes on.
        let waiter = queue.clone();
        let early = tokio::task::spawn_blocking(move || {
            waiter.stop_and_wait(std::time::Duration::from_millis(100))
        });
        assert!(!early.await.unwrap(), "returned while the job still ran");
        assert!(matches!(
            queue.submit(request("late", &[])),
            Err(SubmitError::Stopped)
        ));
        // The client leaves; the job ends at its next token and the thread with it.
        drop(running);
        gate.allow(3);
        let waiter = queue.clone();
        let ended = tokio::task::spawn_blocking(move || {
            waiter.stop_and_wait(std::time::Duration::from_secs(10))
        });
        assert!(ended.await.unwrap(), "the generator thread did not end");
    }

    #[tokio::test]
    async fn dropping_the_queue_stops_the_generator_and_fails_waiters() {
        let (queue, mut gate) = start(&["a"], 2);
        let running = queue.submit(request("running", &[])).expect("accepted");
        started(&mut gate, "running").await;
        let waiting = queue.submit(request("waiting", &[])).expect("accepted");
        drop(queue);
        // The waiting job's channel closes without any event.
        assert_eq!(collect(waiting).await, (String::new(), None));
        gate.allow(1);
        assert_eq!(collect(running).await.0, "a");
    }
}
