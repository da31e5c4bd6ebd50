//! Duo abilities: `access_duo_chat`, Duo feature switches, seats and the unit
//! primitives they grant, and the chat authorizer's coded denials.

use crate::queries::Queries;

use super::facts::{GroupFacts, InstanceFacts, ProjectFacts, paid};
use super::*;

/// Where a Duo switch was turned: the instance, a group (and so everything
/// below it) or one project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DuoSwitchScope {
    Instance,
    Group(i64),
    Project(i64),
}

/// Whether a resource may go into a prompt, and if not, what the user may be
/// told: an unreadable resource is indistinguishable from a missing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AiResourceAccess {
    Allowed,
    NotFound,
    /// Readable, but Duo features are off for its group or project.
    DuoOff,
}

/// The add-ons whose seats are assigned to the user `$1` and valid today.
macro_rules! seats_sql {
    () => {
        "SELECT DISTINCT p.add_on FROM add_on_seat_assignments a
         JOIN add_on_purchases p ON p.id = a.purchase_id
         WHERE a.user_id = $1 AND p.started_on <= current_date AND p.expires_on >= current_date"
    };
}

impl Policy {
    pub(super) fn group_duo_features(group: &GroupFacts, user: Option<Actor>) -> bool {
        Self::group_readable(group, user) && group.duo_chain_enabled
    }

    pub(super) fn project_duo_features(project: &ProjectFacts, user: Option<Actor>) -> bool {
        Self::project_readable(project, user)
            && project.duo_features_enabled
            && project.group.duo_chain_enabled
    }

