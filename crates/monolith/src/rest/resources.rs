//! Groups, projects and issues in GitLab's REST shapes, plus instance settings and
//! seats; the other resources live in sibling modules whose routes are mounted
//! here. Every read goes through the policy; what a user may not read answers
//! 404, as if it did not exist.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::common::{
    AUTHOR_COLUMNS, Container, actor, author, check_visibility, on_constraint, paged,
    readable_group, readable_project, references, require_write, split_labels, state_filter, ts,
    visibility_rank,
};
use super::items::{Found, Item, created, find_readable, readable_rows};
use super::notes::{self, NoteTarget, Noteable};
use super::pagination::PageParams;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES, ci, epics, members, merge_requests};
use super::{optional_user, require_admin, require_user};
use crate::app_state::AppState;
use crate::policy::{Ability, Actor, Subject, WriteAbility};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/groups", web::get().to(list_groups))
        .route("/groups", web::post().to(create_group))
        .route("/groups/{id}", web::get().to(show_group))
        .route("/groups/{id}", web::put().to(update_group))
        .route("/projects", web::get().to(list_projects))
        .route("/projects", web::post().to(create_project))
        .route("/projects/{id}", web::get().to(show_project))
        .route("/projects/{id}", web::put().to(update_project))
        .route("/projects/{id}/issues", web::get().to(list_issues))
        .route("/projects/{id}/issues", web::post().to(create_issue))
        .route("/projects/{id}/issues/{iid}", web::get().to(show_issue))
        .route(
            "/projects/{id}/issues/{iid}/notes",
            web::get().to(notes::list::<IssueNotes>),
        )
        .route(
            "/projects/{id}/issues/{iid}/notes",
            web::post().to(notes::create::<IssueNotes>),
        )
        .route("/application/settings", web::get().to(show_settings))
        .route("/application/settings", web::put().to(update_settings))
        .route(
            "/add_on_purchases/{add_on}/assignments",
            web::post().to(assign_seat),
        )
        .configure(members::routes)
        .configure(epics::routes)
        .configure(merge_requests::routes)
        .configure(ci::routes);
}

// ---- groups -------------------------------------------------------------------

const GROUP_SQL: &str = "WITH RECURSIVE chain(id, parent_id, full_path, root) AS (
        SELECT id, parent_id, path, id FROM groups WHERE parent_id IS NULL
        UNION ALL
        SELECT g.id, g.parent_id, c.full_path || '/' || g.path, c.root FROM groups g JOIN chain c ON g.parent_id = c.id
    )
    SELECT g.id, g.name, g.path, g.description, g.visibility, g.parent_id, g.duo_features_enabled,
           g.experiment_and_beta_features, g.created_at, c.full_path
    FROM groups g JOIN chain c ON c.id = g.id";

/// GitLab's group entity. The plan is not part of it (GitLab shows plans on
/// namespaces, to admins); ours is set on creation only.
fn group_json(row: &tokio_postgres::Row, base: &url::Url) -> Value {
    let full_path: String = row.get("full_path");
    json!({
        "id": row.get::<_, i64>("id"),
        "name": row.get::<_, String>("name"),
        "path": row.get::<_, String>("path"),
        "full_path": full_path,
        "full_name": full_path.replace('/', " / "),
        "description": row.get::<_, String>("description"),
        "visibility": row.get::<_, String>("visibility"),
        "parent_id": row.get::<_, Option<i64>>("parent_id"),
        "avatar_url": Value::Null,
        "web_url": format!("{}groups/{full_path}", base.as_str()),
        "duo_features_enabled": row.get::<_, bool>("duo_features_enabled"),
        "experiment_features_enabled": row.get::<_, bool>("experiment_and_beta_features"),
        "created_at": ts(row, "created_at"),
    })
}

