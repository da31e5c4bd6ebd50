//! Groups, projects and the items in them, in GitLab's REST shapes. Every read goes
//! through the policy; what a user may not read answers 404, as if it did not exist.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::pagination::PageParams;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES, optional_user, require_admin, require_user};
use crate::policy::{Ability, Actor, Subject, access};
use crate::web::AppState;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/groups", web::get().to(list_groups))
        .route("/groups", web::post().to(create_group))
        .route("/groups/{id}", web::get().to(show_group))
        .route("/groups/{id}/members", web::get().to(list_group_members))
        .route("/groups/{id}/members", web::post().to(add_group_member))
        .route("/groups/{id}/epics", web::get().to(list_epics))
        .route("/groups/{id}/epics/{iid}", web::get().to(show_epic))
        .route("/projects", web::get().to(list_projects))
        .route("/projects", web::post().to(create_project))
        .route("/projects/{id}", web::get().to(show_project))
        .route("/projects/{id}/members", web::post().to(add_project_member))
        .route("/projects/{id}/issues", web::get().to(list_issues))
        .route("/projects/{id}/issues", web::post().to(create_issue))
        .route("/projects/{id}/issues/{iid}", web::get().to(show_issue))
        .route(
            "/projects/{id}/issues/{iid}/notes",
            web::get().to(list_issue_notes),
        )
        .route(
            "/projects/{id}/issues/{iid}/notes",
            web::post().to(create_issue_note),
        )
        .route(
            "/projects/{id}/merge_requests",
            web::get().to(list_merge_requests),
        )
        .route(
            "/projects/{id}/merge_requests/{iid}",
            web::get().to(show_merge_request),
        )
        .route("/projects/{id}/jobs/import", web::post().to(import_job))
        .route("/projects/{id}/jobs/{job_id}", web::get().to(show_job))
        .route(
            "/projects/{id}/jobs/{job_id}/trace",
            web::get().to(job_trace),
        )
        .route("/application/settings", web::get().to(show_settings))
        .route("/application/settings", web::put().to(update_settings))
        .route(
            "/add_on_purchases/{add_on}/assignments",
            web::post().to(assign_seat),
        );
}

fn actor(user: &Option<crate::tokens::AuthenticatedUser>) -> Option<Actor> {
    user.as_ref().map(Actor::from)
}

async fn can(
    state: &AppState,
    user: Option<Actor>,
    ability: Ability,
    subject: Subject,
) -> Result<bool, ApiError> {
    let db = state.pool.get().await?;
    Ok(state.policy.can(&**db, user, ability, subject).await?)
}

fn paged(req: &HttpRequest, params: PageParams, items: Vec<Value>) -> HttpResponse {
    let page = params.resolve();
    let total = items.len();
    let mut builder = HttpResponse::Ok();
    page.headers(&mut builder, req, total);
    builder.json(page.slice(items))
}

fn ts(row: &tokio_postgres::Row, col: &str) -> DateTime<Utc> {
    row.get(col)
}

// ---- groups -------------------------------------------------------------------

