//! The MCP server's tools, named and shaped as GitLab's: each one is a REST
//! read or write of this module's parent, run for the MCP caller through the
//! same floor (policy, finders, renderers) as the REST route, so a tool shows
//! exactly what `GET /api/v4/...` would show that user, and refuses alike.

use std::sync::{Arc, LazyLock};

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::super::ApiError;
use super::super::epics::{EpicNotes, find_epic};
use super::super::issues::{IssueNotes, NewIssueParams, find_issue, issue_created, issue_json};
use super::super::merge_requests::{
    commits_of, diffs_of, find_merge_request, found_json, mr_json, pipelines_of,
};
use super::super::notes::{NewNoteParams, note_created, notes_of};
use super::McpCaller;
use crate::app_state::AppState;
use crate::code_index::chat_context::{Outcome, Searched, search_project};
use crate::policy::{Ability, Subject};
use crate::work_items::SortOrder;
use crate::work_items::epics::EpicKey;

/// The server's version as `get_mcp_server_version` reports it.
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Most items one list tool returns per page.
const MAX_PER_PAGE: usize = 100;

/// What a tool call produced: a JSON value for the client, or a refusal
/// that the client sees as a tool result with `isError: true`.
pub type ToolResult = Result<Value, ToolError>;

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments do not fit the tool's schema: a JSON-RPC error.
    #[error("{0}")]
    Arguments(String),
    /// What REST would have answered (404, 403, 400...): a tool error.
    #[error("{0}")]
    Api(#[from] ApiError),
    /// A refusal of the MCP server's own (Duo off in the project).
    #[error("{0}")]
    Refused(String),
}

struct ToolSpec {
    name: &'static str,
    description: &'static str,
    read_only: bool,
    schema: fn() -> Value,
}

/// A project given as its numeric id or its full path, as GitLab's tools take it.
fn project_ref() -> Value {
    json!({"type": ["string", "integer"], "description": "The project's ID or URL-encoded full path."})
}

fn iid(what: &str) -> Value {
    json!({"type": "integer", "minimum": 1, "description": format!("The internal ID of the {what}.")})
}

fn paging() -> [(&'static str, Value); 2] {
    [
        ("page", json!({"type": "integer", "minimum": 1})),
        (
            "per_page",
            json!({"type": "integer", "minimum": 1, "maximum": MAX_PER_PAGE}),
        ),
    ]
}

fn object(required: &[&str], properties: Vec<(&str, Value)>) -> Value {
    let props: serde_json::Map<String, Value> = properties
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    })
}

