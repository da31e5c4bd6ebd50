//! What a job is: a payload type stored as JSON under its kind. Both the store
//! (which enqueues it) and the worker (which runs it) build on this.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A job payload type, stored as JSON under its kind.
pub trait Job: Serialize + DeserializeOwned + Send + Sync + 'static {
    const KIND: &'static str;
}
