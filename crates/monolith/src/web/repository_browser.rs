//! A project's repository in the browser: the tree at a ref (the default
//! branch unless the URL names another), breadcrumbs, and files shown as text
//! with line numbers. Binary and oversized files are not shown. Each page has
//! "Ask Duo" buttons that open the chat with the file, the directory or the
//! whole repository attached as GitLab's additional context (`file`,
//! `directory`, `repository`); the chat reads the content itself, through the
//! policy, when the question is answered. The buttons show only where the
//! policy would let the content go to AI: Duo on for the user in the
//! project, and (for a file) not excluded by its Duo context exclusion rules.
//!
//! URLs follow GitLab's: `/<project>/-/tree/<ref>/<dir>` and
//! `/<project>/-/blob/<ref>/<file>`. A ref may contain slashes; the longest
//! leading part of the path that names a branch or tag (or a commit id as the
//! first segment) is the ref.

use std::path::PathBuf;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use maud::{Markup, html};
use serde_json::{Value, json};

use super::PageError;
use super::layout::{self, Page};
use crate::app_state::AppState;
use crate::identity::sessions::SessionUser;
use crate::namespaces::projects;
use crate::policy::{Ability, Actor, AiReader, CodeForAi};
use crate::repositories::{RepositoryError, reader};

/// Longest `<ref>/<path>` part of a URL accepted (GitLab's path limit is
/// similar); longer ones are refused before the repository is opened.
pub const MAX_LOCATION_BYTES: usize = 4096;
/// Largest file shown as text.
pub const MAX_VIEW_BYTES: u64 = 512 * 1024;
/// Most entries of one directory listed.
const MAX_LISTED_ENTRIES: usize = 1000;
/// Most other branches and tags offered to switch to.
const MAX_LISTED_REFS: usize = 50;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/{project:.+}/-/tree", web::get().to(tree_root))
        .route("/{project:.+}/-/tree/{location:.*}", web::get().to(tree))
        .route("/{project:.+}/-/blob/{location:.+}", web::get().to(blob));
}

/// A project whose code the user may read.
struct CodeProject {
    id: i64,
    name: String,
    description: String,
    full_path: String,
    default_branch: String,
    repository: PathBuf,
    /// What of the code the user may ask Duo about (`None`: nothing, Duo is
    /// off for them here); the "Ask Duo" buttons follow it.
    for_ai: Option<CodeForAi>,
}

/// The project at `full_path` when the user may read its code; "not found"
/// otherwise (a hidden project looks like a missing one).
async fn code_project(
    state: &AppState,
    session: &SessionUser,
    full_path: &str,
) -> Result<CodeProject, PageError> {
    let db = state.pool.get().await?;
    let id = super::project_with(
        state,
        &*db,
        session,
        full_path,
        &[Ability::ReadProject, Ability::ReadCode],
    )
    .await?;
    let facts = projects::code_facts(&*db, id).await?;
    let for_ai = state
        .policy
        .code_for_ai(&*db, AiReader::User(Actor::from(&session.user)), id)
        .await?;
    Ok(CodeProject {
        id,
        name: facts.name,
        description: facts.description,
        full_path: full_path.to_owned(),
        default_branch: facts.default_branch,
        repository: state.repositories.path(id),
        for_ai,
    })
}

/// Why a URL's `<ref>/<path>` part is refused outright.
fn check_location(location: &str) -> Result<(), &'static str> {
    if location.len() > MAX_LOCATION_BYTES {
        return Err("The path is too long.");
    }
    if location.contains('\0') {
        return Err("The path contains a NUL character.");
    }
    if location.split('/').any(|s| s == "..") || location.contains('\\') {
        return Err("The path must stay inside the repository.");
    }
    Ok(())
}

fn bad_request(session: &SessionUser, why: &str) -> HttpResponse {
    page_response(
        StatusCode::BAD_REQUEST,
        session,
        "Bad request",
        html! { section class="card narrow" { h1 { "Bad request" } p { (why) } } },
    )
}