async fn list_groups(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let user = actor(&optional_user(&state, &req).await?);
    let db = state.pool.get().await?;
    let sql = format!("{GROUP_SQL} ORDER BY g.id");
    let rows = readable_rows(&state, &**db, user, Item::GROUP, &sql, &[]).await?;
    let items = rows
        .iter()
        .map(|r| group_json(r, &state.config.external_url))
        .collect();
    Ok(paged(&req, q.into_inner(), items))
}

async fn group_response(state: &AppState, id: i64) -> Result<Value, ApiError> {
    let db = state.pool.get().await?;
    let row = db
        .query_opt(&format!("{GROUP_SQL} WHERE g.id = $1"), &[&id])
        .await?
        .ok_or(ApiError::NotFound("Group"))?;
    Ok(group_json(&row, &state.config.external_url))
}

async fn show_group(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    readable_group(&state, &req, id).await?;
    Ok(HttpResponse::Ok().json(group_response(&state, id).await?))
}

#[derive(Deserialize)]
struct NewGroup {
    name: String,
    path: String,
    parent_id: Option<i64>,
    visibility: Option<String>,
    /// Our addition: the GitLab.com plan of a root group (`free`, `premium`,
    /// `ultimate`), which the Duo rules read.
    plan: Option<String>,
    description: Option<String>,
    duo_features_enabled: Option<bool>,
    experiment_features_enabled: Option<bool>,
}

async fn create_group(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<NewGroup>,
) -> Result<HttpResponse, ApiError> {
    let me = require_admin(&state, &req, WRITE_SCOPES).await?;
    let b = body.into_inner();
    let visibility = check_visibility(b.visibility.as_deref())?;
    let plan = b.plan.unwrap_or_else(|| "free".into());
    if !["free", "premium", "ultimate"].contains(&plan.as_str()) {
        return Err(ApiError::BadRequest(
            "plan does not have a valid value".into(),
        ));
    }
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    let row = tx
        .query_opt(
            "INSERT INTO groups (name, path, parent_id, visibility, plan, description, duo_features_enabled, experiment_and_beta_features)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING id",
            &[
                &b.name,
                &b.path,
                &b.parent_id,
                &visibility,
                &plan,
                &b.description.unwrap_or_default(),
                &b.duo_features_enabled.unwrap_or(true),
                &b.experiment_features_enabled.unwrap_or(false),
            ],
        )
        .await
        .map_err(on_constraint(ApiError::BadRequest("parent_id is invalid".into())))?
        .ok_or_else(|| ApiError::BadRequest("Failed to save group {:path=>[\"has already been taken\"]}".into()))?;
    let id: i64 = row.get(0);
    tx.execute(
        "INSERT INTO group_members (group_id, user_id, access_level) VALUES ($1, $2, 50) ON CONFLICT DO NOTHING",
        &[&id, &me.id],
    )
    .await?;
    tx.commit().await?;
    Ok(HttpResponse::Created().json(group_response(&state, id).await?))
}

#[derive(Debug, Deserialize)]
struct GroupUpdate {
    name: Option<String>,
    path: Option<String>,
    description: Option<String>,
    visibility: Option<String>,
    duo_features_enabled: Option<bool>,
    /// Only on top-level groups, as in GitLab.
    experiment_features_enabled: Option<bool>,
}

/// The most open visibility among a group's direct subgroups and projects.
async fn widest_child_visibility(
    db: &impl tokio_postgres::GenericClient,
    group: i64,
) -> Result<usize, ApiError> {
    let rows = db
        .query(
            "SELECT visibility FROM groups WHERE parent_id = $1
             UNION SELECT visibility FROM projects WHERE group_id = $1",
            &[&group],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| visibility_rank(r.get::<_, &str>(0)))
        .max()
        .unwrap_or(0))
}

