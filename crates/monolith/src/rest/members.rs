//! Direct members of groups and projects.
//!
//! Who may manage them follows GitLab: group owners manage group members;
//! project maintainers and owners (own or inherited role) manage project members,
//! a maintainer only for roles up to their own (they cannot add, change or remove
//! an owner). Admins manage everything. Anyone may remove their own membership.
//! A group always keeps an owner: its last one (counting owners inherited from
//! ancestor groups) can be neither removed nor demoted.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::containers::{Container, require_write};
use super::error::on_constraint;
use super::pagination::{PageParams, paged};
use super::param_values::like_pattern;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES, require_user};
use crate::app_state::AppState;
use crate::identity::tokens::AuthenticatedUser;
use crate::identity::users;
use crate::namespaces::members::{self, Member, Source};
use crate::policy::{Actor, WriteAbility, access};

/// Which kind of container a members route's `{id}` names.
pub(super) trait SourceKind: 'static {
    fn source(id: i64) -> Container;
}

/// Members of a group (`/groups/{id}/members`).
pub(super) struct OfGroup;
/// Members of a project (`/projects/{id}/members`).
pub(super) struct OfProject;

impl SourceKind for OfGroup {
    fn source(id: i64) -> Container {
        Container::Group(id)
    }
}

impl SourceKind for OfProject {
    fn source(id: i64) -> Container {
        Container::Project(id)
    }
}

/// Whose members a group or project holds and what managing them takes: the
/// rules barely differ.
trait MemberSource {
    fn members(self) -> Source;
    fn admin_ability(self) -> WriteAbility;
    fn valid_level(self, level: i32) -> bool;
}

impl MemberSource for Container {
    fn members(self) -> Source {
        match self {
            Container::Group(id) => Source::Group(id),
            Container::Project(id) => Source::Project(id),
        }
    }

    fn admin_ability(self) -> WriteAbility {
        match self {
            Container::Group(_) => WriteAbility::AdminGroupMember,
            Container::Project(_) => WriteAbility::AdminProjectMember,
        }
    }

    /// Minimal access exists only on groups.
    fn valid_level(self, level: i32) -> bool {
        let levels: &[i32] = match self {
            Container::Group(_) => &[5, 10, 15, 20, 30, 40, 50],
            Container::Project(_) => &[10, 15, 20, 30, 40, 50],
        };
        levels.contains(&level)
    }
}

fn member_json(member: &Member, base: &url::Url) -> Value {
    json!({
        "id": member.id,
        "username": member.username,
        "name": member.name,
        "state": member.state,
        "avatar_url": Value::Null,
        "web_url": format!("{}{}", base.as_str(), member.username),
        "access_level": member.access_level,
        "created_at": member.created_at,
        "expires_at": Value::Null,
    })
}

async fn find_member(
    state: &AppState,
    source: Container,
    user_id: i64,
) -> Result<Member, ApiError> {
    let db = state.pool.get().await?;
    members::find(&*db, source.members(), user_id)
        .await?
        .ok_or(ApiError::RecordNotFound)
}

#[derive(Debug, Deserialize)]
pub(super) struct MemberListParams {
    page: Option<usize>,
    per_page: Option<usize>,
    /// Part of a username or name.
    query: Option<String>,
}

pub(super) async fn list<K: SourceKind>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<MemberListParams>,
) -> Result<HttpResponse, ApiError> {
    let source = K::source(path.into_inner());
    require_user(&state, &req, READ_SCOPES).await?;
    source.readable(&state, &req).await?;
    let db = state.pool.get().await?;
    let pattern = like_pattern(q.query.as_deref());
    let items = members::list(&*db, source.members(), pattern.as_deref())
        .await?
        .iter()
        .map(|m| member_json(m, &state.config.external_url))
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

pub(super) async fn show<K: SourceKind>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    let source = K::source(id);
    require_user(&state, &req, READ_SCOPES).await?;
    source.readable(&state, &req).await?;
    let member = find_member(&state, source, user_id).await?;
    Ok(HttpResponse::Ok().json(member_json(&member, &state.config.external_url)))
}

