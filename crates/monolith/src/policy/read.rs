//! Read abilities: GitLab's visibility and inherited-membership rules.

use crate::queries::Queries;

use super::facts::{GroupFacts, ProjectFacts};
use super::*;

impl Policy {
    /// Whether the user has `ability` on `subject`; a composite identity
    /// needs it for both the human and the service account.
    pub async fn can(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        ability: Ability,
        subject: Subject,
    ) -> Result<bool, PolicyError> {
        match Actor::composite(user) {
            Some((human, bot)) => Ok(self.can_one(db, Some(human), ability, subject).await?
                && self.can_one(db, Some(bot), ability, subject).await?),
            None => self.can_one(db, user, ability, subject).await,
        }
    }

    async fn can_one(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        ability: Ability,
        subject: Subject,
    ) -> Result<bool, PolicyError> {
        use Ability::*;
        match (ability, subject) {
            (ReadGroup, Subject::Group(id)) => {
                self.group_allows(db, user, id, Self::group_readable).await
            }
            (ReadProject, Subject::Project(id)) => {
                self.project_allows(db, user, id, Self::project_readable)
                    .await
            }
            (ReadIssue, Subject::Issue(id)) => self.read_issue(db, user, id).await,
            (ReadEpic, Subject::Epic(id)) => self.read_epic(db, user, id).await,
            (ReadMergeRequest, Subject::MergeRequest(id)) => {
                self.read_project_code_item(db, user, "merge_requests", id)
                    .await
            }
            (ReadBuild, Subject::Build(id)) => {
                self.read_project_code_item(db, user, "ci_builds", id).await
            }
            // Code: anyone who reads a public or internal project; reporters and
            // above in a private one (GitLab's `download_code`).
            (ReadCode, Subject::Project(id)) => {
                self.project_allows(db, user, id, Self::project_code_readable)
                    .await
            }
            // `read_build` on a project: its pipelines and jobs as a whole.
            (ReadBuild, Subject::Project(id)) => {
                self.project_allows(db, user, id, Self::project_code_readable)
                    .await
            }
            (ReadNote, Subject::Note(id)) => self.read_note(db, user, id).await,
            (AccessDuoFeatures, Subject::Group(id)) => {
                self.group_allows(db, user, id, Self::group_duo_features)
                    .await
            }
            (AccessDuoFeatures, Subject::Project(id)) => {
                self.project_allows(db, user, id, Self::project_duo_features)
                    .await
            }
            (AccessDuoChat, Subject::Global) => self.duo_chat_global(db, user).await,
            (AccessDuoChat, Subject::Group(id)) => self.duo_chat_group(db, user, id).await,
            (AccessDuoChat, Subject::Project(id)) => self.duo_chat_project(db, user, id).await,
            (AdministerInstance, Subject::Global) => Ok(Self::administers_instance(user)),
            // An ability that does not apply to the subject is never granted.
            _ => Ok(false),
        }
    }

    // ---- facts -------------------------------------------------------------

    pub(super) fn visible(visibility: &str, user: Option<Actor>) -> bool {
        match visibility {
            "public" => true,
            "internal" => user.is_some(),
            _ => false,
        }
    }

    pub(super) fn group_readable(facts: &GroupFacts, user: Option<Actor>) -> bool {
        user.is_some_and(|u| u.admin)
            || Self::visible(&facts.visibility, user)
            || facts.access >= access::MINIMAL
            || facts.member_below
    }

    pub(super) fn project_readable(facts: &ProjectFacts, user: Option<Actor>) -> bool {
        user.is_some_and(|u| u.admin)
            || Self::visible(&facts.visibility, user)
            || facts.access >= access::GUEST
    }

    /// Whether the group exists and `rule` holds for the user on it.
    pub(super) async fn group_allows(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        id: i64,
        rule: fn(&GroupFacts, Option<Actor>) -> bool,
    ) -> Result<bool, PolicyError> {
        let facts = self.group_facts(db, user, id).await?;
        Ok(facts.is_some_and(|f| rule(&f, user)))
    }

    /// Whether the project exists and `rule` holds for the user on it.
    pub(super) async fn project_allows(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        id: i64,
        rule: fn(&ProjectFacts, Option<Actor>) -> bool,
    ) -> Result<bool, PolicyError> {
        let facts = self.project_facts(db, user, id).await?;
        Ok(facts.is_some_and(|f| rule(&f, user)))
    }