/// Owners (and admins) edit a group.
async fn update_group(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<GroupUpdate>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    Container::Group(id)
        .writer(&state, &req, WriteAbility::AdminGroup)
        .await?;
    let b = body.into_inner();
    for (field, value) in [("name", &b.name), ("path", &b.path)] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(ApiError::BadRequest(format!("{field} is empty")));
        }
    }
    let db = state.pool.get().await?;
    let current = db
        .query_one(
            "SELECT g.parent_id, p.visibility FROM groups g LEFT JOIN groups p ON p.id = g.parent_id WHERE g.id = $1",
            &[&id],
        )
        .await?;
    let parent: Option<i64> = current.get(0);
    let parent_visibility: Option<String> = current.get(1);
    if b.experiment_features_enabled.is_some() && parent.is_some() {
        return Err(ApiError::invalid(
            "experiment_features_enabled",
            "can only be changed on a top-level group",
        ));
    }
    if let Some(v) = b.visibility.as_deref() {
        let v = check_visibility(Some(v))?;
        if let Some(pv) = parent_visibility.as_deref()
            && visibility_rank(&v) > visibility_rank(pv)
        {
            return Err(ApiError::invalid(
                "visibility_level",
                format!("{v} is not allowed since the parent group has a {pv} visibility."),
            ));
        }
        if widest_child_visibility(&**db, id).await? > visibility_rank(&v) {
            return Err(ApiError::invalid(
                "visibility_level",
                format!(
                    "{v} is not allowed since this group contains projects or subgroups with higher visibility."
                ),
            ));
        }
    }
    db.execute(
        "UPDATE groups SET name = coalesce($2, name), path = coalesce($3, path),
            description = coalesce($4, description), visibility = coalesce($5, visibility),
            duo_features_enabled = coalesce($6, duo_features_enabled),
            experiment_and_beta_features = coalesce($7, experiment_and_beta_features)
         WHERE id = $1",
        &[
            &id,
            &b.name,
            &b.path,
            &b.description,
            &b.visibility,
            &b.duo_features_enabled,
            &b.experiment_features_enabled,
        ],
    )
    .await
    .map_err(on_constraint(ApiError::invalid(
        "path",
        "has already been taken",
    )))?;
    Ok(HttpResponse::Ok().json(group_response(&state, id).await?))
}

// ---- projects -----------------------------------------------------------------

const PROJECT_SQL: &str = "WITH RECURSIVE chain(id, full_path) AS (
        SELECT id, path FROM groups WHERE parent_id IS NULL
        UNION ALL
        SELECT g.id, c.full_path || '/' || g.path FROM groups g JOIN chain c ON g.parent_id = c.id
    )
    SELECT p.id, p.name, p.path, p.description, p.visibility, p.group_id, p.duo_features_enabled, p.created_at,
           c.full_path || '/' || p.path AS full_path
    FROM projects p JOIN chain c ON c.id = p.group_id";

fn project_json(row: &tokio_postgres::Row, base: &url::Url) -> Value {
    let full_path: String = row.get("full_path");
    json!({
        "id": row.get::<_, i64>("id"),
        "name": row.get::<_, String>("name"),
        "path": row.get::<_, String>("path"),
        "path_with_namespace": full_path,
        "name_with_namespace": full_path.replace('/', " / "),
        "description": row.get::<_, String>("description"),
        "visibility": row.get::<_, String>("visibility"),
        "namespace": { "id": row.get::<_, i64>("group_id"), "kind": "group" },
        "web_url": format!("{}{full_path}", base.as_str()),
        "duo_features_enabled": row.get::<_, bool>("duo_features_enabled"),
        "default_branch": "main",
        "created_at": ts(row, "created_at"),
    })
}

async fn list_projects(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let user = actor(&optional_user(&state, &req).await?);
    let db = state.pool.get().await?;
    let sql = format!("{PROJECT_SQL} ORDER BY p.id DESC");
    let rows = readable_rows(&state, &**db, user, Item::PROJECT, &sql, &[]).await?;
    let items = rows
        .iter()
        .map(|r| project_json(r, &state.config.external_url))
        .collect();
    Ok(paged(&req, q.into_inner(), items))
}

