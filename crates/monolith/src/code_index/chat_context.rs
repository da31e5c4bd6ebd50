//! A chat question's `REPOSITORY` and `DIRECTORY` context: authorized,
//! searched, and rendered into the item's `content` as GitLab's classic
//! codebase search does, before the agent loop starts.
//!
//! In order, before anything is searched or embedded: the user's seat grants
//! `include_repository_context` / `include_directory_context`; the project
//! exists, the user may read its code and Duo is on for it (otherwise the same
//! answer as for a project that does not exist); the index is usable.
//!
//! An item's `metadata.branch` (seed 002's phase 2) searches that branch's
//! index instead of the default branch's: the name is checked as git checks
//! a branch name before anything is looked up, the branch must exist once
//! the project was authorized, and a branch not indexed yet is queued and
//! answered "being indexed" (see [`super::branches`]).

use std::collections::BTreeSet;

use crate::queries::Queries;
use contracts::{AdditionalContext, ContextCategory, DuoErrorCode, UnitPrimitive};
use uuid::Uuid;

use super::branches::{self, BadBranch};
use super::filters::Exclusions;
use super::search::{self, QueryVector, Retrieval, Scope};
use super::store::{self, IndexState};
use super::{CodeIndex, CodeIndexError};
use crate::gateway_client::EmbeddingPurpose;
use crate::policy::{Actor, AiReader, Policy};

/// What chat says while a project is being indexed (GitLab's wording).
pub const BEING_INDEXED: &str = "The repository is being indexed. Try again in a few minutes.";

/// What chat says while a branch is being indexed.
pub fn branch_being_indexed(branch: &str) -> String {
    format!("The branch {branch} of the repository is being indexed. Try again in a few minutes.")
}

/// A directory this small is sent whole instead of searched.
const SMALL_DIRECTORY_FILES: usize = 5;
const SMALL_DIRECTORY_BYTES: usize = 6_000;
/// Cap on what one item adds to the prompt.
const MAX_ITEM_BYTES: usize = 16_000;

/// How the context turned out.
#[derive(Debug)]
pub enum Outcome {
    /// The items, with repository and directory ones filled in.
    Ready(Vec<AdditionalContext>),
    /// A plain answer instead of running the agent (the index is not ready).
    Answer(String),
    /// A coded refusal or failure.
    Refused(DuoErrorCode, String),
}

/// One repository or directory item, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    project_id: i64,
    directory: Option<String>,
    /// A branch other than the default to search (`metadata.branch`).
    branch: Option<String>,
}

/// Why an item names no searchable target.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BadTarget {
    /// No project GID, or an unusable directory.
    Unreadable,
    Branch(BadBranch),
}

/// Fills the repository and directory items of `items`; other items pass
/// through unchanged.
pub async fn prepare(
    index: &CodeIndex,
    policy: &Policy,
    actor: Actor,
    scopes: &BTreeSet<UnitPrimitive>,
    question: &str,
    items: Vec<AdditionalContext>,
) -> Result<Outcome, CodeIndexError> {
    if !items.iter().any(|i| is_code_context(i.category)) {
        return Ok(Outcome::Ready(items));
    }
    let mut out = Vec::with_capacity(items.len());
    let mut query_vector: Option<QueryVector> = None;
    for mut item in items {
        if !is_code_context(item.category) {
            out.push(item);
            continue;
        }
        let needed = match item.category {
            ContextCategory::Directory => UnitPrimitive::IncludeDirectoryContext,
            _ => UnitPrimitive::IncludeRepositoryContext,
        };
        if !scopes.contains(&needed) {
            return Ok(Outcome::Refused(
                DuoErrorCode::M3005,
                format!("the seat does not include {}", needed.as_str()),
            ));
        }
        let target = match target_of(&item) {
            Ok(target) => target,
            Err(BadTarget::Unreadable) => {
                return Ok(Outcome::Refused(
                    DuoErrorCode::M3003,
                    "unreadable context item".into(),
                ));
            }
            Err(BadTarget::Branch(e)) => {
                return Ok(Outcome::Refused(
                    DuoErrorCode::M4001,
                    format!("metadata.branch: {e}"),
                ));
            }
        };
        match project_context(index, policy, actor, &target, question, &mut query_vector).await? {
            Searched::Text(text) => item.content = Some(text),
            Searched::Other(outcome) => return Ok(outcome),
        }
        out.push(item);
    }
    Ok(Outcome::Ready(out))
}

