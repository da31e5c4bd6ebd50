//! Users and their personal access tokens.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::NaiveDate;
use serde::Deserialize;
use serde_json::{Value, json};

use super::pagination::{PageParams, paged};
use super::param_values::like_pattern;
use super::{ApiError, READ_SCOPES, WRITE_SCOPES, require_admin, require_user};
use crate::app_state::AppState;
use crate::identity::passwords::{self, PasswordError};
use crate::identity::sessions;
use crate::identity::tokens::{self, AuthenticatedUser, TokenFilter, TokenRecord};
use crate::identity::users::{self, User, UserChanges, UserFilter};

/// Reading users also works with a `read_user` token, as in GitLab.
const USER_READ_SCOPES: &[&str] = &["api", "read_api", "read_user"];

fn user_json(user: &User, base: &url::Url, with_admin: bool) -> Value {
    let mut v = json!({
        "id": user.id,
        "username": user.username,
        "name": user.name,
        "state": user.state,
        "avatar_url": Value::Null,
        "web_url": format!("{}{}", base.as_str(), user.username),
        "created_at": user.created_at,
        "bot": user.bot(),
    });
    if with_admin && let Some(obj) = v.as_object_mut() {
        obj.insert("is_admin".into(), json!(user.admin));
        obj.insert("email".into(), json!(user.email));
    }
    v
}

pub(super) async fn current_user(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, USER_READ_SCOPES).await?;
    let client = state.pool.get().await?;
    let user = users::by_id(&*client, me.id)
        .await?
        .ok_or_else(|| ApiError::Internal("the token's user is gone".into()))?;
    Ok(HttpResponse::Ok().json(user_json(&user, &state.config.external_url, true)))
}

#[derive(Debug, Deserialize)]
pub(super) struct UserListParams {
    page: Option<usize>,
    per_page: Option<usize>,
    /// Exact username, case-insensitive.
    username: Option<String>,
    /// Part of a username or name (and, for admins, of an email address).
    search: Option<String>,
    #[serde(default)]
    active: bool,
    #[serde(default)]
    blocked: bool,
}

/// Everyone signed in may list users; only admins see `is_admin` and `email`
/// (and may search by email).
pub(super) async fn list_users(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<UserListParams>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, USER_READ_SCOPES).await?;
    let q = q.into_inner();
    let pattern = like_pattern(q.search.as_deref());
    let state_filter = match (q.active, q.blocked) {
        (true, true) => return Ok(paged_users(&req, &q, Vec::new())),
        (true, false) => Some("active"),
        (false, true) => Some("blocked"),
        (false, false) => None,
    };
    let client = state.pool.get().await?;
    let filter = UserFilter {
        username: q.username.as_deref(),
        pattern: pattern.as_deref(),
        pattern_matches_email: me.admin,
        state: state_filter,
    };
    let items = users::list(&*client, &filter)
        .await?
        .iter()
        .map(|u| user_json(u, &state.config.external_url, me.admin))
        .collect();
    Ok(paged_users(&req, &q, items))
}

fn paged_users(req: &HttpRequest, q: &UserListParams, items: Vec<Value>) -> HttpResponse {
    paged(req, PageParams::new(q.page, q.per_page), items)
}

pub(super) async fn show_user(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, USER_READ_SCOPES).await?;
    let client = state.pool.get().await?;
    let user = users::by_id(&*client, path.into_inner())
        .await?
        .ok_or(ApiError::NotFound("User"))?;
    Ok(HttpResponse::Ok().json(user_json(&user, &state.config.external_url, me.admin)))
}

#[derive(Deserialize)]
pub(super) struct NewUser {
    username: String,
    name: String,
    email: String,
    #[serde(default)]
    admin: bool,
}

pub(super) async fn create_user(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: super::params::Params<NewUser>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let body = body.into_inner();
    if body.username.trim().is_empty() || body.email.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "username and email are required".into(),
        ));
    }
    let client = state.pool.get().await?;
    let new = users::NewUser {
        username: &body.username,
        name: &body.name,
        email: &body.email,
        admin: body.admin,
    };
    let user = users::create(&*client, &new)
        .await?
        .ok_or_else(|| ApiError::Conflict("Username or email has already been taken".into()))?;
    Ok(HttpResponse::Created().json(user_json(&user, &state.config.external_url, true)))
}

