//! One generator thread owns the chat engine; requests wait in a bounded FIFO
//! queue (fair: first come, first served) and stream their events back over a
//! channel. A closed channel means the client went away, which halts decoding.

use std::thread;

use tokio::sync::mpsc;

use crate::chat_template::END_OF_TURN;
use crate::engine::{ChatEngine, EngineError, EngineFinish, Flow, SamplingParams};
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

#[derive(Clone)]
pub struct GenerationQueue {
    jobs: mpsc::Sender<Job>,
}

impl GenerationQueue {
    /// Starts the generator thread. `make_engine` runs on that thread, so an
    /// engine that is not `Sync` (or slow to load) stays there.
    pub fn start<E, F>(capacity: usize, make_engine: F) -> Result<Self, EngineError>
    where
        E: ChatEngine + 'static,
        F: FnOnce() -> Result<E, EngineError> + Send + 'static,
    {
        let (jobs, mut inbox) = mpsc::channel::<Job>(capacity.max(1));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        thread::Builder::new()
            .name("chat-generator".into())
            .spawn(move || {
                let mut engine = match make_engine() {
                    Ok(engine) => {
                        let _ = ready_tx.send(Ok(()));
                        engine
                    }
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                while let Some(job) = inbox.blocking_recv() {
                    if job.events.is_closed() {
                        continue;
                    }
                    run_job(&mut engine, job);
                }
            })
            .map_err(|e| {
                EngineError::Inference(format!("cannot start the generator thread: {e}"))
            })?;
        ready_rx.recv().map_err(|_| {
            EngineError::Inference("the generator thread exited while loading".into())
        })??;
        Ok(Self { jobs })
    }

    pub fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<mpsc::UnboundedReceiver<GenerationEvent>, SubmitError> {
        let (events, receiver) = mpsc::unbounded_channel();
        self.jobs
            .try_send(Job { request, events })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => SubmitError::QueueFull,
                mpsc::error::TrySendError::Closed(_) => SubmitError::Stopped,
            })?;
        Ok(receiver)
    }
}

