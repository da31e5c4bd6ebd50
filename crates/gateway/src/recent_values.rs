//! A few values kept by key, the oldest dropped first: what the gateway's
//! per-thread caches (parsed provider URLs, escaped prompt texts, tool
//! schemas, metric handles) keep between calls, each in a `thread_local!`.
//!
//! Lookups compare keys one by one: these caches hold a handful of entries,
//! and a linear scan of them costs less than hashing a key would.

use std::borrow::Borrow;

#[derive(Debug)]
pub(crate) struct RecentValues<K, V> {
    entries: Vec<(K, V)>,
    capacity: usize,
}

impl<K, V: Clone> RecentValues<K, V> {
    pub(crate) const fn new(capacity: usize) -> Self {
        Self {
            entries: Vec::new(),
            capacity,
        }
    }

    /// The value kept under `key`; else the one `make` gives, kept with its
    /// key (the oldest entry dropped when full). `make` giving `None` keeps
    /// nothing.
    pub(crate) fn get_or_make<Q>(
        &mut self,
        key: &Q,
        make: impl FnOnce() -> Option<(K, V)>,
    ) -> Option<V>
    where
        K: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        if let Some(value) = self.find(key) {
            return Some(value.clone());
        }
        let (key, value) = make()?;
        Some(self.keep(key, value))
    }

    /// [`Self::get_or_make`] for values that can always be made.
    pub(crate) fn get_or_insert_with<Q>(&mut self, key: &Q, make: impl FnOnce() -> (K, V)) -> V
    where
        K: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        if let Some(value) = self.find(key) {
            return value.clone();
        }
        let (key, value) = make();
        self.keep(key, value)
    }

    fn find<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        self.entries
            .iter()
            .find(|(kept, _)| kept.borrow() == key)
            .map(|(_, value)| value)
    }

    fn keep(&mut self, key: K, value: V) -> V {
        if self.entries.len() >= self.capacity {
            self.entries.remove(0);
        }
        self.entries.push((key, value.clone()));
        value
    }

    /// The kept keys, oldest first.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.iter().map(|(key, _)| key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_value_is_found_by_its_key_and_the_oldest_goes_first() {
        let mut recent: RecentValues<String, usize> = RecentValues::new(2);
        let mut made = 0;
        let mut get = |recent: &mut RecentValues<String, usize>, key: &str| {
            recent.get_or_make(key, || {
                made += 1;
                Some((key.to_owned(), key.len()))
            })
        };
        assert_eq!(get(&mut recent, "a"), Some(1));
        assert_eq!(get(&mut recent, "bb"), Some(2));
        assert_eq!(get(&mut recent, "a"), Some(1));
        assert_eq!(get(&mut recent, "ccc"), Some(3));
        assert_eq!(recent.keys().collect::<Vec<_>>(), ["bb", "ccc"]);
        assert_eq!(get(&mut recent, "a"), Some(1));
        assert_eq!(
            made, 4,
            "\"a\" was made again once dropped, never while kept"
        );
        assert_eq!(recent.get_or_make("none", || None), None);
        assert_eq!(recent.keys().count(), 2);
        assert_eq!(
            recent.get_or_insert_with("dddd", || ("dddd".to_owned(), 4)),
            4
        );
        assert_eq!(
            recent.get_or_insert_with("dddd", || ("dddd".to_owned(), 0)),
            4
        );
        assert_eq!(recent.keys().collect::<Vec<_>>(), ["a", "dddd"]);
    }
}
