//! Users and their personal access tokens.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, NaiveDate, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, READ_SCOPES, WRITE_SCOPES, require_admin, require_user};
use crate::tokens;
use crate::web::AppState;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/user", web::get().to(current_user))
        .route("/users", web::post().to(create_user))
        .route("/users/{id}", web::get().to(show_user))
        .route(
            "/users/{id}/personal_access_tokens",
            web::post().to(create_token),
        )
        .route("/personal_access_tokens/self", web::get().to(token_self))
        .route(
            "/personal_access_tokens/{id}",
            web::delete().to(revoke_token),
        );
}

fn user_json(row: &tokio_postgres::Row, base: &url::Url, with_admin: bool) -> Value {
    let username: String = row.get("username");
    let created_at: DateTime<Utc> = row.get("created_at");
    let mut v = json!({
        "id": row.get::<_, i64>("id"),
        "username": username,
        "name": row.get::<_, String>("name"),
        "state": row.get::<_, String>("state"),
        "avatar_url": Value::Null,
        "web_url": format!("{}{}", base.as_str(), username),
        "created_at": created_at,
    });
    if with_admin && let Some(obj) = v.as_object_mut() {
        obj.insert("is_admin".into(), json!(row.get::<_, bool>("admin")));
        obj.insert("email".into(), json!(row.get::<_, String>("email")));
    }
    v
}

const USER_COLUMNS: &str = "id, username, name, email, admin, state, created_at";

async fn current_user(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut scopes: Vec<&'static str> = READ_SCOPES.to_vec();
    scopes.push("read_user");
    let me = require_user(&state, &req, &scopes).await?;
    let client = state.pool.get().await?;
    let row = client
        .query_one(
            &format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1"),
            &[&me.id],
        )
        .await?;
    Ok(HttpResponse::Ok().json(user_json(&row, &state.config.external_url, true)))
}

async fn show_user(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, READ_SCOPES).await?;
    let client = state.pool.get().await?;
    let row = client
        .query_opt(
            &format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1"),
            &[&path.into_inner()],
        )
        .await?
        .ok_or(ApiError::NotFound("User"))?;
    Ok(HttpResponse::Ok().json(user_json(&row, &state.config.external_url, me.admin)))
}

#[derive(Deserialize)]
struct NewUser {
    username: String,
    name: String,
    email: String,
    #[serde(default)]
    admin: bool,
}

async fn create_user(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<NewUser>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let body = body.into_inner();
    if body.username.trim().is_empty() || body.email.trim().is_empty() {
        return Err(ApiError::BadRequest(
            "username and email are required".into(),
        ));
    }
    let client = state.pool.get().await?;
    let row = client
        .query_opt(
            &format!(
                "INSERT INTO users (username, name, email, admin) VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING RETURNING {USER_COLUMNS}"
            ),
            &[&body.username, &body.name, &body.email, &body.admin],
        )
        .await?
        .ok_or_else(|| ApiError::Conflict("Username or email has already been taken".into()))?;
    Ok(HttpResponse::Created().json(user_json(&row, &state.config.external_url, true)))
}

#[derive(Deserialize)]
struct NewToken {
    name: String,
    scopes: Vec<String>,
    expires_at: Option<NaiveDate>,
}

fn token_json(row: &tokio_postgres::Row) -> Value {
    let expires_at: Option<NaiveDate> = row.get("expires_at");
    let revoked: bool = row.get("revoked");
    let active = !revoked && expires_at.is_none_or(|d| d > Utc::now().date_naive());
    json!({
        "id": row.get::<_, i64>("id"),
        "name": row.get::<_, String>("name"),
        "revoked": revoked,
        "created_at": row.get::<_, DateTime<Utc>>("created_at"),
        "scopes": row.get::<_, Vec<String>>("scopes"),
        "user_id": row.get::<_, i64>("user_id"),
        "last_used_at": row.get::<_, Option<DateTime<Utc>>>("last_used_at"),
        "active": active,
        "expires_at": expires_at,
    })
}

const TOKEN_COLUMNS: &str =
    "id, name, revoked, created_at, scopes, user_id, last_used_at, expires_at";

async fn create_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
    body: web::Json<NewToken>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&state, &req, WRITE_SCOPES).await?;
    let user_id = path.into_inner();
    let body = body.into_inner();
    let client = state.pool.get().await?;
    if client
        .query_opt("SELECT 1 FROM users WHERE id = $1", &[&user_id])
        .await?
        .is_none()
    {
        return Err(ApiError::NotFound("User"));
    }
    let created = tokens::create(
        &**client,
        user_id,
        &body.name,
        &body.scopes,
        body.expires_at,
    )
    .await?;
    let row = client
        .query_one(
            &format!("SELECT {TOKEN_COLUMNS} FROM personal_access_tokens WHERE id = $1"),
            &[&created.id],
        )
        .await?;
    let mut v = token_json(&row);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("token".into(), json!(created.token));
    }
    Ok(HttpResponse::Created().json(v))
}

async fn token_self(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    // Any valid token may describe itself.
    let me = require_user(&state, &req, tokens::KNOWN_SCOPES).await?;
    let client = state.pool.get().await?;
    let row = client
        .query_one(
            &format!("SELECT {TOKEN_COLUMNS} FROM personal_access_tokens WHERE id = $1"),
            &[&me.token_id],
        )
        .await?;
    Ok(HttpResponse::Ok().json(token_json(&row)))
}

async fn revoke_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let me = require_user(&state, &req, WRITE_SCOPES).await?;
    let token_id = path.into_inner();
    let client = state.pool.get().await?;
    let owner: Option<i64> = client
        .query_opt(
            "SELECT user_id FROM personal_access_tokens WHERE id = $1",
            &[&token_id],
        )
        .await?
        .map(|r| r.get(0));
    match owner {
        // Someone else's token is not found unless the caller is an admin.
        Some(owner) if owner == me.id || me.admin => {
            tokens::revoke(&**client, token_id).await?;
            Ok(HttpResponse::NoContent().finish())
        }
        _ => Err(ApiError::NotFound("Personal Access Token")),
    }
}