/// The result of searching one project (or directory) for a question.
#[derive(Debug)]
pub enum Searched {
    /// The info lines and `<search_result>` blocks.
    Text(String),
    /// Not searchable: the answer or refusal to give instead.
    Other(Outcome),
}

/// Authorizes the user for the project's code, checks its index and
/// searches it (or sends a small directory whole). `branch` searches that
/// branch instead of the default one, exactly as an item's
/// `metadata.branch` does: a name git would refuse is M4001 before anything
/// is looked up, then the same authorization, on-demand indexing and
/// exclusions.
pub async fn search_project(
    index: &CodeIndex,
    policy: &Policy,
    actor: Actor,
    project_id: i64,
    directory: Option<String>,
    branch: Option<&str>,
    question: &str,
) -> Result<Searched, CodeIndexError> {
    let branch = match branch.map(branches::validate_name).transpose() {
        Ok(name) => name.map(str::to_owned),
        Err(e) => {
            return Ok(Searched::Other(Outcome::Refused(
                DuoErrorCode::M4001,
                format!("branch: {e}"),
            )));
        }
    };
    let target = Target {
        project_id,
        directory,
        branch,
    };
    project_context(index, policy, actor, &target, question, &mut None).await
}

/// The branch a question's repository or directory context names for
/// `project_id`, if any (the chat tool searches it like the item does).
pub fn context_branch(items: &[AdditionalContext], project_id: i64) -> Option<String> {
    code_targets(items)
        .filter(|t| t.project_id == project_id)
        .find_map(|t| t.branch)
}

/// The project of the question's first repository or directory item.
pub fn context_project(items: &[AdditionalContext]) -> Option<i64> {
    code_targets(items).next().map(|t| t.project_id)
}

/// The readable targets of the code context items (bad ones were refused
/// before the agent started).
fn code_targets(items: &[AdditionalContext]) -> impl Iterator<Item = Target> + '_ {
    items
        .iter()
        .filter(|i| is_code_context(i.category))
        .filter_map(|i| target_of(i).ok())
}