const GROUP_SQL: &str = "WITH RECURSIVE chain(id, parent_id, full_path, root) AS (
        SELECT id, parent_id, path, id FROM groups WHERE parent_id IS NULL
        UNION ALL
        SELECT g.id, g.parent_id, c.full_path || '/' || g.path, c.root FROM groups g JOIN chain c ON g.parent_id = c.id
    )
    SELECT g.id, g.name, g.path, g.description, g.visibility, g.parent_id, g.plan, g.duo_features_enabled,
           g.experiment_and_beta_features, g.created_at, c.full_path
    FROM groups g JOIN chain c ON c.id = g.id";

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
        "web_url": format!("{}groups/{full_path}", base.as_str()),
        "plan": row.get::<_, String>("plan"),
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
    let rows = db.query(&format!("{GROUP_SQL} ORDER BY g.id"), &[]).await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(
                &**db,
                user,
                Ability::ReadGroup,
                Subject::Group(row.get("id")),
            )
            .await?
        {
            items.push(group_json(&row, &state.config.external_url));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

async fn show_group(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let user = actor(&optional_user(&state, &req).await?);
    let id = path.into_inner();
    if !can(&state, user, Ability::ReadGroup, Subject::Group(id)).await? {
        return Err(ApiError::NotFound("Group"));
    }
    let db = state.pool.get().await?;
    let row = db
        .query_one(&format!("{GROUP_SQL} WHERE g.id = $1"), &[&id])
        .await?;
    Ok(HttpResponse::Ok().json(group_json(&row, &state.config.external_url)))
}

#[derive(Deserialize)]
struct NewGroup {
    name: String,
    path: String,
    parent_id: Option<i64>,
    visibility: Option<String>,
    plan: Option<String>,
    description: Option<String>,
    duo_features_enabled: Option<bool>,
    experiment_features_enabled: Option<bool>,
}

fn check_visibility(v: &Option<String>) -> Result<String, ApiError> {
    let v = v.clone().unwrap_or_else(|| "private".into());
    if ["private", "internal", "public"].contains(&v.as_str()) {
        Ok(v)
    } else {
        Err(ApiError::BadRequest(
            "visibility does not have a valid value".into(),
        ))
    }
}

async fn create_group(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<NewGroup>,
) -> Result<HttpResponse, ApiError> {
    let me = require_admin(&state, &req, WRITE_SCOPES).await?;
    let b = body.into_inner();
    let visibility = check_visibility(&b.visibility)?;
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
        .map_err(|e| if e.code().is_some() { ApiError::BadRequest("parent_id is invalid".into()) } else { e.into() })?
        .ok_or_else(|| ApiError::BadRequest("Failed to save group {:path=>[\"has already been taken\"]}".into()))?;
    let id: i64 = row.get(0);
    tx.execute(
        "INSERT INTO group_members (group_id, user_id, access_level) VALUES ($1, $2, 50) ON CONFLICT DO NOTHING",
        &[&id, &me.id],
    )
    .await?;
    tx.commit().await?;
    let row = db
        .query_one(&format!("{GROUP_SQL} WHERE g.id = $1"), &[&id])
        .await?;
    Ok(HttpResponse::Created().json(group_json(&row, &state.config.external_url)))
}

#[derive(Deserialize)]
struct NewMember {
    user_id: i64,
    access_level: i32,
}

fn member_json(row: &tokio_postgres::Row, base: &url::Url) -> Value {
    let username: String = row.get("username");
    json!({
        "id": row.get::<_, i64>("id"),
        "username": username,
        "name": row.get::<_, String>("name"),
        "state": row.get::<_, String>("state"),
        "web_url": format!("{}{username}", base.as_str()),
        "access_level": row.get::<_, i32>("access_level"),
        "created_at": ts(row, "created_at"),
    })
}

/// Only owners (and admins) manage members.
async fn require_owner(
    state: &AppState,
    me: &crate::tokens::AuthenticatedUser,
    group: Option<i64>,
    project: Option<i64>,
) -> Result<(), ApiError> {
    if me.admin {
        return Ok(());
    }
    let db = state.pool.get().await?;
    let level: Option<i32> = match (group, project) {
        (Some(g), _) => db
            .query_one(
                "WITH RECURSIVE anc(id, parent_id) AS (SELECT id, parent_id FROM groups WHERE id = $1
                 UNION ALL SELECT g.id, g.parent_id FROM groups g JOIN anc ON g.id = anc.parent_id)
                 SELECT max(access_level) FROM group_members WHERE user_id = $2 AND group_id IN (SELECT id FROM anc)",
                &[&g, &me.id],
            )
            .await?
            .get(0),
        (None, Some(p)) => db
            .query_one(
                "SELECT greatest(
                    (SELECT access_level FROM project_members WHERE project_id = $1 AND user_id = $2),
                    (WITH RECURSIVE anc(id, parent_id) AS (
                        SELECT id, parent_id FROM groups WHERE id = (SELECT group_id FROM projects WHERE id = $1)
                        UNION ALL SELECT g.id, g.parent_id FROM groups g JOIN anc ON g.id = anc.parent_id)
                     SELECT max(access_level) FROM group_members WHERE user_id = $2 AND group_id IN (SELECT id FROM anc)))",
                &[&p, &me.id],
            )
            .await?
            .get(0),
        _ => None,
    };
    if level.unwrap_or(0) >= access::OWNER {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

async fn list_group_members(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let user = actor(&Some(require_user(&state, &req, READ_SCOPES).await?));
    let id = path.into_inner();
    if !can(&state, user, Ability::ReadGroup, Subject::Group(id)).await? {
        return Err(ApiError::NotFound("Group"));
    }
    let db = state.pool.get().await?;
    let rows = db
        .query(
            "SELECT u.id, u.username, u.name, u.state, m.access_level, m.created_at
             FROM group_members m JOIN users u ON u.id = m.user_id WHERE m.group_id = $1 ORDER BY u.id",
            &[&id],
        )
        .await?;
    let items = rows
        .iter()
        .map(|r| member_json(r, &state.config.external_url))
        .collect();
    Ok(paged(&req, q.into_inner(), items))
}

fn check_level(level: i32) -> Result<(), ApiError> {
    if [5, 10, 15, 20, 30, 40, 50].contains(&level) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "access_level does not have a valid value".into(),
        ))
    }
}