async fn project_response(state: &AppState, id: i64) -> Result<Value, ApiError> {
    let db = state.pool.get().await?;
    let row = db
        .query_opt(&format!("{PROJECT_SQL} WHERE p.id = $1"), &[&id])
        .await?
        .ok_or(ApiError::NotFound("Project"))?;
    Ok(project_json(&row, &state.config.external_url))
}

async fn show_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    readable_project(&state, &req, id).await?;
    Ok(HttpResponse::Ok().json(project_response(&state, id).await?))
}

#[derive(Deserialize)]
struct NewProject {
    name: String,
    path: Option<String>,
    namespace_id: i64,
    visibility: Option<String>,
    description: Option<String>,
    duo_features_enabled: Option<bool>,
}

/// Maintainers and owners of the group (and admins) create projects in it.
async fn create_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<NewProject>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let b = body.into_inner();
    if !super::common::can(
        &state,
        Some(Actor::from(&me)),
        Ability::ReadGroup,
        Subject::Group(b.namespace_id),
    )
    .await?
    {
        return Err(ApiError::NotFound("Namespace"));
    }
    require_write(
        &state,
        &me,
        WriteAbility::CreateProject,
        Subject::Group(b.namespace_id),
    )
    .await?;
    let visibility = check_visibility(b.visibility.as_deref())?;
    let path = b
        .path
        .unwrap_or_else(|| b.name.to_lowercase().replace(' ', "-"));
    let db = state.pool.get().await?;
    let row = db
        .query_opt(
            "INSERT INTO projects (group_id, name, path, visibility, description, duo_features_enabled)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING id",
            &[&b.namespace_id, &b.name, &path, &visibility, &b.description.unwrap_or_default(), &b.duo_features_enabled.unwrap_or(true)],
        )
        .await?
        .ok_or_else(|| ApiError::BadRequest("path has already been taken".into()))?;
    let id: i64 = row.get(0);
    Ok(HttpResponse::Created().json(project_response(&state, id).await?))
}

#[derive(Debug, Deserialize)]
struct ProjectUpdate {
    name: Option<String>,
    description: Option<String>,
    visibility: Option<String>,
    duo_features_enabled: Option<bool>,
}

/// Maintainers edit a project; renaming it or changing its visibility takes an
/// owner (GitLab's `rename_project` and `change_visibility_level`).
async fn update_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<ProjectUpdate>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let me = Container::Project(id)
        .writer(&state, &req, WriteAbility::AdminProject)
        .await?;
    let subject = Subject::Project(id);
    let b = body.into_inner();
    let db = state.pool.get().await?;
    let current = db
        .query_one(
            "SELECT p.name, p.visibility, g.visibility FROM projects p JOIN groups g ON g.id = p.group_id WHERE p.id = $1",
            &[&id],
        )
        .await?;
    let (name, visibility, group_visibility): (String, String, String) =
        (current.get(0), current.get(1), current.get(2));
    if let Some(new_name) = b.name.as_deref() {
        if new_name.trim().is_empty() {
            return Err(ApiError::BadRequest("name is empty".into()));
        }
        if new_name != name {
            require_write(&state, &me, WriteAbility::RenameProject, subject).await?;
        }
    }
    if let Some(v) = b.visibility.as_deref() {
        let v = check_visibility(Some(v))?;
        if v != visibility {
            require_write(&state, &me, WriteAbility::ChangeProjectVisibility, subject).await?;
        }
        if visibility_rank(&v) > visibility_rank(&group_visibility) {
            return Err(ApiError::invalid(
                "visibility_level",
                format!("{v} is not allowed in a {group_visibility} group."),
            ));
        }
    }
    db.execute(
        "UPDATE projects SET name = coalesce($2, name), description = coalesce($3, description),
            visibility = coalesce($4, visibility), duo_features_enabled = coalesce($5, duo_features_enabled)
         WHERE id = $1",
        &[&id, &b.name, &b.description, &b.visibility, &b.duo_features_enabled],
    )
    .await?;
    Ok(HttpResponse::Ok().json(project_response(&state, id).await?))
}

