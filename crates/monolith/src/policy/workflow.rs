//! Duo Workflow abilities (GitLab's `duo_workflow` project ability and the
//! workflow policy): who may create and run workflows in a group or project,
//! and who may read or change one workflow.

use crate::queries::Queries;

use super::*;

/// Unit primitives that let a seat holder run Duo Workflow (the legacy name
/// still counts, as in GitLab).
const WORKFLOW_PRIMITIVES: &[UnitPrimitive] = &[
    UnitPrimitive::DuoAgentPlatform,
    UnitPrimitive::DuoWorkflowExecuteWorkflow,
];

/// A workflow as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkflowFacts {
    pub owner_id: i64,
    /// The project or group the workflow runs in.
    pub container: Subject,
}

impl Policy {
    /// Whether `user` may create and run Duo Workflow in the project or group:
    /// developer access (directly or through an ancestor group), Duo features on
    /// for it and every ancestor (and for the instance), and a seat whose add-on
    /// grants `duo_agent_platform`.
    pub async fn can_run_duo_workflow(
        &self,
        db: &impl Queries,
        user: Actor,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        if !self.container_allows_workflow(db, user, container).await? {
            return Ok(false);
        }
        let granted = self.seat_unit_primitives(db, user.id).await?;
        Ok(WORKFLOW_PRIMITIVES.iter().any(|up| granted.contains(up)))
    }

    /// Whether the user may use the Duo Agent Platform at all (outside any
    /// group or project): Duo on for the instance and a seat granting it.
    pub async fn may_use_duo_agent_platform(
        &self,
        db: &impl Queries,
        user: Actor,
    ) -> Result<bool, PolicyError> {
        if !self.instance(db).await?.duo_features_enabled {
            return Ok(false);
        }
        let granted = self.seat_unit_primitives(db, user.id).await?;
        Ok(WORKFLOW_PRIMITIVES.iter().any(|up| granted.contains(up)))
    }

    /// The composite-identity rule: the human may run workflows there, and so
    /// may the service account acting for them (developer access and Duo on;
    /// service accounts hold no seats).
    pub async fn can_run_duo_workflow_as(
        &self,
        db: &impl Queries,
        user: Actor,
        service_account: Option<Actor>,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        if !self.can_run_duo_workflow(db, user, container).await? {
            return Ok(false);
        }
        match service_account {
            Some(bot) => self.container_allows_workflow(db, bot, container).await,
            None => Ok(true),
        }
    }

    /// Whether `user` may read (and so change) the workflow: its owner or an
    /// admin, who may still run workflows where it lives.
    pub async fn can_access_workflow(
        &self,
        db: &impl Queries,
        user: Actor,
        service_account: Option<Actor>,
        workflow: WorkflowFacts,
    ) -> Result<bool, PolicyError> {
        if workflow.owner_id != user.id && !user.admin {
            return Ok(false);
        }
        self.can_run_duo_workflow_as(db, user, service_account, workflow.container)
            .await
    }

    async fn container_allows_workflow(
        &self,
        db: &impl Queries,
        user: Actor,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        let instance = self.instance(db).await?;
        if !instance.duo_features_enabled {
            return Ok(false);
        }
        let actor = Some(user);
        match container {
            Subject::Project(id) => {
                let Some(project) = self.project_facts(db, actor, id).await? else {
                    return Ok(false);
                };
                Ok(Self::project_duo_features(&project, actor)
                    && (user.admin || project.access >= access::DEVELOPER))
            }
            Subject::Group(id) => {
                let Some(group) = self.group_facts(db, actor, id).await? else {
                    return Ok(false);
                };
                Ok(Self::group_duo_features(&group, actor)
                    && (user.admin || group.access >= access::DEVELOPER))
            }
            _ => Ok(false),
        }
    }
}

/// Whether a workflow may use tools of MCP servers, and which servers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkflowMcp {
    /// The workflow entity's `mcp_enabled`.
    pub enabled: bool,
    /// The instance allow-list (`*` or URL prefixes) when `enabled`; empty
    /// otherwise, so nothing reads a list that does not apply.
    pub allowed_servers: Vec<String>,
}

impl Policy {
    /// [`Policy::mcp_for_workflows`] for one workflow container.
    pub async fn mcp_for_workflow(
        db: &impl Queries,
        container: Subject,
    ) -> Result<WorkflowMcp, PolicyError> {
        Ok(Self::mcp_for_workflows(db, &[container])
            .await?
            .pop()
            .unwrap_or_default())
    }

    /// Whether Duo Workflow may use MCP servers in each container (a
    /// workflow's project, group, or none), in order: the instance admin
    /// switched it on, Duo features are on there (instance, every group
    /// above, the project: [`Policy::duo_switched_on`]'s rule), and the
    /// top-level group allows it (its `duo_workflow_mcp_enabled`; a
    /// workflow outside any group has only the instance switch to ask).
    /// Who may read the workflow is the caller's check, made before.
    ///
    /// One query for any number of containers: the workflow service reads
    /// the entity on every run, and the list endpoints show many.
    pub async fn mcp_for_workflows(
        db: &impl Queries,
        containers: &[Subject],
    ) -> Result<Vec<WorkflowMcp>, PolicyError> {
        if containers.is_empty() {
            return Ok(Vec::new());
        }
        // Only projects, groups and "nowhere" hold workflows; anything else
        // is asked about as a project that does not exist (never enabled).
        let (projects, groups): (Vec<Option<i64>>, Vec<Option<i64>>) = containers
            .iter()
            .map(|c| match *c {
                Subject::Project(id) => (Some(id), None),
                Subject::Group(id) => (None, Some(id)),
                Subject::Global => (None, None),
                _ => (Some(0), None),
            })
            .unzip();
        let row = db
            .query_one(
                "WITH RECURSIVE start AS (
                     SELECT a.ord,
                            CASE WHEN a.project_id IS NULL THEN a.group_id ELSE p.group_id END AS group_id,
                            a.project_id IS NULL OR coalesce(p.duo_features_enabled, false) AS project_on,
                            a.project_id IS NULL AND a.group_id IS NULL AS nowhere
                     FROM unnest($1::bigint[], $2::bigint[]) WITH ORDINALITY AS a(project_id, group_id, ord)
                     LEFT JOIN projects p ON p.id = a.project_id
                 ), chain(ord, parent_id, duo, mcp) AS (
                     SELECT s.ord, g.parent_id, g.duo_features_enabled, g.duo_workflow_mcp_enabled
                     FROM start s JOIN groups g ON g.id = s.group_id
                     UNION ALL
                     SELECT c.ord, g.parent_id, g.duo_features_enabled, g.duo_workflow_mcp_enabled
                     FROM chain c JOIN groups g ON g.id = c.parent_id
                 )
                 SELECT (SELECT coalesce(array_agg(
                             i.duo_workflow_mcp_enabled AND i.duo_features_enabled AND s.project_on
                             AND (s.nowhere OR coalesce(
                                 (SELECT bool_and(c.duo) AND bool_or(c.mcp AND c.parent_id IS NULL)
                                  FROM chain c WHERE c.ord = s.ord), false))
                             ORDER BY s.ord), '{}')
                         FROM start s),
                        i.duo_workflow_mcp_allowed_servers
                 FROM instance_settings i",
                &[&projects, &groups],
            )
            .await?;
        let enabled: Vec<bool> = row.get(0);
        let allowed: Vec<String> = row.get(1);
        Ok(enabled
            .into_iter()
            .map(|on| WorkflowMcp {
                enabled: on,
                allowed_servers: if on { allowed.clone() } else { Vec::new() },
            })
            .collect())
    }
}