async fn add_group_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<NewMember>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let id = path.into_inner();
    if !can(
        &state,
        Some(Actor::from(&me)),
        Ability::ReadGroup,
        Subject::Group(id),
    )
    .await?
    {
        return Err(ApiError::NotFound("Group"));
    }
    require_owner(&state, &me, Some(id), None).await?;
    check_level(body.access_level)?;
    let db = state.pool.get().await?;
    db.execute(
        "INSERT INTO group_members (group_id, user_id, access_level) VALUES ($1, $2, $3)
         ON CONFLICT (group_id, user_id) DO UPDATE SET access_level = EXCLUDED.access_level",
        &[&id, &body.user_id, &body.access_level],
    )
    .await
    .map_err(|e| {
        if e.code().is_some() {
            ApiError::NotFound("User")
        } else {
            e.into()
        }
    })?;
    let row = db
        .query_one(
            "SELECT u.id, u.username, u.name, u.state, m.access_level, m.created_at
             FROM group_members m JOIN users u ON u.id = m.user_id WHERE m.group_id = $1 AND m.user_id = $2",
            &[&id, &body.user_id],
        )
        .await?;
    Ok(HttpResponse::Created().json(member_json(&row, &state.config.external_url)))
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
    let rows = db
        .query(&format!("{PROJECT_SQL} ORDER BY p.id DESC"), &[])
        .await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(
                &**db,
                user,
                Ability::ReadProject,
                Subject::Project(row.get("id")),
            )
            .await?
        {
            items.push(project_json(&row, &state.config.external_url));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

async fn readable_project(
    state: &AppState,
    req: &HttpRequest,
    id: i64,
) -> Result<Option<Actor>, ApiError> {
    let user = actor(&optional_user(state, req).await?);
    if !can(state, user, Ability::ReadProject, Subject::Project(id)).await? {
        return Err(ApiError::NotFound("Project"));
    }
    Ok(user)
}

async fn show_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    readable_project(&state, &req, id).await?;
    let db = state.pool.get().await?;
    let row = db
        .query_one(&format!("{PROJECT_SQL} WHERE p.id = $1"), &[&id])
        .await?;
    Ok(HttpResponse::Ok().json(project_json(&row, &state.config.external_url)))
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

async fn create_project(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<NewProject>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let b = body.into_inner();
    if !can(
        &state,
        Some(Actor::from(&me)),
        Ability::ReadGroup,
        Subject::Group(b.namespace_id),
    )
    .await?
    {
        return Err(ApiError::NotFound("Namespace"));
    }
    require_owner(&state, &me, Some(b.namespace_id), None).await?;
    let visibility = check_visibility(&b.visibility)?;
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
    let row = db
        .query_one(&format!("{PROJECT_SQL} WHERE p.id = $1"), &[&id])
        .await?;
    Ok(HttpResponse::Created().json(project_json(&row, &state.config.external_url)))
}

async fn add_project_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<NewMember>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let id = path.into_inner();
    readable_project(&state, &req, id).await?;
    require_owner(&state, &me, None, Some(id)).await?;
    check_level(body.access_level)?;
    let db = state.pool.get().await?;
    db.execute(
        "INSERT INTO project_members (project_id, user_id, access_level) VALUES ($1, $2, $3)
         ON CONFLICT (project_id, user_id) DO UPDATE SET access_level = EXCLUDED.access_level",
        &[&id, &body.user_id, &body.access_level],
    )
    .await
    .map_err(|e| {
        if e.code().is_some() {
            ApiError::NotFound("User")
        } else {
            e.into()
        }
    })?;
    let row = db
        .query_one(
            "SELECT u.id, u.username, u.name, u.state, m.access_level, m.created_at
             FROM project_members m JOIN users u ON u.id = m.user_id WHERE m.project_id = $1 AND m.user_id = $2",
            &[&id, &body.user_id],
        )
        .await?;
    Ok(HttpResponse::Created().json(member_json(&row, &state.config.external_url)))
}