    /// Whether Duo features are switched on for a group or project itself,
    /// whoever asks: on for the instance, for every group above it and for
    /// the project (GitLab's cascading `duo_features_enabled`). What
    /// background work (the code index) and the workflow tools' gate decide
    /// on; `false` for a container that does not exist.
    pub async fn duo_switched_on(
        db: &impl Queries,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        let (group_sql, project_id, group_id) = match container {
            Subject::Project(id) => (
                "SELECT group_id FROM projects WHERE id = $1",
                Some(id),
                None,
            ),
            Subject::Group(id) => ("SELECT $1::bigint", None, Some(id)),
            _ => return Ok(false),
        };
        let id = project_id.or(group_id).unwrap_or_default();
        let row = db
            .query_opt(
                &format!(
                    "WITH RECURSIVE chain(id, parent_id, enabled) AS (
                         SELECT g.id, g.parent_id, g.duo_features_enabled FROM groups g
                         WHERE g.id = ({group_sql})
                         UNION ALL
                         SELECT g.id, g.parent_id, g.duo_features_enabled FROM groups g
                         JOIN chain c ON g.id = c.parent_id
                     )
                     SELECT (SELECT duo_features_enabled FROM instance_settings)
                            AND (SELECT bool_and(enabled) FROM chain)
                            AND coalesce((SELECT duo_features_enabled FROM projects WHERE id = $2), true)"
                ),
                &[&id, &project_id],
            )
            .await?;
        Ok(row
            .and_then(|r| r.get::<_, Option<bool>>(0))
            .unwrap_or(false))
    }

    /// Every project under `scope` with whether Duo is switched on for it
    /// ([`Policy::duo_switched_on`], for many projects in one query).
    pub async fn duo_switches_under(
        db: &impl Queries,
        scope: DuoSwitchScope,
    ) -> Result<Vec<(i64, bool)>, PolicyError> {
        let (kind, id) = match scope {
            DuoSwitchScope::Instance => ("instance", 0),
            DuoSwitchScope::Group(id) => ("group", id),
            DuoSwitchScope::Project(id) => ("project", id),
        };
        let rows = db
            .query(
                "WITH RECURSIVE tree(id, enabled) AS (
                     SELECT id, duo_features_enabled FROM groups WHERE parent_id IS NULL
                     UNION ALL
                     SELECT g.id, t.enabled AND g.duo_features_enabled FROM groups g
                     JOIN tree t ON g.parent_id = t.id
                 ), below(id) AS (
                     SELECT id FROM groups WHERE id = $2 AND $1 = 'group'
                     UNION ALL
                     SELECT g.id FROM groups g JOIN below b ON g.parent_id = b.id
                 )
                 SELECT p.id, p.duo_features_enabled AND t.enabled
                        AND (SELECT duo_features_enabled FROM instance_settings)
                 FROM projects p JOIN tree t ON t.id = p.group_id
                 WHERE $1 = 'instance'
                    OR ($1 = 'group' AND p.group_id IN (SELECT id FROM below))
                    OR ($1 = 'project' AND p.id = $2)
                 ORDER BY p.id",
                &[&kind, &id],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// The add-ons whose seats are assigned to the user and currently valid.
    pub async fn assigned_add_ons(
        &self,
        db: &impl Queries,
        user_id: i64,
    ) -> Result<BTreeSet<AddOn>, PolicyError> {
        let rows = db.query(seats_sql!(), &[&user_id]).await?;
        Ok(rows
            .iter()
            .filter_map(|r| AddOn::parse(r.get::<_, &str>(0)))
            .collect())
    }

    /// The unit primitives granted by the add-ons named in `add_ons`.
    fn seat_scopes(&self, add_ons: Vec<&str>) -> BTreeSet<UnitPrimitive> {
        let add_ons: BTreeSet<AddOn> = add_ons.into_iter().filter_map(AddOn::parse).collect();
        self.catalogue.union(&add_ons)
    }

    /// Unit primitives the user's seats grant (the `scopes` of the gateway JWT).
    pub async fn seat_unit_primitives(
        &self,
        db: &impl Queries,
        user_id: i64,
    ) -> Result<BTreeSet<UnitPrimitive>, PolicyError> {
        let add_ons = self.assigned_add_ons(db, user_id).await?;
        Ok(self.catalogue.union(&add_ons))
    }

    /// Memberships that count on GitLab.com: a group whose root is on a paid plan,
    /// with Duo features (and, second value, experiment and beta features) on.
    pub(super) async fn saas_memberships(
        &self,
        db: &impl Queries,
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

    pub(super) async fn duo_chat_global(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
    ) -> Result<bool, PolicyError> {
        Ok(self.why_no_duo_chat(db, user).await?.is_none())
    }

    /// Why the user may not use Duo Chat at all (`access_duo_chat` on the
    /// global subject), or `None` when they may: the one place that rule lives,
    /// so what a page tells the user is what the policy decided.
    pub async fn why_no_duo_chat(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
    ) -> Result<Option<NoDuoChat>, PolicyError> {
        Ok(self.duo_chat_access(db, user).await?.err())
    }

    /// [`Self::why_no_duo_chat`], and when the user may chat, the unit
    /// primitives their seats grant (read once for both).
    pub async fn duo_chat_access(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
    ) -> Result<Result<BTreeSet<UnitPrimitive>, NoDuoChat>, PolicyError> {
        let Some(user) = user else {
            return Ok(Err(NoDuoChat::SignedOut));
        };
        let facts = self.chat_access_facts(db, user.id).await?;
        self.decide_duo_chat(db, user, facts.instance, facts.scopes)
            .await
    }

    /// The facts a user's chat access is decided on: the instance's and the
    /// user's valid seats, in one statement, on the web role and again in the
    /// worker (which reads them before the actor is known, with a question's
    /// other facts in one round trip; see
    /// [`Policy::authorize_chat_user_scopes_with`]).
    ///
    /// The same statement reads the user's account (active or not), the
    /// instance's gateway setting and its settings generation, which the
    /// worker needs with them.
    pub async fn chat_access_facts(
        &self,
        db: &impl Queries,
        user_id: i64,
    ) -> Result<ChatAccessFacts, PolicyError> {
        let row = db
            .query_one(
                concat!(
                    "SELECT realm, instance_tier, duo_features_enabled, ARRAY(",
                    seats_sql!(),
                    "), ai_gateway_url, (SELECT u.admin FROM (",
                    crate::identity::users::active_user_sql!(),
                    ") u), settings_generation FROM instance_settings"
                ),
                &[&user_id],
            )
            .await?;
        Ok(ChatAccessFacts {
            user_id,
            instance: InstanceFacts::from_row(&row),
            scopes: self.seat_scopes(row.get::<_, Vec<&str>>(3)),
            active_admin: row.get(5),
            gateway_url_setting: row.get(4),
            settings_generation: row.get(6),
        })
    }

    /// [`Policy::authorize_chat_user_scopes`] decided on `facts` read
    /// beforehand; facts of another user, or a composite identity (two users
    /// to check), are read again.
    pub async fn authorize_chat_user_scopes_with(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        facts: ChatAccessFacts,
    ) -> Result<BTreeSet<UnitPrimitive>, ChatAuthError> {
        match user {
            Some(actor) if actor.id == facts.user_id && Actor::composite(user).is_none() => self
                .decide_duo_chat(db, actor, facts.instance, facts.scopes)
                .await?
                .map_err(|_| ChatAuthError::Denied(DuoErrorCode::M3004)),
            _ => self.authorize_chat_user_scopes(db, user).await,
        }
    }

    async fn decide_duo_chat(
        &self,
        db: &impl Queries,
        user: Actor,
        instance: InstanceFacts,
        scopes: BTreeSet<UnitPrimitive>,
    ) -> Result<Result<BTreeSet<UnitPrimitive>, NoDuoChat>, PolicyError> {
        match instance.realm {
            Realm::SelfManaged if !paid(&instance.tier) => return Ok(Err(NoDuoChat::NotIncluded)),
            Realm::SelfManaged if !instance.duo_features_enabled => {
                return Ok(Err(NoDuoChat::TurnedOff));
            }
            Realm::SelfManaged => {}
            Realm::Saas => {
                if !self.saas_memberships(db, user.id).await?.0 {
                    return Ok(Err(NoDuoChat::NotIncluded));
                }
            }
        }
        if scopes.contains(&UnitPrimitive::DuoChat) {
            Ok(Ok(scopes))
        } else {
            Ok(Err(NoDuoChat::NoSeat))
        }
    }

    pub(super) async fn duo_chat_group(
        &self,
        db: &impl Queries,
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

    pub(super) async fn duo_chat_project(
        &self,
        db: &impl Queries,
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
    pub(super) async fn realm_allows_container(
        &self,
        db: &impl Queries,
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
        db: &impl Queries,
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

    /// [`Self::authorize_chat_user`] that also answers the unit primitives
    /// the user's seats grant (the gateway token's scopes), read once.
    pub async fn authorize_chat_user_scopes(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
    ) -> Result<BTreeSet<UnitPrimitive>, ChatAuthError> {
        match user {
            // A composite identity needs both of its identities' rights
            // (`can`): checked as `authorize_chat_user` does.
            Some(actor) if Actor::composite(user).is_some() => {
                self.authorize_chat_user(db, user).await?;
                Ok(self.seat_unit_primitives(db, actor.id).await?)
            }
            _ => self
                .duo_chat_access(db, user)
                .await?
                .map_err(|_| ChatAuthError::Denied(DuoErrorCode::M3004)),
        }
    }

    /// The user may use chat at all; otherwise M3004.
    pub async fn authorize_chat_user(
        &self,
        db: &impl Queries,
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
        db: &impl Queries,
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
        db: &impl Queries,
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
        db: &impl Queries,
        user: Actor,
        resource: Subject,
    ) -> Result<bool, PolicyError> {
        Ok(self.ai_resource_access(db, user, resource).await? == AiResourceAccess::Allowed)
    }

    /// [`Policy::may_send_to_ai`] with the reason of a refusal: the one rule
    /// for a chat question's resource, when the question is asked and when it
    /// is answered.
    pub async fn ai_resource_access(
        &self,
        db: &impl Queries,
        user: Actor,
        resource: Subject,
    ) -> Result<AiResourceAccess, PolicyError> {
        let Some(ability) = Ability::to_read(resource).filter(|a| *a != Ability::ReadNote) else {
            return Ok(AiResourceAccess::NotFound);
        };
        if !self.can(db, Some(user), ability, resource).await? {
            return Ok(AiResourceAccess::NotFound);
        }
        if !self.duo_features_on_for(db, user, resource).await? {
            return Ok(AiResourceAccess::DuoOff);
        }
        Ok(AiResourceAccess::Allowed)
    }

    /// Whether Duo features are on, for `user`, in the group or project that
    /// holds `resource` (the second half of [`Policy::may_send_to_ai`], for
    /// callers that already checked readability).
    pub async fn duo_features_on_for(
        &self,
        db: &impl Queries,
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
        db: &impl Queries,
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
