//! What the rules decide on: the instance's settings, and a user's standing in a
//! group or project (visibility, plan, Duo switches, inherited access level).

use crate::queries::Queries;

use super::*;

#[derive(Debug, Clone)]
pub(super) struct InstanceFacts {
    pub(super) realm: Realm,
    pub(super) tier: String,
    pub(super) duo_features_enabled: bool,
}

/// What a user's chat access is decided on, read ahead
/// ([`Policy::chat_access_facts`]); opaque outside the policy but for what
/// the worker reads with it to save statements: the user as an active
/// account and the instance's gateway setting.
#[derive(Debug, Clone)]
pub struct ChatAccessFacts {
    pub(super) user_id: i64,
    pub(super) instance: InstanceFacts,
    pub(super) scopes: BTreeSet<UnitPrimitive>,
    /// `Some(admin)` when the user's account is active.
    pub(super) active_admin: Option<bool>,
    /// `instance_settings.ai_gateway_url` as stored.
    pub(super) gateway_url_setting: Option<String>,
    /// `instance_settings.settings_generation`: moves on with every change
    /// of the feature flags or the AI model settings.
    pub(super) settings_generation: i64,
}

impl ChatAccessFacts {
    /// The user, when the account is active (as `identity::users::active`).
    pub fn actor(&self) -> Option<Actor> {
        self.active_admin
            .map(|admin| Actor::user(self.user_id, admin))
    }

    /// The instance's `realm` and its `ai_gateway_url` setting as stored:
    /// what `gateway_client::instance_route` would read.
    pub fn gateway_settings(&self) -> (&'static str, Option<&str>) {
        (
            self.instance.realm.as_str(),
            self.gateway_url_setting.as_deref(),
        )
    }

    /// The generation of the flags and model settings when these facts were
    /// read (`agent::settings_cache`).
    pub fn settings_generation(&self) -> i64 {
        self.settings_generation
    }
}

#[derive(Debug, Clone)]
pub(super) struct GroupFacts {
    pub(super) visibility: String,
    pub(super) root_plan: String,
    /// The group and all its ancestors have Duo features switched on.
    pub(super) duo_chain_enabled: bool,
    /// Highest access level the user holds here or on an ancestor.
    pub(super) access: i32,
    /// The user is a member of this group's subtree (groups or projects below it).
    pub(super) member_below: bool,
}

#[derive(Debug, Clone)]
pub(super) struct ProjectFacts {
    pub(super) visibility: String,
    pub(super) duo_features_enabled: bool,
    pub(super) group: GroupFacts,
    pub(super) access: i32,
}

impl InstanceFacts {
    /// From a row whose first columns are `realm, instance_tier,
    /// duo_features_enabled`.
    pub(super) fn from_row(row: &tokio_postgres::Row) -> Self {
        Self {
            realm: Realm::parse(row.get::<_, &str>(0)),
            tier: row.get(1),
            duo_features_enabled: row.get(2),
        }
    }
}

pub(super) fn paid(plan: &str) -> bool {
    plan == "premium" || plan == "ultimate"
}

impl Policy {
    pub(super) async fn instance(&self, db: &impl Queries) -> Result<InstanceFacts, PolicyError> {
        let row = db
            .query_one(
                "SELECT realm, instance_tier, duo_features_enabled FROM instance_settings",
                &[],
            )
            .await?;
        Ok(InstanceFacts::from_row(&row))
    }

    pub(super) async fn group_facts(
        &self,
        db: &impl Queries,
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

    pub(super) async fn project_facts(
        &self,
        db: &impl Queries,
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
}
