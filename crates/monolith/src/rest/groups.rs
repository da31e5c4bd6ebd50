//! Groups in GitLab's REST shapes: list, show, create, update.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::containers::{Container, actor, readable_group};
use super::error::on_constraint;
use super::item_access::Item;
use super::pagination::{PageParams, paged};
use super::param_values::{check_visibility, visibility_rank};
use super::{ApiError, WRITE_SCOPES};
use super::{optional_user, require_admin};
use crate::app_state::AppState;
use crate::namespaces::groups::{self, Group, GroupChanges, GroupCreation};
use crate::policy::{DuoSwitchScope, WriteAbility};
use crate::review::instructions::Source;

// ---- groups -------------------------------------------------------------------

/// GitLab's group entity. The plan is not part of it (GitLab shows plans on
/// namespaces, to admins); ours is set on creation only.
pub(super) fn group_json(group: &Group, base: &url::Url) -> Value {
    let full_path = &group.full_path;
    json!({
        "id": group.id,
        "name": group.name,
        "path": group.path,
        "full_path": full_path,
        "full_name": full_path.replace('/', " / "),
        "description": group.description,
        "visibility": group.visibility,
        "parent_id": group.parent_id,
        "avatar_url": Value::Null,
        "web_url": format!("{}groups/{full_path}", base.as_str()),
        "duo_features_enabled": group.duo_features_enabled,
        "experiment_features_enabled": group.experiment_features_enabled,
        "ai_settings": { "duo_workflow_mcp_enabled": group.duo_workflow_mcp_enabled },
        "duo_code_review_instructions": group.duo_code_review_instructions,
        "created_at": group.created_at,
    })
}

pub(super) async fn list_groups(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<PageParams>,
) -> Result<HttpResponse, ApiError> {
    let user = actor(&optional_user(&state, &req).await?);
    let db = state.pool.get().await?;
    let item = Item::GROUP;
    let mut items = Vec::new();
    for group in groups::list(&*db).await? {
        if state
            .policy
            .can(&*db, user, item.ability, (item.subject)(group.id))
            .await?
        {
            items.push(group_json(&group, &state.config.external_url));
        }
    }
    Ok(paged(&req, q.into_inner(), items))
}

pub(super) async fn group_response(state: &AppState, id: i64) -> Result<Value, ApiError> {
    let db = state.pool.get().await?;
    let group = groups::by_id(&*db, id)
        .await?
        .ok_or(ApiError::NotFound("Group"))?;
    Ok(group_json(&group, &state.config.external_url))
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
    let new = groups::NewGroup {
        name: &b.name,
        path: &b.path,
        parent_id: b.parent_id,
        visibility: &visibility,
        plan: &plan,
        description: b.description.as_deref().unwrap_or_default(),
        duo_features_enabled: b.duo_features_enabled.unwrap_or(true),
        experiment_features_enabled: b.experiment_features_enabled.unwrap_or(false),
    };
    let id = match groups::create(&mut db, &new, me.id).await? {
        GroupCreation::Created(id) => id,
        GroupCreation::Refused => {
            return Err(ApiError::BadRequest("parent_id is invalid".into()));
        }
        GroupCreation::PathTaken => {
            return Err(ApiError::BadRequest(
                "Failed to save group {:path=>[\"has already been taken\"]}".into(),
            ));
        }
    };
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
    /// GitLab's group AI settings (JSON, or the form keys
    /// `ai_settings_attributes[duo_workflow_mcp_enabled]`).
    ai_settings_attributes: Option<AiSettingsAttributes>,
    /// Our extension: review instructions the group's merge request reviews
    /// apply, after the instance's (YAML; `""` for none).
    duo_code_review_instructions: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct AiSettingsAttributes {
    /// Only on top-level groups, as in GitLab.
    duo_workflow_mcp_enabled: Option<bool>,
}

/// The most open visibility among a group's direct subgroups and projects.
pub(super) async fn widest_child_visibility(
    db: &impl crate::queries::Queries,
    group: i64,
) -> Result<usize, ApiError> {
    Ok(groups::child_visibilities(db, group)
        .await?
        .iter()
        .map(|v| visibility_rank(v))
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
    if let Some(text) = &b.duo_code_review_instructions {
        let path = Container::Group(id).full_path(&*db).await?;
        super::admin::checked_review_instructions(text, Source::Group(path))?;
    }
    let (parent, parent_visibility) = groups::parent_and_its_visibility(&*db, id).await?;
    if b.experiment_features_enabled.is_some() && parent.is_some() {
        return Err(ApiError::invalid(
            "experiment_features_enabled",
            "can only be changed on a top-level group",
        ));
    }
    let mcp_enabled = b
        .ai_settings_attributes
        .as_ref()
        .and_then(|a| a.duo_workflow_mcp_enabled);
    if mcp_enabled.is_some() && parent.is_some() {
        return Err(ApiError::invalid(
            "ai_settings.duo_workflow_mcp_enabled",
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
    let changes = GroupChanges {
        name: b.name.as_deref(),
        path: b.path.as_deref(),
        description: b.description.as_deref(),
        visibility: b.visibility.as_deref(),
        duo_features_enabled: b.duo_features_enabled,
        experiment_features_enabled: b.experiment_features_enabled,
        duo_workflow_mcp_enabled: mcp_enabled,
        duo_code_review_instructions: b.duo_code_review_instructions.as_deref(),
    };
    groups::update(&*db, id, &changes)
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
