//! Issues and their notes in GitLab's REST shapes.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::containers::{Container, readable_project};
use super::entities::{closed_by, references, user_basic};
use super::item_access::{Found, Item, find_readable};
use super::notes::{NoteTarget, Noteable};
use super::pagination::{PageParams, paged};
use super::param_values::{split_labels, state_filter};
use crate::app_state::AppState;
use crate::policy::Actor;
use crate::work_items::issues::{self, Issue, IssueFilter, LabelFilter, NewIssue};
use crate::work_items::{Author, UserRef};

// ---- issues -------------------------------------------------------------------

pub(super) fn issue_json(issue: &Issue, base: &url::Url, full_path: &str) -> Value {
    let iid = issue.iid;
    let assignees: Vec<Value> = issue
        .assignees
        .iter()
        .map(|a: &UserRef| user_basic(a, base))
        .collect();
    json!({
        "id": issue.id,
        "iid": iid,
        "project_id": issue.project_id,
        "title": issue.title,
        "description": issue.description,
        "state": issue.state,
        "confidential": issue.confidential,
        "labels": issue.labels,
        "author": user_basic(&issue.author, base),
        "assignee": assignees.first().cloned().unwrap_or(Value::Null),
        "assignees": assignees,
        "references": references(full_path, '#', iid),
        "web_url": format!("{}{full_path}/-/issues/{iid}", base.as_str()),
        "created_at": issue.created_at,
        "updated_at": issue.updated_at,
        "closed_at": issue.closed_at,
        "closed_by": closed_by(issue.closed_by.as_ref(), base),
        "due_date": issue.due_date.map(|d| d.to_string()),
    })
}

#[derive(Debug, Deserialize)]
pub(super) struct IssueListParams {
    page: Option<usize>,
    per_page: Option<usize>,
    /// `opened`, `closed` or `all` (the default).
    state: Option<String>,
    /// Comma-separated labels an issue must all carry; `None` for issues without
    /// labels, `Any` for issues with at least one.
    labels: Option<String>,
}

/// GitLab's `labels` filter: `None`, `Any`, or labels an issue must all carry.
pub(super) fn labels_filter(labels: Option<&str>) -> LabelFilter {
    match labels.map(str::trim) {
        Some(l) if l.eq_ignore_ascii_case("none") => LabelFilter::None,
        Some(l) if l.eq_ignore_ascii_case("any") => LabelFilter::Any,
        other => LabelFilter::All(split_labels(other)),
    }
}

pub(super) async fn list_issues(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<IssueListParams>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let user = readable_project(&state, &req, id).await?;
    let q = q.into_inner();
    let filter = IssueFilter {
        state: state_filter(q.state.as_deref(), &["opened", "closed"])?,
        labels: labels_filter(q.labels.as_deref()),
    };
    let db = state.pool.get().await?;
    let full_path = Container::Project(id).full_path(&*db).await?;
    let found = issues::list(&*db, id, &filter).await?;
    let readable = Item::ISSUE.keep_readable(&state, &*db, user, found).await?;
    let items = readable
        .iter()
        .map(|i| issue_json(i, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

/// An issue the caller may read, with its project's full path; 404 otherwise.
pub(super) async fn find_issue(
    state: &AppState,
    req: &impl super::Caller,
    project: i64,
    iid: i32,
) -> Result<Found<Issue>, ApiError> {
    let container = Container::Project(project);
    find_readable(state, req, container, Item::ISSUE, async |db| {
        issues::by_iid(db, project, iid).await
    })
    .await
}

pub(super) async fn show_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let issue = find_issue(&state, &req, project, iid).await?;
    Ok(HttpResponse::Ok().json(issue_json(
        &issue.item,
        &state.config.external_url,
        &issue.full_path,
    )))
}

#[derive(Deserialize)]
pub(super) struct NewIssueParams {
    pub title: String,
    pub description: Option<String>,
    pub confidential: Option<bool>,
    pub labels: Option<super::params::LabelList>,
    pub assignee_ids: Option<Vec<i64>>,
}

pub(super) async fn create_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<NewIssueParams>,
) -> Result<HttpResponse, ApiError> {
    let created = issue_created(&state, &req, path.into_inner(), body.into_inner()).await?;
    Ok(HttpResponse::Created().json(created))
}

/// Opens an issue in a project the caller may read, authored by them.
pub(super) async fn issue_created(
    state: &AppState,
    req: &impl super::Caller,
    project: i64,
    b: NewIssueParams,
) -> Result<Value, ApiError> {
    let me = req.writer(state).await?;
    readable_project(state, req, project).await?;
    if b.title.trim().is_empty() {
        return Err(ApiError::BadRequest("title is missing".into()));
    }
    let mut db = state.pool.get().await?;
    let issue = issues::create(
        &mut db,
        NewIssue {
            project,
            title: b.title,
            description: b.description.unwrap_or_default(),
            confidential: b.confidential.unwrap_or(false),
            labels: b.labels.unwrap_or_default().0,
            assignee_ids: b.assignee_ids.unwrap_or_default(),
            author: Author {
                id: me.author_id(),
                on_behalf_of: me.on_behalf_of(),
            },
        },
    )
    .await?;
    let full_path = Container::Project(project).full_path(&*db).await?;
    Ok(issue_json(&issue, &state.config.external_url, &full_path))
}

/// Notes of an issue: `/projects/{id}/issues/{iid}/notes`.
pub(super) struct IssueNotes;

impl NoteTarget for IssueNotes {
    type Path = (i64, i32);

    async fn find(
        state: &AppState,
        req: &impl super::Caller,
        (project, iid): (i64, i32),
    ) -> Result<(Option<Actor>, Noteable), ApiError> {
        let issue = find_issue(state, req, project, iid).await?;
        let noteable = Noteable::issue(issue.item.id, iid, project);
        Ok((issue.user, noteable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_filter_modes() {
        assert_eq!(labels_filter(None), LabelFilter::All(Vec::new()));
        assert_eq!(labels_filter(Some("None")), LabelFilter::None);
        assert_eq!(labels_filter(Some("any")), LabelFilter::Any);
        assert_eq!(
            labels_filter(Some("bug, p1")),
            LabelFilter::All(vec!["bug".to_owned(), "p1".to_owned()])
        );
    }
}
