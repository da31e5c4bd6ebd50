//! Resources a question names, attached before the first model step.
//!
//! A question such as "Summarize acme/platform/api#1" or one holding a link
//! to an issue, merge request, epic or CI job of this instance names its
//! resource plainly. Like the page a
//! user is looking at, that resource is resolved, authorized with the same
//! checks as the reader tools (the seat's unit primitive, then the work
//! items domain's read rules) and sent as the question's context, so a model
//! that chooses tools poorly can still answer from it; a model that uses
//! tools well keeps them. A resource the user may not read is left out
//! exactly like one that does not exist: nothing tells them apart.
//!
//! Commits, files and directories named by link or reference are read by
//! [`super::named_code`], with their readers' checks.
//!
//! Only unambiguous forms are attached: one full reference or link per
//! kind (a bare `#12` counts when the page gives its project). Anything
//! needing interpretation stays with the reader tools and their prompts.

use contracts::UnitPrimitive;

use super::named_code::{AttachedContext, code_context, named_code_in};
use super::tools::build_reader::job_id_in;
use super::tools::resource_identifier::{Identifier, ReaderKind, direct_candidates, resolve};
use super::{RequestContext, Services};
use crate::policy::Subject;

/// The kinds looked for, in the order the first readable one wins.
const KINDS: [ReaderKind; 3] = [
    ReaderKind::Issue,
    ReaderKind::MergeRequest,
    ReaderKind::Epic,
];

/// The identifiers of `question` that name one resource each, by kind.
pub fn named_in(question: &str, base: &url::Url) -> Vec<(ReaderKind, Identifier)> {
    KINDS
        .into_iter()
        .filter_map(
            |kind| match direct_candidates(kind, question, base).as_slice() {
                [one] if *one != Identifier::Current => Some((kind, one.clone())),
                _ => None,
            },
        )
        .collect()
}

/// The context of the first resource the question names that the user may
/// read, if any: work items and jobs first, then commits, files and
/// directories.
pub async fn named_context(services: &Services, ctx: &RequestContext) -> Option<AttachedContext> {
    let named = named_in(&ctx.question, &services.external_url);
    let job = job_id_in(&ctx.question, &services.external_url);
    let code = named_code_in(&ctx.question, &services.external_url);
    if named.is_empty() && job.is_none() && code.is_empty() {
        return None;
    }
    let db = match services.pool.get().await {
        Ok(db) => db,
        Err(e) => {
            tracing::debug!(error = %e, "no database connection for a named resource");
            return None;
        }
    };
    let mut subjects = Vec::new();
    for (kind, identifier) in named {
        // The seat must allow reading this kind, as for its reader tool.
        if !ctx.has_scope(kind.unit_primitive()) {
            continue;
        }
        match resolve(services, ctx, &*db, kind, &identifier).await {
            Ok(Some(id)) => subjects.push(kind.item_kind().subject(id)),
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "a named resource could not be resolved"),
        }
    }
    // A CI job linked from this instance (as `build_reader` finds it).
    if let Some(id) = job.filter(|_| ctx.has_scope(UnitPrimitive::AskBuild)) {
        subjects.push(Subject::Build(id));
    }
    for subject in subjects {
        match crate::work_items::ai::page_context(
            &services.policy,
            &*db,
            ctx.actor,
            subject,
            &services.external_url,
        )
        .await
        {
            Ok(Some(context)) => return Some(AttachedContext::Resource(context)),
            // Refused: as if it did not exist.
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "a named resource could not be read"),
        }
    }
    for named in &code {
        match code_context(services, ctx, &*db, named).await {
            Ok(Some(context)) => return Some(context),
            // Refused, excluded or missing: all alike.
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "named code could not be read"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> url::Url {
        url::Url::parse("http://gitlab.test:3000/").unwrap()
    }

    #[test]
    fn references_and_links_are_found_per_kind() {
        let named = named_in(
            "Compare acme/api#1 with http://gitlab.test:3000/acme/api/-/merge_requests/3 please",
            &base(),
        );
        assert_eq!(
            named,
            vec![
                (
                    ReaderKind::Issue,
                    Identifier::Reference {
                        path: "acme/api".into(),
                        iid: 1
                    }
                ),
                (
                    ReaderKind::MergeRequest,
                    Identifier::Url("http://gitlab.test:3000/acme/api/-/merge_requests/3".into())
                ),
            ]
        );
    }

    #[test]
    fn nothing_is_named_in_a_plain_question_or_an_ambiguous_one() {
        assert!(named_in("What is a merge request?", &base()).is_empty());
        assert!(named_in("Is acme/api#1 a duplicate of acme/api#2?", &base()).is_empty());
        // Links to other hosts are not this instance's resources.
        assert!(named_in("See https://example.com/acme/api/-/issues/1", &base()).is_empty());
    }
}
