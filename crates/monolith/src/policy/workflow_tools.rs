//! Duo Workflow's tokens (`ai_workflows`) on the REST endpoints its GitLab
//! tools call: a run acts as its user, and only where Duo is switched on. An
//! owner who turns Duo off for a project or group (or an admin, for the
//! instance) stops every token already handed to a workflow from reading or
//! writing there, whatever else the user may do.

use crate::queries::Queries;

use super::*;

impl Policy {
    /// Whether a workflow token of `user` may act in `container` (the
    /// project or group an endpoint names): Duo switched on there (instance,
    /// every ancestor group, the project). A container the user cannot read
    /// is let through: the endpoint answers it as it answers any caller, so
    /// the token learns nothing about a private project's switches.
    pub async fn workflow_token_may_act_in(
        &self,
        db: &impl Queries,
        user: Actor,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        let read = match container {
            Subject::Project(_) => Ability::ReadProject,
            Subject::Group(_) => Ability::ReadGroup,
            _ => return Ok(true),
        };
        if Self::duo_switched_on(db, container).await? {
            return Ok(true);
        }
        Ok(!self.can(db, Some(user), read, container).await?)
    }
}
