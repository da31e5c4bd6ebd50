//! The feature flags of one question: evaluated for its actors (the user,
//! and the project and group of the resource it is about), announced to the
//! gateway on every call of the question (`x-gitlab-enabled-feature-flags`),
//! and checked again before a flag-gated tool runs.

use crate::features::FlagActor;
use crate::policy::{Actor, PolicyError, Subject};
use crate::queries::Queries;

use super::Services;

/// The names of the flags on for this question, sorted, from `flags` (read
/// with the question's other facts).
pub async fn for_question(
    services: &Services,
    db: &impl Queries,
    flags: &crate::features::store::Snapshot,
    actor: Actor,
    resource: Option<Subject>,
) -> Result<Vec<String>, PolicyError> {
    let mut actors = vec![FlagActor::User {
        id: actor.id,
        admin: actor.admin,
    }];
    let container = match resource {
        Some(subject) => services.policy.container_of(db, subject).await?,
        None => None,
    };
    match container {
        Some(Subject::Project(project)) => {
            actors.push(FlagActor::Project(project));
            if let Some(group) = crate::namespaces::group_of_project(db, project).await? {
                actors.push(FlagActor::Group(group));
            }
        }
        Some(Subject::Group(group)) => actors.push(FlagActor::Group(group)),
        _ => {}
    }
    // One read of the flags serves the announced list and the usage
    // record's categorisation switch (asked about the user alone).
    crate::ai_usage::recording::note_categorization(crate::ai_usage::categorize::wanted_in(
        flags, actor.id,
    ));
    Ok(flags.enabled_flags(&actors))
}

impl Services {
    /// These services announcing `flags` to the gateway.
    pub fn with_feature_flags(&self, flags: &[String]) -> Services {
        let mut services = self.clone();
        services.gateway = services.gateway.with_enabled_feature_flags(flags.to_vec());
        services
    }
}
