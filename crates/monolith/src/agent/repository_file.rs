//! A `currentFile` that names a repository file instead of carrying its text:
//! a blob link of this instance (`<project>/-/blob/<ref>/<path>`), or a path in
//! the project the question is about (its default branch). The file is read
//! only after the policy lets the user read the project's code and send it to
//! AI, and only when the project's Duo context exclusion rules let it through
//! ([`Policy::code_for_ai`]); otherwise nothing is read. Text the client sent
//! itself (an editor's file or selection) is held to the same rules when it
//! says which file of this instance it comes from.

use crate::queries::Queries;

use crate::policy::{Actor, AiReader, CodeForAi, Policy, Subject};
use crate::repositories::{Repositories, reader};

/// Most characters of a file sent as the selection.
pub const MAX_FILE_CHARS: usize = 60_000;

/// Where a named file is: the project, the revision (`None`: the default
/// branch) and the path inside the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLocation {
    pub project_path: Option<String>,
    pub rev_and_path: String,
}

/// `https://host/acme/website/-/blob/main/src/app.js` → (`acme/website`,
/// `main/src/app.js`); the split of the ref from the path needs the repository.
pub fn parse_blob_url(text: &str, base: &url::Url) -> Option<FileLocation> {
    let path = super::instance_links::path_below(text, base)?;
    let (project, rest) = path.split_once("/-/blob/")?;
    Some(FileLocation {
        project_path: Some(project.to_owned()),
        rev_and_path: rest.to_owned(),
    })
}

/// A file named by a question, as it may go to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileText {
    Text(String),
    /// The project's Duo context exclusion rules exclude it: nothing of it
    /// is read.
    Excluded,
    /// No file the user may send to AI (or none at all).
    Unavailable,
}

/// Reads the file `name` refers to for `actor`, if it names one they may send
/// to AI. `resource` is the question's page resource.
pub async fn read(
    db: &impl Queries,
    policy: &Policy,
    repositories: &Repositories,
    base: &url::Url,
    actor: Actor,
    resource: Option<Subject>,
    name: &str,
) -> Result<FileText, String> {
    let located = parse_blob_url(name, base);
    let project = match &located {
        Some(FileLocation {
            project_path: Some(path),
            ..
        }) => crate::namespaces::project_id_by_full_path(db, path)
            .await
            .map_err(|e| e.to_string())?,
        _ => match resource {
            Some(Subject::Project(id)) => Some(id),
            _ => None,
        },
    };
    let Some(project) = project else {
        return Ok(FileText::Unavailable);
    };
    let Some(code) = policy
        .code_for_ai(db, AiReader::User(actor), project)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(FileText::Unavailable);
    };
    let default_branch = crate::namespaces::projects::default_branch(db, project)
        .await
        .map_err(|e| e.to_string())?;
    let path = repositories.path(project);
    if !path.join("HEAD").exists() {
        return Ok(FileText::Unavailable);
    }
    let rev_and_path = match located {
        Some(l) => l.rev_and_path,
        None => format!("{default_branch}/{}", name.trim_start_matches('/')),
    };
    tokio::task::spawn_blocking(move || read_at(&path, &rev_and_path, &code))
        .await
        .map_err(|e| e.to_string())
}

/// Whether text the client sent along as the content of `name` may go to
/// the model. `name` is a blob link of this instance, or a path in
/// `project` (the item's own project) or else in the page's project. When it
/// names a project of this instance, that project's gate must let the file
/// through ([`Policy::code_for_ai`]: Duo on, the exclusion rules); text
/// that names no project here passes (nothing of ours to hold back).
pub async fn sent_text_allowed(
    db: &impl Queries,
    policy: &Policy,
    base: &url::Url,
    actor: Actor,
    resource: Option<Subject>,
    project: Option<i64>,
    name: &str,
) -> Result<bool, String> {
    let (project, paths) = match parse_blob_url(name, base) {
        Some(FileLocation {
            project_path: Some(path),
            rev_and_path,
        }) => {
            // Unknown projects fail closed: the link says it is ours.
            let id = crate::namespaces::project_id_by_full_path(db, &path)
                .await
                .map_err(|e| e.to_string())?
                .unwrap_or(0);
            (Some(id), path_candidates(&rev_and_path))
        }
        _ => {
            let page_project = match resource {
                Some(subject) => match policy
                    .container_of(db, subject)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    Some(Subject::Project(id)) => Some(id),
                    _ => None,
                },
                None => None,
            };
            (project.or(page_project), vec![name.to_owned()])
        }
    };
    let Some(project) = project else {
        return Ok(true);
    };
    let code = policy
        .code_for_ai(db, AiReader::User(actor), project)
        .await
        .map_err(|e| e.to_string())?;
    Ok(code.is_some_and(|code| paths.iter().all(|p| code.allows(p))))
}

