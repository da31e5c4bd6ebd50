//! Groups, projects and their members: the records (in [`groups`],
//! [`projects`], [`members`]) and finding a group or project by its full path
//! (`acme/platform/api`), as GitLab's references and its REST API's
//! URL-encoded ids name them. Paths compare case-insensitively, as GitLab's
//! routes do. Nothing here decides access: callers authorize with the policy
//! module before showing or changing anything.

pub mod groups;
pub mod members;
pub mod projects;

use crate::queries::Queries;

/// A `WITH` clause giving every group's `full_path` as `paths(id, full_path)`.
pub const FULL_PATHS: &str = "WITH RECURSIVE paths(id, full_path) AS (
        SELECT id, path FROM groups WHERE parent_id IS NULL
        UNION ALL
        SELECT g.id, p.full_path || '/' || g.path FROM groups g JOIN paths p ON g.parent_id = p.id
    )";

pub async fn group_id_by_full_path(
    db: &impl Queries,
    full_path: &str,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let sql = format!("{FULL_PATHS} SELECT id FROM paths WHERE lower(full_path) = lower($1)");
    Ok(db.query_opt(&sql, &[&full_path]).await?.map(|r| r.get(0)))
}

pub async fn project_id_by_full_path(
    db: &impl Queries,
    full_path: &str,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let sql = format!(
        "{FULL_PATHS} SELECT pr.id FROM projects pr JOIN paths ON paths.id = pr.group_id
         WHERE lower(paths.full_path || '/' || pr.path) = lower($1)"
    );
    Ok(db.query_opt(&sql, &[&full_path]).await?.map(|r| r.get(0)))
}