/// A ref, the commit it names and the path after it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Located {
    reference: String,
    commit: String,
    path: String,
    /// Branch and tag names (at most [`MAX_LISTED_REFS`]) to switch to.
    others: Vec<String>,
}

/// Splits `<ref>/<path>`: the longest leading run of segments that is a
/// branch or tag name, else a commit id as the first segment. `None` when
/// nothing matches or the repository is empty.
fn locate(
    repository: &std::path::Path,
    location: &str,
) -> Result<Option<Located>, RepositoryError> {
    if !repository.join("HEAD").exists() {
        return Ok(None);
    }
    let refs = reader::refs(repository)?;
    let parts: Vec<&str> = location.trim_matches('/').split('/').collect();
    for split in (1..=parts.len()).rev() {
        let candidate = parts[..split].join("/");
        let known = refs.branches.contains_key(&candidate) || refs.tags.contains_key(&candidate);
        let commit_like = split == 1
            && (7..=40).contains(&candidate.len())
            && candidate.chars().all(|c| c.is_ascii_hexdigit());
        if !known && !commit_like {
            continue;
        }
        match reader::resolve(repository, &candidate) {
            Ok(commit) => {
                let others = refs
                    .branches
                    .keys()
                    .chain(refs.tags.keys())
                    .filter(|name| **name != candidate)
                    .take(MAX_LISTED_REFS)
                    .cloned()
                    .collect();
                return Ok(Some(Located {
                    reference: candidate,
                    commit,
                    path: parts[split..].join("/"),
                    others,
                }));
            }
            Err(RepositoryError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RepositoryError> + Send + 'static,
) -> Result<Result<T, RepositoryError>, PageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PageError::Internal(e.to_string()))
}

fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A path for a URL: every byte but unreserved ones and `/` percent-encoded.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'/' | b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn tree_url(project: &CodeProject, reference: &str, path: &str) -> String {
    let mut url = format!("/{}/-/tree/{}", project.full_path, encode_path(reference));
    if !path.is_empty() {
        url.push('/');
        url.push_str(&encode_path(path));
    }
    url
}

fn blob_url(project: &CodeProject, reference: &str, path: &str) -> String {
    format!(
        "/{}/-/blob/{}/{}",
        project.full_path,
        encode_path(reference),
        encode_path(path)
    )
}

/// What "Ask Duo about ..." attaches, as the chat page's query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskAbout {
    File,
    Directory,
    Repository,
}

impl AskAbout {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "file" => Some(Self::File),
            "directory" => Some(Self::Directory),
            "repository" => Some(Self::Repository),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Directory => "directory",
            Self::Repository => "repository",
        }
    }
}

fn ask_duo_link(project: &CodeProject, about: AskAbout, reference: &str, path: &str) -> Markup {
    let gid = crate::gid::format("Project", project.id);
    let mut href = format!(
        "/-/chat?resource={}&resource_title={}&context={}",
        encode(&gid),
        encode(&project.name),
        about.name()
    );
    if about != AskAbout::Repository {
        href.push_str(&format!(
            "&context_ref={}&context_path={}",
            encode(reference),
            encode(path)
        ));
    }
    let label = match about {
        AskAbout::File => "Ask Duo about this file",
        AskAbout::Directory => "Ask Duo about this directory",
        AskAbout::Repository => "Ask Duo about this repository",
    };
    html! {
        a class={ "button ask-duo ask-" (about.name()) @if about == AskAbout::File { " primary" } }
          href=(href) { (label) }
    }
}

