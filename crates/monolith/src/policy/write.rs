//! Write abilities (REST changes, project code) by role.

use crate::queries::Queries;

use super::facts::ProjectFacts;
use super::*;

// ---- project code and REST write rules -----------------------------------------

/// Changes made through the REST API, each granted from the role GitLab requires
/// for it on the group or project (admins may make them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteAbility {
    /// Edit a group's settings (`admin_group`): owners.
    AdminGroup,
    /// Add, change or remove group members (`admin_group_member`): owners.
    AdminGroupMember,
    /// Create a project in a group (`create_projects`): maintainers.
    CreateProject,
    /// Create an epic in a group: planners and above.
    CreateEpic,
    /// Edit a project's settings (`admin_project`): maintainers.
    AdminProject,
    /// Rename a project (`rename_project`): owners.
    RenameProject,
    /// Delete a project and its repository (`remove_project`): owners.
    RemoveProject,
    /// Change a project's visibility (`change_visibility_level`): owners.
    ChangeProjectVisibility,
    /// Add, change or remove project members (`admin_project_member`): maintainers,
    /// for roles up to their own (see [`Policy::may_manage_role`]).
    AdminProjectMember,
    /// Open a merge request (`create_merge_request_in`): developers.
    CreateMergeRequest,
    /// Import a finished CI job (our addition): maintainers.
    ImportJob,
    /// Write an internal note on an issue or epic: reporters.
    CreateInternalNote,
}

impl WriteAbility {
    /// The least access level that grants the ability.
    pub fn min_access(self) -> i32 {
        use WriteAbility::*;
        match self {
            AdminGroup
            | AdminGroupMember
            | RenameProject
            | RemoveProject
            | ChangeProjectVisibility => access::OWNER,
            CreateProject | AdminProject | AdminProjectMember | ImportJob => access::MAINTAINER,
            CreateMergeRequest => access::DEVELOPER,
            CreateInternalNote => access::REPORTER,
            CreateEpic => access::PLANNER,
        }
    }

    pub(super) fn applies_to(self, container: Subject) -> bool {
        use WriteAbility::*;
        match container {
            Subject::Group(_) => matches!(
                self,
                AdminGroup | AdminGroupMember | CreateProject | CreateEpic | CreateInternalNote
            ),
            Subject::Project(_) => matches!(
                self,
                AdminProject
                    | RenameProject
                    | RemoveProject
                    | ChangeProjectVisibility
                    | AdminProjectMember
                    | CreateMergeRequest
                    | ImportJob
                    | CreateInternalNote
            ),
            _ => false,
        }
    }
}

impl Policy {
    /// Merge requests and CI show code: in a private project they need reporter
    /// access, elsewhere whoever reads the project reads them.
    pub(super) fn project_code_readable(project: &ProjectFacts, user: Option<Actor>) -> bool {
        Self::project_readable(project, user)
            && (project.visibility != "private"
                || user.is_some_and(|u| u.admin)
                || project.access >= access::REPORTER)
    }

    /// The user's effective access level on a group or project: their own
    /// membership or one inherited from an ancestor group, whichever is higher.
    /// `NO_ACCESS` for anonymous users, strangers and other subjects.
    pub async fn access_level(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        container: Subject,
    ) -> Result<i32, PolicyError> {
        // A composite identity acts with the lower of its two levels.
        if let Some((human, bot)) = Actor::composite(user) {
            let human = self.access_level_one(db, Some(human), container).await?;
            let bot = self.access_level_one(db, Some(bot), container).await?;
            return Ok(human.min(bot));
        }
        self.access_level_one(db, user, container).await
    }

    async fn access_level_one(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        container: Subject,
    ) -> Result<i32, PolicyError> {
        if user.is_none() {
            return Ok(access::NO_ACCESS);
        }
        Ok(match container {
            Subject::Group(id) => self
                .group_facts(db, user, id)
                .await?
                .map_or(access::NO_ACCESS, |f| f.access),
            Subject::Project(id) => self
                .project_facts(db, user, id)
                .await?
                .map_or(access::NO_ACCESS, |f| f.access),
            _ => access::NO_ACCESS,
        })
    }

    /// Whether the signed-in user may make the change on the group or project:
    /// they can read it and either are an admin or hold the role the change needs.
    pub async fn can_write(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        ability: WriteAbility,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        match Actor::composite(user) {
            Some((human, bot)) => Ok(self
                .can_write_one(db, Some(human), ability, container)
                .await?
                && self
                    .can_write_one(db, Some(bot), ability, container)
                    .await?),
            None => self.can_write_one(db, user, ability, container).await,
        }
    }

    async fn can_write_one(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        ability: WriteAbility,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        let Some(actor) = user else { return Ok(false) };
        if !ability.applies_to(container) {
            return Ok(false);
        }
        let (readable, level) = match container {
            Subject::Group(id) => match self.group_facts(db, user, id).await? {
                Some(f) => (Self::group_readable(&f, user), f.access),
                None => return Ok(false),
            },
            Subject::Project(id) => match self.project_facts(db, user, id).await? {
                Some(f) => (Self::project_readable(&f, user), f.access),
                None => return Ok(false),
            },
            _ => return Ok(false),
        };
        Ok(readable && (actor.admin || level >= ability.min_access()))
    }