/// Each way `ref/path` may split into a path (refs may contain slashes):
/// all are checked, so no reading of the ref lets an excluded file through.
fn path_candidates(rev_and_path: &str) -> Vec<String> {
    let parts: Vec<&str> = rev_and_path.split('/').collect();
    (1..parts.len()).map(|i| parts[i..].join("/")).collect()
}

/// Why a `file` context item could not be filled.
#[derive(Debug)]
pub enum FileItemError {
    /// The item names no file the user may send to AI (or none at all):
    /// the same answer whether the project is hidden or the file missing.
    Unreadable,
    /// Reading failed (database, repository): worth a retry.
    Failed(String),
}

/// Fills the `file` items that name a repository file of this instance
/// (`metadata.projectId`, `metadata.relativePath`, optional `metadata.ref`)
/// and came without content, as the web pages' "Ask Duo about this file"
/// sends them: the file is read only after the policy lets the user send
/// the project's code to AI and its exclusion rules let the file through.
/// Items that carry their own content (an editor's open file or selection)
/// keep it only when [`sent_text_allowed`]; an excluded file's item says so
/// instead of holding its content. Other categories pass through unchanged.
pub async fn fill_file_items(
    db: &impl Queries,
    policy: &Policy,
    repositories: &Repositories,
    base: &url::Url,
    actor: Actor,
    resource: Option<Subject>,
    items: Vec<contracts::AdditionalContext>,
) -> Result<Vec<contracts::AdditionalContext>, FileItemError> {
    let failed = |e: String| FileItemError::Failed(e);
    let mut out = Vec::with_capacity(items.len());
    for mut item in items {
        let is_file = item.category == contracts::ContextCategory::File;
        let is_code = is_file || item.category == contracts::ContextCategory::Snippet;
        let empty = item.content.as_deref().is_none_or(|c| c.trim().is_empty());
        if !is_code || (!is_file && empty) {
            out.push(item);
            continue;
        }
        if !empty {
            let (project, name) = sent_item_origin(&item);
            if let Some(name) = name
                && !sent_text_allowed(db, policy, base, actor, resource, project, &name)
                    .await
                    .map_err(failed)?
            {
                item.content = Some(CodeForAi::excluded_note(&name));
            }
            out.push(item);
            continue;
        }
        let Some(location) = RepositoryFileItem::of(item.metadata.as_ref()) else {
            return Err(FileItemError::Unreadable);
        };
        let text = match read_item(db, policy, repositories, actor, &location).await? {
            FileText::Text(text) => text,
            FileText::Excluded => CodeForAi::excluded_note(&location.path),
            FileText::Unavailable => return Err(FileItemError::Unreadable),
        };
        item.content = Some(text);
        out.push(item);
    }
    Ok(out)
}

/// Where a context item that carries content says it comes from: its
/// project (`metadata.projectId`) and its file (`metadata.relativePath`,
/// else an id that is a blob link).
fn sent_item_origin(item: &contracts::AdditionalContext) -> (Option<i64>, Option<String>) {
    let metadata = item.metadata.as_ref();
    let text = |key: &str| {
        metadata
            .and_then(|m| m.get(key))
            .and_then(serde_json::Value::as_str)
    };
    let project = text("projectId")
        .and_then(crate::gid::parse)
        .and_then(|(kind, id)| (kind == "Project").then_some(id));
    let name = text("relativePath")
        .or(item.id.as_deref())
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned);
    (project, name)
}

/// Where a `file` item's metadata says its file is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RepositoryFileItem {
    project_id: i64,
    reference: Option<String>,
    path: String,
}

impl RepositoryFileItem {
    fn of(metadata: Option<&serde_json::Map<String, serde_json::Value>>) -> Option<Self> {
        let metadata = metadata?;
        let text = |key: &str| metadata.get(key).and_then(serde_json::Value::as_str);
        let project_id = match crate::gid::parse(text("projectId")?)? {
            ("Project", id) => id,
            _ => return None,
        };
        let path = reader::clean_path(text("relativePath")?).ok()?;
        if path.is_empty() {
            return None;
        }
        let reference = text("ref")
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_owned);
        Some(Self {
            project_id,
            reference,
            path,
        })
    }
}