/// The additional-context item the chat page attaches for "Ask Duo about
/// ..." (GitLab's shapes), with its title; `None` when the user may not read
/// the project's code or the path is not acceptable. The item carries no
/// content: the chat reads it through the policy when it answers.
pub async fn chat_context_item(
    state: &AppState,
    session: &SessionUser,
    project_id: i64,
    about: AskAbout,
    reference: Option<&str>,
    path: Option<&str>,
) -> Result<Option<(Value, String)>, PageError> {
    let db = state.pool.get().await?;
    // The policy's gate for code on its way to AI: nothing when Duo is off
    // for the user here, and no file its exclusion rules exclude.
    let Some(for_ai) = state
        .policy
        .code_for_ai(&*db, AiReader::User(Actor::from(&session.user)), project_id)
        .await?
    else {
        return Ok(None);
    };
    let Some((facts, full_path)) = projects::code_facts_with_path(&*db, project_id).await? else {
        return Ok(None);
    };
    let projects::CodeFacts {
        name,
        description,
        default_branch,
    } = facts;
    let gid = crate::gid::format("Project", project_id);
    let path = match path.map(str::trim) {
        Some(p) if check_location(p).is_ok() => match reader::clean_path(p) {
            Ok(clean) => clean,
            Err(_) => return Ok(None),
        },
        Some(_) => return Ok(None),
        None => String::new(),
    };
    let reference = reference
        .map(str::trim)
        .filter(|r| !r.is_empty() && r.len() <= 255 && !r.contains('\0'))
        .unwrap_or(&default_branch)
        .to_owned();
    let item = match about {
        AskAbout::Repository => (
            json!({
                "category": "REPOSITORY",
                "id": gid,
                "content": "",
                "metadata": { "name": name, "pathWithNamespace": full_path, "description": description },
            }),
            format!("the repository {full_path}"),
        ),
        AskAbout::Directory if !path.is_empty() => (
            json!({
                "category": "DIRECTORY",
                "id": format!("dir:///{full_path}/{path}"),
                "content": "",
                "metadata": { "relativePath": path, "projectId": gid, "projectPathWithNamespace": full_path },
            }),
            format!("the directory {path}/ of {full_path}"),
        ),
        AskAbout::File if !path.is_empty() && for_ai.allows(&path) => {
            let id = format!(
                "{}/{full_path}/-/blob/{reference}/{path}",
                state.config.external_url.as_str().trim_end_matches('/')
            );
            if id.chars().count() > crate::chat::MAX_CONTEXT_ID_CHARS {
                return Ok(None);
            }
            (
                json!({
                    "category": "FILE",
                    "id": id,
                    "content": "",
                    "metadata": { "title": path, "relativePath": path, "projectId": gid, "ref": reference },
                }),
                format!("the file {path} of {full_path}"),
            )
        }
        _ => return Ok(None),
    };
    Ok(Some(item))
}

fn page_response(
    status: StatusCode,
    session: &SessionUser,
    title: &str,
    body: Markup,
) -> HttpResponse {
    layout::html_response(
        status,
        layout::render(
            Page {
                title,
                session: Some(session),
                scripts: &[],
                data: Value::Null,
            },
            body,
        ),
    )
}

/// `project / ref / a / b`, each a link to its tree.
fn breadcrumbs(project: &CodeProject, reference: &str, path: &str) -> Markup {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    html! {
        nav class="breadcrumbs" aria-label="Path" {
            a href={ "/" (project.full_path) } { (project.name) }
            " / "
            a href=(tree_url(project, reference, "")) { span class="badge" { (reference) } }
            @for (i, segment) in segments.iter().enumerate() {
                " / "
                @if i + 1 == segments.len() {
                    span aria-current="page" { (segment) }
                } @else {
                    a href=(tree_url(project, reference, &segments[..=i].join("/"))) { (segment) }
                }
            }
        }
    }
}

async fn tree_root(
    state: web::Data<AppState>,
    req: HttpRequest,
    project: web::Path<String>,
) -> Result<HttpResponse, PageError> {
    show_tree(&state, &req, &project.into_inner(), "").await
}