/// [`search_project`] with the question's embedding cached across items.
async fn project_context(
    index: &CodeIndex,
    policy: &Policy,
    actor: Actor,
    target: &Target,
    question: &str,
    query_vector: &mut Option<QueryVector>,
) -> Result<Searched, CodeIndexError> {
    let mut db = index.pool.get().await?;
    let Some(code) = policy
        .code_for_ai(&*db, AiReader::User(actor), target.project_id)
        .await?
    else {
        return Ok(Searched::Other(Outcome::Refused(
            DuoErrorCode::M3003,
            "project not readable".into(),
        )));
    };
    let branch_index = match &target.branch {
        None => None,
        Some(name) => match branch_index(index, &*db, target.project_id, name).await? {
            BranchLookup::Default => None,
            BranchLookup::Indexed(id) => Some((id, name.as_str())),
            BranchLookup::Missing => {
                return Ok(Searched::Other(Outcome::Refused(
                    DuoErrorCode::M4001,
                    format!("the branch {name} does not exist in the repository"),
                )));
            }
            BranchLookup::Other(outcome) => return Ok(Searched::Other(outcome)),
        },
    };
    // A branch's index was found searchable above; the default branch's here.
    let default_status = match branch_index {
        None => Some(store::status(&*db, target.project_id).await?),
        Some(_) => None,
    };
    match default_status {
        None => {}
        Some(Some(s)) if s.state == IndexState::Failed => {
            let code = s
                .last_error_code
                .as_deref()
                .and_then(DuoErrorCode::parse)
                .unwrap_or(DuoErrorCode::A9999);
            return Ok(Searched::Other(Outcome::Refused(
                code,
                format!(
                    "indexing the repository failed: {}",
                    s.last_error.unwrap_or_default()
                ),
            )));
        }
        Some(Some(s)) if s.searchable() => {}
        Some(_) => {
            store::ensure_status(&*db, target.project_id).await?;
            super::enqueue_index(&*db, target.project_id, index.settings.max_attempts).await?;
            return Ok(Searched::Other(Outcome::Answer(BEING_INDEXED.to_owned())));
        }
    }
    let sql = format!(
        "{} SELECT p.name, paths.full_path || '/' || p.path, p.description
         FROM projects p JOIN paths ON paths.id = p.group_id WHERE p.id = $1",
        crate::namespaces::FULL_PATHS
    );
    let project = db.query_one(&sql, &[&target.project_id]).await?;
    let (name, full_path, description): (String, String, String) =
        (project.get(0), project.get(1), project.get(2));
    let exclusions = code.exclusions();

    let mut text = String::new();
    match &target.directory {
        Some(dir) => {
            text.push_str(&format!(
                "Path: {dir}\nRepository ID: gid://gitlab/Project/{}\nRepository Path: {full_path}\n",
                target.project_id
            ));
        }
        None => {
            text.push_str(&format!(
                "Name: {name}\nPath: {full_path}\nDescription: {description}\n"
            ));
        }
    }
    if let Some((_, branch)) = branch_index {
        text.push_str(&format!("Branch: {branch}\n"));
    }
    let branch_id = branch_index.map(|(id, _)| id);
    let whole = match &target.directory {
        Some(dir) => {
            small_directory(index, &*db, target.project_id, branch_id, dir, exclusions).await?
        }
        None => None,
    };
    let blocks = match whole {
        Some(files) => {
            text.push_str("The directory is small, so all of its files follow, each in <search_result> tags.\n");
            files
        }
        None => {
            if query_vector.is_none() {
                let auth = super::embedding_auth(&*db, actor.id, Uuid::new_v4()).await?;
                let model = index.embedding_model(&*db).await?;
                let answer = index
                    .gateway
                    .code_embeddings(
                        &auth,
                        EmbeddingPurpose::Search,
                        &[question.to_owned()],
                        model.as_ref(),
                    )
                    .await?;
                *query_vector = answer.vectors.into_iter().next().map(|vector| QueryVector {
                    model: answer.model,
                    vector,
                });
            }
            let scope = Scope {
                project_id: target.project_id,
                directory: target.directory.clone(),
            };
            let hits = search::search_on(
                &mut db,
                &scope,
                branch_id,
                question,
                query_vector.as_ref(),
                Retrieval::Fused,
                index.settings.search_results,
                exclusions,
            )
            .await?;
            text.push_str(
                "A semantic search was run over the repository's code for the user's question. \
                 The most relevant results follow, each in <search_result> tags.\n",
            );
            hits.into_iter().map(|h| (h.path, h.content)).collect()
        }
    };
    for (path, content) in blocks {
        let block = format!(
            "<search_result>\n<file_path>{path}</file_path>\n<content>{content}</content>\n</search_result>\n"
        );
        if text.len() + block.len() > MAX_ITEM_BYTES {
            break;
        }
        text.push_str(&block);
    }
    Ok(Searched::Text(text))
}

fn is_code_context(category: ContextCategory) -> bool {
    matches!(
        category,
        ContextCategory::Repository | ContextCategory::Directory
    )
}

/// Which index a `metadata.branch` names, once the project is authorized.
#[derive(Debug)]
pub enum BranchLookup {
    /// The default branch (named explicitly).
    Default,
    /// The branch's index, searchable (`code_index_branches.id`).
    Indexed(i64),
    /// No such branch in the repository.
    Missing,
    /// Not searchable: the answer or refusal to give instead.
    Other(Outcome),
}

