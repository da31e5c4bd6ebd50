//! Groups and projects as what holds everything else: the caller may read one
//! (404 otherwise, as if it did not exist) and make a change in it (403), and
//! its full path. Every endpoint of a group's or project's contents starts
//! here.

use super::{ApiError, Caller};
use crate::app_state::AppState;
use crate::identity::tokens::AuthenticatedUser;
use crate::policy::{Ability, Actor, Subject, WriteAbility};
use crate::queries::Queries;

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
        req: &impl Caller,
    ) -> Result<Option<Actor>, ApiError> {
        let (ability, name) = match self {
            Container::Group(_) => (Ability::ReadGroup, "Group"),
            Container::Project(_) => (Ability::ReadProject, "Project"),
        };
        let user = actor(&req.reader(state).await?);
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
        req: &impl Caller,
        ability: WriteAbility,
    ) -> Result<AuthenticatedUser, ApiError> {
        let me = req.writer(state).await?;
        self.readable(state, req).await?;
        require_write(state, &me, ability, self.subject()).await?;
        Ok(me)
    }
}

/// The caller (if any), after checking they may read the project; 404 otherwise.
pub(super) async fn readable_project(
    state: &AppState,
    req: &impl Caller,
    id: i64,
) -> Result<Option<Actor>, ApiError> {
    Container::Project(id).readable(state, req).await
}

/// The caller (if any), after checking they may read the group; 404 otherwise.
pub(super) async fn readable_group(
    state: &AppState,
    req: &impl Caller,
    id: i64,
) -> Result<Option<Actor>, ApiError> {
    Container::Group(id).readable(state, req).await
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