const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "get_mcp_server_version",
        description: "Returns the version of this GitLab MCP server.",
        read_only: true,
        schema: || object(&[], vec![]),
    },
    ToolSpec {
        name: "get_issue",
        description: "Gets one issue of a project: title, description, state, labels, assignees, author and URL.",
        read_only: true,
        schema: || {
            object(
                &["id", "issue_iid"],
                vec![("id", project_ref()), ("issue_iid", iid("issue"))],
            )
        },
    },
    ToolSpec {
        name: "create_issue",
        description: "Creates an issue in a project, authored by the caller.",
        read_only: false,
        schema: || {
            object(
                &["id", "title"],
                vec![
                    ("id", project_ref()),
                    (
                        "title",
                        json!({"type": "string", "minLength": 1, "maxLength": 255}),
                    ),
                    (
                        "description",
                        json!({"type": "string", "maxLength": 1_048_576}),
                    ),
                    (
                        "labels",
                        json!({"type": "string", "description": "Comma-separated label names."}),
                    ),
                    (
                        "assignee_ids",
                        json!({"type": "array", "items": {"type": "integer"}}),
                    ),
                    ("confidential", json!({"type": "boolean"})),
                ],
            )
        },
    },
    ToolSpec {
        name: "get_merge_request",
        description: "Gets one merge request of a project: title, description, branches, state and URL.",
        read_only: true,
        schema: || {
            object(
                &["id", "merge_request_iid"],
                vec![
                    ("id", project_ref()),
                    ("merge_request_iid", iid("merge request")),
                ],
            )
        },
    },
    ToolSpec {
        name: "get_merge_request_commits",
        description: "Lists the commits of a merge request, newest first.",
        read_only: true,
        schema: || mr_list_schema(),
    },
    ToolSpec {
        name: "get_merge_request_diffs",
        description: "Lists the file diffs of a merge request.",
        read_only: true,
        schema: || mr_list_schema(),
    },
    ToolSpec {
        name: "get_merge_request_pipelines",
        description: "Lists the pipelines run for a merge request's source branch, newest first.",
        read_only: true,
        schema: || mr_list_schema(),
    },
    ToolSpec {
        name: "get_pipeline_jobs",
        description: "Lists the jobs of a pipeline.",
        read_only: true,
        schema: || {
            let mut props = vec![
                ("id", project_ref()),
                ("pipeline_id", json!({"type": "integer", "minimum": 1})),
            ];
            props.extend(paging());
            object(&["id", "pipeline_id"], props)
        },
    },
    ToolSpec {
        name: "get_workitem_notes",
        description: "Lists the comments of a work item (an issue in a project, an epic in a group), oldest first.",
        read_only: true,
        schema: || {
            let mut props = work_item_props();
            props.extend(paging());
            object(&["work_item_iid"], props)
        },
    },
    ToolSpec {
        name: "create_workitem_note",
        description: "Adds a comment to a work item (an issue in a project, an epic in a group).",
        read_only: false,
        schema: || {
            let mut props = work_item_props();
            props.push((
                "body",
                json!({"type": "string", "minLength": 1, "maxLength": 1_048_576}),
            ));
            props.push(("internal", json!({"type": "boolean"})));
            object(&["work_item_iid", "body"], props)
        },
    },
    ToolSpec {
        name: "search",
        description: "Searches issues, merge requests or projects by text, in a project, a group or everything the caller may read.",
        read_only: true,
        schema: || {
            let mut props = vec![
                (
                    "scope",
                    json!({"type": "string", "enum": ["issues", "merge_requests", "projects"]}),
                ),
                (
                    "search",
                    json!({"type": "string", "minLength": 1, "maxLength": 255}),
                ),
                ("project_id", project_ref()),
                (
                    "group_id",
                    json!({"type": ["string", "integer"], "description": "The group's ID or full path."}),
                ),
            ];
            props.extend(paging());
            object(&["scope", "search"], props)
        },
    },
    ToolSpec {
        name: "semantic_code_search",
        description: "Searches a project's code by meaning (its code index) and returns the closest snippets with their paths.",
        read_only: true,
        schema: || {
            object(
                &["project_id", "semantic_query"],
                vec![
                    ("project_id", project_ref()),
                    (
                        "semantic_query",
                        json!({"type": "string", "minLength": 1, "maxLength": 2000}),
                    ),
                    (
                        "directory_path",
                        json!({"type": "string", "maxLength": 1024}),
                    ),
                    (
                        "ref",
                        json!({"type": "string", "minLength": 1, "maxLength": 255,
                            "description": "A branch to search instead of the default branch (indexed on first use)."}),
                    ),
                ],
            )
        },
    },
];

fn mr_list_schema() -> Value {
    let mut props = vec![
        ("id", project_ref()),
        ("merge_request_iid", iid("merge request")),
    ];
    props.extend(paging());
    object(&["id", "merge_request_iid"], props)
}

fn work_item_props() -> Vec<(&'static str, Value)> {
    vec![
        ("project_id", project_ref()),
        (
            "group_id",
            json!({"type": ["string", "integer"], "description": "The group's ID or full path (for epics)."}),
        ),
        ("work_item_iid", iid("work item")),
    ]
}

/// The catalogue as `tools/list` answers it, built once.
pub static CATALOGUE: LazyLock<Vec<Tool>> = LazyLock::new(catalogue);

/// The catalogue as `tools/list` answers it.
pub fn catalogue() -> Vec<Tool> {
    TOOLS
        .iter()
        .map(|spec| {
            let schema = match (spec.schema)() {
                Value::Object(map) => map,
                _ => JsonObject::new(),
            };
            Tool::new(spec.name, spec.description, Arc::new(schema)).with_annotations(
                ToolAnnotations::new()
                    .read_only(spec.read_only)
                    .destructive(false),
            )
        })
        .collect()
}