async fn read_item(
    db: &impl Queries,
    policy: &Policy,
    repositories: &Repositories,
    actor: Actor,
    location: &RepositoryFileItem,
) -> Result<FileText, FileItemError> {
    let failed = |e: &dyn std::fmt::Display| FileItemError::Failed(e.to_string());
    let Some(code) = policy
        .code_for_ai(db, AiReader::User(actor), location.project_id)
        .await
        .map_err(|e| failed(&e))?
    else {
        return Ok(FileText::Unavailable);
    };
    if !code.allows(&location.path) {
        return Ok(FileText::Excluded);
    }
    let reference = match &location.reference {
        Some(r) => r.clone(),
        None => match crate::namespaces::projects::default_branch_if_any(db, location.project_id)
            .await
            .map_err(|e| failed(&e))?
        {
            Some(branch) => branch,
            None => return Ok(FileText::Unavailable),
        },
    };
    let repository = repositories.path(location.project_id);
    if !repository.join("HEAD").exists() {
        return Ok(FileText::Unavailable);
    }
    let file = location.path.clone();
    let text = tokio::task::spawn_blocking(move || {
        let commit = reader::resolve(&repository, &reference).ok()?;
        read_text(&repository, &commit, &file)
    })
    .await
    .map_err(|e| failed(&e))?;
    Ok(text.map_or(FileText::Unavailable, FileText::Text))
}

/// Tries each split of `ref/path` (refs may contain slashes), shortest ref
/// first; the first ref that resolves decides, and its path must be one the
/// project's exclusion rules let through.
fn read_at(path: &std::path::Path, rev_and_path: &str, code: &CodeForAi) -> FileText {
    let parts: Vec<&str> = rev_and_path.split('/').collect();
    for split in 1..parts.len() {
        let (rev, file) = (parts[..split].join("/"), parts[split..].join("/"));
        let Ok(commit) = reader::resolve(path, &rev) else {
            continue;
        };
        if !code.allows(&file) {
            return FileText::Excluded;
        }
        return read_text(path, &commit, &file).map_or(FileText::Unavailable, FileText::Text);
    }
    FileText::Unavailable
}

/// A text file's content at `commit`, cut to [`MAX_FILE_CHARS`].
fn read_text(repository: &std::path::Path, commit: &str, file: &str) -> Option<String> {
    let blob = reader::file(repository, commit, file, (MAX_FILE_CHARS * 4) as u64).ok()?;
    let text = String::from_utf8(blob.content).ok()?;
    Some(crate::agent::tools::resource_identifier::bounded(
        &text,
        MAX_FILE_CHARS,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_links_of_this_instance_only() {
        let base = url::Url::parse("http://localhost:3000/").unwrap();
        assert_eq!(
            parse_blob_url(
                "http://localhost:3000/acme/website/-/blob/main/src/app.js",
                &base
            ),
            Some(FileLocation {
                project_path: Some("acme/website".into()),
                rev_and_path: "main/src/app.js".into()
            })
        );
        assert_eq!(
            parse_blob_url("http://elsewhere/acme/w/-/blob/main/x", &base),
            None
        );
        assert_eq!(parse_blob_url("src/app.js", &base), None);
    }

    #[test]
    fn file_items_name_a_project_and_a_clean_path() {
        let item = |v: serde_json::Value| RepositoryFileItem::of(v.as_object());
        assert_eq!(
            item(
                serde_json::json!({"projectId": "gid://gitlab/Project/7", "relativePath": "src/app.js", "ref": "main"})
            ),
            Some(RepositoryFileItem {
                project_id: 7,
                reference: Some("main".into()),
                path: "src/app.js".into()
            })
        );
        assert_eq!(
            item(
                serde_json::json!({"projectId": "gid://gitlab/Project/7", "relativePath": "../etc/passwd"})
            ),
            None
        );
        assert_eq!(
            item(serde_json::json!({"projectId": "gid://gitlab/Issue/7", "relativePath": "a"})),
            None
        );
        assert_eq!(
            item(
                serde_json::json!({"projectId": "gid://gitlab/Project/7", "relativePath": "a\u{0}b"})
            ),
            None
        );
        assert_eq!(item(serde_json::json!({"relativePath": "a"})), None);
    }
}
