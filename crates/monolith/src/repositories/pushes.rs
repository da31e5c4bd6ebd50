//! What a push changed: the ref updates between two snapshots of a
//! repository's refs, recorded in `repository_pushes`, and the
//! `repository_pushed` job that tells other features (the code index, merge
//! request diffs) about them without polling.

use std::collections::BTreeSet;

use crate::queries::Queries;
use job_queue::{EnqueueOptions, Job};
use serde::{Deserialize, Serialize};

use super::reader::Refs;

/// The id git uses for "no object" on either side of a ref update.
pub const ZERO_SHA: &str = "0000000000000000000000000000000000000000";

/// One ref that moved, appeared or went away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    /// The full ref name (`refs/heads/main`).
    pub name: String,
    /// [`ZERO_SHA`] when the ref was created.
    pub before: String,
    /// [`ZERO_SHA`] when the ref was deleted.
    pub after: String,
}

/// The refs that differ between `before` and `after`, in name order.
pub fn ref_updates(before: &Refs, after: &Refs) -> Vec<RefUpdate> {
    let (old, new) = (before.full(), after.full());
    let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    names
        .into_iter()
        .filter_map(|name| {
            let b = old.get(name).map_or(ZERO_SHA, String::as_str);
            let a = new.get(name).map_or(ZERO_SHA, String::as_str);
            (a != b).then(|| RefUpdate {
                name: name.clone(),
                before: b.to_owned(),
                after: a.to_owned(),
            })
        })
        .collect()
}

/// The job enqueued after every accepted push (at most one pending per project:
/// a burst of pushes leaves one job, which reads the repository as it is when it runs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryPushed {
    pub project_id: i64,
}

impl Job for RepositoryPushed {
    const KIND: &'static str = "repository_pushed";
}

/// Stores the updates of one push and enqueues [`RepositoryPushed`], in the
/// caller's transaction when it passes one. Nothing is written for an empty list
/// (a rejected push, or one that changed nothing).
pub async fn record(
    db: &impl Queries,
    project_id: i64,
    pusher_id: Option<i64>,
    updates: &[RefUpdate],
) -> Result<(), job_queue::QueueError> {
    if updates.is_empty() {
        return Ok(());
    }
    for update in updates {
        db.execute(
            "INSERT INTO repository_pushes (project_id, ref, before_sha, after_sha, pusher_id)
             VALUES ($1, $2, $3, $4, $5)",
            &[
                &project_id,
                &update.name,
                &update.before,
                &update.after,
                &pusher_id,
            ],
        )
        .await?;
    }
    crate::db::enqueue(
        db,
        &RepositoryPushed { project_id },
        EnqueueOptions::default()
            .queue("repositories")
            .dedupe(format!("repository_pushed:{project_id}")),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(branches: &[(&str, &str)], tags: &[(&str, &str)]) -> Refs {
        Refs {
            branches: branches
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn updates_cover_created_moved_and_deleted_refs() {
        let before = refs(&[("main", "a"), ("old", "b")], &[]);
        let after = refs(&[("main", "c"), ("new", "d")], &[("v1", "c")]);
        let updates = ref_updates(&before, &after);
        let summary: Vec<(&str, &str, &str)> = updates
            .iter()
            .map(|u| (u.name.as_str(), u.before.as_str(), u.after.as_str()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("refs/heads/main", "a", "c"),
                ("refs/heads/new", ZERO_SHA, "d"),
                ("refs/heads/old", "b", ZERO_SHA),
                ("refs/tags/v1", ZERO_SHA, "c"),
            ]
        );
        assert!(ref_updates(&after, &after).is_empty());
    }
}
