//! A `currentFile` that names a repository file instead of carrying its text:
//! a blob link of this instance (`<project>/-/blob/<ref>/<path>`), or a path in
//! the project the question is about (its default branch). The file is read
//! only after the policy lets the user read the project's code and send it to
//! AI; otherwise nothing is read and the command says no code was given.

use tokio_postgres::GenericClient;

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
    db: &impl GenericClient,
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
}
