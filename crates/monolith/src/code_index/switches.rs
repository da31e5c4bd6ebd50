//! The index follows the Duo switches: code is embedded only for projects
//! where Duo is on (for the instance, every group above them and the project).
//!
//! Turning Duo off drops what is indexed of each project it covers at once
//! (chunks deleted, state marked), and a run in flight stops at its next
//! write ([`super::indexer`] checks before every embedding call and inside
//! every transaction that stores chunks). Turning it on again queues a full
//! walk of each project whose index was dropped that way. Both are
//! idempotent, so a caller that saved a switch without knowing whether it
//! changed can always call [`follow_duo_switch`]; the periodic catch-up job
//! sweeps too, for switches turned by any other way.

use crate::policy::{DuoSwitchScope, Policy};
use crate::queries::Queries;

use super::{CodeIndexError, enqueue_index, store};

/// What following a switch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Followed {
    /// Projects under the switch with Duo off (their index is gone).
    pub dropped: Vec<i64>,
    /// Projects whose dropped index is now being rebuilt.
    pub reindexing: Vec<i64>,
}

/// Brings the index of every project under `scope` in line with its Duo
/// switches, as they are now.
pub async fn follow_duo_switch(
    db: &impl Queries,
    scope: DuoSwitchScope,
    max_attempts: i32,
) -> Result<Followed, CodeIndexError> {
    let projects = Policy::duo_switches_under(db, scope).await?;
    let (on, off): (Vec<_>, Vec<_>) = projects.into_iter().partition(|(_, on)| *on);
    let dropped: Vec<i64> = off.into_iter().map(|(id, _)| id).collect();
    let on: Vec<i64> = on.into_iter().map(|(id, _)| id).collect();
    store::forget(db, &dropped).await?;
    let reindexing = store::take_duo_off_marks(db, &on).await?;
    for project_id in &reindexing {
        enqueue_index(db, *project_id, max_attempts).await?;
    }
    if !dropped.is_empty() || !reindexing.is_empty() {
        tracing::info!(
            ?scope,
            dropped = dropped.len(),
            reindexing = reindexing.len(),
            "code index follows a Duo switch"
        );
    }
    Ok(Followed {
        dropped,
        reindexing,
    })
}
