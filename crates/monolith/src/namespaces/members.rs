//! Direct members of groups and projects: who they are and the access level
//! each holds. The rules of who may change them are the policy's.

use chrono::{DateTime, Utc};

use crate::queries::Queries;

/// What members belong to: a group or a project, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Group(i64),
    Project(i64),
}

impl Source {
    fn id(self) -> i64 {
        match self {
            Source::Group(id) | Source::Project(id) => id,
        }
    }

    /// The table of the source's members and its key column.
    fn table(self) -> (&'static str, &'static str) {
        match self {
            Source::Group(_) => ("group_members", "group_id"),
            Source::Project(_) => ("project_members", "project_id"),
        }
    }

    fn member_sql(self) -> String {
        let (table, key) = self.table();
        format!(
            "SELECT u.id, u.username, u.name, u.state, m.access_level, m.created_at
             FROM {table} m JOIN users u ON u.id = m.user_id WHERE m.{key} = $1"
        )
    }
}

/// A member: the user and their access level here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: i64,
    pub username: String,
    pub name: String,
    pub state: String,
    pub access_level: i32,
    pub created_at: DateTime<Utc>,
}

fn member_from_row(row: &tokio_postgres::Row) -> Member {
    Member {
        id: row.get("id"),
        username: row.get("username"),
        name: row.get("name"),
        state: row.get("state"),
        access_level: row.get("access_level"),
        created_at: row.get("created_at"),
    }
}

/// The members whose username or name matches the `ILIKE` `pattern` (all
/// without one), by user id.
pub async fn list(
    db: &impl Queries,
    source: Source,
    pattern: Option<&str>,
) -> Result<Vec<Member>, tokio_postgres::Error> {
    let sql = format!(
        "{} AND ($2::text IS NULL OR u.username ILIKE $2 OR u.name ILIKE $2) ORDER BY u.id",
        source.member_sql()
    );
    Ok(db
        .query(&sql, &[&source.id(), &pattern])
        .await?
        .iter()
        .map(member_from_row)
        .collect())
}

/// User `user_id` as a direct member; `None` when they are not one.
pub async fn find(
    db: &impl Queries,
    source: Source,
    user_id: i64,
) -> Result<Option<Member>, tokio_postgres::Error> {
    let sql = format!("{} AND m.user_id = $2", source.member_sql());
    Ok(db
        .query_opt(&sql, &[&source.id(), &user_id])
        .await?
        .as_ref()
        .map(member_from_row))
}

/// Adds the user with `access_level`; false when they are a member already.
/// An unknown user fails with the database's constraint error.
pub async fn add(
    db: &impl Queries,
    source: Source,
    user_id: i64,
    access_level: i32,
) -> Result<bool, tokio_postgres::Error> {
    let (table, key) = source.table();
    let inserted = db
        .execute(
            &format!(
                "INSERT INTO {table} ({key}, user_id, access_level) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
            ),
            &[&source.id(), &user_id, &access_level],
        )
        .await?;
    Ok(inserted > 0)
}

pub async fn set_access_level(
    db: &impl Queries,
    source: Source,
    user_id: i64,
    access_level: i32,
) -> Result<(), tokio_postgres::Error> {
    let (table, key) = source.table();
    db.execute(
        &format!("UPDATE {table} SET access_level = $3 WHERE {key} = $1 AND user_id = $2"),
        &[&source.id(), &user_id, &access_level],
    )
    .await?;
    Ok(())
}

pub async fn remove(
    db: &impl Queries,
    source: Source,
    user_id: i64,
) -> Result<(), tokio_postgres::Error> {
    let (table, key) = source.table();
    db.execute(
        &format!("DELETE FROM {table} WHERE {key} = $1 AND user_id = $2"),
        &[&source.id(), &user_id],
    )
    .await?;
    Ok(())
}

/// How many users other than `user_id` hold `level` in the group, directly
/// or through an ancestor group.
pub async fn others_with_level_in_group(
    db: &impl Queries,
    group: i64,
    user_id: i64,
    level: i32,
) -> Result<i64, tokio_postgres::Error> {
    Ok(db
        .query_one(
            "WITH RECURSIVE anc(id, parent_id) AS (
                 SELECT id, parent_id FROM groups WHERE id = $1
                 UNION ALL
                 SELECT g.id, g.parent_id FROM groups g JOIN anc ON g.id = anc.parent_id
             )
             SELECT count(DISTINCT m.user_id) FROM group_members m JOIN anc ON anc.id = m.group_id
             WHERE m.access_level = $3 AND m.user_id <> $2",
            &[&group, &user_id, &level],
        )
        .await?
        .get(0))
}
