//! `commit_reader`: reads one commit of a repository the user may read: its
//! message, author, stats and a bounded diff.
//!
//! A commit is named by a link of this instance (`<project>/-/commit/<sha>`), a
//! reference (`group/project@<sha>`), or an id together with a project path
//! ("commit 1a2b3c in acme/website") or the project of the page the user is on.
//! Anything less plain goes to the gateway's identifier prompt
//! (`chat/commit_reader`). The user's access to the project's code is checked
//! before the repository is opened: a missing commit and an unreadable one end
//! the same way (M3003). The diff of a file the project's Duo context
//! exclusion rules exclude is left out, and the model is told it was.

use crate::queries::Queries;
use async_trait::async_trait;
use contracts::{DuoErrorCode, UnitPrimitive};
use serde_json::{Map, Value, json};

use super::resource_identifier::{MAX_TEXT_CHARS, bounded};
use super::{Tool, ToolEnv, ToolInput, ToolOutcome};
use crate::agent::{RequestContext, Services};
use crate::policy::{Ability, Actor, AiReader, ChatAuthError, CodeForAi, Subject};
use crate::repositories::reader;

/// Identifier prompt attempts before giving up with M3003.
const PROMPT_ATTEMPTS: usize = 3;
/// Most changed files listed for the model.
const MAX_FILES: usize = 50;

/// How a question names a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitRef {
    /// A project's full path and a commit id (or its prefix).
    InProject { path: String, sha: String },
    /// An id alone: in the project of the user's page.
    InCurrentProject { sha: String },
}

