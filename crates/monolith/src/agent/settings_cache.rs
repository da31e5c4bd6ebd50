//! The feature flags and the model choices chat answers read, kept between
//! answers for as long as the instance's settings generation stays the same.
//!
//! Every change to the flags or the AI model settings moves
//! `instance_settings.settings_generation` on in its own transaction (the
//! triggers of migration V72), and each answer reads that number with the
//! user's access facts anyway. So an answer whose generation is the one kept
//! here needs neither read; one that sees a newer generation reads them again
//! (one round trip after a change) and keeps what it read under it.
//!
//! What is kept is never older than its label: it is read after the facts
//! that gave the generation. A change committed in between makes the label
//! older than the content, and the next answer, seeing the newer number,
//! reads again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::ai_models::{Choice, Feature};
use crate::features::store::Snapshot;

#[derive(Debug, Default)]
pub struct SettingsCache {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    generation: i64,
    flags: Option<Arc<Snapshot>>,
    choices: HashMap<Feature, Choice>,
}

impl SettingsCache {
    /// The flags kept for `generation`, if any.
    pub fn flags(&self, generation: i64) -> Option<Arc<Snapshot>> {
        self.with(generation, |kept| kept.flags.clone())
    }

    /// The model choice of `feature` kept for `generation`, if any.
    pub fn choice(&self, generation: i64, feature: Feature) -> Option<Choice> {
        self.with(generation, |kept| kept.choices.get(&feature).cloned())
    }

    /// Keeps `flags`, read after seeing `generation`.
    pub fn keep_flags(&self, generation: i64, flags: Arc<Snapshot>) {
        self.keep(generation, |kept| kept.flags = Some(flags));
    }

    /// Keeps `feature`'s `choice`, read after seeing `generation`.
    pub fn keep_choice(&self, generation: i64, feature: Feature, choice: Choice) {
        self.keep(generation, |kept| {
            kept.choices.insert(feature, choice);
        });
    }

    fn with<T>(&self, generation: i64, read: impl FnOnce(&Kept) -> Option<T>) -> Option<T> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.generation == generation {
            read(&kept)
        } else {
            None
        }
    }

    /// Older generations are forgotten when a newer one is kept; what an
    /// answer that saw an older one read is not kept at all.
    fn keep(&self, generation: i64, store: impl FnOnce(&mut Kept)) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if generation > kept.generation {
            *kept = Kept {
                generation,
                ..Kept::default()
            };
        }
        if generation == kept.generation {
            store(&mut kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_values_serve_their_generation_only() {
        let cache = SettingsCache::default();
        assert!(cache.flags(0).is_none());
        assert!(cache.choice(0, Feature::DuoChat).is_none());

        cache.keep_flags(3, Arc::new(Snapshot::default()));
        cache.keep_choice(3, Feature::DuoChat, Choice::Disabled);
        assert!(cache.flags(3).is_some());
        assert_eq!(cache.choice(3, Feature::DuoChat), Some(Choice::Disabled));
        assert!(cache.flags(4).is_none());
        assert!(cache.choice(2, Feature::DuoChat).is_none());

        // An answer that saw an older generation keeps nothing.
        cache.keep_choice(2, Feature::DuoChat, Choice::Vendored);
        assert_eq!(cache.choice(3, Feature::DuoChat), Some(Choice::Disabled));

        // A newer generation forgets everything kept for the older one.
        cache.keep_choice(4, Feature::DuoChat, Choice::Vendored);
        assert_eq!(cache.choice(4, Feature::DuoChat), Some(Choice::Vendored));
        assert!(cache.flags(4).is_none());
        assert!(cache.flags(3).is_none());
    }
}
