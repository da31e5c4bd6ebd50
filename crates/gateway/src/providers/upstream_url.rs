//! Provider addresses parsed once per worker thread, not once per call.
//!
//! Every model call names its provider by a URL put together from
//! configuration (a base URL and a path), and parsing it (the host's IDNA
//! processing included) cost more instructions than anything else the
//! gateway does to start the call. The texts are few — a handful of
//! providers, paths and allowed models — so each worker thread keeps the
//! last ones it parsed and hands out copies.

use std::cell::RefCell;

use reqwest::{Client, RequestBuilder, Url};

use crate::recent_values::RecentValues;

/// URLs each worker thread keeps parsed (the oldest goes first).
const KEPT: usize = 16;
/// Longer texts are parsed every time, so the kept ones stay small.
const MAX_KEPT_BYTES: usize = 512;

thread_local! {
    static PARSED: RefCell<RecentValues<String, Url>> = const { RefCell::new(RecentValues::new(KEPT)) };
}

/// `text` parsed as `Url::parse` does, from the thread's kept ones when it
/// was parsed before; `None` when it is not a URL (the caller then lets
/// reqwest report it as before).
pub(crate) fn parsed(text: &str) -> Option<Url> {
    if text.len() > MAX_KEPT_BYTES {
        return Url::parse(text).ok();
    }
    PARSED.with_borrow_mut(|kept| {
        kept.get_or_make(text, || Some((text.to_owned(), Url::parse(text).ok()?)))
    })
}

/// `client.post(url)`, with the URL parsed once per thread.
pub(crate) fn post(client: &Client, url: String) -> RequestBuilder {
    match parsed(&url) {
        Some(parsed) => client.post(parsed),
        None => client.post(url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_url_is_the_same_as_a_fresh_parse() {
        for text in [
            "http://127.0.0.1:5052/v1/messages",
            "https://api.anthropic.com/v1/messages",
            "https://bücher.example/v1/chat/completions?alt=sse",
        ] {
            let fresh = Url::parse(text).ok();
            assert_eq!(parsed(text), fresh);
            // The second time it comes from the thread's kept ones.
            assert_eq!(parsed(text), fresh);
        }
        assert_eq!(parsed("not a url"), None);
        assert_eq!(parsed("not a url"), None);
    }

    #[test]
    fn the_thread_keeps_a_bounded_number() {
        for i in 0..(3 * KEPT) {
            let text = format!("http://127.0.0.1:{}/v1/messages", 1000 + i);
            assert_eq!(parsed(&text), Url::parse(&text).ok());
        }
        PARSED.with_borrow(|kept| assert_eq!(kept.keys().count(), KEPT));
        let long = format!("http://127.0.0.1/{}", "a".repeat(MAX_KEPT_BYTES));
        assert_eq!(parsed(&long), Url::parse(&long).ok());
        PARSED.with_borrow(|kept| assert!(kept.keys().all(|text| *text != long)));
    }
}