// ---- issues -------------------------------------------------------------------

const ISSUE_SQL: &str = "SELECT i.id, i.iid, i.project_id, i.title, i.description, i.state, i.confidential, i.labels,
        i.created_at, i.updated_at, u.id AS author_id, u.username AS author_username, u.name AS author_name,
        coalesce((SELECT array_agg(a.user_id ORDER BY a.user_id) FROM issue_assignees a WHERE a.issue_id = i.id), '{}') AS assignee_ids
    FROM issues i JOIN users u ON u.id = i.author_id";

fn author(row: &tokio_postgres::Row) -> Value {
    json!({
        "id": row.get::<_, i64>("author_id"),
        "username": row.get::<_, String>("author_username"),
        "name": row.get::<_, String>("author_name"),
    })
}

fn issue_json(row: &tokio_postgres::Row) -> Value {
    let assignees: Vec<i64> = row.get("assignee_ids");
    json!({
        "id": row.get::<_, i64>("id"),
        "iid": row.get::<_, i32>("iid"),
        "project_id": row.get::<_, i64>("project_id"),
        "title": row.get::<_, String>("title"),
        "description": row.get::<_, String>("description"),
        "state": row.get::<_, String>("state"),
        "confidential": row.get::<_, bool>("confidential"),
        "labels": row.get::<_, Vec<String>>("labels"),
        "author": author(row),
        "assignees": assignees.iter().map(|id| json!({ "id": id })).collect::<Vec<_>>(),
        "created_at": ts(row, "created_at"),
        "updated_at": ts(row, "updated_at"),
    })
}

async fn list_issues(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let user = readable_project(&state, &req, id).await?;
    let db = state.pool.get().await?;
    let rows = db
        .query(
            &format!("{ISSUE_SQL} WHERE i.project_id = $1 ORDER BY i.id DESC"),
            &[&id],
        )
        .await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(
                &**db,
                user,
                Ability::ReadIssue,
                Subject::Issue(row.get("id")),
            )
            .await?
        {
            items.push(issue_json(&row));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

async fn find_issue(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    iid: i32,
) -> Result<(Option<Actor>, tokio_postgres::Row), ApiError> {
    let user = readable_project(state, req, project).await?;
    let db = state.pool.get().await?;
    let row = db
        .query_opt(
            &format!("{ISSUE_SQL} WHERE i.project_id = $1 AND i.iid = $2"),
            &[&project, &iid],
        )
        .await?
        .ok_or(ApiError::NotFound("Issue"))?;
    if !state
        .policy
        .can(
            &**db,
            user,
            Ability::ReadIssue,
            Subject::Issue(row.get("id")),
        )
        .await?
    {
        return Err(ApiError::NotFound("Issue"));
    }
    Ok((user, row))
}

async fn show_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let (_, row) = find_issue(&state, &req, project, iid).await?;
    Ok(HttpResponse::Ok().json(issue_json(&row)))
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
    let labels: Vec<String> = b
        .labels
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
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
            .map_err(|e| if e.code().is_some() { ApiError::BadRequest("assignee_ids is invalid".into()) } else { e.into() })?;
    }
    tx.commit().await?;
    let row = db
        .query_one(&format!("{ISSUE_SQL} WHERE i.id = $1"), &[&id])
        .await?;
    Ok(HttpResponse::Created().json(issue_json(&row)))
}