// ---- issues -------------------------------------------------------------------

fn issue_sql() -> String {
    format!(
        "SELECT i.id, i.iid, i.project_id, i.title, i.description, i.state, i.confidential, i.labels,
            i.created_at, i.updated_at, {AUTHOR_COLUMNS},
            coalesce((SELECT json_agg(json_build_object('id', au.id, 'username', au.username, 'name', au.name,
                                                        'state', au.state) ORDER BY au.id)
                      FROM issue_assignees a JOIN users au ON au.id = a.user_id WHERE a.issue_id = i.id),
                     '[]'::json) AS assignees
         FROM issues i JOIN users u ON u.id = i.author_id"
    )
}

fn issue_json(row: &tokio_postgres::Row, base: &url::Url, full_path: &str) -> Value {
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
    // No state history is kept: a closed issue was closed at its last update.
    let closed_at = (state == "closed").then(|| ts(row, "updated_at"));
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
        "closed_at": closed_at,
    })
}

#[derive(Debug, Deserialize)]
struct IssueListParams {
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
fn labels_filter(labels: Option<&str>) -> (&'static str, Vec<String>) {
    match labels.map(str::trim) {
        Some(l) if l.eq_ignore_ascii_case("none") => ("none", Vec::new()),
        Some(l) if l.eq_ignore_ascii_case("any") => ("any", Vec::new()),
        other => ("all", split_labels(other)),
    }
}

async fn list_issues(
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
    let full_path = Container::Project(id).full_path(&**db).await?;
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
        &**db,
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
async fn find_issue(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    iid: i32,
) -> Result<Found, ApiError> {
    let sql = format!("{} WHERE i.project_id = $1 AND i.iid = $2", issue_sql());
    let project = Container::Project(project);
    find_readable(state, req, project, Item::ISSUE, &sql, &iid).await
}

async fn show_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let issue = find_issue(&state, &req, project, iid).await?;
    Ok(HttpResponse::Ok().json(issue.json(&state, issue_json)))
}

#[derive(Deserialize)]
struct NewIssue {
    title: String,
    description: Option<String>,
    confidential: Option<bool>,
    labels: Option<String>,
    assignee_ids: Option<Vec<i64>>,
}

async fn create_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<NewIssue>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let project = path.into_inner();
    readable_project(&state, &req, project).await?;
    let b = body.into_inner();
    if b.title.trim().is_empty() {
        return Err(ApiError::BadRequest("title is missing".into()));
    }
    let labels = split_labels(b.labels.as_deref());
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
            "INSERT INTO issues (project_id, iid, title, description, author_id, confidential, labels)
             VALUES ($1, (SELECT coalesce(max(iid), 0) + 1 FROM issues WHERE project_id = $1), $2, $3, $4, $5, $6)
             RETURNING id",
            &[&project, &b.title, &b.description.unwrap_or_default(), &me.id, &b.confidential.unwrap_or(false), &labels],
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
        &**db,
        Container::Project(project),
        &sql,
        id,
        issue_json,
    )
    .await
}

/// Notes of an issue: `/projects/{id}/issues/{iid}/notes`.
struct IssueNotes;

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

// ---- application settings and seats ---------------------------------------------

fn settings_json(row: &tokio_postgres::Row) -> Value {
    json!({
        "gitlab_dedicated_instance": false,
        "realm": row.get::<_, String>("realm"),
        "instance_tier": row.get::<_, String>("instance_tier"),
        "duo_features_enabled": row.get::<_, bool>("duo_features_enabled"),
        "ai_gateway_url": row.get::<_, Option<String>>("ai_gateway_url"),
        "ai_action_api_rate_limit": row.get::<_, i32>("ai_action_api_rate_limit"),
        "duo_chat_expiration_days": row.get::<_, i32>("duo_chat_expiration_days"),
    })
}

const SETTINGS_SQL: &str = "SELECT realm, instance_tier, duo_features_enabled, ai_gateway_url, ai_action_api_rate_limit, duo_chat_expiration_days FROM instance_settings";

