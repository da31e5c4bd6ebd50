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

use super::common::{
    like_pattern, on_constraint, paged, readable_group, readable_project, require_write, ts,
};
use super::pagination::PageParams;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES, require_user};
use crate::policy::{Actor, Subject, WriteAbility, access};
use crate::tokens::AuthenticatedUser;
use crate::web::AppState;

pub(super) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/groups/{id}/members", web::get().to(list_group_members))
        .route("/groups/{id}/members", web::post().to(add_group_member))
        .route(
            "/groups/{id}/members/{user_id}",
            web::get().to(show_group_member),
        )
        .route(
            "/groups/{id}/members/{user_id}",
            web::put().to(update_group_member),
        )
        .route(
            "/groups/{id}/members/{user_id}",
            web::delete().to(remove_group_member),
        )
        .route(
            "/projects/{id}/members",
            web::get().to(list_project_members),
        )
        .route("/projects/{id}/members", web::post().to(add_project_member))
        .route(
            "/projects/{id}/members/{user_id}",
            web::get().to(show_project_member),
        )
        .route(
            "/projects/{id}/members/{user_id}",
            web::put().to(update_project_member),
        )
        .route(
            "/projects/{id}/members/{user_id}",
            web::delete().to(remove_project_member),
        );
}

/// Where members live: the table and key column differ, the rules barely.
#[derive(Debug, Clone, Copy)]
enum Source {
    Group(i64),
    Project(i64),
}

impl Source {
    fn id(self) -> i64 {
        match self {
            Source::Group(id) | Source::Project(id) => id,
        }
    }

    fn subject(self) -> Subject {
        match self {
            Source::Group(id) => Subject::Group(id),
            Source::Project(id) => Subject::Project(id),
        }
    }

    fn table(self) -> (&'static str, &'static str) {
        match self {
            Source::Group(_) => ("group_members", "group_id"),
            Source::Project(_) => ("project_members", "project_id"),
        }
    }

    fn admin_ability(self) -> WriteAbility {
        match self {
            Source::Group(_) => WriteAbility::AdminGroupMember,
            Source::Project(_) => WriteAbility::AdminProjectMember,
        }
    }

    /// Minimal access exists only on groups.
    fn valid_level(self, level: i32) -> bool {
        let levels: &[i32] = match self {
            Source::Group(_) => &[5, 10, 15, 20, 30, 40, 50],
            Source::Project(_) => &[10, 15, 20, 30, 40, 50],
        };
        levels.contains(&level)
    }

    /// 404 unless the caller may read the group or project.
    async fn readable(
        self,
        state: &AppState,
        req: &HttpRequest,
    ) -> Result<Option<Actor>, ApiError> {
        match self {
            Source::Group(id) => readable_group(state, req, id).await,
            Source::Project(id) => readable_project(state, req, id).await,
        }
    }
}

fn member_json(row: &tokio_postgres::Row, base: &url::Url) -> Value {
    let username: String = row.get("username");
    json!({
        "id": row.get::<_, i64>("id"),
        "username": username,
        "name": row.get::<_, String>("name"),
        "state": row.get::<_, String>("state"),
        "avatar_url": Value::Null,
        "web_url": format!("{}{username}", base.as_str()),
        "access_level": row.get::<_, i32>("access_level"),
        "created_at": ts(row, "created_at"),
        "expires_at": Value::Null,
    })
}

fn member_sql(source: Source) -> String {
    let (table, key) = source.table();
    format!(
        "SELECT u.id, u.username, u.name, u.state, m.access_level, m.created_at
         FROM {table} m JOIN users u ON u.id = m.user_id WHERE m.{key} = $1"
    )
}

async fn find_member(
    state: &AppState,
    source: Source,
    user_id: i64,
) -> Result<tokio_postgres::Row, ApiError> {
    let db = state.pool.get().await?;
    db.query_opt(
        &format!("{} AND m.user_id = $2", member_sql(source)),
        &[&source.id(), &user_id],
    )
    .await?
    .ok_or(ApiError::RecordNotFound)
}