#[derive(Debug, Deserialize)]
pub(super) struct UserUpdate {
    username: Option<String>,
    name: Option<String>,
    email: Option<String>,
    admin: Option<bool>,
    password: Option<String>,
}

/// Admins change a user's username, name, email, admin flag or password.
/// Internal users (the review bot) never get a password or admin rights.
pub(super) async fn update_user(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<UserUpdate>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let id = path.into_inner();
    let b = body.into_inner();
    for (field, value) in [
        ("username", &b.username),
        ("email", &b.email),
        ("name", &b.name),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(ApiError::BadRequest(format!("{field} is empty")));
        }
    }
    let client = state.pool.get().await?;
    let internal = users::is_internal(&*client, id)
        .await?
        .ok_or(ApiError::NotFound("User"))?;
    if internal && b.password.is_some() {
        return Err(ApiError::ForbiddenBecause(
            "An internal user cannot have a password",
        ));
    }
    if internal && b.admin == Some(true) {
        return Err(ApiError::ForbiddenBecause(
            "An internal user cannot be an administrator",
        ));
    }
    let hashed = match b.password.clone() {
        // Hashing takes tens of milliseconds of CPU: off the async workers.
        Some(password) => Some(
            web::block(move || passwords::hash(&password))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?
                .map_err(|e| match e {
                    PasswordError::Hash(detail) => ApiError::Internal(detail),
                    other => ApiError::invalid("password", other.to_string()),
                })?,
        ),
        None => None,
    };
    if let Some(email) = &b.email
        && users::email_taken_by_other(&*client, email, id).await?
    {
        return Err(ApiError::Conflict("Email has already been taken".into()));
    }
    if let Some(username) = &b.username
        && users::username_taken_by_other(&*client, username, id).await?
    {
        return Err(ApiError::Conflict("Username has already been taken".into()));
    }
    let changes = UserChanges {
        username: b.username.as_deref(),
        name: b.name.as_deref(),
        email: b.email.as_deref(),
        admin: b.admin,
    };
    let user = users::update(&*client, id, &changes).await.map_err(|e| {
        // A concurrent update took the name or address between check and write.
        if e.code().is_some() {
            ApiError::Conflict("Username or email has already been taken".into())
        } else {
            e.into()
        }
    })?;
    if let Some(hashed) = hashed {
        users::set_password(&*client, id, &hashed).await?;
        // A new password signs the user out everywhere.
        sessions::destroy_all_for_user(&*client, id).await?;
    }
    Ok(HttpResponse::Ok().json(user_json(&user, &state.config.external_url, true)))
}

async fn user_state(state: &AppState, id: i64) -> Result<String, ApiError> {
    let client = state.pool.get().await?;
    users::state_of(&*client, id)
        .await?
        .ok_or(ApiError::NotFound("User"))
}

/// Blocks a user (admins only): their tokens then answer 403. GitLab answers 201
/// with `true`, also for an already blocked user.
pub(super) async fn block_user(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let me = require_admin(&state, &req, WRITE_SCOPES).await?;
    let id = path.into_inner();
    user_state(&state, id).await?;
    if internal(&state, id).await? {
        return Err(ApiError::ForbiddenBecause(
            "An internal user cannot be blocked",
        ));
    }
    if id == me.id {
        return Err(ApiError::ForbiddenBecause(
            "The API initiating user cannot be blocked by the API",
        ));
    }
    set_state(&state, id, "blocked").await
}

/// Unblocks a blocked user (admins only); deactivated users stay deactivated.
pub(super) async fn unblock_user(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let id = path.into_inner();
    if user_state(&state, id).await? == "deactivated" {
        return Err(ApiError::ForbiddenBecause(
            "Deactivated users cannot be unblocked by the API",
        ));
    }
    set_state(&state, id, "active").await
}

/// Whether user `id` (who exists) is an internal user such as the review bot.
async fn internal(state: &AppState, id: i64) -> Result<bool, ApiError> {
    let client = state.pool.get().await?;
    Ok(users::is_internal(&*client, id).await?.unwrap_or(false))
}

async fn set_state(state: &AppState, id: i64, new_state: &str) -> Result<HttpResponse, ApiError> {
    let client = state.pool.get().await?;
    users::set_state(&*client, id, new_state).await?;
    Ok(HttpResponse::Created().json(true))
}

#[derive(Deserialize)]
pub(super) struct NewToken {
    name: String,
    scopes: Vec<String>,
    expires_at: Option<NaiveDate>,
}

