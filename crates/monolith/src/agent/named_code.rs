//! Code a question names: a commit, a file or a directory of this instance.
//!
//! The forms are the plain ones: a commit link (`<project>/-/commit/<sha>`),
//! a reference (`group/project@<sha>`), an id with a project path, or a bare
//! id on a project's page (as `commit_reader` reads them); a file link
//! (`<project>/-/blob/<ref>/<path>`, optionally `#L10-20`); a directory link
//! (`<project>/-/tree/<ref>/<path>`). Each is read only after the same checks
//! as its reader: `commit_reader`'s for commits, the file context's
//! ([`crate::policy::Policy::code_for_ai`]) for files and directories. A file
//! the project's Duo context exclusion rules exclude is left out exactly like
//! one that does not exist or may not be read, and is never listed.

use contracts::{AdditionalContext, ContextCategory, ResourceContext, ResourceType, UnitPrimitive};
use serde_json::{Map, json};

use super::repository_file::{self, FileText};
use super::tools::commit_reader::{self, CommitRef};
use super::tools::resource_identifier::{MAX_TEXT_CHARS, bounded};
use super::{RequestContext, Services};
use crate::policy::{AiReader, CodeForAi};
use crate::queries::Queries;
use crate::repositories::reader;

/// Most directory entries listed for the model.
const MAX_LISTED_ENTRIES: usize = 200;

/// Lines of a file, 1-based and inclusive, as a `#L10-20` anchor names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRange {
    pub first: usize,
    pub last: usize,
}

/// A piece of code a question names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedCode {
    Commit(CommitRef),
    /// A blob link: its project, `ref/path` (split once the repository is
    /// open: refs may hold slashes) and an optional line range.
    File {
        project_path: String,
        rev_and_path: String,
        lines: Option<LineRange>,
    },
    /// A tree link: its project and `ref[/path]`.
    Directory {
        project_path: String,
        rev_and_path: String,
    },
}

/// What a named piece of code attaches to the question.
#[derive(Debug, Clone, PartialEq)]
pub enum AttachedContext {
    /// A resource in the page-resource shape (a work item, a job, a commit) (`context`, type `commit`).
    Resource(ResourceContext),
    /// A file or a directory: an additional context item.
    Item(AdditionalContext),
}

/// The words of a question, without the punctuation around them.
fn tokens(text: &str) -> Vec<&str> {
    text.split_whitespace()
        .map(|raw| {
            raw.trim_start_matches(['(', '"', '\'', '`', '<'])
                .trim_end_matches(|c: char| {
                    matches!(
                        c,
                        ',' | '.' | '?' | '!' | ')' | '"' | '\'' | ':' | ';' | '`' | '>'
                    )
                })
        })
        .filter(|t| !t.is_empty())
        .collect()
}

/// `#L10`, `#L10-20` or `#L10-L20`.
fn parse_lines(fragment: &str) -> Option<LineRange> {
    let rest = fragment.strip_prefix('L')?;
    let (first, last) = match rest.split_once('-') {
        Some((a, b)) => (a, b.trim_start_matches('L')),
        None => (rest, rest),
    };
    let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
    (first >= 1 && last >= first).then_some(LineRange { first, last })
}

/// A `/-/blob/` or `/-/tree/` link of this instance: (project, kind, rest,
/// fragment).
fn parse_code_link(text: &str, base: &url::Url) -> Option<NamedCode> {
    let path = super::instance_links::path_below(text, base)?;
    let decoded = crate::percent::decode(&path)?;
    if let Some((project, rest)) = decoded.split_once("/-/blob/") {
        let rest = rest.trim_end_matches('/');
        // A blob link names a file: a ref and at least one path segment.
        if project.is_empty() || !rest.contains('/') {
            return None;
        }
        return Some(NamedCode::File {
            project_path: project.to_owned(),
            rev_and_path: rest.to_owned(),
            lines: url::Url::parse(text.trim())
                .ok()
                .and_then(|url| url.fragment().and_then(parse_lines)),
        });
    }
    let (project, rest) = decoded.split_once("/-/tree/")?;
    let rest = rest.trim_end_matches('/');
    (!project.is_empty() && !rest.is_empty()).then(|| NamedCode::Directory {
        project_path: project.to_owned(),
        rev_and_path: rest.to_owned(),
    })
}

/// The pieces of code `question` names unambiguously: at most one per kind
/// (two different files, say, need interpretation and name none).
pub fn named_code_in(question: &str, base: &url::Url) -> Vec<NamedCode> {
    let mut files = Vec::new();
    let mut directories = Vec::new();
    for token in tokens(question) {
        if !(token.starts_with("http://") || token.starts_with("https://")) {
            continue;
        }
        match parse_code_link(token, base) {
            Some(file @ NamedCode::File { .. }) if !files.contains(&file) => files.push(file),
            Some(dir @ NamedCode::Directory { .. }) if !directories.contains(&dir) => {
                directories.push(dir);
            }
            _ => {}
        }
    }
    let mut named = Vec::new();
    if let Some(commit) = commit_reader::direct_commit(question, base) {
        named.push(NamedCode::Commit(commit));
    }
    if files.len() == 1 {
        named.append(&mut files);
    }
    if directories.len() == 1 {
        named.append(&mut directories);
    }
    named
}