    /// Whether the user may grant, change or take away the role `level` in the
    /// group or project: admins and owners manage every role, anyone else only
    /// roles up to their own (a maintainer cannot make or touch an owner).
    pub async fn may_manage_role(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        container: Subject,
        level: i32,
    ) -> Result<bool, PolicyError> {
        let Some(actor) = user else { return Ok(false) };
        if actor.admin && actor.service_account.is_none_or(|bot| bot.admin) {
            return Ok(true);
        }
        let own = self.access_level(db, user, container).await?;
        Ok(own >= access::OWNER || own >= level)
    }
}

/// An item whose edit rights are asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditableItem {
    Issue(i64),
    MergeRequest(i64),
    Epic(i64),
}

impl Policy {
    /// Whether the user may edit (and close or reopen) the item, GitLab's
    /// `update_issue` / `update_merge_request` / `update_epic`: who can read it
    /// and is its author, an assignee (issues), or holds the role (planner for
    /// issues and epics, developer for merge requests); admins always.
    pub async fn may_edit(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        item: EditableItem,
    ) -> Result<bool, PolicyError> {
        match Actor::composite(user) {
            Some((human, bot)) => Ok(self.may_edit_one(db, Some(human), item).await?
                && self.may_edit_one(db, Some(bot), item).await?),
            None => self.may_edit_one(db, user, item).await,
        }
    }

    async fn may_edit_one(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        item: EditableItem,
    ) -> Result<bool, PolicyError> {
        let Some(actor) = user else { return Ok(false) };
        let (read, subject, sql, min) = match item {
            EditableItem::Issue(id) => (
                Ability::ReadIssue,
                Subject::Issue(id),
                "SELECT project_id, author_id = $2 OR EXISTS (SELECT 1 FROM issue_assignees WHERE issue_id = $1 AND user_id = $2) FROM issues WHERE id = $1",
                access::PLANNER,
            ),
            EditableItem::MergeRequest(id) => (
                Ability::ReadMergeRequest,
                Subject::MergeRequest(id),
                "SELECT project_id, author_id = $2 FROM merge_requests WHERE id = $1",
                access::DEVELOPER,
            ),
            EditableItem::Epic(id) => (
                Ability::ReadEpic,
                Subject::Epic(id),
                "SELECT group_id, author_id = $2 FROM epics WHERE id = $1",
                access::PLANNER,
            ),
        };
        if !self.can(db, user, read, subject).await? {
            return Ok(false);
        }
        let id = match item {
            EditableItem::Issue(id) | EditableItem::MergeRequest(id) | EditableItem::Epic(id) => id,
        };
        let Some(row) = db.query_opt(sql, &[&id, &actor.id]).await? else {
            return Ok(false);
        };
        if actor.admin || row.get::<_, bool>(1) {
            return Ok(true);
        }
        let container = match item {
            EditableItem::Epic(_) => Subject::Group(row.get(0)),
            _ => Subject::Project(row.get(0)),
        };
        Ok(self.access_level(db, user, container).await? >= min)
    }
}

/// What a user may push to a project's repository (ordered: less first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PushAccess {
    /// Nothing (GitLab's `push_code` is refused).
    None,
    /// Every branch but the protected default branch.
    UnprotectedBranches,
    /// Every branch.
    All,
}

impl Policy {
    /// GitLab's `push_code`: developers and above (admins always) of a project
    /// they can read; the default branch, when the project protects it, only
    /// for maintainers and above.
    pub async fn push_access(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        project: i64,
    ) -> Result<PushAccess, PolicyError> {
        match Actor::composite(user) {
            Some((human, bot)) => {
                let human = self.push_access_one(db, Some(human), project).await?;
                let bot = self.push_access_one(db, Some(bot), project).await?;
                Ok(human.min(bot))
            }
            None => self.push_access_one(db, user, project).await,
        }
    }

    async fn push_access_one(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        project: i64,
    ) -> Result<PushAccess, PolicyError> {
        let Some(actor) = user else {
            return Ok(PushAccess::None);
        };
        if !self
            .can(db, user, Ability::ReadCode, Subject::Project(project))
            .await?
        {
            return Ok(PushAccess::None);
        }
        let level = self
            .access_level(db, user, Subject::Project(project))
            .await?;
        if !actor.admin && level < access::DEVELOPER {
            return Ok(PushAccess::None);
        }
        let protected: bool = db
            .query_opt(
                "SELECT protect_default_branch FROM projects WHERE id = $1",
                &[&project],
            )
            .await?
            .is_some_and(|r| r.get(0));
        Ok(if protected && !actor.admin && level < access::MAINTAINER {
            PushAccess::UnprotectedBranches
        } else {
            PushAccess::All
        })
    }
}
