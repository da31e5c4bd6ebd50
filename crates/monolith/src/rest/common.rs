//! Pieces every REST resource module shares: who is asking, what the policy says,
//! pagination, and the small JSON fragments GitLab repeats (users, references).

use crate::queries::Queries;
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{Value, json};

use super::pagination::PageParams;
use super::{ApiError, WRITE_SCOPES, optional_user, require_user};
use crate::app_state::AppState;
use crate::identity::tokens::AuthenticatedUser;
use crate::policy::{Ability, Actor, Subject, WriteAbility};
use crate::work_items::{SortOrder, UserRef, WorkItemError};

pub(super) fn actor(user: &Option<AuthenticatedUser>) -> Option<Actor> {
    user.as_ref().map(Actor::from)
}

pub(super) async fn can(
    state: &AppState,
    user: Option<Actor>,
    ability: Ability,
    subject: Subject,
) -> Result<bool, ApiError> {
    let db = state.pool.get().await?;
    Ok(state.policy.can(&*db, user, ability, subject).await?)
}

/// 403 unless the policy grants the change on the group or project.
pub(super) async fn require_write(
    state: &AppState,
    user: &AuthenticatedUser,
    ability: WriteAbility,
    container: Subject,
) -> Result<(), ApiError> {
    let db = state.pool.get().await?;
    if state
        .policy
        .can_write(&*db, Some(Actor::from(user)), ability, container)
        .await?
    {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// A group or project: what holds issues, merge requests, epics and CI, and what
/// a caller must be able to read before anything in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Container {
    Group(i64),
    Project(i64),
}

impl Container {
    pub fn subject(self) -> Subject {
        match self {
            Container::Group(id) => Subject::Group(id),
            Container::Project(id) => Subject::Project(id),
        }
    }

    /// The caller (if any), after checking they may read the container; 404
    /// otherwise, as if it did not exist.
    pub async fn readable(
        self,
        state: &AppState,
        req: &HttpRequest,
    ) -> Result<Option<Actor>, ApiError> {
        let (ability, name) = match self {
            Container::Group(_) => (Ability::ReadGroup, "Group"),
            Container::Project(_) => (Ability::ReadProject, "Project"),
        };
        let user = actor(&optional_user(state, req).await?);
        if !can(state, user, ability, self.subject()).await? {
            return Err(ApiError::NotFound(name));
        }
        Ok(user)
    }

    /// `acme/platform` for a group, `acme/platform/api` for a project.
    pub async fn full_path(self, db: &impl Queries) -> Result<String, ApiError> {
        match self {
            Container::Group(id) => group_full_path(db, id).await,
            Container::Project(id) => project_full_path(db, id).await,
        }
    }

    /// The signed-in caller with an `api` token, after checking they may read the
    /// container (404) and make the change `ability` in it (403).
    pub async fn writer(
        self,
        state: &AppState,
        req: &HttpRequest,
        ability: WriteAbility,
    ) -> Result<AuthenticatedUser, ApiError> {
        let me = require_user(state, req, WRITE_SCOPES).await?;
        self.readable(state, req).await?;
        require_write(state, &me, ability, self.subject()).await?;
        Ok(me)
    }
}

/// The caller (if any), after checking they may read the project; 404 otherwise.
pub(super) async fn readable_project(
    state: &AppState,
    req: &HttpRequest,
    id: i64,
) -> Result<Option<Actor>, ApiError> {
    Container::Project(id).readable(state, req).await
}

/// The caller (if any), after checking they may read the group; 404 otherwise.
pub(super) async fn readable_group(
    state: &AppState,
    req: &HttpRequest,
    id: i64,
) -> Result<Option<Actor>, ApiError> {
    Container::Group(id).readable(state, req).await
}

/// One page of an already filtered list, with GitLab's pagination headers.
pub(super) fn paged(req: &HttpRequest, params: PageParams, items: Vec<Value>) -> HttpResponse {
    let page = params.resolve();
    let total = items.len();
    let mut builder = HttpResponse::Ok();
    page.headers(&mut builder, req, total);
    builder.json(page.slice(items))
}

/// GitLab's basic user fragment.
pub(super) fn user_basic(user: &UserRef, base: &url::Url) -> Value {
    json!({
        "id": user.id,
        "username": user.username,
        "name": user.name,
        "state": user.state,
        "avatar_url": Value::Null,
        "web_url": format!("{}{}", base.as_str(), user.username),
    })
}

/// Who closed an item (`null` when open or unknown).
pub(super) fn closed_by(closer: Option<&UserRef>, base: &url::Url) -> Value {
    closer.map_or(Value::Null, |user| user_basic(user, base))
}

/// GitLab's `references` of an item: `short` (`#1`), `relative` (the same inside
/// its own project or group) and `full` (`acme/api#1`).
pub(super) fn references(full_path: &str, sigil: char, iid: i32) -> Value {
    json!({
        "short": format!("{sigil}{iid}"),
        "relative": format!("{sigil}{iid}"),
        "full": format!("{full_path}{sigil}{iid}"),
    })
}

pub(super) async fn project_full_path(db: &impl Queries, project: i64) -> Result<String, ApiError> {
    crate::namespaces::project_full_path(db, project)
        .await?
        .ok_or(ApiError::NotFound("Project"))
}

pub(super) async fn group_full_path(db: &impl Queries, group: i64) -> Result<String, ApiError> {
    crate::namespaces::group_full_path(db, group)
        .await?
        .ok_or(ApiError::NotFound("Group"))
}

/// GitLab takes labels as one comma-separated string.
pub(super) fn split_labels(labels: Option<&str>) -> Vec<String> {
    labels
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// An `ILIKE` pattern matching text that contains `search` literally; `None` for
/// an absent or blank search.
pub(super) fn like_pattern(search: Option<&str>) -> Option<String> {
    let s = search.map(str::trim).filter(|s| !s.is_empty())?;
    let escaped = s
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    Some(format!("%{escaped}%"))
}

/// The `sort` parameter: `desc` (the default) or `asc`.
pub(super) fn sort_order(sort: Option<&str>) -> Result<SortOrder, ApiError> {
    match sort {
        None | Some("desc") => Ok(SortOrder::Desc),
        Some("asc") => Ok(SortOrder::Asc),
        Some(_) => Err(ApiError::BadRequest(
            "sort does not have a valid value".into(),
        )),
    }
}

/// The `state` filter of a list: `None` for `all` (the default), else one of
/// `states`.
pub(super) fn state_filter(
    state: Option<&str>,
    states: &[&str],
) -> Result<Option<String>, ApiError> {
    match state {
        None | Some("all") => Ok(None),
        Some(s) if states.contains(&s) => Ok(Some(s.to_owned())),
        Some(_) => Err(ApiError::BadRequest(
            "state does not have a valid value".into(),
        )),
    }
}

pub(super) const VISIBILITIES: &[&str] = &["private", "internal", "public"];

/// `private` < `internal` < `public`.
pub(super) fn visibility_rank(v: &str) -> usize {
    VISIBILITIES.iter().position(|x| *x == v).unwrap_or(0)
}

pub(super) fn check_visibility(v: Option<&str>) -> Result<String, ApiError> {
    let v = v.unwrap_or("private");
    if VISIBILITIES.contains(&v) {
        Ok(v.to_owned())
    } else {
        Err(ApiError::BadRequest(
            "visibility does not have a valid value".into(),
        ))
    }
}

/// A constraint violation (unknown foreign key, duplicate) becomes `err`; other
/// database failures stay internal errors.
pub(super) fn on_constraint(err: ApiError) -> impl FnOnce(tokio_postgres::Error) -> ApiError {
    move |e| {
        if e.code().is_some() { err } else { e.into() }
    }
}

impl From<WorkItemError> for ApiError {
    fn from(e: WorkItemError) -> Self {
        match e {
            WorkItemError::BadRequest(msg) => ApiError::BadRequest(msg),
            WorkItemError::Invalid { field, message } => ApiError::invalid(field, message),
            WorkItemError::Conflict(msg) => ApiError::Conflict(msg),
            WorkItemError::Db(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_visibility() {
        assert_eq!(split_labels(Some(" bug, ,p1 ")), vec!["bug", "p1"]);
        assert!(split_labels(None).is_empty());
        assert_eq!(like_pattern(Some(" 50%_a\\ ")).unwrap(), "%50\\%\\_a\\\\%");
        assert_eq!(like_pattern(Some("  ")), None);
        assert!(visibility_rank("public") > visibility_rank("internal"));
        assert!(visibility_rank("internal") > visibility_rank("private"));
        assert_eq!(check_visibility(None).unwrap(), "private");
        assert!(check_visibility(Some("secret")).is_err());
        assert_eq!(
            references("acme/api", '#', 3),
            json!({"short": "#3", "relative": "#3", "full": "acme/api#3"})
        );
    }
}