/// The unit primitive the user's seat needs for `named`, as for its reader.
fn unit_primitive(named: &NamedCode) -> UnitPrimitive {
    match named {
        NamedCode::Commit(_) => UnitPrimitive::AskCommit,
        NamedCode::File { .. } => UnitPrimitive::IncludeFileContext,
        NamedCode::Directory { .. } => UnitPrimitive::IncludeDirectoryContext,
    }
}

/// The context `named` attaches for the user, or `None` when it may not be
/// read, is excluded or does not exist (nothing tells these apart).
pub async fn code_context(
    services: &Services,
    ctx: &RequestContext,
    db: &impl Queries,
    named: &NamedCode,
) -> Result<Option<AttachedContext>, String> {
    if !ctx.has_scope(unit_primitive(named)) {
        return Ok(None);
    }
    match named {
        NamedCode::Commit(commit) => commit_context(services, ctx, db, commit).await,
        NamedCode::File {
            project_path,
            rev_and_path,
            lines,
        } => file_context(services, ctx, db, project_path, rev_and_path, *lines).await,
        NamedCode::Directory {
            project_path,
            rev_and_path,
        } => directory_context(services, ctx, db, project_path, rev_and_path).await,
    }
}

async fn commit_context(
    services: &Services,
    ctx: &RequestContext,
    db: &impl Queries,
    commit: &CommitRef,
) -> Result<Option<AttachedContext>, String> {
    let Some((project, sha)) = commit_reader::commit_project(services, ctx, db, commit).await?
    else {
        return Ok(None);
    };
    let (code, full_path) =
        match commit_reader::readable_commit_code(services, db, ctx.actor, project).await {
            Ok(found) => found,
            Err(commit_reader::CommitRefusal::Failed(e)) => return Err(e),
            // Refused: as if it did not exist.
            Err(_) => return Ok(None),
        };
    Ok(commit_reader::describe(services, &code, &full_path, &sha)
        .await?
        .map(|content| {
            AttachedContext::Resource(ResourceContext {
                resource_type: ResourceType::Commit,
                content,
            })
        }))
}

async fn file_context(
    services: &Services,
    ctx: &RequestContext,
    db: &impl Queries,
    project_path: &str,
    rev_and_path: &str,
    lines: Option<LineRange>,
) -> Result<Option<AttachedContext>, String> {
    let base = services.external_url.as_str().trim_end_matches('/');
    let link = format!("{base}/{project_path}/-/blob/{rev_and_path}");
    // The file context's own reader: the policy's gate, then each split
    // of `ref/path` held to the project's exclusion rules.
    let text = match repository_file::read(
        db,
        &services.policy,
        &services.repositories,
        &services.external_url,
        ctx.actor,
        None,
        &link,
    )
    .await?
    {
        FileText::Text(text) => text,
        FileText::Excluded | FileText::Unavailable => return Ok(None),
    };
    let content = match lines {
        Some(range) => {
            let picked: Vec<&str> = text
                .lines()
                .skip(range.first - 1)
                .take(range.last - range.first + 1)
                .collect();
            if picked.is_empty() {
                return Ok(None);
            }
            picked.join("\n")
        }
        None => text,
    };
    let project_id = crate::namespaces::project_id_by_full_path(db, project_path)
        .await
        .map_err(|e| e.to_string())?;
    let mut metadata = Map::new();
    metadata.insert("webUrl".into(), json!(link));
    if let Some(id) = project_id {
        metadata.insert(
            "projectId".into(),
            json!(format!("gid://gitlab/Project/{id}")),
        );
    }
    if let Some(range) = lines {
        metadata.insert("startLine".into(), json!(range.first));
        metadata.insert("endLine".into(), json!(range.last));
    }
    let id = match lines {
        Some(range) => format!("{link}#L{}-{}", range.first, range.last),
        None => link,
    };
    Ok(Some(AttachedContext::Item(AdditionalContext {
        category: ContextCategory::File,
        id: Some(id),
        content: Some(bounded(&content, MAX_TEXT_CHARS)),
        metadata: Some(metadata),
    })))
}