fn run_job<E: ChatEngine>(engine: &mut E, job: Job) {
    let Job { request, events } = job;
    let prompt = engine.tokenize(&request.prompt);
    let mut stops = request.stop;
    // The template's end-of-turn marker may also come out as plain text.
    stops.push(END_OF_TURN.to_owned());
    let mut scanner = StopScanner::new(stops);
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
        if !step.emit.is_empty() && events.send(GenerationEvent::Delta(step.emit)).is_err() {
            return Flow::Halt;
        }
        if step.stopped {
            hit_stop = true;
            return Flow::Halt;
        }
        Flow::Continue
    });
    let event = match result {
        Ok(run) => {
            if !started {
                let _ = events.send(GenerationEvent::Started {
                    prompt_tokens: prompt_len,
                });
            }
            let rest = scanner.finish();
            if !rest.is_empty() {
                let _ = events.send(GenerationEvent::Delta(rest));
            }
            let reason = match run.finish {
                EngineFinish::Length if !hit_stop => FinishReason::Length,
                _ => FinishReason::Stop,
            };
            GenerationEvent::Finished {
                reason,
                completion_tokens: run.completion_tokens,
            }
        }
        Err(err) => GenerationEvent::Failed(err),
    };
    let _ = events.send(event);
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;

    use super::*;
    use crate::engine::EngineRun;

    /// Emits `pieces` one by one; before each it waits for a permit, so the
    /// test decides exactly how far generation gets.
    struct GatedEngine {
        pieces: Vec<&'static str>,
        permits: std_mpsc::Receiver<()>,
        emitted: std_mpsc::Sender<usize>,
    }

    impl ChatEngine for GatedEngine {
        fn tokenize(&self, text: &str) -> Vec<i32> {
            text.bytes().map(i32::from).collect()
        }
        fn detokenize(&self, _tokens: &[i32]) -> String {
            String::new()
        }
        fn context_tokens(&self) -> u32 {
            4096
        }
        fn generate(
            &mut self,
            _prompt: &[i32],
            params: &SamplingParams,
            on_piece: &mut dyn FnMut(&[u8]) -> Flow,
        ) -> Result<EngineRun, EngineError> {
            let mut produced = 0;
            for piece in self.pieces.iter().take(params.max_tokens as usize) {
                if self.permits.recv().is_err() {
                    break;
                }
                produced += 1;
                let flow = on_piece(piece.as_bytes());
                let _ = self.emitted.send(produced);
                if flow == Flow::Halt {
                    return Ok(EngineRun {
                        completion_tokens: produced,
                        finish: EngineFinish::Halted,
                    });
                }
            }
            Ok(EngineRun {
                completion_tokens: produced,
                finish: EngineFinish::Length,
            })
        }
    }

    fn request(stop: &[&str]) -> GenerationRequest {
        GenerationRequest {
            prompt: "hi".into(),
            params: SamplingParams {
                max_tokens: 100,
                ..SamplingParams::default()
            },
            stop: stop.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn start(
        pieces: Vec<&'static str>,
        capacity: usize,
    ) -> (
        GenerationQueue,
        std_mpsc::Sender<()>,
        std_mpsc::Receiver<usize>,
    ) {
        let (permit_tx, permits) = std_mpsc::channel();
        let (emitted, emitted_rx) = std_mpsc::channel();
        let queue = GenerationQueue::start(capacity, move || {
            Ok(GatedEngine {
                pieces,
                permits,
                emitted,
            })
        })
        .expect("queue starts");
        (queue, permit_tx, emitted_rx)
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

    #[tokio::test]
    async fn stop_string_split_over_pieces_ends_generation_and_is_not_emitted() {
        let (queue, permits, _emitted) = start(vec!["Thought", ": go\nObs", "ervation", ": 1"], 4);
        for _ in 0..4 {
            permits.send(()).expect("permit");
        }
        let events = queue.submit(request(&["Observation:"])).expect("accepted");
        let (text, reason) = collect(events).await;
        assert_eq!(text, "Thought: go\n");
        assert_eq!(reason, Some(FinishReason::Stop));
    }

    #[tokio::test]
    async fn end_of_turn_text_is_a_stop_too() {
        let (queue, permits, _emitted) = start(vec!["Hi", "<|im_", "end|>", "junk"], 4);
        for _ in 0..4 {
            permits.send(()).expect("permit");
        }
        let (text, reason) = collect(queue.submit(request(&[])).expect("accepted")).await;
        assert_eq!(text, "Hi");
        assert_eq!(reason, Some(FinishReason::Stop));
    }

    #[tokio::test]
    async fn full_queue_is_refused_and_jobs_run_in_order() {
        let (queue, permits, emitted) = start(vec!["a", "b"], 1);
        let mut first = queue.submit(request(&[])).expect("first runs");
        // Let the first job produce a piece so it is certainly off the queue.
        permits.send(()).expect("permit");
        assert!(matches!(
            first.recv().await,
            Some(GenerationEvent::Started { .. })
        ));
        assert_eq!(emitted.recv().expect("emitted"), 1);
        let second = queue
            .submit(request(&[]))
            .expect("second waits in the queue");
        assert!(matches!(
            queue.submit(request(&[])),
            Err(SubmitError::QueueFull)
        ));
        for _ in 0..3 {
            permits.send(()).expect("permit");
        }
        let (first_text, _) = collect(first).await;
        assert_eq!(first_text, "ab");
        let (second_text, _) = collect(second).await;
        assert_eq!(second_text, "ab");
    }

    #[tokio::test]
    async fn dropping_the_receiver_halts_generation() {
        let (queue, permits, emitted) = start(vec!["a", "b", "c", "d"], 1);
        let mut events = queue.submit(request(&[])).expect("accepted");
        permits.send(()).expect("permit");
        assert!(matches!(
            events.recv().await,
            Some(GenerationEvent::Started { .. })
        ));
        assert_eq!(emitted.recv().expect("emitted"), 1);
        drop(events);
        permits.send(()).expect("permit");
        // The engine sees the closed channel at the next piece and stops there.
        assert_eq!(emitted.recv().expect("emitted"), 2);
        // A new job starts from its first piece: the old one did not go on.
        let mut next = queue.submit(request(&[])).expect("accepted");
        permits.send(()).expect("permit");
        assert!(matches!(
            next.recv().await,
            Some(GenerationEvent::Started { .. })
        ));
        assert_eq!(emitted.recv().expect("emitted"), 1);
    }
}
