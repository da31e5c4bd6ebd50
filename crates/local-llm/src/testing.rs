//! Test doubles for the engine seams, shared by the unit tests and the HTTP
//! tests in `tests/`. They let a test decide exactly how far a generation or
//! an embedding call gets, so queueing and cancellation are tested without
//! timing guesses. Not part of the server's API.

use std::sync::Mutex;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::embeddings::{EmbedError, EmbedModel, Embedded};
use crate::engine::{
    ChatEngine, EngineError, EngineFinish, EngineRun, Flow, ModelInfo, SamplingParams,
};

/// How long a test waits for a report before giving up (a hang guard, not a delay).
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// What the gated chat engine did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateReport {
    /// A generation began for this prompt text.
    Started { prompt: String },
    /// The `count`-th piece of the current run was handed to the sink.
    Piece { count: usize },
    /// The run ended.
    Finished { prompt: String, run: EngineRun },
}

/// A chat engine that emits `pieces` one by one, each only after the test
/// grants a permit. Tokens are the prompt's bytes, so reports carry the prompt.
pub struct GatedEngine {
    pieces: Vec<String>,
    permits: std_mpsc::Receiver<()>,
    reports: mpsc::UnboundedSender<GateReport>,
}

/// The test's side of a `GatedEngine`.
pub struct EngineGate {
    permits: std_mpsc::Sender<()>,
    reports: mpsc::UnboundedReceiver<GateReport>,
}

pub fn gated_engine(pieces: &[&str]) -> (GatedEngine, EngineGate) {
    let (permit_tx, permits) = std_mpsc::channel();
    let (reports, report_rx) = mpsc::unbounded_channel();
    (
        GatedEngine {
            pieces: pieces.iter().map(|p| (*p).to_owned()).collect(),
            permits,
            reports,
        },
        EngineGate {
            permits: permit_tx,
            reports: report_rx,
        },
    )
}

impl EngineGate {
    /// Lets the engine produce `pieces` more pieces (across runs).
    pub fn allow(&self, pieces: usize) {
        for _ in 0..pieces {
            let _ = self.permits.send(());
        }
    }

    /// The next report, or `None` if none comes within `REPORT_TIMEOUT`.
    pub async fn next(&mut self) -> Option<GateReport> {
        tokio::time::timeout(REPORT_TIMEOUT, self.reports.recv())
            .await
            .ok()
            .flatten()
    }

    /// Skips piece reports up to the next `Finished`.
    pub async fn finished(&mut self) -> Option<(String, EngineRun)> {
        loop {
            if let GateReport::Finished { prompt, run } = self.next().await? {
                return Some((prompt, run));
            }
        }
    }

    /// A report that has already arrived, without waiting.
    pub fn try_next(&mut self) -> Option<GateReport> {
        self.reports.try_recv().ok()
    }
}

impl ChatEngine for GatedEngine {
    fn tokenize(&self, text: &str) -> Vec<i32> {
        text.bytes().map(i32::from).collect()
    }

    fn detokenize(&self, tokens: &[i32]) -> String {
        let bytes: Vec<u8> = tokens
            .iter()
            .map(|t| u8::try_from(*t).unwrap_or(b'?'))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn context_tokens(&self) -> u32 {
        4096
    }

    /// No template of its own: the server falls back to ChatML.
    fn model_info(&self) -> ModelInfo {
        ModelInfo {
            chat_template: None,
            bos_token: String::new(),
            eos_token: "<|im_end|>".to_owned(),
            end_of_turn_texts: vec!["<|im_end|>".to_owned()],
            context_tokens: self.context_tokens(),
        }
    }

    fn generate(
        &mut self,
        prompt: &[i32],
        params: &SamplingParams,
        on_piece: &mut dyn FnMut(&[u8]) -> Flow,
    ) -> Result<EngineRun, EngineError> {
        let prompt = self.detokenize(prompt);
        let _ = self.reports.send(GateReport::Started {
            prompt: prompt.clone(),
        });
        let mut produced = 0;
        let mut finish = EngineFinish::EndOfTurn;
        for piece in &self.pieces {
            if produced >= params.max_tokens as usize {
                finish = EngineFinish::Length;
                break;
            }
            if self.permits.recv().is_err() {
                break;
            }
            produced += 1;
            let flow = on_piece(piece.as_bytes());
            let _ = self.reports.send(GateReport::Piece { count: produced });
            if flow == Flow::Halt {
                finish = EngineFinish::Halted;
                break;
            }
        }
        let run = EngineRun {
            completion_tokens: produced,
            finish,
            cached_tokens: 0,
            drafts: crate::speculation::DraftStats::default(),
        };
        let _ = self.reports.send(GateReport::Finished { prompt, run });
        Ok(run)
    }
}

/// An embedder that reports each call's inputs, then holds the call until the
/// test grants a permit. Vectors are `[1, 0, 0, 0]`.
pub struct GatedEmbedder {
    permits: Mutex<std_mpsc::Receiver<()>>,
    entered: mpsc::UnboundedSender<Vec<String>>,
}

pub struct EmbedGate {
    permits: std_mpsc::Sender<()>,
    entered: mpsc::UnboundedReceiver<Vec<String>>,
}

pub fn gated_embedder() -> (GatedEmbedder, EmbedGate) {
    let (permit_tx, permits) = std_mpsc::channel();
    let (entered, entered_rx) = mpsc::unbounded_channel();
    (
        GatedEmbedder {
            permits: Mutex::new(permits),
            entered,
        },
        EmbedGate {
            permits: permit_tx,
            entered: entered_rx,
        },
    )
}

impl EmbedGate {
    pub fn allow(&self, calls: usize) {
        for _ in 0..calls {
            let _ = self.permits.send(());
        }
    }

    /// The inputs of the next call that reached the model.
    pub async fn entered(&mut self) -> Option<Vec<String>> {
        tokio::time::timeout(REPORT_TIMEOUT, self.entered.recv())
            .await
            .ok()
            .flatten()
    }

    pub fn try_entered(&mut self) -> Option<Vec<String>> {
        self.entered.try_recv().ok()
    }
}

impl EmbedModel for GatedEmbedder {
    fn embed(&self, texts: &[String]) -> Result<Embedded, EmbedError> {
        let _ = self.entered.send(texts.to_vec());
        let permits = self
            .permits
            .lock()
            .map_err(|_| EmbedError::Inference("gate poisoned".into()))?;
        permits
            .recv()
            .map_err(|_| EmbedError::Inference("gate closed".into()))?;
        Ok(Embedded {
            vectors: texts.iter().map(|_| vec![1.0, 0.0, 0.0, 0.0]).collect(),
            token_counts: texts
                .iter()
                .map(|t| t.split_whitespace().count() + 2)
                .collect(),
            truncated: vec![false; texts.len()],
        })
    }
}
