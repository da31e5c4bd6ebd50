//! What was learnt from a GraphQL document, kept by its text.
//!
//! Clients send the same few documents over and over (GitLab's frontend and
//! editor extensions send `aiAction` with new variables only), and juniper's
//! executor parses each request's document anyway. What this crate learns from
//! a document before juniper runs it (its cost for the limits, where its
//! variables hold `JSON` values) depends on the text and the operation name
//! alone, so it is kept instead of parsing the text again for each.
//!
//! The cache is bounded by entries and by the bytes of the texts it keeps
//! (each document is at most [`super::limits::MAX_QUERY_BYTES`]): when full it
//! starts afresh. A caller sending ever new documents costs one parse per
//! document, as without the cache, and at most [`MAX_BYTES`] of memory.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Mutex, PoisonError};

/// Most documents kept per cache.
pub const MAX_DOCUMENTS: usize = 512;
/// Most bytes of document text kept per cache (GitLab's clients' documents
/// are one or two kilobytes).
pub const MAX_BYTES: usize = 1024 * 1024;

pub struct DocumentCache<V> {
    hasher: std::collections::hash_map::RandomState,
    kept: Mutex<Kept<V>>,
}

struct Kept<V> {
    entries: HashMap<u64, Entry<V>>,
    /// The bytes of the texts in `entries`.
    bytes: usize,
}

struct Entry<V> {
    query: Box<str>,
    operation_name: Option<Box<str>>,
    value: V,
}

impl<V: Clone> Default for DocumentCache<V> {
    fn default() -> Self {
        Self {
            hasher: std::collections::hash_map::RandomState::new(),
            kept: Mutex::new(Kept {
                entries: HashMap::new(),
                bytes: 0,
            }),
        }
    }
}

impl<V: Clone> DocumentCache<V> {
    /// The value kept for `query` and `operation_name`, else `learn`'s, kept.
    /// `learn` runs without the lock held (two threads may both learn the
    /// same document; they learn the same thing).
    pub fn get_or_learn(
        &self,
        query: &str,
        operation_name: Option<&str>,
        learn: impl FnOnce() -> V,
    ) -> V {
        let key = {
            let mut hasher = self.hasher.build_hasher();
            query.hash(&mut hasher);
            operation_name.hash(&mut hasher);
            hasher.finish()
        };
        if let Some(entry) = self.lock().entries.get(&key)
            && &*entry.query == query
            && entry.operation_name.as_deref() == operation_name
        {
            return entry.value.clone();
        }
        let value = learn();
        let size = query.len() + operation_name.map_or(0, str::len);
        let mut kept = self.lock();
        if kept.entries.len() >= MAX_DOCUMENTS || kept.bytes + size > MAX_BYTES {
            kept.entries.clear();
            kept.bytes = 0;
        }
        // A hash shared with another document: the newer one takes the place.
        let replaced = kept.entries.insert(
            key,
            Entry {
                query: query.into(),
                operation_name: operation_name.map(Into::into),
                value: value.clone(),
            },
        );
        let freed = replaced.map_or(0, |old| {
            old.query.len() + old.operation_name.as_deref().map_or(0, str::len)
        });
        kept.bytes = (kept.bytes + size).saturating_sub(freed);
        value
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept<V>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let kept = self.lock();
        (kept.entries.len(), kept.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_document_is_learnt_once_per_text_and_operation() {
        let cache = DocumentCache::<usize>::default();
        let learnt = Cell::new(0);
        let learn = |n: usize| {
            learnt.set(learnt.get() + 1);
            n
        };
        assert_eq!(cache.get_or_learn("query { a }", None, || learn(1)), 1);
        assert_eq!(cache.get_or_learn("query { a }", None, || learn(2)), 1);
        assert_eq!(learnt.get(), 1);
        // Another operation name or another text is another document.
        assert_eq!(cache.get_or_learn("query { a }", Some("A"), || learn(3)), 3);
        assert_eq!(cache.get_or_learn("query { a } ", None, || learn(4)), 4);
        assert_eq!(cache.get_or_learn("query { a }", Some("A"), || learn(5)), 3);
        assert_eq!(learnt.get(), 3);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let cache = DocumentCache::<usize>::default();
        for n in 0..(MAX_DOCUMENTS * 3) {
            cache.get_or_learn(&format!("query {{ f{n} }}"), None, || n);
            assert!(cache.len().0 <= MAX_DOCUMENTS);
        }
        // What was kept last is still served.
        let last = MAX_DOCUMENTS * 3 - 1;
        assert_eq!(
            cache.get_or_learn(&format!("query {{ f{last} }}"), None, || 0),
            last
        );
        // Large documents: bounded by their bytes long before their count.
        let large = DocumentCache::<usize>::default();
        for n in 0..200 {
            let text = format!("query {{ f{n} }}{}", " ".repeat(19_000));
            large.get_or_learn(&text, Some("Op"), || n);
            let (entries, bytes) = large.len();
            assert!(bytes <= MAX_BYTES, "{bytes}");
            assert!(entries <= MAX_BYTES / 19_000, "{entries}");
        }
    }
}