fn is_sha(text: &str) -> bool {
    (7..=40).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_project_path(text: &str) -> bool {
    text.contains('/')
        && text.split('/').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

/// `<base>/<project>/-/commit/<sha>` of this instance.
fn parse_url(text: &str, base: &url::Url) -> Option<CommitRef> {
    let path = crate::agent::instance_links::path_below(text, base)?;
    let (project, rest) = path.split_once("/-/commit/")?;
    let sha = rest.trim_end_matches('/');
    (is_sha(sha) && is_project_path(project)).then(|| CommitRef::InProject {
        path: project.to_owned(),
        sha: sha.to_ascii_lowercase(),
    })
}

/// `group/project@sha`.
fn parse_reference(text: &str) -> Option<CommitRef> {
    let (path, sha) = text.rsplit_once('@')?;
    (is_sha(sha) && is_project_path(path)).then(|| CommitRef::InProject {
        path: path.to_owned(),
        sha: sha.to_ascii_lowercase(),
    })
}

/// The plain ways `text` names a commit; `None` when it needs interpretation.
pub fn direct_commit(text: &str, base: &url::Url) -> Option<CommitRef> {
    let tokens: Vec<&str> = text
        .split_whitespace()
        .map(|raw| {
            raw.trim_start_matches(['(', '"', '\'', '`'])
                .trim_end_matches(|c: char| {
                    matches!(
                        c,
                        ',' | '.' | '?' | '!' | ')' | '"' | '\'' | ':' | ';' | '`'
                    )
                })
        })
        .filter(|t| !t.is_empty())
        .collect();
    let mut found: Vec<CommitRef> = Vec::new();
    for token in &tokens {
        let hit = if token.starts_with("http://") || token.starts_with("https://") {
            parse_url(token, base)
        } else {
            parse_reference(token)
        };
        if let Some(hit) = hit
            && !found.contains(&hit)
        {
            found.push(hit);
        }
    }
    if !found.is_empty() {
        return (found.len() == 1).then(|| found.remove(0));
    }
    // An id and at most one project path, in any order.
    let shas: Vec<&&str> = tokens.iter().filter(|t| is_sha(t)).collect();
    let paths: Vec<&&str> = tokens
        .iter()
        .filter(|t| is_project_path(t) && !t.starts_with("http"))
        .collect();
    match (shas.as_slice(), paths.as_slice()) {
        ([sha], [path]) => Some(CommitRef::InProject {
            path: (**path).to_owned(),
            sha: sha.to_ascii_lowercase(),
        }),
        ([sha], []) => Some(CommitRef::InCurrentProject {
            sha: sha.to_ascii_lowercase(),
        }),
        _ => None,
    }
}

/// Reads the identifier prompt's JSON answer.
pub fn parse_identifier_json(text: &str, base: &url::Url) -> Option<CommitRef> {
    let value: Value = serde_json::from_str(text.get(text.find('{')?..=text.rfind('}')?)?).ok()?;
    let object = value.as_object()?;
    let get = |key: &str| {
        object
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .and_then(|(_, v)| v.as_str().map(|s| s.trim().to_owned()))
    };
    let identifier = get("ResourceIdentifier")?;
    match get("ResourceIdentifierType")?.to_ascii_lowercase().as_str() {
        "url" => parse_url(&identifier, base),
        "reference" => parse_reference(&identifier),
        "iid" | "current" if is_sha(&identifier) => Some(CommitRef::InCurrentProject {
            sha: identifier.to_ascii_lowercase(),
        }),
        _ => None,
    }
}

pub struct CommitReader;

impl CommitReader {
    async fn identify(
        &self,
        env: &ToolEnv<'_>,
        input: &ToolInput,
    ) -> Result<Option<CommitRef>, ToolOutcome> {
        if let Some(found) = direct_commit(&input.input, &env.services.external_url) {
            return Ok(Some(found));
        }
        let mut inputs = Map::new();
        inputs.insert("input".into(), json!(input.input));
        inputs.insert("suggestions".into(), json!(input.suggestions));
        for _ in 0..PROMPT_ATTEMPTS {
            let text = env
                .services
                .gateway
                .prompt(
                    &env.ctx.auth,
                    "chat/commit_reader",
                    inputs.clone(),
                    env.ctx.model.metadata(),
                )
                .await
                .map_err(|err| ToolOutcome::failed(err.code(), err.to_string()))?;
            if let Some(found) = parse_identifier_json(&text, &env.services.external_url) {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl Tool for CommitReader {
    fn name(&self) -> &'static str {
        "commit_reader"
    }

    fn unit_primitive(&self) -> UnitPrimitive {
        UnitPrimitive::AskCommit
    }

    fn feature_flag(&self) -> Option<&'static str> {
        Some("ai_commit_reader_for_chat")
    }

    async fn execute(&self, env: &ToolEnv<'_>, input: &ToolInput) -> ToolOutcome {
        let not_found = || ToolOutcome::failed(DuoErrorCode::M3003, "not found or not readable");
        let commit = match self.identify(env, input).await {
            Ok(Some(commit)) => commit,
            Ok(None) => return not_found(),
            Err(outcome) => return outcome,
        };
        let db = match env.services.pool.get().await {
            Ok(db) => db,
            Err(e) => return ToolOutcome::failed(DuoErrorCode::M4001, e.to_string()),
        };
        let (project, sha) = match commit_project(env.services, env.ctx, &*db, &commit).await {
            Ok(Some(found)) => found,
            Ok(None) => return not_found(),
            Err(e) => return ToolOutcome::failed(DuoErrorCode::M4001, e),
        };
        let (code, full_path) =
            match readable_commit_code(env.services, &*db, env.ctx.actor, project).await {
                Ok(found) => found,
                Err(CommitRefusal::Hidden) => return not_found(),
                Err(CommitRefusal::Denied(code)) => {
                    return ToolOutcome::failed(code, "not found or not readable");
                }
                Err(CommitRefusal::Failed(e)) => {
                    return ToolOutcome::failed(DuoErrorCode::M4001, e);
                }
            };
        drop(db);
        match describe(env.services, &code, &full_path, &sha).await {
            Ok(Some(text)) => ToolOutcome::Observation(format!(
                "Please use this information about the identified commit: {text}"
            )),
            Ok(None) => not_found(),
            Err(e) => ToolOutcome::failed(DuoErrorCode::M5000, e),
        }
    }
}

/// The project `commit` is in (it exists; nothing said about access): the
/// named one, or the project of the user's page.
pub async fn commit_project(
    services: &Services,
    ctx: &RequestContext,
    db: &impl Queries,
    commit: &CommitRef,
) -> Result<Option<(i64, String)>, String> {
    match commit {
        CommitRef::InProject { path, sha } => {
            Ok(crate::namespaces::project_id_by_full_path(db, path)
                .await
                .map_err(|e| e.to_string())?
                .map(|id| (id, sha.clone())))
        }
        CommitRef::InCurrentProject { sha } => {
            let Some(resource) = ctx.resource else {
                return Ok(None);
            };
            match services
                .policy
                .container_of(db, resource)
                .await
                .map_err(|e| e.to_string())?
            {
                Some(Subject::Project(id)) => Ok(Some((id, sha.clone()))),
                _ => Ok(None),
            }
        }
    }
}

/// Why a project's commits may not be shown to the model.
#[derive(Debug)]
pub enum CommitRefusal {
    /// Treated as missing: no code access, or no Duo for the user here.
    Hidden,
    /// Refused with GitLab's chat code for the resource.
    Denied(DuoErrorCode),
    /// The database or the policy failed.
    Failed(String),
}

/// The checks before a commit of `project` is read, in order: the user's
/// access to its code (a guest sees the project but not its commits), then
/// Duo for the project, then the exclusion rules the diff is held to.
/// Returns those rules and the project's full path.
pub async fn readable_commit_code(
    services: &Services,
    db: &impl Queries,
    actor: Actor,
    project: i64,
) -> Result<(CodeForAi, String), CommitRefusal> {
    let failed = |e: &dyn std::fmt::Display| CommitRefusal::Failed(e.to_string());
    let subject = Subject::Project(project);
    if !services
        .policy
        .can(db, Some(actor), Ability::ReadCode, subject)
        .await
        .map_err(|e| failed(&e))?
    {
        return Err(CommitRefusal::Hidden);
    }
    match services
        .policy
        .authorize_chat_resource(db, Some(actor), subject)
        .await
    {
        Ok(()) => {}
        Err(ChatAuthError::Denied(code)) => return Err(CommitRefusal::Denied(code)),
        Err(ChatAuthError::Policy(e)) => return Err(failed(&e)),
    }
    let code = services
        .policy
        .code_for_ai(db, AiReader::User(actor), project)
        .await
        .map_err(|e| failed(&e))?
        .ok_or(CommitRefusal::Hidden)?;
    let full_path = crate::namespaces::projects::full_path(db, project)
        .await
        .map_err(|e| failed(&e))?;
    Ok((code, full_path))
}

/// The commit as the model reads it; `None` when the repository has no such commit.
pub async fn describe(
    services: &Services,
    code: &CodeForAi,
    full_path: &str,
    sha: &str,
) -> Result<Option<String>, String> {
    let path = services.repositories.path(code.project_id());
    if !path.join("HEAD").exists() {
        return Ok(None);
    }
    let (p, s) = (path.clone(), sha.to_owned());
    let info = tokio::task::spawn_blocking(move || {
        reader::resolve(&p, &s).and_then(|id| reader::commit(&p, &id))
    })
    .await
    .map_err(|e| e.to_string())?;
    let Ok(info) = info else {
        return Ok(None);
    };
    let changes = reader::diff(
        &path,
        info.parent_ids.first().map(String::as_str),
        &info.id,
        MAX_FILES,
    )
    .await
    .map_err(|e| e.to_string())?;
    let (additions, deletions) = changes
        .iter()
        .fold((0u64, 0u64), |(a, d), c| (a + c.additions, d + c.deletions));
    // The diff shares one budget across files, in the order git lists them.
    let mut budget = MAX_TEXT_CHARS;
    let mut files = Vec::new();
    for change in &changes {
        // A rename counts as both paths: either one excluded hides the diff.
        let excluded = !code.allows(&change.old_path) || !code.allows(&change.new_path);
        let diff = if excluded {
            CodeForAi::excluded_note(&change.new_path)
        } else {
            let diff = bounded(&change.diff, budget);
            budget = budget.saturating_sub(change.diff.chars().count());
            diff
        };
        files.push(json!({
            "old_path": change.old_path,
            "new_path": change.new_path,
            "new_file": change.new_file,
            "deleted_file": change.deleted_file,
            "renamed_file": change.renamed_file,
            "excluded": excluded,
            "diff": diff,
        }));
    }
    let base = services.external_url.as_str().trim_end_matches('/');
    let body = json!({
        "id": info.id,
        "project": full_path,
        "web_url": format!("{base}/{full_path}/-/commit/{}", info.id),
        "title": info.title,
        "message": bounded(&info.message, MAX_TEXT_CHARS),
        "author_name": info.author_name,
        "author_email": info.author_email,
        "authored_date": info.authored_date.to_rfc3339(),
        "parent_ids": info.parent_ids,
        "stats": { "additions": additions, "deletions": deletions, "total": additions + deletions, "files": changes.len() },
        "diffs": files,
    });
    Ok(Some(format!("<commit>{body}</commit>")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> url::Url {
        url::Url::parse("https://gitlab.example.com/").unwrap()
    }

    #[test]
    fn plain_forms_are_found() {
        let in_project = |path: &str, sha: &str| {
            Some(CommitRef::InProject {
                path: path.into(),
                sha: sha.into(),
            })
        };
        assert_eq!(
            direct_commit("What does commit 1a2b3c4 in acme/website change?", &base()),
            in_project("acme/website", "1a2b3c4")
        );
        assert_eq!(
            direct_commit(
                "explain https://gitlab.example.com/acme/website/-/commit/ABCDEF1234",
                &base()
            ),
            in_project("acme/website", "abcdef1234")
        );
        assert_eq!(
            direct_commit("see acme/web@deadbeef.", &base()),
            in_project("acme/web", "deadbeef")
        );
        assert_eq!(
            direct_commit("what changed in 0123456?", &base()),
            Some(CommitRef::InCurrentProject {
                sha: "0123456".into()
            })
        );
        // Other hosts, two ids, or no id at all need the prompt.
        assert_eq!(
            direct_commit("https://evil.example.com/acme/w/-/commit/1234567", &base()),
            None
        );
        assert_eq!(
            direct_commit("compare 1234567 and 7654321 in acme/w", &base()),
            None
        );
        assert_eq!(direct_commit("the latest commit please", &base()), None);
    }

    #[test]
    fn the_prompts_answer_is_read() {
        let text = r#"Sure: {"ResourceIdentifierType": "reference", "ResourceIdentifier": "acme/w@1234567"}"#;
        assert_eq!(
            parse_identifier_json(text, &base()),
            Some(CommitRef::InProject {
                path: "acme/w".into(),
                sha: "1234567".into()
            })
        );
        assert_eq!(parse_identifier_json("{}", &base()), None);
    }
}
