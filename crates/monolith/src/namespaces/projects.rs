//! Project records: what the projects API lists, creates, changes and
//! deletes, and the facts other parts read about one project (its name,
//! default branch, full path). The repository on disk is the repositories
//! domain's; whoever creates or deletes a project handles both.

use chrono::{DateTime, Utc};

use crate::queries::Queries;

/// A project as the projects API shows one, with the state of its code index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    pub id: i64,
    pub name: String,
    pub path: String,
    pub description: String,
    pub visibility: String,
    pub group_id: i64,
    pub duo_features_enabled: bool,
    pub created_at: DateTime<Utc>,
    pub default_branch: String,
    pub duo_context_exclusion_rules: Vec<String>,
    /// `acme/platform/api`.
    pub full_path: String,
    /// `None` until the project was first indexed.
    pub code_index: Option<CodeIndexState>,
}

/// Where the code index of a project stands (`docs/code-search.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeIndexState {
    pub state: String,
    pub chunk_count: Option<i32>,
    pub indexed_commit: Option<String>,
    pub indexed_at: Option<DateTime<Utc>>,
    pub last_error_code: Option<String>,
}

const PROJECT_SQL: &str = "WITH RECURSIVE chain(id, full_path) AS (
        SELECT id, path FROM groups WHERE parent_id IS NULL
        UNION ALL
        SELECT g.id, c.full_path || '/' || g.path FROM groups g JOIN chain c ON g.parent_id = c.id
    )
    SELECT p.id, p.name, p.path, p.description, p.visibility, p.group_id, p.duo_features_enabled, p.created_at,
           p.default_branch, p.duo_context_exclusion_rules,
           s.state AS code_index_state, s.chunk_count AS code_index_chunks,
           s.indexed_commit AS code_index_commit, s.last_error_code AS code_index_error,
           s.indexed_at AS code_index_at,
           c.full_path || '/' || p.path AS full_path
    FROM projects p JOIN chain c ON c.id = p.group_id
    LEFT JOIN code_index_states s ON s.project_id = p.id";

fn project_from_row(row: &tokio_postgres::Row) -> Project {
    Project {
        id: row.get("id"),
        name: row.get("name"),
        path: row.get("path"),
        description: row.get("description"),
        visibility: row.get("visibility"),
        group_id: row.get("group_id"),
        duo_features_enabled: row.get("duo_features_enabled"),
        created_at: row.get("created_at"),
        default_branch: row.get("default_branch"),
        duo_context_exclusion_rules: row.get("duo_context_exclusion_rules"),
        full_path: row.get("full_path"),
        code_index: row
            .get::<_, Option<String>>("code_index_state")
            .map(|state| CodeIndexState {
                state,
                chunk_count: row.get("code_index_chunks"),
                indexed_commit: row.get("code_index_commit"),
                indexed_at: row.get("code_index_at"),
                last_error_code: row.get("code_index_error"),
            }),
    }
}

/// Every project, newest first.
pub async fn list(db: &impl Queries) -> Result<Vec<Project>, tokio_postgres::Error> {
    let sql = format!("{PROJECT_SQL} ORDER BY p.id DESC");
    Ok(db
        .query(&sql, &[])
        .await?
        .iter()
        .map(project_from_row)
        .collect())
}

pub async fn by_id(db: &impl Queries, id: i64) -> Result<Option<Project>, tokio_postgres::Error> {
    let sql = format!("{PROJECT_SQL} WHERE p.id = $1");
    Ok(db
        .query_opt(&sql, &[&id])
        .await?
        .as_ref()
        .map(project_from_row))
}

/// A project to create in group `group_id`.
#[derive(Debug, Clone, Copy)]
pub struct NewProject<'a> {
    pub group_id: i64,
    pub name: &'a str,
    pub path: &'a str,
    pub visibility: &'a str,
    pub description: &'a str,
    pub duo_features_enabled: bool,
}

/// Creates the project and returns its id; `None` when its path is taken in
/// the group.
pub async fn create(
    db: &impl Queries,
    new: &NewProject<'_>,
) -> Result<Option<i64>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "INSERT INTO projects (group_id, name, path, visibility, description, duo_features_enabled)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING id",
            &[
                &new.group_id,
                &new.name,
                &new.path,
                &new.visibility,
                &new.description,
                &new.duo_features_enabled,
            ],
        )
        .await?
        .map(|r| r.get(0)))
}

/// Deletes the project's records (what belongs to it goes with it).
pub async fn delete(db: &impl Queries, id: i64) -> Result<(), tokio_postgres::Error> {
    db.execute("DELETE FROM projects WHERE id = $1", &[&id])
        .await?;
    Ok(())
}

/// What changing a project's name or visibility is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameAndVisibility {
    pub name: String,
    pub visibility: String,
    /// The visibility of the project's group, which the project's may not exceed.
    pub group_visibility: String,
}

pub async fn name_and_visibility(
    db: &impl Queries,
    id: i64,
) -> Result<NameAndVisibility, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT p.name, p.visibility, g.visibility FROM projects p JOIN groups g ON g.id = p.group_id WHERE p.id = $1",
            &[&id],
        )
        .await?;
    Ok(NameAndVisibility {
        name: row.get(0),
        visibility: row.get(1),
        group_visibility: row.get(2),
    })
}

