//! `codebase_search`: searches one project's code index for the agent, so a
//! question like "where is the rate limit configured in acme/website?"
//! works without the client attaching repository context.
//!
//! The Action Input names the project by its full path (the first word with
//! a `/` that is a project); otherwise the project of the question's
//! repository or directory context, or of the page the user is on. When the
//! question's repository or directory context for that project names a
//! branch (`metadata.branch`), that branch is searched, as the item itself
//! is. The same checks as repository context apply before anything is
//! searched (`read_code`, Duo on for the project; a missing and an
//! unreadable project answer alike), and a project or branch still being
//! indexed says so.

use async_trait::async_trait;
use contracts::{DuoErrorCode, UnitPrimitive};

use super::{Tool, ToolEnv, ToolInput, ToolOutcome};
use crate::chat::completion::ChatAnswer;
use crate::code_index::chat_context::{self, Outcome, Searched};
use crate::policy::Subject;

pub struct CodebaseSearch;

/// Words of the input that look like a project's full path.
fn path_candidates(input: &str) -> Vec<String> {
    input
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| {
                matches!(c, '`' | '"' | '\'' | ',' | '.' | '?' | ':' | '(' | ')')
            })
        })
        .filter(|w| {
            w.contains('/')
                && w.len() <= 255
                && w.split('/').all(|part| {
                    !part.is_empty()
                        && part
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                })
        })
        .map(str::to_owned)
        .collect()
}

#[async_trait]
impl Tool for CodebaseSearch {
    fn name(&self) -> &'static str {
        "codebase_search"
    }

    fn unit_primitive(&self) -> UnitPrimitive {
        UnitPrimitive::CodebaseSearch
    }

    fn feature_flag(&self) -> Option<&'static str> {
        Some("ai_codebase_search_for_chat")
    }

    async fn execute(&self, env: &ToolEnv<'_>, input: &ToolInput) -> ToolOutcome {
        let services = env.services;
        let db = match services.pool.get().await {
            Ok(db) => db,
            Err(e) => return ToolOutcome::failed(DuoErrorCode::A9999, e.to_string()),
        };
        let mut project = None;
        let mut query = input.input.clone();
        for candidate in path_candidates(&input.input) {
            match crate::namespaces::project_id_by_full_path(&*db, &candidate).await {
                Ok(Some(id)) => {
                    project = Some(id);
                    query = query.replacen(&candidate, " ", 1);
                    break;
                }
                Ok(None) => {}
                Err(e) => return ToolOutcome::failed(DuoErrorCode::A9999, e.to_string()),
            }
        }
        if project.is_none() {
            project = chat_context::context_project(&env.ctx.additional_context);
        }
        if project.is_none()
            && let Some(resource) = env.ctx.resource
        {
            project = match services.policy.container_of(&*db, resource).await {
                Ok(Some(Subject::Project(id))) => Some(id),
                Ok(_) => None,
                Err(e) => return ToolOutcome::failed(DuoErrorCode::A9999, e.to_string()),
            };
        }
        drop(db);
        let Some(project) = project else {
            return ToolOutcome::Observation(
                "No project was named. Ask the user which project's code to search \
                 (its full path, such as group/project)."
                    .to_owned(),
            );
        };
        let query = if query.trim().is_empty() {
            env.ctx.question.clone()
        } else {
            query.trim().to_owned()
        };
        let branch = chat_context::context_branch(&env.ctx.additional_context, project);
        match chat_context::search_project(
            &services.code_index,
            &services.policy,
            env.ctx.actor,
            project,
            None,
            branch.as_deref(),
            &query,
        )
        .await
        {
            Ok(Searched::Text(text)) => ToolOutcome::Observation(text),
            Ok(Searched::Other(Outcome::Answer(text))) => {
                let _ = env.chunks.send(text.clone());
                ToolOutcome::Final(ChatAnswer::text(text))
            }
            Ok(Searched::Other(Outcome::Refused(code, detail))) => {
                ToolOutcome::failed(code, detail)
            }
            Ok(Searched::Other(Outcome::Ready(_))) => {
                ToolOutcome::failed(DuoErrorCode::A9999, "unexpected search outcome")
            }
            Err(e) => ToolOutcome::failed(e.code(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_paths_are_picked_from_the_input() {
        assert_eq!(
            path_candidates("acme/website rate limit, or `a/b/c`?"),
            vec!["acme/website".to_owned(), "a/b/c".to_owned()]
        );
        assert!(path_candidates("rate limit / throttle").is_empty());
    }
}
