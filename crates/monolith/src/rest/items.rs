//! Reading what groups and projects hold through the policy: the rows of a list
//! the caller may see, one item found by key (404 alike whether it is missing or
//! hidden), and the answer to creating one.

use actix_web::{HttpRequest, HttpResponse};
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::queries::Queries;

use super::ApiError;
use super::common::Container;
use crate::app_state::AppState;
use crate::policy::{Ability, Actor, Subject};

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
}

/// The rows of `sql` the caller may read, in the query's order.
pub(super) async fn readable_rows(
    state: &AppState,
    db: &impl Queries,
    user: Option<Actor>,
    item: Item,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, ApiError> {
    let mut readable = Vec::new();
    for row in db.query(sql, params).await? {
        if item.readable(state, db, user, row.get("id")).await? {
            readable.push(row);
        }
    }
    Ok(readable)
}

/// An item of a group or project, found for a caller who may read it.
pub(super) struct Found {
    pub user: Option<Actor>,
    pub row: Row,
    /// The container's full path, for the item's references and URLs.
    pub full_path: String,
}

impl Found {
    /// The item in the JSON shape `to_json` gives it.
    pub fn json(&self, state: &AppState, to_json: ItemJson) -> Value {
        to_json(&self.row, &state.config.external_url, &self.full_path)
    }
}

/// The item of `container` that `sql` finds (`$1` the container's id, `$2` the
/// `key`), once the caller may read both; otherwise 404 for the container or
/// the item.
pub(super) async fn find_readable(
    state: &AppState,
    req: &HttpRequest,
    container: Container,
    item: Item,
    sql: &str,
    key: &(dyn ToSql + Sync),
) -> Result<Found, ApiError> {
    let user = container.readable(state, req).await?;
    let db = state.pool.get().await?;
    let id = container.id();
    let row = db
        .query_opt(sql, &[&id, key])
        .await?
        .ok_or(ApiError::NotFound(item.name))?;
    if !item.readable(state, &*db, user, row.get("id")).await? {
        return Err(ApiError::NotFound(item.name));
    }
    let full_path = container.full_path(&*db).await?;
    Ok(Found {
        user,
        row,
        full_path,
    })
}

/// The JSON of an item, given its row, the instance's URL and its container's
/// full path.
pub(super) type ItemJson = fn(&Row, &url::Url, &str) -> Value;

/// `201 Created` with the item just made in `container`, which `sql` reads back
/// by its `id` (`$1`).
pub(super) async fn created(
    state: &AppState,
    db: &impl Queries,
    container: Container,
    sql: &str,
    id: i64,
    to_json: ItemJson,
) -> Result<HttpResponse, ApiError> {
    let row = db.query_one(sql, &[&id]).await?;
    let full_path = container.full_path(db).await?;
    Ok(HttpResponse::Created().json(to_json(&row, &state.config.external_url, &full_path)))
}