/// Whether `name` is one of the tools.
pub fn exists(name: &str) -> bool {
    TOOLS.iter().any(|t| t.name == name)
}

/// Refuses arguments outside the bounds the tool's input schema states
/// (`minimum`, `maximum`, `minLength`, `maxLength`, `enum`): serde checks the
/// names and types, not these, and a value the client was told is invalid
/// (`page: 0`) must not be quietly bent into a valid one. The schema itself
/// is the rule, so the two cannot drift apart.
fn check_bounds(name: &str, arguments: &JsonObject) -> Result<(), ToolError> {
    let Some(tool) = CATALOGUE.iter().find(|t| t.name == name) else {
        return Ok(());
    };
    let Some(Value::Object(properties)) = tool.input_schema.get("properties") else {
        return Ok(());
    };
    let refuse = |why: String| Err(ToolError::Arguments(format!("invalid arguments: {why}")));
    for (key, value) in arguments {
        // An unknown argument or a value of the wrong type is serde's to refuse.
        let Some(schema) = properties.get(key) else {
            continue;
        };
        if let Some(n) = value.as_f64() {
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                && n < min
            {
                return refuse(format!("{key} must be at least {min}"));
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                && n > max
            {
                return refuse(format!("{key} must be at most {max}"));
            }
        }
        if let Some(text) = value.as_str() {
            // JSON Schema counts characters, not bytes.
            let len = text.chars().count();
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && (len as u64) < min
            {
                return refuse(format!("{key} must be at least {min} characters long"));
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && (len as u64) > max
            {
                return refuse(format!("{key} must be at most {max} characters long"));
            }
        }
        if let Some(Value::Array(allowed)) = schema.get("enum")
            && !allowed.contains(value)
        {
            let names: Vec<String> = allowed
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect();
            return refuse(format!("{key} must be one of {}", names.join(", ")));
        }
    }
    Ok(())
}

fn args<T: DeserializeOwned>(arguments: &JsonObject) -> Result<T, ToolError> {
    serde_json::from_value(Value::Object(arguments.clone()))
        .map_err(|e| ToolError::Arguments(format!("invalid arguments: {e}")))
}

/// An id or a full path, as the `id`, `project_id` and `group_id` arguments.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum IdOrPath {
    Id(i64),
    Path(String),
}

impl IdOrPath {
    /// The project's id; an unknown path is id 0, which reads as "not found"
    /// exactly like a project the caller may not see.
    async fn project(&self, state: &AppState) -> Result<i64, ToolError> {
        self.resolve(state, false).await
    }

    async fn group(&self, state: &AppState) -> Result<i64, ToolError> {
        self.resolve(state, true).await
    }

    async fn resolve(&self, state: &AppState, group: bool) -> Result<i64, ToolError> {
        let path = match self {
            IdOrPath::Id(id) => return Ok(*id),
            IdOrPath::Path(p) => match p.parse::<i64>() {
                Ok(id) => return Ok(id),
                Err(_) => crate::percent::decode(p).unwrap_or_else(|| p.clone()),
            },
        };
        let db = state.pool.get().await.map_err(ApiError::from)?;
        let found = if group {
            crate::namespaces::group_id_by_full_path(&*db, &path).await
        } else {
            crate::namespaces::project_id_by_full_path(&*db, &path).await
        }
        .map_err(ApiError::from)?;
        Ok(found.unwrap_or(0))
    }
}

/// `page`/`per_page` applied to a whole list, as the REST pagination does.
/// (Each tool's arguments name them itself: serde cannot refuse unknown
/// fields next to a flattened struct.) Values out of the schema's bounds were
/// refused before ([`check_bounds`]); the clamp only keeps the arithmetic
/// safe.
fn paged(page: Option<usize>, per_page: Option<usize>, items: Vec<Value>) -> Value {
    let per_page = per_page.unwrap_or(20).clamp(1, MAX_PER_PAGE);
    let page = page.unwrap_or(1).max(1);
    Value::Array(
        items
            .into_iter()
            .skip((page - 1).saturating_mul(per_page))
            .take(per_page)
            .collect(),
    )
}

/// Refuses a project or group whose Duo features are off: the MCP server is
/// a Duo feature, and a project that turned Duo off has not agreed to have an
/// agent read it. A container the caller cannot read passes, so that the
/// tool answers "not found" as REST does and nothing leaks.
async fn refuse_where_duo_is_off(
    state: &AppState,
    caller: &McpCaller,
    container: Subject,
) -> Result<(), ToolError> {
    let db = state.pool.get().await.map_err(ApiError::from)?;
    refuse_where_duo_is_off_in(&*db, state, caller, container).await
}

/// [`refuse_where_duo_is_off`] on a connection the caller holds.
async fn refuse_where_duo_is_off_in(
    db: &impl crate::queries::Queries,
    state: &AppState,
    caller: &McpCaller,
    container: Subject,
) -> Result<(), ToolError> {
    let allowed = state
        .policy
        .workflow_token_may_act_in(db, caller.actor(), container)
        .await
        .map_err(ApiError::from)?;
    if allowed {
        Ok(())
    } else {
        Err(ToolError::Refused(
            super::super::workflow_tools::DUO_OFF.into(),
        ))
    }
}

/// The project a tool names, once Duo may act there.
async fn project(state: &AppState, caller: &McpCaller, id: &IdOrPath) -> Result<i64, ToolError> {
    let project = id.project(state).await?;
    refuse_where_duo_is_off(state, caller, Subject::Project(project)).await?;
    Ok(project)
}

/// `read` of the project a tool names, once Duo may act there, for reads of
/// the database only. The Duo switch is read beside `read` (on a second
/// connection) rather than before it: one round trip less on every call,
/// a fifth of a tool's own time. The outcome is the sequential one: where
/// Duo is off, what was read is dropped unseen and the refusal answers; a
/// project the caller cannot read passes the switch and `read` answers 404.
/// Writes, and reads that cost more than a query (git, the code index), use
/// [`project`] first instead.
async fn read_in_project<T>(
    state: &AppState,
    caller: &McpCaller,
    id: &IdOrPath,
    read: impl AsyncFnOnce(i64) -> Result<T, ApiError>,
) -> Result<T, ToolError> {
    let project = id.project(state).await?;
    let (duo, value) = futures::join!(
        refuse_where_duo_is_off(state, caller, Subject::Project(project)),
        read(project)
    );
    duo?;
    Ok(value?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IssueArgs {
    id: IdOrPath,
    issue_iid: i32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewIssueArgs {
    id: IdOrPath,
    title: String,
    description: Option<String>,
    labels: Option<super::super::params::LabelList>,
    assignee_ids: Option<Vec<i64>>,
    confidential: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MergeRequestArgs {
    id: IdOrPath,
    merge_request_iid: i32,
    page: Option<usize>,
    per_page: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineJobsArgs {
    id: IdOrPath,
    pipeline_id: i64,
    page: Option<usize>,
    per_page: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkItemArgs {
    project_id: Option<IdOrPath>,
    group_id: Option<IdOrPath>,
    work_item_iid: i64,
    body: Option<String>,
    internal: Option<bool>,
    page: Option<usize>,
    per_page: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    scope: String,
    search: String,
    project_id: Option<IdOrPath>,
    group_id: Option<IdOrPath>,
    page: Option<usize>,
    per_page: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeSearchArgs {
    project_id: IdOrPath,
    semantic_query: String,
    directory_path: Option<String>,
    /// A branch other than the default (GitLab's name for a branch argument).
    #[serde(rename = "ref")]
    branch: Option<String>,
}

/// Runs the tool `name` for `caller`.
pub async fn call(
    state: &AppState,
    caller: &McpCaller,
    name: &str,
    arguments: &JsonObject,
) -> ToolResult {
    check_bounds(name, arguments)?;
    let base = &state.config.external_url;
    match name {
        "get_mcp_server_version" => Ok(json!({ "version": SERVER_VERSION })),
        "get_issue" => {
            let a: IssueArgs = args(arguments)?;
            let issue = read_in_project(state, caller, &a.id, async |project| {
                find_issue(state, caller, project, a.issue_iid).await
            })
            .await?;
            Ok(issue_json(&issue.item, base, &issue.full_path))
        }
        "create_issue" => {
            let a: NewIssueArgs = args(arguments)?;
            let project = project(state, caller, &a.id).await?;
            let params = NewIssueParams {
                title: a.title,
                description: a.description,
                confidential: a.confidential,
                labels: a.labels,
                assignee_ids: a.assignee_ids,
            };
            Ok(issue_created(state, caller, project, params).await?)
        }
        "get_merge_request" => {
            let a: MergeRequestArgs = args(arguments)?;
            let mr = read_in_project(state, caller, &a.id, async |project| {
                find_merge_request(state, caller, project, a.merge_request_iid).await
            })
            .await?;
            Ok(found_json(state, &mr))
        }
        "get_merge_request_commits" => {
            let a: MergeRequestArgs = args(arguments)?;
            let project = project(state, caller, &a.id).await?;
            let items = commits_of(state, caller, project, a.merge_request_iid).await?;
            Ok(paged(a.page, a.per_page, items))
        }
        "get_merge_request_diffs" => {
            let a: MergeRequestArgs = args(arguments)?;
            let project = project(state, caller, &a.id).await?;
            let items = diffs_of(state, caller, project, a.merge_request_iid).await?;
            let items = without_excluded_files(state, project, items).await?;
            Ok(paged(a.page, a.per_page, items))
        }
        "get_merge_request_pipelines" => {
            let a: MergeRequestArgs = args(arguments)?;
            let items = read_in_project(state, caller, &a.id, async |project| {
                pipelines_of(state, caller, project, a.merge_request_iid).await
            })
            .await?;
            Ok(paged(a.page, a.per_page, items))
        }
        "get_pipeline_jobs" => {
            let a: PipelineJobsArgs = args(arguments)?;
            let items = read_in_project(state, caller, &a.id, async |project| {
                super::super::ci::jobs_of(state, caller, project, Some(a.pipeline_id), &[]).await
            })
            .await?;
            Ok(paged(a.page, a.per_page, items))
        }
        "get_workitem_notes" | "create_workitem_note" => {
            let a: WorkItemArgs = args(arguments)?;
            work_item_notes(state, caller, name == "create_workitem_note", a).await
        }
        "search" => {
            let a: SearchArgs = args(arguments)?;
            search(state, caller, a).await
        }
        "semantic_code_search" => {
            let a: CodeSearchArgs = args(arguments)?;
            let project = project(state, caller, &a.project_id).await?;
            let scope = CodeScope {
                project,
                directory: a.directory_path,
                branch: a.branch,
            };
            semantic_search(state, caller, scope, &a.semantic_query).await
        }
        other => Err(ToolError::Arguments(format!("unknown tool {other}"))),
    }
}

/// A merge request's diffs without the content of files the project's Duo
/// context exclusion rules leave out (their path stays, their diff goes).
async fn without_excluded_files(
    state: &AppState,
    project: i64,
    mut items: Vec<Value>,
) -> Result<Vec<Value>, ToolError> {
    let db = state.pool.get().await.map_err(ApiError::from)?;
    let exclusions = crate::policy::Policy::context_exclusions(&*db, project)
        .await
        .map_err(ApiError::from)?;
    for item in &mut items {
        let path = item["new_path"].as_str().unwrap_or_default().to_owned();
        let old = item["old_path"].as_str().unwrap_or_default().to_owned();
        if exclusions.excludes(&path) || exclusions.excludes(&old) {
            item["diff"] = json!(crate::policy::CodeForAi::excluded_note(&path));
        }
    }
    Ok(items)
}

async fn work_item_notes(
    state: &AppState,
    caller: &McpCaller,
    create: bool,
    a: WorkItemArgs,
) -> ToolResult {
    let iid = a.work_item_iid;
    let note = |a: &WorkItemArgs| -> Result<NewNoteParams, ToolError> {
        let body = a.body.clone().unwrap_or_default();
        if body.trim().is_empty() {
            return Err(ToolError::Arguments("body is missing".into()));
        }
        Ok(NewNoteParams {
            body,
            internal: a.internal,
            confidential: None,
        })
    };
    match (&a.project_id, &a.group_id) {
        (Some(p), None) => {
            let iid = i32::try_from(iid)
                .map_err(|_| ToolError::Arguments("work_item_iid is too large".into()))?;
            if create {
                let project = project(state, caller, p).await?;
                let new = note(&a)?;
                Ok(note_created::<IssueNotes>(state, caller, (project, iid), new).await?)
            } else {
                let items = read_in_project(state, caller, p, async |project| {
                    notes_of::<IssueNotes>(state, caller, (project, iid), SortOrder::Asc).await
                })
                .await?;
                Ok(paged(a.page, a.per_page, items))
            }
        }
        (None, Some(g)) => {
            let group = g.group(state).await?;
            refuse_where_duo_is_off(state, caller, Subject::Group(group)).await?;
            let epic = find_epic(state, caller, group, EpicKey::Iid(iid)).await?;
            let path = (group, epic.item.id);
            if create {
                let new = note(&a)?;
                Ok(note_created::<EpicNotes>(state, caller, path, new).await?)
            } else {
                let items = notes_of::<EpicNotes>(state, caller, path, SortOrder::Asc).await?;
                Ok(paged(a.page, a.per_page, items))
            }
        }
        _ => Err(ToolError::Arguments(
            "give either project_id (an issue) or group_id (an epic)".into(),
        )),
    }
}

/// Most projects one search reads through.
const MAX_SEARCHED_PROJECTS: usize = 50;

async fn search(state: &AppState, caller: &McpCaller, a: SearchArgs) -> ToolResult {
    let term = a.search.trim().to_lowercase();
    if term.is_empty() || term.chars().count() > 255 || term.contains('\0') {
        return Err(ToolError::Arguments(
            "search must be 1 to 255 characters".into(),
        ));
    }
    let actor = Some(caller.actor());
    // A project named outright is refused where Duo is off, as every tool
    // refuses it (a reader learns why; someone who cannot read it gets the
    // same 404 as for a project that does not exist, below). Resolved before
    // this takes its own connection: a pool of one would wait for itself.
    let only_project = match &a.project_id {
        Some(p) => Some(project(state, caller, p).await?),
        None => None,
    };
    let group = match &a.group_id {
        Some(g) => Some(g.group(state).await?),
        None => None,
    };
    let db = state.pool.get().await.map_err(ApiError::from)?;
    // The projects searched: the one named, those of the group named, or all,
    // keeping those the caller may read and Duo may act in.
    let mut candidates: Vec<(i64, String)> = Vec::new();
    let group_path = match group {
        Some(group) => {
            if !state
                .policy
                .can(&*db, actor, Ability::ReadGroup, Subject::Group(group))
                .await
                .map_err(ApiError::from)?
            {
                return Err(ApiError::NotFound("Group").into());
            }
            // Off for a group is off for everything under it: the search
            // could only come back empty, so say why, as for a project.
            refuse_where_duo_is_off_in(&*db, state, caller, Subject::Group(group)).await?;
            Some(
                crate::namespaces::group_full_path(&*db, group)
                    .await
                    .map_err(ApiError::from)?
                    .ok_or(ApiError::NotFound("Group"))?,
            )
        }
        None => None,
    };
    for p in crate::namespaces::projects::list(&*db)
        .await
        .map_err(ApiError::from)?
    {
        if only_project.is_some_and(|id| id != p.id) {
            continue;
        }
        let full_path = crate::namespaces::projects::full_path(&*db, p.id)
            .await
            .map_err(ApiError::from)?;
        if let Some(group) = &group_path
            && !full_path.starts_with(&format!("{group}/"))
        {
            continue;
        }
        if !state
            .policy
            .can(&*db, actor, Ability::ReadProject, Subject::Project(p.id))
            .await
            .map_err(ApiError::from)?
            || !state
                .policy
                .workflow_token_may_act_in(&*db, caller.actor(), Subject::Project(p.id))
                .await
                .map_err(ApiError::from)?
        {
            continue;
        }
        candidates.push((p.id, full_path));
        if candidates.len() >= MAX_SEARCHED_PROJECTS {
            break;
        }
    }
    if only_project.is_some() && candidates.is_empty() {
        return Err(ApiError::NotFound("Project").into());
    }
    let base = &state.config.external_url;
    let every_issue = crate::work_items::issues::IssueFilter {
        state: None,
        labels: crate::work_items::issues::LabelFilter::All(Vec::new()),
    };
    let matches = |texts: &[&str]| texts.iter().any(|t| t.to_lowercase().contains(&term));
    let mut found = Vec::new();
    match a.scope.as_str() {
        "projects" => {
            for (id, full_path) in &candidates {
                if matches(&[full_path]) {
                    found.push(json!({
                        "id": id,
                        "path_with_namespace": full_path,
                        "web_url": format!("{}{full_path}", base.as_str()),
                    }));
                }
            }
        }
        "issues" => {
            for (id, full_path) in &candidates {
                let all = crate::work_items::issues::list(&*db, *id, &every_issue)
                    .await
                    .map_err(ApiError::from)?;
                let hits: Vec<_> = all
                    .into_iter()
                    .filter(|i| matches(&[&i.title, &i.description]))
                    .collect();
                let readable = super::super::item_access::Item::ISSUE
                    .keep_readable(state, &*db, actor, hits)
                    .await?;
                found.extend(readable.iter().map(|i| issue_json(i, base, full_path)));
            }
        }
        "merge_requests" => {
            for (id, full_path) in &candidates {
                let all = crate::work_items::merge_requests::list(&*db, *id, None)
                    .await
                    .map_err(ApiError::from)?;
                let hits: Vec<_> = all
                    .into_iter()
                    .filter(|m| matches(&[&m.title, &m.description]))
                    .collect();
                let readable = super::super::item_access::Item::MERGE_REQUEST
                    .keep_readable(state, &*db, actor, hits)
                    .await?;
                found.extend(readable.iter().map(|m| mr_json(m, base, full_path)));
            }
        }
        other => {
            return Err(ToolError::Arguments(format!(
                "scope {other} is not one of issues, merge_requests, projects"
            )));
        }
    }
    Ok(paged(a.page, a.per_page, found))
}

// ---- semantic_code_search: the code index, with chat's gate (the caller reads
// the code, Duo is on, excluded files never appear) -------------------------

/// Where `semantic_code_search` looks.
struct CodeScope {
    project: i64,
    directory: Option<String>,
    branch: Option<String>,
}

async fn semantic_search(
    state: &AppState,
    caller: &McpCaller,
    scope: CodeScope,
    query: &str,
) -> ToolResult {
    let CodeScope {
        project,
        directory,
        branch,
    } = scope;
    if query.trim().is_empty() || query.contains('\0') {
        return Err(ToolError::Arguments("semantic_query is empty".into()));
    }
    // The REST floor first: a project the caller cannot read is "not found",
    // worded as everywhere else.
    super::super::containers::readable_project(state, caller, project).await?;
    let index = state
        .code_index()
        .map_err(|e| ToolError::Refused(format!("the AI gateway client could not start: {e}")))?;
    let searched = search_project(
        &index,
        &state.policy,
        caller.actor(),
        project,
        directory,
        branch.as_deref(),
        query,
    )
    .await
    .map_err(|e| ToolError::Refused(format!("the code search failed: {e} ({})", e.code())))?;
    match searched {
        Searched::Text(text) | Searched::Other(Outcome::Answer(text)) => Ok(Value::String(text)),
        Searched::Other(Outcome::Refused(code, detail)) => {
            Err(ToolError::Refused(format!("{detail} ({code})")))
        }
        Searched::Other(Outcome::Ready(_)) => {
            Err(ToolError::Refused("the code search found nothing".into()))
        }
    }
}
