//! User records: what the users API lists, creates and changes, service
//! accounts, and the few facts other parts need about one user (the name a
//! commit is signed with, whether an account may still act). Who may see or
//! change a user is the policy's decision, made by the caller.

use chrono::{DateTime, Utc};

use crate::queries::Queries;

/// A user as the users API shows one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub name: String,
    pub email: String,
    pub admin: bool,
    /// `active`, `blocked` or `deactivated`.
    pub state: String,
    pub created_at: DateTime<Utc>,
    /// GitLab's user type: `human`, or an internal user such as the review
    /// bot (`duo_code_review_bot`).
    pub user_type: String,
}

impl User {
    /// An internal user (GitLab's `bot?`): never signs in, holds no tokens.
    pub fn bot(&self) -> bool {
        self.user_type != HUMAN
    }
}

/// The `user_type` of people.
const HUMAN: &str = "human";

const USER_COLUMNS: &str = "id, username, name, email, admin, state, created_at, user_type";

fn user_from_row(row: &tokio_postgres::Row) -> User {
    User {
        id: row.get("id"),
        username: row.get("username"),
        name: row.get("name"),
        email: row.get("email"),
        admin: row.get("admin"),
        state: row.get("state"),
        created_at: row.get("created_at"),
        user_type: row.get("user_type"),
    }
}

pub async fn by_id(db: &impl Queries, id: i64) -> Result<Option<User>, tokio_postgres::Error> {
    let sql = format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1");
    Ok(db
        .query_opt(&sql, &[&id])
        .await?
        .as_ref()
        .map(user_from_row))
}

pub async fn exists(db: &impl Queries, id: i64) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .query_opt("SELECT 1 FROM users WHERE id = $1", &[&id])
        .await?
        .is_some())
}

/// Those of `ids` that name no user, in the order given.
pub async fn missing(db: &impl Queries, ids: &[i64]) -> Result<Vec<i64>, tokio_postgres::Error> {
    let found: Vec<i64> = db
        .query("SELECT id FROM users WHERE id = ANY($1)", &[&ids])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(ids
        .iter()
        .copied()
        .filter(|id| !found.contains(id))
        .collect())
}

/// Whether user `id` is an internal user (the review bot); `None` for no
/// such user.
pub async fn is_internal(
    db: &impl Queries,
    id: i64,
) -> Result<Option<bool>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT user_type <> 'human' FROM users WHERE id = $1",
            &[&id],
        )
        .await?
        .map(|r| r.get(0)))
}

/// The review bot (GitLab's internal `GitLabDuo`), as items show it.
pub async fn review_bot(db: &impl Queries) -> Result<Option<User>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {USER_COLUMNS} FROM users WHERE user_type = 'duo_code_review_bot' ORDER BY id LIMIT 1"
    );
    Ok(db.query_opt(&sql, &[]).await?.as_ref().map(user_from_row))
}

/// Which users a list shows; every field left `None` lets all through.
#[derive(Debug, Clone, Copy, Default)]
pub struct UserFilter<'a> {
    /// Exact username, any case.
    pub username: Option<&'a str>,
    /// An `ILIKE` pattern matched against username and name.
    pub pattern: Option<&'a str>,
    /// Whether `pattern` also matches email addresses.
    pub pattern_matches_email: bool,
    pub state: Option<&'a str>,
}

/// Users matching `filter`, newest first.
pub async fn list(
    db: &impl Queries,
    filter: &UserFilter<'_>,
) -> Result<Vec<User>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {USER_COLUMNS} FROM users
         WHERE ($1::text IS NULL OR lower(username) = lower($1))
           AND ($2::text IS NULL OR username ILIKE $2 OR name ILIKE $2 OR ($3 AND email ILIKE $2))
           AND ($4::text IS NULL OR state = $4)
         ORDER BY id DESC"
    );
    let rows = db
        .query(
            &sql,
            &[
                &filter.username,
                &filter.pattern,
                &filter.pattern_matches_email,
                &filter.state,
            ],
        )
        .await?;
    Ok(rows.iter().map(user_from_row).collect())
}

/// A user to create.
#[derive(Debug, Clone, Copy)]
pub struct NewUser<'a> {
    pub username: &'a str,
    pub name: &'a str,
    pub email: &'a str,
    pub admin: bool,
}

/// Creates the user; `None` when the username or email is taken.
pub async fn create(
    db: &impl Queries,
    new: &NewUser<'_>,
) -> Result<Option<User>, tokio_postgres::Error> {
    let sql = format!(
        "INSERT INTO users (username, name, email, admin) VALUES ($1, $2, $3, $4)
         ON CONFLICT DO NOTHING RETURNING {USER_COLUMNS}"
    );
    Ok(db
        .query_opt(&sql, &[&new.username, &new.name, &new.email, &new.admin])
        .await?
        .as_ref()
        .map(user_from_row))
}

/// Whether a user other than `id` has this email address (any case).
pub async fn email_taken_by_other(
    db: &impl Queries,
    email: &str,
    id: i64,
) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM users WHERE lower(email) = lower($1) AND id <> $2",
            &[&email, &id],
        )
        .await?
        .is_some())
}

