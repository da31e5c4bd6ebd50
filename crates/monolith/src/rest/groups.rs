//! Groups in GitLab's REST shapes: list, show, create, update.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::common::{
    Container, actor, check_visibility, on_constraint, paged, readable_group, ts, visibility_rank,
};
use super::items::{Item, readable_rows};
use super::pagination::PageParams;
use super::{ApiError, WRITE_SCOPES};
use super::{optional_user, require_admin};
use crate::app_state::AppState;
use crate::policy::{DuoSwitchScope, WriteAbility};

// ---- groups -------------------------------------------------------------------

pub(super) const GROUP_SQL: &str = "WITH RECURSIVE chain(id, parent_id, full_path, root) AS (
        SELECT id, parent_id, path, id FROM groups WHERE parent_id IS NULL
        UNION ALL
        SELECT g.id, g.parent_id, c.full_path || '/' || g.path, c.root FROM groups g JOIN chain c ON g.parent_id = c.id
    )
    SELECT g.id, g.name, g.path, g.description, g.visibility, g.parent_id, g.duo_features_enabled,
           g.experiment_and_beta_features, g.created_at, c.full_path
    FROM groups g JOIN chain c ON c.id = g.id";

/// GitLab's group entity. The plan is not part of it (GitLab shows plans on
/// namespaces, to admins); ours is set on creation only.
pub(super) fn group_json(row: &tokio_postgres::Row, base: &url::Url) -> Value {
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

pub(super) async fn list_groups(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let user = actor(&optional_user(&state, &req).await?);
    let db = state.pool.get().await?;
    let sql = format!("{GROUP_SQL} ORDER BY g.id");
    let rows = readable_rows(&state, &*db, user, Item::GROUP, &sql, &[]).await?;
    let items = rows
        .iter()
        .map(|r| group_json(r, &state.config.external_url))
        .collect();
    Ok(paged(&req, q.into_inner(), items))
}

pub(super) async fn group_response(state: &AppState, id: i64) -> Result<Value, ApiError> {
    let db = state.pool.get().await?;
    let row = db
        .query_opt(&format!("{GROUP_SQL} WHERE g.id = $1"), &[&id])
        .await?
        .ok_or(ApiError::NotFound("Group"))?;
    Ok(group_json(&row, &state.config.external_url))
}

pub(super) async fn show_group(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    readable_group(&state, &req, id).await?;
    Ok(HttpResponse::Ok().json(group_response(&state, id).await?))
}

#[derive(Deserialize)]
pub(super) struct NewGroup {
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

pub(super) async fn create_group(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: super::params::Params<NewGroup>,
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
pub(super) struct GroupUpdate {
    name: Option<String>,
    path: Option<String>,
    description: Option<String>,
    visibility: Option<String>,
    duo_features_enabled: Option<bool>,
    /// Only on top-level groups, as in GitLab.
    experiment_features_enabled: Option<bool>,
}

/// The most open visibility among a group's direct subgroups and projects.
pub(super) async fn widest_child_visibility(
    db: &impl crate::queries::Queries,
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
pub(super) async fn update_group(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<GroupUpdate>,
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
        if widest_child_visibility(&*db, id).await? > visibility_rank(&v) {
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
    if b.duo_features_enabled.is_some() {
        super::projects::follow_duo_switch(&state, &*db, DuoSwitchScope::Group(id)).await?;
    }
    Ok(HttpResponse::Ok().json(group_response(&state, id).await?))
}
