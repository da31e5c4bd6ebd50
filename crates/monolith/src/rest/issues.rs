//! Issues and their notes in GitLab's REST shapes.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::common::{
    AUTHOR_COLUMNS, CLOSED_BY_COLUMNS, Container, author, closed_by, on_constraint, paged,
    readable_project, references, split_labels, state_filter, ts,
};
use super::items::{Found, Item, created, find_readable, readable_rows};
use super::notes::{NoteTarget, Noteable};
use super::pagination::PageParams;
use super::require_user;
use super::{ApiError, WRITE_SCOPES};
use crate::app_state::AppState;
use crate::policy::Actor;

// ---- issues -------------------------------------------------------------------

pub(super) fn issue_sql() -> String {
    format!(
        "SELECT i.id, i.iid, i.project_id, i.title, i.description, i.state, i.confidential, i.labels,
            i.created_at, i.updated_at, coalesce(i.closed_at, CASE WHEN i.state = 'closed' THEN i.updated_at END) AS closed_at, i.due_date, {AUTHOR_COLUMNS}, {CLOSED_BY_COLUMNS},
            coalesce((SELECT json_agg(json_build_object('id', au.id, 'username', au.username, 'name', au.name,
                                                        'state', au.state) ORDER BY au.id)
                      FROM issue_assignees a JOIN users au ON au.id = a.user_id WHERE a.issue_id = i.id),
                     '[]'::json) AS assignees
         FROM issues i JOIN users u ON u.id = i.author_id LEFT JOIN users cb ON cb.id = i.closed_by_id"
    )
}