// ---- notes --------------------------------------------------------------------

fn note_json(row: &tokio_postgres::Row) -> Value {
    json!({
        "id": row.get::<_, i64>("id"),
        "body": row.get::<_, String>("body"),
        "author": author(row),
        "noteable_type": row.get::<_, String>("noteable_type"),
        "noteable_id": row.get::<_, i64>("noteable_id"),
        "internal": row.get::<_, bool>("internal"),
        "confidential": row.get::<_, bool>("internal"),
        "system": row.get::<_, bool>("system"),
        "created_at": ts(row, "created_at"),
        "updated_at": ts(row, "updated_at"),
    })
}

const NOTE_SQL: &str = "SELECT n.id, n.body, n.noteable_type, n.noteable_id, n.internal, n.system, n.created_at, n.updated_at,
        u.id AS author_id, u.username AS author_username, u.name AS author_name
    FROM notes n JOIN users u ON u.id = n.author_id";

async fn list_issue_notes(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let (user, issue) = find_issue(&state, &req, project, iid).await?;
    let issue_id: i64 = issue.get("id");
    let db = state.pool.get().await?;
    let rows = db
        .query(&format!("{NOTE_SQL} WHERE n.noteable_type = 'Issue' AND n.noteable_id = $1 ORDER BY n.id DESC"), &[&issue_id])
        .await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(&**db, user, Ability::ReadNote, Subject::Note(row.get("id")))
            .await?
        {
            items.push(note_json(&row));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

#[derive(Deserialize)]
struct NewNote {
    body: String,
    internal: Option<bool>,
}

async fn create_issue_note(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    body: web::Json<NewNote>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let (project, iid) = path.into_inner();
    let (_, issue) = find_issue(&state, &req, project, iid).await?;
    if body.body.trim().is_empty() {
        return Err(ApiError::BadRequest("body is missing".into()));
    }
    let issue_id: i64 = issue.get("id");
    let db = state.pool.get().await?;
    let id: i64 = db
        .query_one(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, body, internal) VALUES ('Issue', $1, $2, $3, $4) RETURNING id",
            &[&issue_id, &me.id, &body.body, &body.internal.unwrap_or(false)],
        )
        .await?
        .get(0);
    let row = db
        .query_one(&format!("{NOTE_SQL} WHERE n.id = $1"), &[&id])
        .await?;
    Ok(HttpResponse::Created().json(note_json(&row)))
}

// ---- epics --------------------------------------------------------------------

const EPIC_SQL: &str = "SELECT e.id, e.iid, e.group_id, e.title, e.description, e.state, e.confidential, e.labels,
        e.created_at, e.updated_at, u.id AS author_id, u.username AS author_username, u.name AS author_name
    FROM epics e JOIN users u ON u.id = e.author_id";

fn epic_json(row: &tokio_postgres::Row) -> Value {
    json!({
        "id": row.get::<_, i64>("id"),
        "iid": row.get::<_, i32>("iid"),
        "group_id": row.get::<_, i64>("group_id"),
        "title": row.get::<_, String>("title"),
        "description": row.get::<_, String>("description"),
        "state": row.get::<_, String>("state"),
        "confidential": row.get::<_, bool>("confidential"),
        "labels": row.get::<_, Vec<String>>("labels"),
        "author": author(row),
        "created_at": ts(row, "created_at"),
        "updated_at": ts(row, "updated_at"),
    })
}

async fn list_epics(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let group = path.into_inner();
    let user = actor(&optional_user(&state, &req).await?);
    if !can(&state, user, Ability::ReadGroup, Subject::Group(group)).await? {
        return Err(ApiError::NotFound("Group"));
    }
    let db = state.pool.get().await?;
    let rows = db
        .query(
            &format!("{EPIC_SQL} WHERE e.group_id = $1 ORDER BY e.id DESC"),
            &[&group],
        )
        .await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(&**db, user, Ability::ReadEpic, Subject::Epic(row.get("id")))
            .await?
        {
            items.push(epic_json(&row));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

async fn show_epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (group, iid) = path.into_inner();
    let user = actor(&optional_user(&state, &req).await?);
    let db = state.pool.get().await?;
    let row = db
        .query_opt(
            &format!("{EPIC_SQL} WHERE e.group_id = $1 AND e.iid = $2"),
            &[&group, &iid],
        )
        .await?
        .ok_or(ApiError::NotFound("Epic"))?;
    if !state
        .policy
        .can(&**db, user, Ability::ReadEpic, Subject::Epic(row.get("id")))
        .await?
    {
        return Err(ApiError::NotFound("Epic"));
    }
    Ok(HttpResponse::Ok().json(epic_json(&row)))
}

// ---- merge requests -------------------------------------------------------------

const MR_SQL: &str = "SELECT m.id, m.iid, m.project_id, m.title, m.description, m.state, m.source_branch, m.target_branch,
        m.labels, m.created_at, m.updated_at, u.id AS author_id, u.username AS author_username, u.name AS author_name
    FROM merge_requests m JOIN users u ON u.id = m.author_id";

fn mr_json(row: &tokio_postgres::Row) -> Value {
    json!({
        "id": row.get::<_, i64>("id"),
        "iid": row.get::<_, i32>("iid"),
        "project_id": row.get::<_, i64>("project_id"),
        "title": row.get::<_, String>("title"),
        "description": row.get::<_, String>("description"),
        "state": row.get::<_, String>("state"),
        "source_branch": row.get::<_, String>("source_branch"),
        "target_branch": row.get::<_, String>("target_branch"),
        "labels": row.get::<_, Vec<String>>("labels"),
        "author": author(row),
        "created_at": ts(row, "created_at"),
        "updated_at": ts(row, "updated_at"),
    })
}

async fn list_merge_requests(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let project = path.into_inner();
    let user = readable_project(&state, &req, project).await?;
    let db = state.pool.get().await?;
    let rows = db
        .query(
            &format!("{MR_SQL} WHERE m.project_id = $1 ORDER BY m.id DESC"),
            &[&project],
        )
        .await?;
    let mut items = Vec::new();
    for row in rows {
        if state
            .policy
            .can(
                &**db,
                user,
                Ability::ReadMergeRequest,
                Subject::MergeRequest(row.get("id")),
            )
            .await?
        {
            items.push(mr_json(&row));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

async fn show_merge_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let user = readable_project(&state, &req, project).await?;
    let db = state.pool.get().await?;
    let row = db
        .query_opt(
            &format!("{MR_SQL} WHERE m.project_id = $1 AND m.iid = $2"),
            &[&project, &iid],
        )
        .await?
        .ok_or(ApiError::NotFound("Merge Request"))?;
    if !state
        .policy
        .can(
            &**db,
            user,
            Ability::ReadMergeRequest,
            Subject::MergeRequest(row.get("id")),
        )
        .await?
    {
        return Err(ApiError::NotFound("Merge Request"));
    }
    Ok(HttpResponse::Ok().json(mr_json(&row)))
}

// ---- CI jobs --------------------------------------------------------------------

#[derive(Deserialize)]
struct ImportedJob {
    name: String,
    stage: String,
    status: String,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    sha: Option<String>,
    log: Option<String>,
}

const JOB_STATUSES: &[&str] = &[
    "created", "pending", "running", "success", "failed", "canceled", "skipped", "manual",
];

fn job_json(row: &tokio_postgres::Row) -> Value {
    json!({
        "id": row.get::<_, i64>("id"),
        "name": row.get::<_, String>("name"),
        "stage": row.get::<_, String>("stage"),
        "status": row.get::<_, String>("status"),
        "ref": row.get::<_, String>("ref"),
        "pipeline": { "id": row.get::<_, i64>("pipeline_id"), "project_id": row.get::<_, i64>("project_id"), "sha": row.get::<_, String>("sha") },
        "created_at": ts(row, "created_at"),
        "finished_at": row.get::<_, Option<DateTime<Utc>>>("finished_at"),
    })
}

const JOB_SQL: &str = "SELECT b.id, b.name, b.stage, b.status, b.project_id, b.pipeline_id, b.created_at, b.finished_at, b.log,
        p.ref, p.sha FROM ci_builds b JOIN ci_pipelines p ON p.id = b.pipeline_id";

/// GitLab has no API to create CI jobs; this documented endpoint imports a finished
/// job and its log (a pipeline is created for it). Maintainers and admins only.
async fn import_job(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<ImportedJob>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let project = path.into_inner();
    readable_project(&state, &req, project).await?;
    let b = body.into_inner();
    if !JOB_STATUSES.contains(&b.status.as_str()) {
        return Err(ApiError::BadRequest(
            "status does not have a valid value".into(),
        ));
    }
    let mut db = state.pool.get().await?;
    if !me.admin {
        let level: Option<i32> = db
            .query_one(
                "SELECT access_level FROM project_members WHERE project_id = $1 AND user_id = $2",
                &[&project, &me.id],
            )
            .await
            .ok()
            .and_then(|r| r.get(0));
        let owner_ok = require_owner(&state, &me, None, Some(project))
            .await
            .is_ok();
        if level.unwrap_or(0) < access::MAINTAINER && !owner_ok {
            return Err(ApiError::Forbidden);
        }
    }
    let tx = db.transaction().await?;
    let pipeline: i64 = tx
        .query_one(
            "INSERT INTO ci_pipelines (project_id, ref, sha, status) VALUES ($1, $2, $3, $4) RETURNING id",
            &[&project, &b.git_ref.unwrap_or_else(|| "main".into()), &b.sha.unwrap_or_else(|| "0000000".into()), &b.status],
        )
        .await?
        .get(0);
    let id: i64 = tx
        .query_one(
            "INSERT INTO ci_builds (project_id, pipeline_id, name, stage, status, log, finished_at)
             VALUES ($1, $2, $3, $4, $5, $6, now()) RETURNING id",
            &[
                &project,
                &pipeline,
                &b.name,
                &b.stage,
                &b.status,
                &b.log.unwrap_or_default(),
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    let row = db
        .query_one(&format!("{JOB_SQL} WHERE b.id = $1"), &[&id])
        .await?;
    Ok(HttpResponse::Created().json(job_json(&row)))
}

async fn find_job(
    state: &AppState,
    req: &HttpRequest,
    project: i64,
    job: i64,
) -> Result<tokio_postgres::Row, ApiError> {
    let user = readable_project(state, req, project).await?;
    let db = state.pool.get().await?;
    let row = db
        .query_opt(
            &format!("{JOB_SQL} WHERE b.id = $1 AND b.project_id = $2"),
            &[&job, &project],
        )
        .await?
        .ok_or(ApiError::NotFound("Job"))?;
    if !state
        .policy
        .can(&**db, user, Ability::ReadBuild, Subject::Build(job))
        .await?
    {
        return Err(ApiError::NotFound("Job"));
    }
    Ok(row)
}

async fn show_job(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (project, job) = path.into_inner();
    let row = find_job(&state, &req, project, job).await?;
    Ok(HttpResponse::Ok().json(job_json(&row)))
}

async fn job_trace(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (project, job) = path.into_inner();
    let row = find_job(&state, &req, project, job).await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(row.get::<_, String>("log")))
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
    let add_on =
        crate::add_ons::AddOn::parse(&path.into_inner()).ok_or(ApiError::NotFound("Add-on"))?;
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
