//! Long prompt texts written as JSON strings once, not once per call.
//!
//! A chat step's system prompt is the same for every request offered the
//! same tools (several kilobytes with their descriptions), and writing it
//! into the provider's request body escaped it byte by byte every time —
//! the largest single cost of an Anthropic chat step in the gateway. Each
//! worker thread keeps the JSON form of the last few long texts it wrote;
//! finding one again costs a comparison of the text, not its escaping.

use std::cell::RefCell;
use std::sync::Arc;

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

use crate::recent_values::RecentValues;

/// Shorter texts are escaped every time: keeping them would save little.
const MIN_KEPT_BYTES: usize = 1024;
/// Longer texts (a large attached file) are escaped every time too: with
/// [`KEPT`], a thread keeps at most ~1 MiB (each text and its JSON form).
const MAX_KEPT_BYTES: usize = 64 * 1024;
/// Texts each worker thread keeps (the oldest goes first).
const KEPT: usize = 8;

thread_local! {
    static KEPT_TEXTS: RefCell<RecentValues<Arc<str>, Arc<RawValue>>> =
        const { RefCell::new(RecentValues::new(KEPT)) };
}

/// A text that serializes as the JSON string it is, long ones from the
/// thread's kept escapes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JsonText<'a>(pub &'a str);

impl Serialize for JsonText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match escaped(self.0) {
            Some(raw) => raw.serialize(serializer),
            None => serializer.serialize_str(self.0),
        }
    }
}

/// The JSON string of a long `text`, escaped once per thread; `None` for
/// texts not worth keeping.
fn escaped(text: &str) -> Option<Arc<RawValue>> {
    if !(MIN_KEPT_BYTES..=MAX_KEPT_BYTES).contains(&text.len()) {
        return None;
    }
    KEPT_TEXTS.with_borrow_mut(|kept| {
        kept.get_or_make(text, || {
            let json = serde_json::to_string(text).ok()?;
            Some((text.into(), RawValue::from_string(json).ok()?.into()))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(text: &str) -> String {
        serde_json::to_string(&JsonText(text)).unwrap_or_default()
    }

    #[test]
    fn a_text_is_written_as_serde_writes_it_kept_or_not() {
        let long = "line \"one\"\n\ttab \\ back é 🦀 \u{1}".repeat(100);
        for text in ["", "short \"quoted\"\n", long.as_str()] {
            let expected = serde_json::to_string(text).unwrap_or_default();
            assert_eq!(written(text), expected);
            // Again, from the kept escapes for the long one.
            assert_eq!(written(text), expected);
        }
        KEPT_TEXTS.with_borrow(|kept| assert!(kept.keys().any(|t| **t == *long)));
    }

    #[test]
    fn kept_texts_are_bounded_and_a_changed_text_is_escaped_anew() {
        let base = "x".repeat(MIN_KEPT_BYTES);
        for i in 0..(3 * KEPT) {
            let text = format!("{base}{i}");
            assert_eq!(written(&text), format!("\"{text}\""));
        }
        KEPT_TEXTS.with_borrow(|kept| assert_eq!(kept.keys().count(), KEPT));
        // Same length, one byte different: never the other text's escape.
        let a = format!("{base}a");
        let b = format!("{base}b");
        assert_eq!(written(&a), format!("\"{a}\""));
        assert_eq!(written(&b), format!("\"{b}\""));
        let huge = "y".repeat(MAX_KEPT_BYTES + 1);
        assert_eq!(written(&huge).len(), huge.len() + 2);
        KEPT_TEXTS.with_borrow(|kept| assert!(kept.keys().all(|t| t.len() <= MAX_KEPT_BYTES)));
    }
}
