//! Who may read AI analytics (usage events and metrics): GitLab's
//! `read_ai_analytics`. Instance admins everywhere; otherwise reporters or
//! above of the group or project, inherited access included. Guests and
//! anonymous visitors never.

use crate::queries::Queries;

use super::*;

impl Policy {
    /// Whether `user` may read the AI usage of `container` (a group or a
    /// project; the instance's is [`Policy::administers_instance`]). A
    /// composite identity needs it for both the human and the service account.
    pub async fn may_read_ai_analytics(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        match Actor::composite(user) {
            Some((human, bot)) => Ok(self.may_read_ai_analytics_one(db, human, container).await?
                && self.may_read_ai_analytics_one(db, bot, container).await?),
            None => match user {
                Some(actor) => self.may_read_ai_analytics_one(db, actor, container).await,
                None => Ok(false),
            },
        }
    }

    async fn may_read_ai_analytics_one(
        &self,
        db: &impl Queries,
        actor: Actor,
        container: Subject,
    ) -> Result<bool, PolicyError> {
        let access = match container {
            Subject::Group(id) => self
                .group_facts(db, Some(actor), id)
                .await?
                .map(|f| f.access),
            Subject::Project(id) => self
                .project_facts(db, Some(actor), id)
                .await?
                .map(|f| f.access),
            _ => None,
        };
        // Admins read any group or project that exists.
        Ok(access.is_some_and(|a| actor.admin || a >= access::REPORTER))
    }
}
