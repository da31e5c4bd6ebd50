//! Groups, projects and their members: the records (in [`groups`],
//! [`projects`], [`members`]) and finding a group or project by its full path
//! (`acme/platform/api`), as GitLab's references and its REST API's
//! URL-encoded ids name them, and the few facts about a project that lists
//! and pages show. Paths compare case-insensitively, as GitLab's routes do. Nothing here decides access: callers authorize with the policy
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

/// `acme/platform` for the group with this id.
pub async fn group_full_path(
    db: &impl Queries,
    group: i64,
) -> Result<Option<String>, tokio_postgres::Error> {
    let sql = format!("{FULL_PATHS} SELECT full_path FROM paths WHERE id = $1");
    Ok(db.query_opt(&sql, &[&group]).await?.map(|r| r.get(0)))
}

/// `acme/platform/api` for the project with this id.
pub async fn project_full_path(
    db: &impl Queries,
    project: i64,
) -> Result<Option<String>, tokio_postgres::Error> {
    let sql = format!(
        "{FULL_PATHS} SELECT paths.full_path || '/' || p.path FROM projects p JOIN paths ON paths.id = p.group_id
         WHERE p.id = $1"
    );
    Ok(db.query_opt(&sql, &[&project]).await?.map(|r| r.get(0)))
}

/// The group the project with this id lives in.
pub async fn group_of_project(
    db: &impl Queries,
    project: i64,
) -> Result<Option<i64>, tokio_postgres::Error> {
    Ok(db
        .query_opt("SELECT group_id FROM projects WHERE id = $1", &[&project])
        .await?
        .map(|r| r.get(0)))
}

/// A project as a list of projects shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectListing {
    pub id: i64,
    pub name: String,
    pub full_path: String,
    pub description: String,
}

/// Up to 500 projects, by full path.
pub async fn projects_by_full_path(
    db: &impl Queries,
) -> Result<Vec<ProjectListing>, tokio_postgres::Error> {
    let rows = db
        .query(
            &format!(
                "{FULL_PATHS} SELECT p.id, p.name, paths.full_path || '/' || p.path, p.description
                 FROM projects p JOIN paths ON paths.id = p.group_id ORDER BY 3 LIMIT 500"
            ),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ProjectListing {
            id: r.get(0),
            name: r.get(1),
            full_path: r.get(2),
            description: r.get(3),
        })
        .collect())
}

/// What a project's page says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectSummary {
    pub name: String,
    pub description: String,
    pub visibility: String,
}

/// The summary of the project with this id (an error when there is none).
pub async fn project_summary(
    db: &impl Queries,
    project: i64,
) -> Result<ProjectSummary, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT name, description, visibility FROM projects WHERE id = $1",
            &[&project],
        )
        .await?;
    Ok(ProjectSummary {
        name: row.get(0),
        description: row.get(1),
        visibility: row.get(2),
    })
}