async fn show_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, READ_SCOPES).await?;
    let db = state.pool.get().await?;
    let row = db.query_one(SETTINGS_SQL, &[]).await?;
    Ok(HttpResponse::Ok().json(settings_json(&row)))
}

#[derive(Deserialize)]
struct SettingsUpdate {
    instance_tier: Option<String>,
    duo_features_enabled: Option<bool>,
    ai_gateway_url: Option<String>,
    duo_chat_expiration_days: Option<i32>,
}

async fn update_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<SettingsUpdate>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let b = body.into_inner();
    if let Some(t) = &b.instance_tier
        && !["free", "premium", "ultimate"].contains(&t.as_str())
    {
        return Err(ApiError::BadRequest(
            "instance_tier does not have a valid value".into(),
        ));
    }
    if let Some(u) = &b.ai_gateway_url
        && url::Url::parse(u).is_err()
    {
        return Err(ApiError::BadRequest("ai_gateway_url is invalid".into()));
    }
    if b.duo_chat_expiration_days
        .is_some_and(|d| !(1..=365).contains(&d))
    {
        return Err(ApiError::BadRequest(
            "duo_chat_expiration_days must be between 1 and 365".into(),
        ));
    }
    let db = state.pool.get().await?;
    db.execute(
        "UPDATE instance_settings SET
           instance_tier = coalesce($1, instance_tier),
           duo_features_enabled = coalesce($2, duo_features_enabled),
           ai_gateway_url = coalesce($3, ai_gateway_url),
           duo_chat_expiration_days = coalesce($4, duo_chat_expiration_days),
           updated_at = now()",
        &[
            &b.instance_tier,
            &b.duo_features_enabled,
            &b.ai_gateway_url,
            &b.duo_chat_expiration_days,
        ],
    )
    .await?;
    let row = db.query_one(SETTINGS_SQL, &[]).await?;
    Ok(HttpResponse::Ok().json(settings_json(&row)))
}

#[derive(Deserialize)]
struct SeatAssignment {
    user_id: i64,
}

/// Assigns a seat of the add-on (`duo_pro` or `duo_enterprise`) to a user; creates
/// an instance-wide purchase on first use. Admins only.
async fn assign_seat(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Json<SeatAssignment>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let add_on = crate::policy::add_ons::AddOn::parse(&path.into_inner())
        .ok_or(ApiError::NotFound("Add-on"))?;
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    let purchase: i64 = match tx
        .query_opt(
            "SELECT id FROM add_on_purchases WHERE add_on = $1 AND namespace_id IS NULL AND expires_on >= current_date
             ORDER BY id LIMIT 1 FOR UPDATE",
            &[&add_on.as_str()],
        )
        .await?
    {
        Some(r) => r.get(0),
        None => tx
            .query_one(
                "INSERT INTO add_on_purchases (add_on, quantity, expires_on) VALUES ($1, 100, current_date + 365) RETURNING id",
                &[&add_on.as_str()],
            )
            .await?
            .get(0),
    };
    let used: i64 = tx
        .query_one(
            "SELECT count(*) FROM add_on_seat_assignments WHERE purchase_id = $1",
            &[&purchase],
        )
        .await?
        .get(0);
    let quantity: i32 = tx
        .query_one(
            "SELECT quantity FROM add_on_purchases WHERE id = $1",
            &[&purchase],
        )
        .await?
        .get(0);
    if used >= i64::from(quantity) {
        return Err(ApiError::Conflict("No seats available".into()));
    }
    tx.execute(
        "INSERT INTO add_on_seat_assignments (purchase_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&purchase, &body.user_id],
    )
    .await
    .map_err(|e| if e.code().is_some() { ApiError::NotFound("User") } else { e.into() })?;
    tx.commit().await?;
    Ok(HttpResponse::Created().json(
        json!({ "add_on": add_on.as_str(), "user_id": body.user_id, "purchase_id": purchase }),
    ))
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