/// Looks the branch up for a user already authorized for the project
/// (`Policy::code_for_ai`) and a name already checked
/// ([`branches::validate_name`]): it must exist; its index is used (and
/// moves to the back of the eviction order), or queued when missing.
pub async fn branch_index(
    index: &CodeIndex,
    db: &impl Queries,
    project_id: i64,
    branch: &str,
) -> Result<BranchLookup, CodeIndexError> {
    let default: Option<String> = db
        .query_opt(
            "SELECT default_branch FROM projects WHERE id = $1",
            &[&project_id],
        )
        .await?
        .map(|r| r.get(0));
    if default.as_deref() == Some(branch) {
        return Ok(BranchLookup::Default);
    }
    if super::indexer::head_commit(index, project_id, branch)
        .await
        .is_none()
    {
        return Ok(BranchLookup::Missing);
    }
    let existing = branches::find(db, project_id, branch).await?;
    if let Some(row) = existing.as_ref().filter(|r| r.state == IndexState::Failed) {
        let code = row
            .last_error_code
            .as_deref()
            .and_then(DuoErrorCode::parse)
            .unwrap_or(DuoErrorCode::A9999);
        return Ok(BranchLookup::Other(Outcome::Refused(
            code,
            format!(
                "indexing the branch failed: {}",
                row.last_error.clone().unwrap_or_default()
            ),
        )));
    }
    let (row, _) =
        branches::use_branch(db, project_id, branch, index.settings.max_branches).await?;
    if row.searchable() {
        return Ok(BranchLookup::Indexed(row.id));
    }
    super::enqueue_branch_index(db, project_id, branch, index.settings.max_attempts).await?;
    Ok(BranchLookup::Other(Outcome::Answer(branch_being_indexed(
        branch,
    ))))
}

/// The project (and directory, and branch) an item names: a repository item
/// by its project GID (or GitLab's blueprint variant with
/// `metadata.directory`), a directory item by `metadata.projectId` and
/// `metadata.relativePath`; either may name `metadata.branch`.
fn target_of(item: &AdditionalContext) -> Result<Target, BadTarget> {
    let metadata = item.metadata.as_ref();
    let meta_str = |key: &str| metadata.and_then(|m| m.get(key)).and_then(|v| v.as_str());
    let branch = match metadata.and_then(|m| m.get("branch")) {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(name)) => Some(
            branches::validate_name(name)
                .map_err(BadTarget::Branch)?
                .to_owned(),
        ),
        Some(_) => return Err(BadTarget::Branch(BadBranch::NotAName)),
    };
    let target = target_without_branch(item, &meta_str).ok_or(BadTarget::Unreadable)?;
    Ok(Target { branch, ..target })
}

fn target_without_branch<'a>(
    item: &'a AdditionalContext,
    meta_str: &impl Fn(&str) -> Option<&'a str>,
) -> Option<Target> {
    let project_gid = match item.category {
        ContextCategory::Directory => meta_str("projectId").or(item.id.as_deref()),
        _ => item.id.as_deref().or(meta_str("projectId")),
    }?;
    let project_id = match crate::gid::parse(project_gid)? {
        ("Project", id) => id,
        _ => return None,
    };
    let directory = match item.category {
        ContextCategory::Directory => Some(meta_str("relativePath")?.to_owned()),
        _ => meta_str("directory").map(str::to_owned),
    }
    .map(|d| d.trim().trim_matches('/').to_owned())
    .filter(|d| !d.is_empty());
    if directory
        .as_deref()
        .is_some_and(|d| d.contains('\0') || d.split('/').any(|p| p == ".."))
    {
        return None;
    }
    Some(Target {
        project_id,
        directory,
        branch: None,
    })
}

