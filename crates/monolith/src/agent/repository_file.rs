//! A `currentFile` that names a repository file instead of carrying its text:
//! a blob link of this instance (`<project>/-/blob/<ref>/<path>`), or a path in
//! the project the question is about (its default branch). The file is read
//! only after the policy lets the user read the project's code and send it to
//! AI; otherwise nothing is read and the command says no code was given.

use crate::queries::Queries;

use crate::policy::{Ability, Actor, Policy, Subject};
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
    let url = url::Url::parse(text.trim()).ok()?;
    if url.host_str() != base.host_str()
        || url.port_or_known_default() != base.port_or_known_default()
    {
        return None;
    }
    let path = url
        .path()
        .strip_prefix(base.path().trim_end_matches('/'))?
        .trim_start_matches('/');
    let (project, rest) = path.split_once("/-/blob/")?;
    Some(FileLocation {
        project_path: Some(project.to_owned()),
        rev_and_path: rest.to_owned(),
    })
}

/// Reads the file `name` refers to for `actor`, if it names one they may send
/// to AI; `None` otherwise. `resource` is the question's page resource.
pub async fn read(
    db: &impl Queries,
    policy: &Policy,
    repositories: &Repositories,
    base: &url::Url,
    actor: Actor,
    resource: Option<Subject>,
    name: &str,
) -> Result<Option<String>, String> {
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
        return Ok(None);
    };
    let subject = Subject::Project(project);
    if !policy
        .can(db, Some(actor), Ability::ReadCode, subject)
        .await
        .map_err(|e| e.to_string())?
        || !policy
            .may_send_to_ai(db, actor, subject)
            .await
            .map_err(|e| e.to_string())?
    {
        return Ok(None);
    }
    let default_branch: String = db
        .query_one(
            "SELECT default_branch FROM projects WHERE id = $1",
            &[&project],
        )
        .await
        .map_err(|e| e.to_string())?
        .get(0);
    let path = repositories.path(project);
    if !path.join("HEAD").exists() {
        return Ok(None);
    }
    let rev_and_path = match located {
        Some(l) => l.rev_and_path,
        None => format!("{default_branch}/{}", name.trim_start_matches('/')),
    };
    tokio::task::spawn_blocking(move || read_at(&path, &rev_and_path))
        .await
        .map_err(|e| e.to_string())
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
/// sends them: the file is read only after the policy lets the user read the
/// project's code and send it to AI. Items that carry their own content (an
/// editor's open file) and every other category pass through unchanged.
pub async fn fill_file_items(
    db: &impl Queries,
    policy: &Policy,
    repositories: &Repositories,
    actor: Actor,
    items: Vec<contracts::AdditionalContext>,
) -> Result<Vec<contracts::AdditionalContext>, FileItemError> {
    let mut out = Vec::with_capacity(items.len());
    for mut item in items {
        let empty = item.content.as_deref().is_none_or(|c| c.trim().is_empty());
        if item.category != contracts::ContextCategory::File || !empty {
            out.push(item);
            continue;
        }
        let Some(location) = RepositoryFileItem::of(item.metadata.as_ref()) else {
            return Err(FileItemError::Unreadable);
        };
        let text = read_item(db, policy, repositories, actor, &location).await?;
        item.content = Some(text);
        out.push(item);
    }
    Ok(out)
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
) -> Result<String, FileItemError> {
    let failed = |e: &dyn std::fmt::Display| FileItemError::Failed(e.to_string());
    let subject = Subject::Project(location.project_id);
    let allowed = policy
        .can(db, Some(actor), Ability::ReadCode, subject)
        .await
        .map_err(|e| failed(&e))?
        && policy
            .may_send_to_ai(db, actor, subject)
            .await
            .map_err(|e| failed(&e))?;
    if !allowed {
        return Err(FileItemError::Unreadable);
    }
    let reference = match &location.reference {
        Some(r) => r.clone(),
        None => db
            .query_opt(
                "SELECT default_branch FROM projects WHERE id = $1",
                &[&location.project_id],
            )
            .await
            .map_err(|e| failed(&e))?
            .map(|row| row.get::<_, String>(0))
            .ok_or(FileItemError::Unreadable)?,
    };
    let repository = repositories.path(location.project_id);
    if !repository.join("HEAD").exists() {
        return Err(FileItemError::Unreadable);
    }
    let file = location.path.clone();
    tokio::task::spawn_blocking(move || {
        let commit = reader::resolve(&repository, &reference).ok()?;
        let blob = reader::file(&repository, &commit, &file, (MAX_FILE_CHARS * 4) as u64).ok()?;
        let text = String::from_utf8(blob.content).ok()?;
        Some(crate::agent::tools::resource_identifier::bounded(
            &text,
            MAX_FILE_CHARS,
        ))
    })
    .await
    .map_err(|e| failed(&e))?
    .ok_or(FileItemError::Unreadable)
}

/// Tries each split of `ref/path` (refs may contain slashes), shortest ref first.
fn read_at(path: &std::path::Path, rev_and_path: &str) -> Option<String> {
    let parts: Vec<&str> = rev_and_path.split('/').collect();
    for split in 1..parts.len() {
        let (rev, file) = (parts[..split].join("/"), parts[split..].join("/"));
        let Ok(commit) = reader::resolve(path, &rev) else {
            continue;
        };
        let blob = reader::file(path, &commit, &file, (MAX_FILE_CHARS * 4) as u64).ok()?;
        let text = String::from_utf8(blob.content).ok()?;
        return Some(crate::agent::tools::resource_identifier::bounded(
            &text,
            MAX_FILE_CHARS,
        ));
    }
    None
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
