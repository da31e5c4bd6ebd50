//! Every permission decision of the monolith, in one place.
//!
//! `Policy::can(db, user, ability, subject)` answers read abilities with GitLab's
//! visibility and inherited-membership rules and `access_duo_chat` with the rules of
//! GitLab.com and self-managed instances (see `docs/monolith.md`). The chat
//! authorizer functions turn a denial into the Duo error code the user is shown.
//! Handlers and tools never re-implement any of these rules.

use std::collections::BTreeSet;
use std::sync::Arc;

use contracts::{DuoErrorCode, UnitPrimitive};

pub mod add_ons;
mod ai_analytics;
mod duo;
pub mod duo_context;
mod facts;
mod merge_request_review;
mod read;
mod workflow;
mod workflow_tools;
mod write;

pub use duo::{AiResourceAccess, DuoSwitchScope};
pub use duo_context::{AiReader, CodeForAi, ContextExclusions};
pub use facts::ChatAccessFacts;
pub use merge_request_review::NoCodeReview;
pub use workflow::{WorkflowFacts, WorkflowMcp};

pub use write::{EditableItem, PushAccess, WriteAbility};

use crate::config::Realm;
use crate::db::DbError;
use add_ons::{AddOn, AddOnCatalogue};

/// GitLab's access levels.
pub mod access {
    pub const NO_ACCESS: i32 = 0;
    pub const MINIMAL: i32 = 5;
    pub const GUEST: i32 = 10;
    pub const PLANNER: i32 = 15;
    pub const REPORTER: i32 = 20;
    pub const DEVELOPER: i32 = 30;
    pub const MAINTAINER: i32 = 40;
    pub const OWNER: i32 = 50;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ability {
    ReadGroup,
    ReadProject,
    ReadIssue,
    ReadEpic,
    ReadMergeRequest,
    ReadBuild,
    ReadNote,
    /// Read (clone, fetch, browse) a project's repository: GitLab's `download_code`.
    ReadCode,
    /// Read the container and Duo features are switched on for it.
    AccessDuoFeatures,
    AccessDuoChat,
    /// Administer the instance (its settings, seats, models): instance admins
    /// only, on the global subject.
    AdministerInstance,
}

impl Ability {
    /// The ability that reads `subject` (`None` for the global subject).
    pub fn to_read(subject: Subject) -> Option<Ability> {
        Some(match subject {
            Subject::Group(_) => Ability::ReadGroup,
            Subject::Project(_) => Ability::ReadProject,
            Subject::Issue(_) => Ability::ReadIssue,
            Subject::Epic(_) => Ability::ReadEpic,
            Subject::MergeRequest(_) => Ability::ReadMergeRequest,
            Subject::Build(_) => Ability::ReadBuild,
            Subject::Note(_) => Ability::ReadNote,
            Subject::Global => return None,
        })
    }
}

/// What an ability is asked about. `Global` means "outside any group or project".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Global,
    Group(i64),
    Project(i64),
    Issue(i64),
    Epic(i64),
    MergeRequest(i64),
    Build(i64),
    Note(i64),
}

/// The signed-in user a decision is made for; `None` is an anonymous visitor.
///
/// A composite identity (a Duo Workflow token owned by a service account,
/// acting for a human) is the human with the service account beside it:
/// every decision then needs both to be allowed, as GitLab's composite
/// identity does, so a run can do nothing its human could not and nothing
/// its service account could not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actor {
    pub id: i64,
    pub admin: bool,
    pub service_account: Option<ServiceAccountActor>,
}

/// The service account of a composite identity, as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceAccountActor {
    pub id: i64,
    pub admin: bool,
}

impl Actor {
    /// A user acting on their own.
    pub fn user(id: i64, admin: bool) -> Self {
        Self {
            id,
            admin,
            service_account: None,
        }
    }

    /// The two identities a composite decision needs, or `None` for a
    /// plain user: (the human alone, the service account alone).
    pub(crate) fn composite(user: Option<Actor>) -> Option<(Actor, Actor)> {
        let actor = user?;
        let bot = actor.service_account?;
        Some((
            Actor::user(actor.id, actor.admin),
            Actor::user(bot.id, bot.admin),
        ))
    }

    /// Who writes what this actor creates: the service account of a
    /// composite identity (on behalf of the human), else the user.
    pub fn author_id(&self) -> i64 {
        self.service_account.map_or(self.id, |bot| bot.id)
    }
}

impl From<&crate::identity::tokens::AuthenticatedUser> for Actor {
    fn from(u: &crate::identity::tokens::AuthenticatedUser) -> Self {
        Actor {
            id: u.id,
            admin: u.admin,
            service_account: u.service_account.as_ref().map(|s| ServiceAccountActor {
                id: s.id,
                admin: s.admin,
            }),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<tokio_postgres::Error> for PolicyError {
    fn from(e: tokio_postgres::Error) -> Self {
        PolicyError::Db(DbError::Query(e))
    }
}

/// Why a user may not use Duo Chat at all ([`Policy::why_no_duo_chat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoDuoChat {
    SignedOut,
    /// The instance's subscription (self-managed) or none of the user's
    /// paid groups with Duo on (GitLab.com) includes Duo.
    NotIncluded,
    /// An administrator turned Duo features off for the instance.
    TurnedOff,
    /// The user holds no seat that grants Duo Chat.
    NoSeat,
}

/// Why chat was refused, as the Duo error code the user sees.
#[derive(Debug, thiserror::Error)]
pub enum ChatAuthError {
    #[error("chat denied ({0:?})")]
    Denied(DuoErrorCode),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

impl ChatAuthError {
    pub fn code(&self) -> Option<DuoErrorCode> {
        match self {
            ChatAuthError::Denied(code) => Some(*code),
            ChatAuthError::Policy(_) => None,
        }
    }
}

#[derive(Clone)]
pub struct Policy {
    catalogue: Arc<AddOnCatalogue>,
}

impl Policy {
    pub fn new(catalogue: Arc<AddOnCatalogue>) -> Self {
        Self { catalogue }
    }

    pub fn catalogue(&self) -> &AddOnCatalogue {
        &self.catalogue
    }

    /// Instance administration (settings, seats, models): instance admins
    /// only. Needs no database, so synchronous callers ask it directly; it is
    /// also [`Ability::AdministerInstance`] on the global subject.
    pub fn administers_instance(user: Option<Actor>) -> bool {
        user.is_some_and(|u| u.admin)
    }
}
