//! What the fake provider answers: scripted responses, failure modes chosen
//! by model name, stop sequences and chunking.

use std::time::Duration;

/// One scripted answer, consumed by the next model request.
#[derive(Debug, Clone, PartialEq)]
pub enum Scripted {
    /// Text, streamed in pieces of the provider's current chunk size.
    Text(String),
    /// Text streamed exactly in these pieces (one delta each).
    Chunks(Vec<String>),
    /// Streams `before`, then holds the stream open until
    /// `FakeProvider::release` is called, then streams `after` and ends it:
    /// tests can see what a client does while a model is still answering.
    /// Stop sequences are applied to each part on its own; a one-shot
    /// (non-streaming) request gets the whole text at once.
    Held {
        before: Vec<String>,
        after: Vec<String>,
    },
    /// A turn that calls tools (native tool calling): Anthropic `tool_use`
    /// blocks with `stop_reason: tool_use`, OpenAI `tool_calls` with
    /// `finish_reason: tool_calls`, streamed or not as the request asks.
    /// Other wires get the text only.
    ToolCalls { text: String, calls: Vec<ToolCall> },
    /// Fail this request.
    Fail(Failure),
}

/// One scripted tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments. OpenAI sends them as this JSON text; Anthropic as
    /// the object (text that is not a JSON object is sent as a string, so
    /// tests can script malformed calls on both wires).
    pub arguments: String,
}

impl ToolCall {
    pub fn new(id: &str, name: &str, arguments: serde_json::Value) -> Self {
        Self {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_string(),
        }
    }

    /// The Anthropic `input`: the object, or the raw text when it is not one.
    pub(crate) fn input(&self) -> serde_json::Value {
        match serde_json::from_str::<serde_json::Value>(&self.arguments) {
            Ok(value @ serde_json::Value::Object(_)) => value,
            _ => serde_json::Value::String(self.arguments.clone()),
        }
    }
}

/// How a request fails.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// Anthropic: 529 `overloaded_error`; OpenAI: 503 `overloaded_error`.
    Overloaded,
    /// 500 `api_error`.
    ServerError,
    /// Any status with an error type and message.
    Status {
        status: u16,
        kind: String,
        message: String,
    },
    /// Streams this text, then an error event (`api_error`).
    ErrorMidStream { text: String },
    /// Sends a chunk that is not valid JSON.
    Malformed,
    /// Sends the response headers, then nothing until the server stops.
    Hang,
}

/// Failure modes chosen by the request's model name, so end-to-end tests can
/// select them through configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelMode {
    SlowFirstToken,
    ErrorMidStream,
    Overloaded,
    ServerError,
    Malformed,
    Hang,
}

impl ModelMode {
    pub(crate) fn from_model(model: &str) -> Option<Self> {
        const MODES: [(&str, ModelMode); 6] = [
            ("fake-slow-first-token", ModelMode::SlowFirstToken),
            ("fake-error-mid-stream", ModelMode::ErrorMidStream),
            ("fake-overloaded", ModelMode::Overloaded),
            ("fake-500", ModelMode::ServerError),
            ("fake-malformed", ModelMode::Malformed),
            ("fake-hang", ModelMode::Hang),
        ];
        MODES
            .iter()
            .find(|(prefix, _)| model.starts_with(prefix))
            .map(|(_, mode)| *mode)
    }
}

/// What one request will get, decided when it arrives.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    Answer {
        pieces: Vec<String>,
        first_byte_delay: Option<Duration>,
        /// Pieces sent only after a release (see [`Scripted::Held`]).
        held: Option<Vec<String>>,
    },
    Tools {
        text: String,
        calls: Vec<ToolCall>,
    },
    Fail(Failure),
}

/// Text after applying stop sequences, and which one (if any) cut it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub pieces: Vec<String>,
    pub stop_sequence: Option<String>,
}

impl Answer {
    pub fn text(&self) -> String {
        self.pieces.concat()
    }
}

/// Truncates the answer at the first occurrence of any stop string, as a real
/// model stops generating there (the stop string itself is not returned).
pub(crate) fn apply_stop(pieces: Vec<String>, stop: &[String]) -> Answer {
    let full: String = pieces.concat();
    let cut = stop
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| full.find(s.as_str()).map(|at| (at, s)))
        .min_by_key(|(at, _)| *at);
    let Some((cut_at, stop_string)) = cut else {
        return Answer {
            pieces,
            stop_sequence: None,
        };
    };
    let mut kept = Vec::new();
    let mut used = 0;
    for piece in pieces {
        if used >= cut_at {
            break;
        }
        let room = cut_at - used;
        if piece.len() <= room {
            used += piece.len();
            kept.push(piece);
        } else {
            // `cut_at` is a char boundary of the full text, so of this piece too.
            kept.push(piece[..room].to_owned());
            used = cut_at;
        }
    }
    Answer {
        pieces: kept,
        stop_sequence: Some(stop_string.clone()),
    }
}