/// A directory's files whole, when there are few and they are small.
async fn small_directory(
    index: &CodeIndex,
    db: &impl Queries,
    project_id: i64,
    branch: Option<i64>,
    directory: &str,
    exclusions: &Exclusions,
) -> Result<Option<Vec<(String, String)>>, CodeIndexError> {
    let Some(pattern) = search::directory_pattern(directory) else {
        return Ok(None);
    };
    let sql = format!(
        "SELECT path, min(blob_id), max(end_byte) FROM code_chunks
         WHERE project_id = $1 AND path LIKE $2 AND {}
         GROUP BY path ORDER BY path LIMIT $3",
        store::on_index(4, branch)
    );
    let rows = db
        .query(
            &sql,
            &[
                &project_id,
                &pattern,
                &((SMALL_DIRECTORY_FILES + 1) as i64),
                &branch,
            ],
        )
        .await?;
    let total: i64 = rows.iter().map(|r| i64::from(r.get::<_, i32>(2))).sum();
    if rows.is_empty() || rows.len() > SMALL_DIRECTORY_FILES || total > SMALL_DIRECTORY_BYTES as i64
    {
        return Ok(None);
    }
    let git_dir = index.repositories.path(project_id);
    let mut files = Vec::new();
    for row in rows {
        let path: String = row.get(0);
        if exclusions.excludes(&path) {
            continue;
        }
        let blob: String = row.get(1);
        let dir = git_dir.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            crate::repositories::reader::blob(&dir, &blob, SMALL_DIRECTORY_BYTES as u64 * 2)
        })
        .await
        .map_err(|e| crate::repositories::RepositoryError::Read(e.to_string()))??;
        files.push((path, String::from_utf8_lossy(&bytes).into_owned()));
    }
    Ok(Some(files))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(v: serde_json::Value) -> AdditionalContext {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn targets_come_from_gids_and_metadata() {
        let repo =
            item(json!({"category": "repository", "id": "gid://gitlab/Project/7", "content": ""}));
        assert_eq!(
            target_of(&repo),
            Ok(Target {
                project_id: 7,
                directory: None,
                branch: None,
            })
        );
        let dir = item(
            json!({"category": "directory", "id": "dir:///x/src/auth", "content": "",
            "metadata": {"relativePath": "src/auth/", "projectId": "gid://gitlab/Project/7"}}),
        );
        assert_eq!(
            target_of(&dir),
            Ok(Target {
                project_id: 7,
                directory: Some("src/auth".into()),
                branch: None,
            })
        );
        let blueprint = item(
            json!({"category": "repository", "id": "gid://gitlab/Project/3",
            "metadata": {"directory": "lib"}}),
        );
        assert_eq!(
            target_of(&blueprint).ok().and_then(|t| t.directory),
            Some("lib".into())
        );
        let escape = item(
            json!({"category": "directory", "metadata": {"relativePath": "../x", "projectId": "gid://gitlab/Project/7"}}),
        );
        assert_eq!(target_of(&escape), Err(BadTarget::Unreadable));
        let no_path = item(
            json!({"category": "directory", "metadata": {"projectId": "gid://gitlab/Project/7"}}),
        );
        assert_eq!(target_of(&no_path), Err(BadTarget::Unreadable));
        let other = item(json!({"category": "repository", "id": "gid://gitlab/Group/7"}));
        assert_eq!(target_of(&other), Err(BadTarget::Unreadable));
    }

    #[test]
    fn branches_come_from_metadata_and_are_checked_first() {
        let on_branch = item(
            json!({"category": "repository", "id": "gid://gitlab/Project/3",
            "metadata": {"branch": "feature/x"}}),
        );
        assert_eq!(
            target_of(&on_branch).ok().and_then(|t| t.branch),
            Some("feature/x".into())
        );
        let dir = item(
            json!({"category": "directory", "metadata": {"relativePath": "src",
            "projectId": "gid://gitlab/Project/7", "branch": "refs/heads/topic"}}),
        );
        assert_eq!(
            target_of(&dir).ok().and_then(|t| t.branch),
            Some("topic".into())
        );
        for bad in [json!("a..b"), json!("x\u{0}y"), json!(""), json!(7)] {
            let item = item(
                json!({"category": "repository", "id": "gid://gitlab/Project/3",
                "metadata": {"branch": bad}}),
            );
            assert!(
                matches!(target_of(&item), Err(BadTarget::Branch(_))),
                "{bad}"
            );
        }
    }
}