/// 400 for an access level the group or project does not have.
fn check_level(source: Container, level: i32) -> Result<(), ApiError> {
    if source.valid_level(level) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "access_level does not have a valid value".into(),
        ))
    }
}

/// 403 unless `me` may manage members here and give or take away `level`.
async fn require_manage(
    state: &AppState,
    me: &AuthenticatedUser,
    source: Container,
    level: i32,
) -> Result<(), ApiError> {
    require_write(state, me, source.admin_ability(), source.subject()).await?;
    let db = state.pool.get().await?;
    if state
        .policy
        .may_manage_role(&*db, Some(Actor::from(me)), source.subject(), level)
        .await?
    {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// 403 when taking `user_id`'s owner role away would leave a group without an
/// owner (direct or inherited).
async fn keep_an_owner(state: &AppState, source: Container, user_id: i64) -> Result<(), ApiError> {
    let Container::Group(group) = source else {
        return Ok(());
    };
    let db = state.pool.get().await?;
    let others = members::others_with_level_in_group(&*db, group, user_id, access::OWNER).await?;
    if others == 0 {
        Err(ApiError::ForbiddenBecause(
            "A group must have at least one owner",
        ))
    } else {
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct NewMember {
    user_id: i64,
    access_level: i32,
}

pub(super) async fn add<K: SourceKind>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<NewMember>,
) -> Result<HttpResponse, ApiError> {
    let source = K::source(path.into_inner());
    let body = body.into_inner();
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    source.readable(&state, &req).await?;
    require_manage(&state, &me, source, body.access_level).await?;
    check_level(source, body.access_level)?;
    let db = state.pool.get().await?;
    if !users::exists(&*db, body.user_id).await? {
        return Err(ApiError::NotFound("User"));
    }
    let inserted = members::add(&*db, source.members(), body.user_id, body.access_level)
        .await
        .map_err(on_constraint(ApiError::NotFound("User")))?;
    if !inserted {
        return Err(ApiError::Conflict("Member already exists".into()));
    }
    let member = find_member(&state, source, body.user_id).await?;
    Ok(HttpResponse::Created().json(member_json(&member, &state.config.external_url)))
}

/// The caller (with a write token) and the access level `user_id` holds now,
/// once the caller may read the group or project.
async fn current_level(
    state: &AppState,
    req: &HttpRequest,
    source: Container,
    user_id: i64,
) -> Result<(AuthenticatedUser, i32), ApiError> {
    let me = require_user(state, req, WRITE_SCOPES).await?;
    source.readable(state, req).await?;
    let current = find_member(state, source, user_id).await?.access_level;
    Ok((me, current))
}

#[derive(Debug, Deserialize)]
pub(super) struct MemberUpdate {
    access_level: i32,
}

pub(super) async fn update<K: SourceKind>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
    body: super::params::Params<MemberUpdate>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    let source = K::source(id);
    let (me, current) = current_level(&state, &req, source, user_id).await?;
    // Both the role taken away and the one given must be within the caller's reach.
    require_manage(&state, &me, source, current).await?;
    require_manage(&state, &me, source, body.access_level).await?;
    check_level(source, body.access_level)?;
    if current == access::OWNER && body.access_level < access::OWNER {
        keep_an_owner(&state, source, user_id).await?;
    }
    let db = state.pool.get().await?;
    members::set_access_level(&*db, source.members(), user_id, body.access_level).await?;
    let member = find_member(&state, source, user_id).await?;
    Ok(HttpResponse::Ok().json(member_json(&member, &state.config.external_url)))
}

pub(super) async fn remove<K: SourceKind>(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    let source = K::source(id);
    let (me, current) = current_level(&state, &req, source, user_id).await?;
    // Leaving is always allowed (but for a group's last owner).
    if me.id != user_id {
        require_manage(&state, &me, source, current).await?;
    }
    if current == access::OWNER {
        keep_an_owner(&state, source, user_id).await?;
    }
    let db = state.pool.get().await?;
    members::remove(&*db, source.members(), user_id).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_access_is_for_groups_only() {
        assert!(Container::Group(1).valid_level(5));
        assert!(!Container::Project(1).valid_level(5));
        assert!(Container::Project(1).valid_level(50));
        assert!(!Container::Group(1).valid_level(60));
    }
}