async fn tree(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, PageError> {
    let (project, location) = path.into_inner();
    show_tree(&state, &req, &project, &location).await
}

async fn show_tree(
    state: &AppState,
    req: &HttpRequest,
    full_path: &str,
    location: &str,
) -> Result<HttpResponse, PageError> {
    let session = super::signed_in(state, req).await?;
    if let Err(why) = check_location(location) {
        return Ok(bad_request(&session, why));
    }
    let project = code_project(state, &session, full_path).await?;
    let location = if location.trim_matches('/').is_empty() {
        project.default_branch.clone()
    } else {
        location.to_owned()
    };
    let repository = project.repository.clone();
    let wanted = location.clone();
    let located = match blocking(move || locate(&repository, &wanted)).await? {
        Ok(Some(located)) => located,
        Ok(None) if location == project.default_branch => {
            return Ok(empty_repository(&session, &project));
        }
        Ok(None) => return Err(PageError::NotFound),
        Err(RepositoryError::NotFound(_)) => return Err(PageError::NotFound),
        Err(RepositoryError::Invalid(why)) => return Ok(bad_request(&session, &why)),
        Err(e) => return Err(PageError::Internal(e.to_string())),
    };
    let dir = match reader::clean_path(&located.path) {
        Ok(dir) => dir,
        Err(_) => return Ok(bad_request(&session, "The path is not valid.")),
    };
    let repository = project.repository.clone();
    let (commit, listed) = (located.commit.clone(), dir.clone());
    let entries = match blocking(move || reader::tree(&repository, &commit, &listed, false)).await?
    {
        Ok(entries) => entries,
        Err(RepositoryError::NotFound(_)) => return Err(PageError::NotFound),
        Err(e) => return Err(PageError::Internal(e.to_string())),
    };
    let shown = entries.len().min(MAX_LISTED_ENTRIES);
    let title = if dir.is_empty() {
        format!("Files · {}", project.name)
    } else {
        format!("{dir} · {}", project.name)
    };
    let reference = &located.reference;
    let body = html! {
        section class="card" {
            div class="title-row" {
                (breadcrumbs(&project, reference, &dir))
                div class="actions" {
                    @if project.for_ai.is_some() {
                        @if !dir.is_empty() { (ask_duo_link(&project, AskAbout::Directory, reference, &dir)) }
                        (ask_duo_link(&project, AskAbout::Repository, reference, ""))
                    }
                }
            }
            @if dir.is_empty() && !project.description.is_empty() {
                p class="muted" { (project.description) }
            }
            @if !located.others.is_empty() {
                details class="refs" {
                    summary { "Switch branch or tag" }
                    ul {
                        @for other in &located.others {
                            li { a href=(tree_url(&project, other, "")) { (other) } }
                        }
                    }
                }
            }
            table class="files" {
                thead { tr { th scope="col" { "Name" } th scope="col" { "Kind" } } }
                tbody {
                    @if !dir.is_empty() {
                        @let parent = dir.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
                        tr { td { a href=(tree_url(&project, reference, parent)) { ".." } } td {} }
                    }
                    @for entry in &entries[..shown] {
                        tr {
                            td {
                                @match entry.kind {
                                    "tree" => a class="dir" href=(tree_url(&project, reference, &entry.path)) { (entry.name) "/" },
                                    "commit" => span class="submodule" { (entry.name) },
                                    _ => a class="file" href=(blob_url(&project, reference, &entry.path)) { (entry.name) },
                                }
                            }
                            td class="muted" {
                                @match entry.kind { "tree" => "directory", "commit" => "submodule", _ => "file" }
                            }
                        }
                    }
                }
            }
            @if entries.len() > shown {
                p class="muted" { (entries.len() - shown) " more entries are not listed." }
            }
            @if entries.is_empty() { p class="muted" { "This directory is empty." } }
        }
    };
    Ok(page_response(StatusCode::OK, &session, &title, body))
}

fn empty_repository(session: &SessionUser, project: &CodeProject) -> HttpResponse {
    page_response(
        StatusCode::OK,
        session,
        &format!("Files · {}", project.name),
        html! {
            section class="card" {
                nav class="breadcrumbs" { a href={ "/" (project.full_path) } { (project.name) } }
                p { "This repository is empty: nothing has been pushed yet." }
            }
        },
    )
}

/// What a file page shows.
enum FileView {
    Text(String),
    Binary,
    TooLarge,
}

fn view_of(content: Vec<u8>) -> FileView {
    // Git's own heuristic: a NUL in the first 8000 bytes means binary.
    if content.iter().take(8000).any(|b| *b == 0) {
        return FileView::Binary;
    }
    match String::from_utf8(content) {
        Ok(text) => FileView::Text(text),
        Err(_) => FileView::Binary,
    }
}

async fn blob(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, PageError> {
    let (full_path, location) = path.into_inner();
    let session = super::signed_in(&state, &req).await?;
    if let Err(why) = check_location(&location) {
        return Ok(bad_request(&session, why));
    }
    let project = code_project(&state, &session, &full_path).await?;
    let repository = project.repository.clone();
    let wanted = location.clone();
    let located = match blocking(move || locate(&repository, &wanted)).await? {
        Ok(Some(located)) => located,
        Ok(None) | Err(RepositoryError::NotFound(_)) => return Err(PageError::NotFound),
        Err(RepositoryError::Invalid(why)) => return Ok(bad_request(&session, &why)),
        Err(e) => return Err(PageError::Internal(e.to_string())),
    };
    let file = match reader::clean_path(&located.path) {
        Ok(file) if !file.is_empty() => file,
        Ok(_) => return Err(PageError::NotFound),
        Err(_) => return Ok(bad_request(&session, "The path is not valid.")),
    };
    let repository = project.repository.clone();
    let (commit, wanted) = (located.commit.clone(), file.clone());
    let view = match blocking(move || reader::file(&repository, &commit, &wanted, MAX_VIEW_BYTES))
        .await?
    {
        Ok(blob) => view_of(blob.content),
        Err(RepositoryError::NotFound(_)) => return Err(PageError::NotFound),
        // `file` refuses past the limit with `Invalid`.
        Err(RepositoryError::Invalid(_)) => FileView::TooLarge,
        Err(e) => return Err(PageError::Internal(e.to_string())),
    };
    let reference = &located.reference;
    let name = file.rsplit('/').next().unwrap_or(&file);
    let body = html! {
        section class="card" {
            div class="title-row" {
                (breadcrumbs(&project, reference, &file))
                div class="actions" {
                    @if matches!(view, FileView::Text(_)) && project.for_ai.as_ref().is_some_and(|c| c.allows(&file)) {
                        (ask_duo_link(&project, AskAbout::File, reference, &file))
                    }
                }
            }
            @match &view {
                FileView::Text(text) => {
                    @let lines = text.lines().count();
                    p class="muted" { (lines) " lines · " (text.len()) " bytes" }
                    pre class="code numbered" aria-label={ "Content of " (name) } {
                        @for (i, line) in text.lines().enumerate() {
                            span class="line" id={ "L" (i + 1) } { (line) "\n" }
                        }
                    }
                },
                FileView::Binary => p class="flash notice" { "This file is binary, so it is not shown." },
                FileView::TooLarge => p class="flash notice" {
                    "This file is larger than " (MAX_VIEW_BYTES / 1024) " KB, so it is not shown."
                },
            }
        }
    };
    Ok(page_response(
        StatusCode::OK,
        &session,
        &format!("{file} · {}", project.name),
        body,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_checked_before_any_read() {
        assert!(check_location("main/src/lib.rs").is_ok());
        assert!(check_location("main/../../etc/passwd").is_err());
        assert!(check_location("main/a\0b").is_err());
        assert!(check_location("main\\..\\x").is_err());
        assert!(check_location(&"a/".repeat(MAX_LOCATION_BYTES)).is_err());
    }

    #[test]
    fn binary_and_text_files_are_told_apart() {
        assert!(matches!(
            view_of(b"fn main() {}\n".to_vec()),
            FileView::Text(_)
        ));
        assert!(matches!(
            view_of(vec![0x89, b'P', b'N', b'G', 0, 1]),
            FileView::Binary
        ));
        assert!(matches!(view_of(vec![0xff, 0xfe, 0x41]), FileView::Binary));
    }

    #[test]
    fn path_segments_are_encoded_for_links() {
        assert_eq!(encode_path("src/a b#c.rs"), "src/a%20b%23c.rs");
        assert_eq!(encode_path("feature/x"), "feature/x");
    }
}