fn token_json(token: &TokenRecord) -> Value {
    json!({
        "id": token.id,
        "name": token.name,
        "revoked": token.revoked,
        "created_at": token.created_at,
        "scopes": token.scopes,
        "user_id": token.user_id,
        "last_used_at": token.last_used_at,
        "active": token.active(),
        "expires_at": token.expires_at,
    })
}

/// The token's record, which a token just presented or created must have.
async fn existing_record(
    client: &impl crate::queries::Queries,
    id: i64,
) -> Result<TokenRecord, ApiError> {
    tokens::record(client, id)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("token {id} is gone")))
}

pub(super) async fn create_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: super::params::Params<NewToken>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let user_id = path.into_inner();
    let body = body.into_inner();
    let client = state.pool.get().await?;
    let internal = users::is_internal(&*client, user_id)
        .await?
        .ok_or(ApiError::NotFound("User"))?;
    if internal {
        return Err(ApiError::BadRequest(
            "An internal user (such as the GitLab Duo review bot) cannot have personal access tokens".into(),
        ));
    }
    let created =
        tokens::create(&*client, user_id, &body.name, &body.scopes, body.expires_at).await?;
    let mut v = token_json(&existing_record(&*client, created.id).await?);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("token".into(), json!(created.token));
    }
    Ok(HttpResponse::Created().json(v))
}

pub(super) async fn token_self(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    // Any valid token may describe itself.
    let me = require_user(&state, &req, tokens::KNOWN_SCOPES).await?;
    let client = state.pool.get().await?;
    Ok(HttpResponse::Ok().json(token_json(&existing_record(&*client, me.token_id).await?)))
}

#[derive(Debug, Deserialize)]
pub(super) struct TokenListParams {
    page: Option<usize>,
    per_page: Option<usize>,
    /// Admins only; ignored for everyone else, who always see their own.
    user_id: Option<i64>,
    revoked: Option<bool>,
    /// `active` or `inactive`.
    state: Option<String>,
    /// Part of the token's name.
    search: Option<String>,
}

/// The caller's own tokens; admins see every user's (or one user's with `user_id`).
pub(super) async fn list_tokens(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<TokenListParams>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, READ_SCOPES).await?;
    let q = q.into_inner();
    let owner = if me.admin { q.user_id } else { Some(me.id) };
    let active = match q.state.as_deref() {
        None => None,
        Some("active") => Some(true),
        Some("inactive") => Some(false),
        Some(_) => {
            return Err(ApiError::BadRequest(
                "state does not have a valid value".into(),
            ));
        }
    };
    let pattern = like_pattern(q.search.as_deref());
    let client = state.pool.get().await?;
    let filter = TokenFilter {
        owner,
        revoked: q.revoked,
        active,
        name_pattern: pattern.as_deref(),
    };
    let items = tokens::records(&*client, &filter)
        .await?
        .iter()
        .map(token_json)
        .collect();
    Ok(paged(&req, PageParams::new(q.page, q.per_page), items))
}

/// One token: its owner and admins see it. Others get 401 whether or not it
/// exists, so ids cannot be probed (GitLab's answer).
pub(super) async fn show_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, READ_SCOPES).await?;
    let client = state.pool.get().await?;
    match tokens::record(&*client, path.into_inner()).await? {
        Some(token) if me.admin || token.user_id == me.id => {
            Ok(HttpResponse::Ok().json(token_json(&token)))
        }
        None if me.admin => Err(ApiError::NotFound("Personal Access Token")),
        _ => Err(ApiError::Unauthorized),
    }
}

/// Revokes the token the request is made with.
pub(super) async fn revoke_token_self(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let me: AuthenticatedUser = require_user(&state, &req, tokens::KNOWN_SCOPES).await?;
    let client = state.pool.get().await?;
    tokens::revoke(&*client, me.token_id).await?;
    Ok(HttpResponse::NoContent().finish())
}

pub(super) async fn revoke_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let token_id = path.into_inner();
    let client = state.pool.get().await?;
    match tokens::owner_of(&*client, token_id).await? {
        // Someone else's token is not found unless the caller is an admin.
        Some(owner) if owner == me.id || me.admin => {
            tokens::revoke(&*client, token_id).await?;
            Ok(HttpResponse::NoContent().finish())
        }
        _ => Err(ApiError::NotFound("Personal Access Token")),
    }
}