async fn directory_context(
    services: &Services,
    ctx: &RequestContext,
    db: &impl Queries,
    project_path: &str,
    rev_and_path: &str,
) -> Result<Option<AttachedContext>, String> {
    let Some(project) = crate::namespaces::project_id_by_full_path(db, project_path)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let Some(code) = services
        .policy
        .code_for_ai(db, AiReader::User(ctx.actor), project)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let repository = services.repositories.path(project);
    if !repository.join("HEAD").exists() {
        return Ok(None);
    }
    let rev_and_path = rev_and_path.to_owned();
    let listed = tokio::task::spawn_blocking(move || list_at(&repository, &rev_and_path, &code))
        .await
        .map_err(|e| e.to_string())?;
    let Some((directory, entries)) = listed else {
        return Ok(None);
    };
    let base = services.external_url.as_str().trim_end_matches('/');
    let link = format!("{base}/{project_path}/-/tree/{}", directory.link_tail());
    let mut metadata = Map::new();
    metadata.insert("webUrl".into(), json!(link));
    metadata.insert(
        "projectId".into(),
        json!(format!("gid://gitlab/Project/{project}")),
    );
    metadata.insert("ref".into(), json!(directory.reference));
    metadata.insert("relativePath".into(), json!(directory.path));
    Ok(Some(AttachedContext::Item(AdditionalContext {
        category: ContextCategory::Directory,
        id: Some(link),
        content: Some(entries),
        metadata: Some(metadata),
    })))
}

/// A directory found in a repository.
struct ListedDirectory {
    reference: String,
    path: String,
}

impl ListedDirectory {
    fn link_tail(&self) -> String {
        if self.path.is_empty() {
            self.reference.clone()
        } else {
            format!("{}/{}", self.reference, self.path)
        }
    }
}

/// Tries each split of `ref[/path]`, shortest ref first; the first ref that
/// resolves decides. The listing is GitLab's tree entries (`type`, `path`),
/// without the ones the exclusion rules exclude; `None` when the directory
/// is missing, excluded, or nothing in it may be shown.
fn list_at(
    repository: &std::path::Path,
    rev_and_path: &str,
    code: &CodeForAi,
) -> Option<(ListedDirectory, String)> {
    let parts: Vec<&str> = rev_and_path.split('/').collect();
    for split in 1..=parts.len() {
        let (rev, dir) = (parts[..split].join("/"), parts[split..].join("/"));
        let Ok(commit) = reader::resolve(repository, &rev) else {
            continue;
        };
        if !dir.is_empty() && !code.allows(&dir) {
            return None;
        }
        let entries = reader::tree(repository, &commit, &dir, false).ok()?;
        let shown: Vec<String> = entries
            .iter()
            .filter(|e| code.allows(&e.path))
            .take(MAX_LISTED_ENTRIES)
            .map(|e| {
                json!({"type": e.kind, "name": e.name, "path": e.path, "mode": e.mode}).to_string()
            })
            .collect();
        if shown.is_empty() {
            return None;
        }
        let total = entries.len();
        let mut listing = format!(
            "Directory `{}` at `{rev}`:\n{}",
            if dir.is_empty() { "/" } else { &dir },
            shown.join("\n")
        );
        if total > MAX_LISTED_ENTRIES {
            listing.push_str(&format!(
                "\n[{MAX_LISTED_ENTRIES} of {total} entries listed]"
            ));
        }
        return Some((
            ListedDirectory {
                reference: rev,
                path: dir,
            },
            listing,
        ));
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
    fn file_and_directory_links_are_found() {
        let named = named_code_in(
            "Explain http://gitlab.test:3000/gl/app/-/blob/main/src/lib.rs#L10-20 and \
             http://gitlab.test:3000/gl/app/-/tree/main/src please",
            &base(),
        );
        assert_eq!(
            named,
            vec![
                NamedCode::File {
                    project_path: "gl/app".into(),
                    rev_and_path: "main/src/lib.rs".into(),
                    lines: Some(LineRange {
                        first: 10,
                        last: 20
                    }),
                },
                NamedCode::Directory {
                    project_path: "gl/app".into(),
                    rev_and_path: "main/src".into(),
                },
            ]
        );
    }

    #[test]
    fn line_anchors_parse() {
        assert_eq!(parse_lines("L7"), Some(LineRange { first: 7, last: 7 }));
        assert_eq!(parse_lines("L3-L9"), Some(LineRange { first: 3, last: 9 }));
        assert_eq!(parse_lines("L9-3"), None);
        assert_eq!(parse_lines("L0"), None);
        assert_eq!(parse_lines("note_1"), None);
    }

    #[test]
    fn other_hosts_and_two_files_name_nothing() {
        assert!(named_code_in("http://elsewhere/gl/app/-/blob/main/a.rs", &base()).is_empty());
        assert!(
            named_code_in(
                "diff http://gitlab.test:3000/gl/app/-/blob/main/a.rs \
                 http://gitlab.test:3000/gl/app/-/blob/main/b.rs",
                &base()
            )
            .is_empty()
        );
        // A blob link without a path names no file.
        assert!(named_code_in("http://gitlab.test:3000/gl/app/-/blob/main", &base()).is_empty());
    }
}