    pub(super) async fn read_issue(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        id: i64,
    ) -> Result<bool, PolicyError> {
        let uid = user.map(|u| u.id);
        let Some(row) = db
            .query_opt(
                "SELECT project_id, confidential, author_id = $2,
                        EXISTS (SELECT 1 FROM issue_assignees WHERE issue_id = i.id AND user_id = $2)
                 FROM issues i WHERE id = $1",
                &[&id, &uid],
            )
            .await?
        else {
            return Ok(false);
        };
        let Some(project) = self.project_facts(db, user, row.get(0)).await? else {
            return Ok(false);
        };
        if !Self::project_readable(&project, user) {
            return Ok(false);
        }
        let confidential: bool = row.get(1);
        let author = row.get::<_, Option<bool>>(2).unwrap_or(false);
        let assignee: bool = row.get(3);
        Ok(!confidential
            || user.is_some_and(|u| u.admin)
            || (user.is_some() && (author || assignee))
            || project.access >= access::REPORTER)
    }

    pub(super) async fn read_epic(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        id: i64,
    ) -> Result<bool, PolicyError> {
        let uid = user.map(|u| u.id);
        let Some(row) = db
            .query_opt(
                "SELECT group_id, confidential, author_id = $2 FROM epics WHERE id = $1",
                &[&id, &uid],
            )
            .await?
        else {
            return Ok(false);
        };
        let Some(group) = self.group_facts(db, user, row.get(0)).await? else {
            return Ok(false);
        };
        if !Self::group_readable(&group, user) {
            return Ok(false);
        }
        let confidential: bool = row.get(1);
        let author = row.get::<_, Option<bool>>(2).unwrap_or(false);
        Ok(!confidential
            || user.is_some_and(|u| u.admin)
            || (user.is_some() && author)
            || group.access >= access::REPORTER)
    }

    /// Merge requests and CI jobs show code: in a private project they need reporter
    /// access, elsewhere whoever reads the project reads them.
    pub(super) async fn read_project_code_item(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        table: &'static str,
        id: i64,
    ) -> Result<bool, PolicyError> {
        let sql = match table {
            "merge_requests" => "SELECT project_id FROM merge_requests WHERE id = $1",
            _ => "SELECT project_id FROM ci_builds WHERE id = $1",
        };
        let Some(row) = db.query_opt(sql, &[&id]).await? else {
            return Ok(false);
        };
        let Some(project) = self.project_facts(db, user, row.get(0)).await? else {
            return Ok(false);
        };
        Ok(Self::project_code_readable(&project, user))
    }

    pub(super) async fn read_note(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        id: i64,
    ) -> Result<bool, PolicyError> {
        let Some(row) = db
            .query_opt(
                "SELECT noteable_type, noteable_id, internal FROM notes WHERE id = $1",
                &[&id],
            )
            .await?
        else {
            return Ok(false);
        };
        let noteable_type: String = row.get(0);
        let noteable_id: i64 = row.get(1);
        let internal: bool = row.get(2);
        let (readable, container_access) = match noteable_type.as_str() {
            "Issue" => {
                let readable = self.read_issue(db, user, noteable_id).await?;
                (
                    readable,
                    self.access_of_item_project(db, user, "issues", noteable_id)
                        .await?,
                )
            }
            "MergeRequest" => {
                let readable = self
                    .read_project_code_item(db, user, "merge_requests", noteable_id)
                    .await?;
                (
                    readable,
                    self.access_of_item_project(db, user, "merge_requests", noteable_id)
                        .await?,
                )
            }
            _ => {
                let readable = self.read_epic(db, user, noteable_id).await?;
                let group_id: Option<i64> = db
                    .query_opt("SELECT group_id FROM epics WHERE id = $1", &[&noteable_id])
                    .await?
                    .map(|r| r.get(0));
                let level = match group_id {
                    Some(g) => self
                        .group_facts(db, user, g)
                        .await?
                        .map_or(access::NO_ACCESS, |f| f.access),
                    None => access::NO_ACCESS,
                };
                (readable, level)
            }
        };
        Ok(readable
            && (!internal || user.is_some_and(|u| u.admin) || container_access >= access::REPORTER))
    }

    pub(super) async fn access_of_item_project(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        table: &'static str,
        id: i64,
    ) -> Result<i32, PolicyError> {
        let sql = match table {
            "issues" => "SELECT project_id FROM issues WHERE id = $1",
            _ => "SELECT project_id FROM merge_requests WHERE id = $1",
        };
        let Some(row) = db.query_opt(sql, &[&id]).await? else {
            return Ok(access::NO_ACCESS);
        };
        Ok(self
            .project_facts(db, user, row.get(0))
            .await?
            .map_or(access::NO_ACCESS, |f| f.access))
    }

    // ---- Duo ---------------------------------------------------------------
}