impl Answer {
    /// Applies stop sequences to a held answer: `after` is dropped when
    /// `before` was already cut.
    pub(crate) fn held(before: Vec<String>, after: Vec<String>, stop: &[String]) -> (Self, Self) {
        let before = apply_stop(before, stop);
        let after = if before.stop_sequence.is_some() {
            Answer {
                pieces: Vec::new(),
                stop_sequence: None,
            }
        } else {
            apply_stop(after, stop)
        };
        (before, after)
    }

    /// The stop sequence that cut either part.
    pub(crate) fn stopped_by(before: &Self, after: &Self) -> Option<String> {
        before
            .stop_sequence
            .clone()
            .or_else(|| after.stop_sequence.clone())
    }
}

/// Splits text into pieces of at most `size` bytes, on char boundaries.
pub(crate) fn split_text(text: &str, size: usize) -> Vec<String> {
    let size = size.max(1);
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(text[start..end].to_owned());
        start = end;
    }
    pieces
}

/// A deterministic unit vector for a text, so embeddings compare stably.
pub(crate) fn embedding(text: &str, dims: usize) -> Vec<f32> {
    // FNV-1a seed, then a xorshift sequence: cheap and stable across runs.
    let mut state: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        state ^= u64::from(byte);
        state = state.wrapping_mul(0x0100_0000_01b3);
    }
    let mut values = Vec::with_capacity(dims);
    for _ in 0..dims {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Map to [-1, 1).
        values.push(((state >> 11) as f64 / (1u64 << 52) as f64 - 1.0) as f32);
    }
    let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        values.iter_mut().for_each(|v| *v /= norm);
    }
    values
}

/// A unit vector of hashed word counts: texts sharing words point the same way.
/// Identifiers are split (`rate_limit`, `rateLimit` → `rate`, `limit`) and
/// words lower-cased, so a question's words meet the code's.
pub(crate) fn bag_of_words_embedding(text: &str, dims: usize) -> Vec<f32> {
    let mut values = vec![0f32; dims.max(1)];
    let mut word = String::new();
    let flush = |word: &mut String, values: &mut Vec<f32>| {
        if word.len() > 1 {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in word.bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            let len = values.len() as u64;
            values[(h % len) as usize] += 1.0;
        }
        word.clear();
    };
    let mut previous_lower = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if c.is_uppercase() && previous_lower {
                flush(&mut word, &mut values);
            }
            previous_lower = c.is_lowercase();
            word.extend(c.to_lowercase());
        } else {
            previous_lower = false;
            flush(&mut word, &mut values);
        }
    }
    flush(&mut word, &mut values);
    let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        values.iter_mut().for_each(|v| *v /= norm);
    }
    values
}

/// A rough token count for `usage` fields.
pub(crate) fn token_count(text: &str) -> usize {
    text.split_whitespace().count().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn stop_cuts_inside_a_piece_and_reports_the_string() {
        let answer = apply_stop(
            s(&["Thought: a", "b\nObserv", "ation: x"]),
            &s(&["Observation:"]),
        );
        assert_eq!(answer.text(), "Thought: ab\n");
        assert_eq!(answer.stop_sequence.as_deref(), Some("Observation:"));
    }

    #[test]
    fn earliest_stop_wins() {
        let answer = apply_stop(s(&["one two three"]), &s(&["three", "two"]));
        assert_eq!(answer.text(), "one ");
        assert_eq!(answer.stop_sequence.as_deref(), Some("two"));
    }

    #[test]
    fn a_held_answer_cut_early_drops_its_second_part() {
        let (before, after) = Answer::held(s(&["a Obs"]), s(&["b"]), &s(&["Obs"]));
        assert_eq!(
            (before.text(), after.text()),
            ("a ".to_owned(), String::new())
        );
        let (before, after) = Answer::held(s(&["a"]), s(&["b Obs c"]), &s(&["Obs"]));
        assert_eq!(
            (before.text(), after.text()),
            ("a".to_owned(), "b ".to_owned())
        );
        assert_eq!(Answer::stopped_by(&before, &after).as_deref(), Some("Obs"));
    }

    #[test]
    fn no_stop_keeps_everything() {
        let answer = apply_stop(s(&["a", "b"]), &s(&["z"]));
        assert_eq!(answer.pieces, s(&["a", "b"]));
        assert_eq!(answer.stop_sequence, None);
    }

    #[test]
    fn split_respects_char_boundaries() {
        let pieces = split_text("héllo wörld", 2);
        assert_eq!(pieces.concat(), "héllo wörld");
        assert!(pieces.iter().all(|p| !p.is_empty() && p.len() <= 3));
    }

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embedding("hello", 16);
        assert_eq!(a, embedding("hello", 16));
        assert_ne!(a, embedding("hellp", 16));
        let norm: f32 = a.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }

    #[test]
    fn modes_come_from_model_names() {
        assert_eq!(
            ModelMode::from_model("fake-overloaded"),
            Some(ModelMode::Overloaded)
        );
        assert_eq!(ModelMode::from_model("fake-hang-2"), Some(ModelMode::Hang));
        assert_eq!(ModelMode::from_model("claude-3-5-sonnet"), None);
    }
}