#[derive(Debug, Deserialize)]
struct MemberListParams {
    page: Option<usize>,
    per_page: Option<usize>,
    /// Part of a username or name.
    query: Option<String>,
}

async fn list(
    state: &AppState,
    req: &HttpRequest,
    source: Source,
    q: MemberListParams,
) -> Result<HttpResponse, ApiError> {
    require_user(state, req, READ_SCOPES).await?;
    source.readable(state, req).await?;
    let db = state.pool.get().await?;
    let pattern = like_pattern(q.query.as_deref());
    let rows = db
        .query(
            &format!(
                "{} AND ($2::text IS NULL OR u.username ILIKE $2 OR u.name ILIKE $2) ORDER BY u.id",
                member_sql(source)
            ),
            &[&source.id(), &pattern],
        )
        .await?;
    let items = rows
        .iter()
        .map(|r| member_json(r, &state.config.external_url))
        .collect();
    let page = PageParams {
        page: q.page,
        per_page: q.per_page,
    };
    Ok(paged(req, page, items))
}

async fn show(
    state: &AppState,
    req: &HttpRequest,
    source: Source,
    user_id: i64,
) -> Result<HttpResponse, ApiError> {
    require_user(state, req, READ_SCOPES).await?;
    source.readable(state, req).await?;
    let row = find_member(state, source, user_id).await?;
    Ok(HttpResponse::Ok().json(member_json(&row, &state.config.external_url)))
}