/// Whether a user other than `id` has this username (any case).
pub async fn username_taken_by_other(
    db: &impl Queries,
    username: &str,
    id: i64,
) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM users WHERE lower(username) = lower($1) AND id <> $2",
            &[&username, &id],
        )
        .await?
        .is_some())
}

/// What an admin changes about a user; `None` keeps the value.
#[derive(Debug, Clone, Copy, Default)]
pub struct UserChanges<'a> {
    pub username: Option<&'a str>,
    pub name: Option<&'a str>,
    pub email: Option<&'a str>,
    pub admin: Option<bool>,
}

/// Applies `changes` to user `id` and returns the user as changed. A taken
/// username or email fails with the database's constraint error.
pub async fn update(
    db: &impl Queries,
    id: i64,
    changes: &UserChanges<'_>,
) -> Result<User, tokio_postgres::Error> {
    let sql = format!(
        "UPDATE users SET username = coalesce($2, username), name = coalesce($3, name),
            email = coalesce($4, email), admin = coalesce($5, admin)
         WHERE id = $1 RETURNING {USER_COLUMNS}"
    );
    let row = db
        .query_one(
            &sql,
            &[
                &id,
                &changes.username,
                &changes.name,
                &changes.email,
                &changes.admin,
            ],
        )
        .await?;
    Ok(user_from_row(&row))
}

/// The user's state (`active`, `blocked`, `deactivated`); `None` for no such user.
pub async fn state_of(db: &impl Queries, id: i64) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(db
        .query_opt("SELECT state FROM users WHERE id = $1", &[&id])
        .await?
        .map(|r| r.get(0)))
}

pub async fn set_state(
    db: &impl Queries,
    id: i64,
    new_state: &str,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE users SET state = $2 WHERE id = $1",
        &[&id, &new_state],
    )
    .await?;
    Ok(())
}

/// Stores a new password hash (see `passwords::hash`) for the person `id`;
/// `false` for an internal user, who keeps none.
pub async fn set_password(
    db: &impl Queries,
    id: i64,
    hashed: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .execute(
            "UPDATE users SET encrypted_password = $2 WHERE id = $1 AND user_type = 'human'",
            &[&id, &hashed],
        )
        .await?
        > 0)
}

/// The name and email address a commit by user `id` is signed with.
pub async fn name_and_email(
    db: &impl Queries,
    id: i64,
) -> Result<(String, String), tokio_postgres::Error> {
    let row = db
        .query_one("SELECT name, email FROM users WHERE id = $1", &[&id])
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// An account that may still act (its state is `active`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveUser {
    pub id: i64,
    pub admin: bool,
}

/// `id, admin` of user `$1` when the account is active (no row otherwise):
/// [`active`]'s statement, and a subquery where the user is read with other
/// facts in one statement.
macro_rules! active_user_sql {
    () => {
        "SELECT id, admin FROM users WHERE id = $1 AND state = 'active'"
    };
}
pub(crate) use active_user_sql;

/// User `id` when the account is active; `None` when it is not or is gone.
pub async fn active(
    db: &impl Queries,
    id: i64,
) -> Result<Option<ActiveUser>, tokio_postgres::Error> {
    Ok(db
        .query_opt(active_user_sql!(), &[&id])
        .await?
        .map(|r| ActiveUser {
            id: r.get(0),
            admin: r.get(1),
        }))
}

/// The id and stored password hash of the active person with this username
/// (given in lower case); `None` when there is none. Internal users (the
/// review bot) never sign in, whatever is stored for them.
pub async fn password_of_active(
    db: &impl Queries,
    username_lowercase: &str,
) -> Result<Option<(i64, Option<String>)>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT id, encrypted_password FROM users
             WHERE lower(username) = $1 AND state = 'active' AND user_type = 'human'",
            &[&username_lowercase],
        )
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

/// A service account as the API shows one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountUser {
    pub id: i64,
    pub username: String,
    pub name: String,
    pub email: String,
}

/// Creates a service account (a user that acts for humans and cannot sign
/// in); `None` when the username or email is taken.
pub async fn create_service_account(
    db: &impl Queries,
    username: &str,
    name: &str,
    email: &str,
) -> Result<Option<ServiceAccountUser>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "INSERT INTO users (username, name, email, service_account) VALUES ($1, $2, $3, true)
             ON CONFLICT DO NOTHING RETURNING id, username, name, email",
            &[&username, &name, &email],
        )
        .await?
        .map(|r| ServiceAccountUser {
            id: r.get(0),
            username: r.get(1),
            name: r.get(2),
            email: r.get(3),
        }))
}

/// Whether user `id` is a service account; `None` for no such user.
pub async fn is_service_account(
    db: &impl Queries,
    id: i64,
) -> Result<Option<bool>, tokio_postgres::Error> {
    Ok(db
        .query_opt("SELECT service_account FROM users WHERE id = $1", &[&id])
        .await?
        .map(|r| r.get(0)))
}
