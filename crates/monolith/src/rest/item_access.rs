//! Reading what groups and projects hold through the policy: the items of a
//! list the caller may see, and one item found by key (404 alike whether it is
//! missing or hidden). The finding is the work items domain's; this says who
//! may see what was found.

use crate::queries::Queries;

use super::containers::Container;
use super::{ApiError, Caller};
use crate::app_state::AppState;
use crate::policy::{Ability, Actor, Subject};
use crate::work_items::Identified;

/// One kind of row as the policy knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    /// GitLab's name for it in a 404 (`404 Merge Request Not Found`).
    pub name: &'static str,
    /// The ability that reads one.
    pub ability: Ability,
    /// The subject a row's `id` stands for.
    pub subject: fn(i64) -> Subject,
}

impl Item {
    pub const GROUP: Item = Item::new("Group", Ability::ReadGroup, Subject::Group);
    pub const PROJECT: Item = Item::new("Project", Ability::ReadProject, Subject::Project);
    pub const ISSUE: Item = Item::new("Issue", Ability::ReadIssue, Subject::Issue);
    pub const MERGE_REQUEST: Item = Item::new(
        "Merge Request",
        Ability::ReadMergeRequest,
        Subject::MergeRequest,
    );
    pub const EPIC: Item = Item::new("Epic", Ability::ReadEpic, Subject::Epic);
    pub const JOB: Item = Item::new("Job", Ability::ReadBuild, Subject::Build);
    pub const NOTE: Item = Item::new("Note", Ability::ReadNote, Subject::Note);

    const fn new(name: &'static str, ability: Ability, subject: fn(i64) -> Subject) -> Item {
        Item {
            name,
            ability,
            subject,
        }
    }

    async fn readable(
        self,
        state: &AppState,
        db: &impl Queries,
        user: Option<Actor>,
        id: i64,
    ) -> Result<bool, ApiError> {
        Ok(state
            .policy
            .can(db, user, self.ability, (self.subject)(id))
            .await?)
    }

    /// The items the caller may read, in their order.
    pub async fn keep_readable<T: Identified>(
        self,
        state: &AppState,
        db: &impl Queries,
        user: Option<Actor>,
        items: Vec<T>,
    ) -> Result<Vec<T>, ApiError> {
        let mut readable = Vec::new();
        for item in items {
            if self.readable(state, db, user, item.id()).await? {
                readable.push(item);
            }
        }
        Ok(readable)
    }
}

/// An item of a group or project, found for a caller who may read it.
pub(super) struct Found<T> {
    pub user: Option<Actor>,
    pub item: T,
    /// The container's full path, for the item's references and URLs.
    pub full_path: String,
}

/// The item of `container` that `find` looks up on a connection, once the
/// caller may read both; otherwise 404 for the container or the item.
pub(super) async fn find_readable<T, F>(
    state: &AppState,
    req: &impl Caller,
    container: Container,
    item: Item,
    find: F,
) -> Result<Found<T>, ApiError>
where
    T: Identified,
    F: AsyncFnOnce(&deadpool_postgres::Client) -> Result<Option<T>, tokio_postgres::Error>,
{
    let user = container.readable(state, req).await?;
    let db = state.pool.get().await?;
    let found = find(&db).await?.ok_or(ApiError::NotFound(item.name))?;
    if !item.readable(state, &*db, user, found.id()).await? {
        return Err(ApiError::NotFound(item.name));
    }
    let full_path = container.full_path(&*db).await?;
    Ok(Found {
        user,
        item: found,
        full_path,
    })
}