/// Replaces the project's Duo context exclusion rules.
pub async fn set_exclusion_rules(
    db: &impl Queries,
    id: i64,
    rules: &[String],
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE projects SET duo_context_exclusion_rules = $2 WHERE id = $1",
        &[&id, &rules],
    )
    .await?;
    Ok(())
}

/// What a maintainer changes about a project; `None` keeps the value.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProjectChanges<'a> {
    pub name: Option<&'a str>,
    pub description: Option<&'a str>,
    pub visibility: Option<&'a str>,
    pub duo_features_enabled: Option<bool>,
    /// The URL path: a rename moves nothing on disk (repositories are stored
    /// by id).
    pub path: Option<&'a str>,
}

/// Applies `changes`; false (and nothing changed) when the new path is taken
/// by another project of the group (any case).
pub async fn update(
    db: &impl Queries,
    id: i64,
    changes: &ProjectChanges<'_>,
) -> Result<bool, tokio_postgres::Error> {
    let updated = db
        .execute(
            "UPDATE projects SET name = coalesce($2, name), description = coalesce($3, description),
                visibility = coalesce($4, visibility), duo_features_enabled = coalesce($5, duo_features_enabled),
                path = coalesce($6, path)
             WHERE id = $1
               AND NOT EXISTS (SELECT 1 FROM projects o WHERE o.group_id = projects.group_id
                               AND o.id <> $1 AND lower(o.path) = lower($6))",
            &[
                &id,
                &changes.name,
                &changes.description,
                &changes.visibility,
                &changes.duo_features_enabled,
                &changes.path,
            ],
        )
        .await?;
    Ok(updated > 0)
}

/// The project's default branch; an error when there is no such project.
pub async fn default_branch(db: &impl Queries, id: i64) -> Result<String, tokio_postgres::Error> {
    Ok(db
        .query_one("SELECT default_branch FROM projects WHERE id = $1", &[&id])
        .await?
        .get(0))
}

/// The project's default branch; `None` when there is no such project.
pub async fn default_branch_if_any(
    db: &impl Queries,
    id: i64,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(db
        .query_opt("SELECT default_branch FROM projects WHERE id = $1", &[&id])
        .await?
        .map(|r| r.get(0)))
}

/// Whether pushes to the project's default branch take a maintainer.
pub async fn protects_default_branch(
    db: &impl Queries,
    id: i64,
) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .query_one(
            "SELECT protect_default_branch FROM projects WHERE id = $1",
            &[&id],
        )
        .await?
        .get(0))
}

/// The project's name; an error when there is no such project.
pub async fn name(db: &impl Queries, id: i64) -> Result<String, tokio_postgres::Error> {
    Ok(db
        .query_one("SELECT name FROM projects WHERE id = $1", &[&id])
        .await?
        .get(0))
}

/// `acme/platform/api`; an error when there is no such project.
pub async fn full_path(db: &impl Queries, id: i64) -> Result<String, tokio_postgres::Error> {
    let sql = format!(
        "{} SELECT paths.full_path || '/' || p.path FROM projects p JOIN paths ON paths.id = p.group_id WHERE p.id = $1",
        super::FULL_PATHS
    );
    Ok(db.query_one(&sql, &[&id]).await?.get(0))
}

/// The project's default branch and full path, in one round trip (what every
/// repository read needs); `None` when there is no such project.
pub async fn repository_facts(
    db: &impl Queries,
    id: i64,
) -> Result<Option<(String, String)>, tokio_postgres::Error> {
    let sql = format!(
        "{} SELECT p.default_branch, paths.full_path || '/' || p.path FROM projects p JOIN paths ON paths.id = p.group_id WHERE p.id = $1",
        super::FULL_PATHS
    );
    Ok(db
        .query_opt(&sql, &[&id])
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

/// What a page about the project's code shows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeFacts {
    pub name: String,
    pub description: String,
    pub default_branch: String,
}

/// An error when there is no such project.
pub async fn code_facts(db: &impl Queries, id: i64) -> Result<CodeFacts, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT name, description, default_branch FROM projects WHERE id = $1",
            &[&id],
        )
        .await?;
    Ok(CodeFacts {
        name: row.get(0),
        description: row.get(1),
        default_branch: row.get(2),
    })
}

/// [`CodeFacts`] with the project's full path; `None` when there is no such
/// project.
pub async fn code_facts_with_path(
    db: &impl Queries,
    id: i64,
) -> Result<Option<(CodeFacts, String)>, tokio_postgres::Error> {
    let sql = format!(
        "{} SELECT p.name, p.description, paths.full_path || '/' || p.path, p.default_branch
         FROM projects p JOIN paths ON paths.id = p.group_id WHERE p.id = $1",
        super::FULL_PATHS
    );
    Ok(db.query_opt(&sql, &[&id]).await?.map(|row| {
        (
            CodeFacts {
                name: row.get(0),
                description: row.get(1),
                default_branch: row.get(3),
            },
            row.get(2),
        )
    }))
}
