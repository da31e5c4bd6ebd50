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
