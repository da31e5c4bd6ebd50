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
use tokio_postgres::GenericClient;

pub mod add_ons;

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
    /// Read the container and Duo features are switched on for it.
    AccessDuoFeatures,
    AccessDuoChat,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actor {
    pub id: i64,
    pub admin: bool,
}

impl From<&crate::identity::tokens::AuthenticatedUser> for Actor {
    fn from(u: &crate::identity::tokens::AuthenticatedUser) -> Self {
        Actor {
            id: u.id,
            admin: u.admin,
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

#[derive(Debug, Clone)]
struct InstanceFacts {
    realm: Realm,
    tier: String,
    duo_features_enabled: bool,
}

#[derive(Debug, Clone)]
struct GroupFacts {
    visibility: String,
    root_plan: String,
    /// The group and all its ancestors have Duo features switched on.
    duo_chain_enabled: bool,
    /// Highest access level the user holds here or on an ancestor.
    access: i32,
    /// The user is a member of this group's subtree (groups or projects below it).
    member_below: bool,
}

#[derive(Debug, Clone)]
struct ProjectFacts {
    visibility: String,
    duo_features_enabled: bool,
    group: GroupFacts,
    access: i32,
}

fn paid(plan: &str) -> bool {
    plan == "premium" || plan == "ultimate"
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

    pub async fn can(
        &self,
        db: &impl GenericClient,
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
            // An ability that does not apply to the subject is never granted.
            _ => Ok(false),
        }
    }

    // ---- facts -------------------------------------------------------------

    async fn instance(&self, db: &impl GenericClient) -> Result<InstanceFacts, PolicyError> {
        let row = db
            .query_one(
                "SELECT realm, instance_tier, duo_features_enabled FROM instance_settings",
                &[],
            )
            .await?;
        Ok(InstanceFacts {
            realm: Realm::parse(row.get::<_, &str>(0)),
            tier: row.get(1),
            duo_features_enabled: row.get(2),
        })
    }

    async fn group_facts(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
        group_id: i64,
    ) -> Result<Option<GroupFacts>, PolicyError> {
        let uid = user.map(|u| u.id);
        let row = db
            .query_opt(
                "WITH RECURSIVE anc(id, parent_id) AS (
                     SELECT id, parent_id FROM groups WHERE id = $1
                     UNION ALL
                     SELECT g.id, g.parent_id FROM groups g JOIN anc ON g.id = anc.parent_id
                 ), des(id) AS (
                     SELECT id FROM groups WHERE id = $1
                     UNION ALL
                     SELECT g.id FROM groups g JOIN des ON g.parent_id = des.id
                 )
                 SELECT g.visibility,
                        (SELECT r.plan FROM groups r JOIN anc ON r.id = anc.id WHERE r.parent_id IS NULL),
                        (SELECT bool_and(a.duo_features_enabled) FROM groups a JOIN anc ON a.id = anc.id),
                        (SELECT max(m.access_level) FROM group_members m JOIN anc ON m.group_id = anc.id
                          WHERE m.user_id = $2),
                        EXISTS (SELECT 1 FROM group_members m JOIN des ON m.group_id = des.id WHERE m.user_id = $2)
                          OR EXISTS (SELECT 1 FROM project_members pm JOIN projects p ON p.id = pm.project_id
                                     JOIN des ON p.group_id = des.id WHERE pm.user_id = $2)
                 FROM groups g WHERE g.id = $1",
                &[&group_id, &uid],
            )
            .await?;
        Ok(row.map(|r| GroupFacts {
            visibility: r.get(0),
            root_plan: r
                .get::<_, Option<String>>(1)
                .unwrap_or_else(|| "free".into()),
            duo_chain_enabled: r.get::<_, Option<bool>>(2).unwrap_or(false),
            access: r.get::<_, Option<i32>>(3).unwrap_or(access::NO_ACCESS),
            member_below: r.get(4),
        }))
    }

    async fn project_facts(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
        project_id: i64,
    ) -> Result<Option<ProjectFacts>, PolicyError> {
        let uid = user.map(|u| u.id);
        let Some(row) = db
            .query_opt(
                "SELECT p.group_id, p.visibility, p.duo_features_enabled,
                        (SELECT access_level FROM project_members WHERE project_id = p.id AND user_id = $2)
                 FROM projects p WHERE p.id = $1",
                &[&project_id, &uid],
            )
            .await?
        else {
            return Ok(None);
        };
        let group_id: i64 = row.get(0);
        let Some(group) = self.group_facts(db, user, group_id).await? else {
            return Ok(None);
        };
        let own: i32 = row.get::<_, Option<i32>>(3).unwrap_or(access::NO_ACCESS);
        Ok(Some(ProjectFacts {
            visibility: row.get(1),
            duo_features_enabled: row.get(2),
            access: own.max(group.access),
            group,
        }))
    }

    // ---- read abilities ----------------------------------------------------

    fn visible(visibility: &str, user: Option<Actor>) -> bool {
        match visibility {
            "public" => true,
            "internal" => user.is_some(),
            _ => false,
        }
    }

    fn group_readable(facts: &GroupFacts, user: Option<Actor>) -> bool {
        user.is_some_and(|u| u.admin)
            || Self::visible(&facts.visibility, user)
            || facts.access >= access::MINIMAL
            || facts.member_below
    }

    fn project_readable(facts: &ProjectFacts, user: Option<Actor>) -> bool {
        user.is_some_and(|u| u.admin)
            || Self::visible(&facts.visibility, user)
            || facts.access >= access::GUEST
    }

    /// Whether the group exists and `rule` holds for the user on it.
    async fn group_allows(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
        id: i64,
        rule: fn(&GroupFacts, Option<Actor>) -> bool,
    ) -> Result<bool, PolicyError> {
        let facts = self.group_facts(db, user, id).await?;
        Ok(facts.is_some_and(|f| rule(&f, user)))
    }

    /// Whether the project exists and `rule` holds for the user on it.
    async fn project_allows(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
        id: i64,
        rule: fn(&ProjectFacts, Option<Actor>) -> bool,
    ) -> Result<bool, PolicyError> {
        let facts = self.project_facts(db, user, id).await?;
        Ok(facts.is_some_and(|f| rule(&f, user)))
    }

    async fn read_issue(
        &self,
        db: &impl GenericClient,
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

    async fn read_epic(
        &self,
        db: &impl GenericClient,
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
    async fn read_project_code_item(
        &self,
        db: &impl GenericClient,
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

    async fn read_note(
        &self,
        db: &impl GenericClient,
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

    async fn access_of_item_project(
        &self,
        db: &impl GenericClient,
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

    fn group_duo_features(group: &GroupFacts, user: Option<Actor>) -> bool {
        Self::group_readable(group, user) && group.duo_chain_enabled
    }

    fn project_duo_features(project: &ProjectFacts, user: Option<Actor>) -> bool {
        Self::project_readable(project, user)
            && project.duo_features_enabled
            && project.group.duo_chain_enabled
    }

    /// The add-ons whose seats are assigned to the user and currently valid.
    pub async fn assigned_add_ons(
        &self,
        db: &impl GenericClient,
        user_id: i64,
    ) -> Result<BTreeSet<AddOn>, PolicyError> {
        let rows = db
            .query(
                "SELECT DISTINCT p.add_on FROM add_on_seat_assignments a
                 JOIN add_on_purchases p ON p.id = a.purchase_id
                 WHERE a.user_id = $1 AND p.started_on <= current_date AND p.expires_on >= current_date",
                &[&user_id],
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| AddOn::parse(r.get::<_, &str>(0)))
            .collect())
    }

    /// Unit primitives the user's seats grant (the `scopes` of the gateway JWT).
    pub async fn seat_unit_primitives(
        &self,
        db: &impl GenericClient,
        user_id: i64,
    ) -> Result<BTreeSet<UnitPrimitive>, PolicyError> {
        let add_ons = self.assigned_add_ons(db, user_id).await?;
        Ok(self.catalogue.union(&add_ons))
    }

    /// Memberships that count on GitLab.com: a group whose root is on a paid plan,
    /// with Duo features (and, second value, experiment and beta features) on.
    async fn saas_memberships(
        &self,
        db: &impl GenericClient,
        user_id: i64,
    ) -> Result<(bool, bool), PolicyError> {
        let row = db
            .query_one(
                "WITH RECURSIVE roots(id, root_id) AS (
                     SELECT id, id FROM groups WHERE parent_id IS NULL
                     UNION ALL
                     SELECT g.id, r.root_id FROM groups g JOIN roots r ON g.parent_id = r.id
                 ), mine AS (
                     SELECT root.duo_features_enabled, root.experiment_and_beta_features
                     FROM group_members m JOIN roots r ON r.id = m.group_id JOIN groups root ON root.id = r.root_id
                     WHERE m.user_id = $1 AND m.access_level >= 10 AND root.plan IN ('premium', 'ultimate')
                 )
                 SELECT EXISTS (SELECT 1 FROM mine WHERE duo_features_enabled),
                        EXISTS (SELECT 1 FROM mine WHERE experiment_and_beta_features)",
                &[&user_id],
            )
            .await?;
        Ok((row.get(0), row.get(1)))
    }

    async fn duo_chat_global(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
    ) -> Result<bool, PolicyError> {
        let Some(user) = user else { return Ok(false) };
        let instance = self.instance(db).await?;
        let realm_allows = match instance.realm {
            Realm::SelfManaged => paid(&instance.tier) && instance.duo_features_enabled,
            Realm::Saas => self.saas_memberships(db, user.id).await?.0,
        };
        if !realm_allows {
            return Ok(false);
        }
        Ok(self
            .seat_unit_primitives(db, user.id)
            .await?
            .contains(&UnitPrimitive::DuoChat))
    }

    async fn duo_chat_group(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
        id: i64,
    ) -> Result<bool, PolicyError> {
        let Some(actor) = user else { return Ok(false) };
        let Some(group) = self.group_facts(db, user, id).await? else {
            return Ok(false);
        };
        if !Self::group_readable(&group, user) || !group.duo_chain_enabled {
            return Ok(false);
        }
        if !self
            .realm_allows_container(db, actor, &group.root_plan, false)
            .await?
        {
            return Ok(false);
        }
        self.duo_chat_global(db, user).await
    }

    async fn duo_chat_project(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
        id: i64,
    ) -> Result<bool, PolicyError> {
        let Some(actor) = user else { return Ok(false) };
        let Some(project) = self.project_facts(db, user, id).await? else {
            return Ok(false);
        };
        if !Self::project_readable(&project, user)
            || !project.duo_features_enabled
            || !project.group.duo_chain_enabled
        {
            return Ok(false);
        }
        if !self
            .realm_allows_container(db, actor, &project.group.root_plan, true)
            .await?
        {
            return Ok(false);
        }
        self.duo_chat_global(db, user).await
    }

    /// The realm-specific column of the seed table for a group or project context.
    async fn realm_allows_container(
        &self,
        db: &impl GenericClient,
        user: Actor,
        root_plan: &str,
        is_project: bool,
    ) -> Result<bool, PolicyError> {
        let instance = self.instance(db).await?;
        Ok(match instance.realm {
            Realm::Saas => paid(root_plan) && self.saas_memberships(db, user.id).await?.1,
            Realm::SelfManaged => {
                let tier_ok = if is_project {
                    instance.tier == "ultimate"
                } else {
                    paid(&instance.tier)
                };
                tier_ok && instance.duo_features_enabled
            }
        })
    }

    /// `include_<category>_context` unit primitives the user may use in chat.
    pub async fn duo_chat_available_features(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
    ) -> Result<Vec<String>, PolicyError> {
        let Some(actor) = user else {
            return Ok(Vec::new());
        };
        if !self.duo_chat_global(db, user).await? {
            return Ok(Vec::new());
        }
        let granted = self.seat_unit_primitives(db, actor.id).await?;
        Ok(INCLUDE_CONTEXT_PRIMITIVES
            .iter()
            .filter(|up| granted.contains(up))
            .map(|up| up.as_str().to_owned())
            .collect())
    }

    // ---- chat authorizer -----------------------------------------------------

    /// The user may use chat at all; otherwise M3004.
    pub async fn authorize_chat_user(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
    ) -> Result<(), ChatAuthError> {
        if self
            .can(db, user, Ability::AccessDuoChat, Subject::Global)
            .await?
        {
            Ok(())
        } else {
            Err(ChatAuthError::Denied(DuoErrorCode::M3004))
        }
    }

    /// Duo is usable in this group or project: M3002 when its owner switched Duo off
    /// for a container the user can read, M3003 when the user cannot read it.
    pub async fn authorize_chat_container(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
        container: Subject,
    ) -> Result<(), ChatAuthError> {
        if !self
            .can(db, user, Ability::AccessDuoFeatures, container)
            .await?
        {
            let ability = match container {
                Subject::Group(_) => Ability::ReadGroup,
                _ => Ability::ReadProject,
            };
            let readable = self.can(db, user, ability, container).await?;
            return Err(ChatAuthError::Denied(if readable {
                DuoErrorCode::M3002
            } else {
                DuoErrorCode::M3003
            }));
        }
        self.authorize_chat_user(db, user).await
    }

    /// The user may read the resource (else M3003, confidential items included) and
    /// use Duo in its container.
    pub async fn authorize_chat_resource(
        &self,
        db: &impl GenericClient,
        user: Option<Actor>,
        resource: Subject,
    ) -> Result<(), ChatAuthError> {
        let Some(ability) = Ability::to_read(resource) else {
            return self.authorize_chat_user(db, user).await;
        };
        if !self.can(db, user, ability, resource).await? {
            return Err(ChatAuthError::Denied(DuoErrorCode::M3003));
        }
        match self.container_of(db, resource).await? {
            Some(container) => self.authorize_chat_container(db, user, container).await,
            None => self.authorize_chat_user(db, user).await,
        }
    }

    /// Whether `resource` may go into a prompt for `user`: they can read it and
    /// Duo features are on for its group or project (GitLab's
    /// `Utils::Authorizer.resource`). Notes and the global subject never go
    /// in as page context.
    pub async fn may_send_to_ai(
        &self,
        db: &impl GenericClient,
        user: Actor,
        resource: Subject,
    ) -> Result<bool, PolicyError> {
        let Some(ability) = Ability::to_read(resource).filter(|a| *a != Ability::ReadNote) else {
            return Ok(false);
        };
        Ok(self.can(db, Some(user), ability, resource).await?
            && self.duo_features_on_for(db, user, resource).await?)
    }

    /// Whether Duo features are on, for `user`, in the group or project that
    /// holds `resource` (the second half of [`Policy::may_send_to_ai`], for
    /// callers that already checked readability).
    pub async fn duo_features_on_for(
        &self,
        db: &impl GenericClient,
        user: Actor,
        resource: Subject,
    ) -> Result<bool, PolicyError> {
        match self.container_of(db, resource).await? {
            Some(container) => {
                self.can(db, Some(user), Ability::AccessDuoFeatures, container)
                    .await
            }
            None => Ok(false),
        }
    }

    /// The group or project a resource belongs to.
    pub async fn container_of(
        &self,
        db: &impl GenericClient,
        resource: Subject,
    ) -> Result<Option<Subject>, PolicyError> {
        let (sql, is_group) = match resource {
            Subject::Group(_) | Subject::Project(_) => return Ok(Some(resource)),
            Subject::Global => return Ok(None),
            Subject::Issue(_) => ("SELECT project_id FROM issues WHERE id = $1", false),
            Subject::MergeRequest(_) => {
                ("SELECT project_id FROM merge_requests WHERE id = $1", false)
            }
            Subject::Build(_) => ("SELECT project_id FROM ci_builds WHERE id = $1", false),
            Subject::Epic(_) => ("SELECT group_id FROM epics WHERE id = $1", true),
            Subject::Note(_) => return Ok(None),
        };
        let id = match resource {
            Subject::Issue(id)
            | Subject::MergeRequest(id)
            | Subject::Build(id)
            | Subject::Epic(id) => id,
            _ => return Ok(None),
        };
        let row = db.query_opt(sql, &[&id]).await?;
        Ok(row.map(|r| {
            let cid: i64 = r.get(0);
            if is_group {
                Subject::Group(cid)
            } else {
                Subject::Project(cid)
            }
        }))
    }
}

/// The additional-context categories chat can receive, as unit primitives.
const INCLUDE_CONTEXT_PRIMITIVES: &[UnitPrimitive] = &[
    UnitPrimitive::IncludeFileContext,
    UnitPrimitive::IncludeSnippetContext,
    UnitPrimitive::IncludeMergeRequestContext,
    UnitPrimitive::IncludeIssueContext,
    UnitPrimitive::IncludeDependencyContext,
    UnitPrimitive::IncludeLocalGitContext,
    UnitPrimitive::IncludeTerminalContext,
    UnitPrimitive::IncludeRepositoryContext,
    UnitPrimitive::IncludeDirectoryContext,
    UnitPrimitive::IncludeUserRuleContext,
];

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
            AdminGroup | AdminGroupMember | RenameProject | ChangeProjectVisibility => {
                access::OWNER
            }
            CreateProject | AdminProject | AdminProjectMember | ImportJob => access::MAINTAINER,
            CreateMergeRequest => access::DEVELOPER,
            CreateInternalNote => access::REPORTER,
            CreateEpic => access::PLANNER,
        }
    }

    fn applies_to(self, container: Subject) -> bool {
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
    fn project_code_readable(project: &ProjectFacts, user: Option<Actor>) -> bool {
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
        db: &impl GenericClient,
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
        db: &impl GenericClient,
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
        db: &impl GenericClient,
        user: Option<Actor>,
        container: Subject,
        level: i32,
    ) -> Result<bool, PolicyError> {
        let Some(actor) = user else { return Ok(false) };
        if actor.admin {
            return Ok(true);
        }
        let own = self.access_level(db, user, container).await?;
        Ok(own >= access::OWNER || own >= level)
    }
}