pub(super) fn issue_json(row: &tokio_postgres::Row, base: &url::Url, full_path: &str) -> Value {
    let iid: i32 = row.get("iid");
    let state: String = row.get("state");
    let assignees: Vec<Value> = match row.get::<_, Value>("assignees") {
        Value::Array(list) => list
            .into_iter()
            .map(|mut a| {
                let web_url = a["username"]
                    .as_str()
                    .map(|u| format!("{}{u}", base.as_str()));
                if let Some(obj) = a.as_object_mut() {
                    obj.insert("avatar_url".into(), Value::Null);
                    obj.insert("web_url".into(), json!(web_url));
                }
                a
            })
            .collect(),
        _ => Vec::new(),
    };
    json!({
        "id": row.get::<_, i64>("id"),
        "iid": iid,
        "project_id": row.get::<_, i64>("project_id"),
        "title": row.get::<_, String>("title"),
        "description": row.get::<_, String>("description"),
        "state": state,
        "confidential": row.get::<_, bool>("confidential"),
        "labels": row.get::<_, Vec<String>>("labels"),
        "author": author(row, base),
        "assignee": assignees.first().cloned().unwrap_or(Value::Null),
        "assignees": assignees,
        "references": references(full_path, '#', iid),
        "web_url": format!("{}{full_path}/-/issues/{iid}", base.as_str()),
        "created_at": ts(row, "created_at"),
        "updated_at": ts(row, "updated_at"),
        "closed_at": row.get::<_, Option<chrono::DateTime<chrono::Utc>>>("closed_at"),
        "closed_by": closed_by(row, base),
        "due_date": row.get::<_, Option<chrono::NaiveDate>>("due_date").map(|d| d.to_string()),
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

/// GitLab's `labels` filter as a mode for the query (`none`, `any` or `all`) and
/// the labels `all` requires (none: every issue matches).
pub(super) fn labels_filter(labels: Option<&str>) -> (&'static str, Vec<String>) {
    match labels.map(str::trim) {
        Some(l) if l.eq_ignore_ascii_case("none") => ("none", Vec::new()),
        Some(l) if l.eq_ignore_ascii_case("any") => ("any", Vec::new()),
        other => ("all", split_labels(other)),
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
    let wanted_state = state_filter(q.state.as_deref(), &["opened", "closed"])?;
    let (label_mode, label_list) = labels_filter(q.labels.as_deref());
    let db = state.pool.get().await?;
    let full_path = Container::Project(id).full_path(&*db).await?;
    let sql = format!(
        "{} WHERE i.project_id = $1 AND ($2::text IS NULL OR i.state = $2)
         AND CASE $3::text WHEN 'none' THEN cardinality(i.labels) = 0
                           WHEN 'any' THEN cardinality(i.labels) > 0
                           ELSE i.labels @> $4::text[] END
         ORDER BY i.id DESC",
        issue_sql()
    );
    let rows = readable_rows(
        &state,
        &*db,
        user,
        Item::ISSUE,
        &sql,
        &[&id, &wanted_state, &label_mode, &label_list],
    )
    .await?;
    let items = rows
        .iter()
        .map(|r| issue_json(r, &state.config.external_url, &full_path))
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

/// An issue the caller may read, with its project's full path; 404 otherwise.
pub(super) async fn find_issue(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    iid: i32,
) -> Result<Found, ApiError> {
    let sql = format!("{} WHERE i.project_id = $1 AND i.iid = $2", issue_sql());
    let project = Container::Project(project);
    find_readable(state, req, project, Item::ISSUE, &sql, &iid).await
}

pub(super) async fn show_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let issue = find_issue(&state, &req, project, iid).await?;
    Ok(HttpResponse::Ok().json(issue.json(&state, issue_json)))
}

#[derive(Deserialize)]
pub(super) struct NewIssue {
    title: String,
    description: Option<String>,
    confidential: Option<bool>,
    labels: Option<super::params::LabelList>,
    assignee_ids: Option<Vec<i64>>,
}

pub(super) async fn create_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<NewIssue>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let project = path.into_inner();
    readable_project(&state, &req, project).await?;
    let b = body.into_inner();
    if b.title.trim().is_empty() {
        return Err(ApiError::BadRequest("title is missing".into()));
    }
    let labels = b.labels.clone().unwrap_or_default().0;
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    // Serialise iid allocation per project.
    tx.execute(
        "SELECT 1 FROM projects WHERE id = $1 FOR UPDATE",
        &[&project],
    )
    .await?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO issues (project_id, iid, title, description, author_id, confidential, labels, on_behalf_of_user_id)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM issues WHERE project_id = $1), $2, $3, $4, $5, $6, $7)
             RETURNING id",
            &[&project, &b.title, &b.description.unwrap_or_default(), &me.author_id(), &b.confidential.unwrap_or(false), &labels, &me.on_behalf_of()],
        )
        .await?
        .get(0);
    for assignee in b.assignee_ids.unwrap_or_default() {
        tx.execute("INSERT INTO issue_assignees (issue_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", &[&id, &assignee])
            .await
            .map_err(on_constraint(ApiError::BadRequest("assignee_ids is invalid".into())))?;
    }
    tx.commit().await?;
    let sql = format!("{} WHERE i.id = $1", issue_sql());
    created(
        &state,
        &*db,
        Container::Project(project),
        &sql,
        id,
        issue_json,
    )
    .await
}

/// Notes of an issue: `/projects/{id}/issues/{iid}/notes`.
pub(super) struct IssueNotes;

impl NoteTarget for IssueNotes {
    type Path = (i64, i32);

    async fn find(
        state: &AppState,
        req: &HttpRequest,
        (project, iid): (i64, i32),
    ) -> Result<(Option<Actor>, Noteable), ApiError> {
        let issue = find_issue(state, req, project, iid).await?;
        let noteable = Noteable::issue(issue.row.get("id"), iid, project);
        Ok((issue.user, noteable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_filter_modes() {
        assert_eq!(labels_filter(None), ("all", Vec::new()));
        assert_eq!(labels_filter(Some("None")), ("none", Vec::new()));
        assert_eq!(labels_filter(Some("any")), ("any", Vec::new()));
        assert_eq!(
            labels_filter(Some("bug, p1")),
            ("all", vec!["bug".to_owned(), "p1".to_owned()])
        );
    }
}