/// 403 unless `me` may manage members here and give or take away `level`.
async fn require_manage(
    state: &AppState,
    me: &AuthenticatedUser,
    source: Source,
    level: i32,
) -> Result<(), ApiError> {
    require_write(state, me, source.admin_ability(), source.subject()).await?;
    let db = state.pool.get().await?;
    if state
        .policy
        .may_manage_role(&**db, Some(Actor::from(me)), source.subject(), level)
        .await?
    {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// 403 when taking `user_id`'s owner role away would leave a group without an
/// owner (direct or inherited).
async fn keep_an_owner(state: &AppState, source: Source, user_id: i64) -> Result<(), ApiError> {
    let Source::Group(group) = source else {
        return Ok(());
    };
    let db = state.pool.get().await?;
    let others: i64 = db
        .query_one(
            "WITH RECURSIVE anc(id, parent_id) AS (
                 SELECT id, parent_id FROM groups WHERE id = $1
                 UNION ALL
                 SELECT g.id, g.parent_id FROM groups g JOIN anc ON g.id = anc.parent_id
             )
             SELECT count(DISTINCT m.user_id) FROM group_members m JOIN anc ON anc.id = m.group_id
             WHERE m.access_level = $3 AND m.user_id <> $2",
            &[&group, &user_id, &access::OWNER],
        )
        .await?
        .get(0);
    if others == 0 {
        Err(ApiError::ForbiddenBecause(
            "A group must have at least one owner",
        ))
    } else {
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
struct NewMember {
    user_id: i64,
    access_level: i32,
}

async fn add(
    state: &AppState,
    req: &HttpRequest,
    source: Source,
    body: NewMember,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(state, req, WRITE_SCOPES).await?;
    source.readable(state, req).await?;
    require_manage(state, &me, source, body.access_level).await?;
    if !source.valid_level(body.access_level) {
        return Err(ApiError::BadRequest(
            "access_level does not have a valid value".into(),
        ));
    }
    let db = state.pool.get().await?;
    if db
        .query_opt("SELECT 1 FROM users WHERE id = $1", &[&body.user_id])
        .await?
        .is_none()
    {
        return Err(ApiError::NotFound("User"));
    }
    let (table, key) = source.table();
    let inserted = db
        .execute(
            &format!(
                "INSERT INTO {table} ({key}, user_id, access_level) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
            ),
            &[&source.id(), &body.user_id, &body.access_level],
        )
        .await
        .map_err(on_constraint(ApiError::NotFound("User")))?;
    if inserted == 0 {
        return Err(ApiError::Conflict("Member already exists".into()));
    }
    let row = find_member(state, source, body.user_id).await?;
    Ok(HttpResponse::Created().json(member_json(&row, &state.config.external_url)))
}

#[derive(Debug, Deserialize)]
struct MemberUpdate {
    access_level: i32,
}

async fn update(
    state: &AppState,
    req: &HttpRequest,
    source: Source,
    user_id: i64,
    body: MemberUpdate,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(state, req, WRITE_SCOPES).await?;
    source.readable(state, req).await?;
    let current: i32 = find_member(state, source, user_id)
        .await?
        .get("access_level");
    // Both the role taken away and the one given must be within the caller's reach.
    require_manage(state, &me, source, current).await?;
    require_manage(state, &me, source, body.access_level).await?;
    if !source.valid_level(body.access_level) {
        return Err(ApiError::BadRequest(
            "access_level does not have a valid value".into(),
        ));
    }
    if current == access::OWNER && body.access_level < access::OWNER {
        keep_an_owner(state, source, user_id).await?;
    }
    let (table, key) = source.table();
    let db = state.pool.get().await?;
    db.execute(
        &format!("UPDATE {table} SET access_level = $3 WHERE {key} = $1 AND user_id = $2"),
        &[&source.id(), &user_id, &body.access_level],
    )
    .await?;
    let row = find_member(state, source, user_id).await?;
    Ok(HttpResponse::Ok().json(member_json(&row, &state.config.external_url)))
}

async fn remove(
    state: &AppState,
    req: &HttpRequest,
    source: Source,
    user_id: i64,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(state, req, WRITE_SCOPES).await?;
    source.readable(state, req).await?;
    let current: i32 = find_member(state, source, user_id)
        .await?
        .get("access_level");
    // Leaving is always allowed (but for a group's last owner).
    if me.id != user_id {
        require_manage(state, &me, source, current).await?;
    }
    if current == access::OWNER {
        keep_an_owner(state, source, user_id).await?;
    }
    let (table, key) = source.table();
    let db = state.pool.get().await?;
    db.execute(
        &format!("DELETE FROM {table} WHERE {key} = $1 AND user_id = $2"),
        &[&source.id(), &user_id],
    )
    .await?;
    Ok(HttpResponse::NoContent().finish())
}

// ---- handlers -------------------------------------------------------------------

async fn list_group_members(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<MemberListParams>,
) -> Result<HttpResponse, ApiError> {
    list(
        &state,
        &req,
        Source::Group(path.into_inner()),
        q.into_inner(),
    )
    .await
}

async fn list_project_members(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    q: web::Query<MemberListParams>,
) -> Result<HttpResponse, ApiError> {
    list(
        &state,
        &req,
        Source::Project(path.into_inner()),
        q.into_inner(),
    )
    .await
}

async fn show_group_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    show(&state, &req, Source::Group(id), user_id).await
}

async fn show_project_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    show(&state, &req, Source::Project(id), user_id).await
}

async fn add_group_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<NewMember>,
) -> Result<HttpResponse, ApiError> {
    add(
        &state,
        &req,
        Source::Group(path.into_inner()),
        body.into_inner(),
    )
    .await
}

async fn add_project_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<NewMember>,
) -> Result<HttpResponse, ApiError> {
    add(
        &state,
        &req,
        Source::Project(path.into_inner()),
        body.into_inner(),
    )
    .await
}

async fn update_group_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
    body: web::Json<MemberUpdate>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    update(&state, &req, Source::Group(id), user_id, body.into_inner()).await
}

async fn update_project_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
    body: web::Json<MemberUpdate>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    update(
        &state,
        &req,
        Source::Project(id),
        user_id,
        body.into_inner(),
    )
    .await
}

async fn remove_group_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    remove(&state, &req, Source::Group(id), user_id).await
}

async fn remove_project_member(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> Result<HttpResponse, ApiError> {
    let (id, user_id) = path.into_inner();
    remove(&state, &req, Source::Project(id), user_id).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_access_is_for_groups_only() {
        assert!(Source::Group(1).valid_level(5));
        assert!(!Source::Project(1).valid_level(5));
        assert!(Source::Project(1).valid_level(50));
        assert!(!Source::Group(1).valid_level(60));
    }
}
