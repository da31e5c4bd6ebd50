//! Group records: what the groups API lists, creates and changes.

use chrono::{DateTime, Utc};

use crate::queries::Queries;

/// A group as the groups API shows one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub id: i64,
    pub name: String,
    pub path: String,
    pub description: String,
    pub visibility: String,
    pub parent_id: Option<i64>,
    pub duo_features_enabled: bool,
    /// GitLab's `experiment_features_enabled` (set on top-level groups).
    pub experiment_features_enabled: bool,
    /// GitLab's `ai_settings.duo_workflow_mcp_enabled` (set on top-level
    /// groups): Duo Workflow may use MCP servers in the group.
    pub duo_workflow_mcp_enabled: bool,
    pub created_at: DateTime<Utc>,
    /// `acme/platform`.
    pub full_path: String,
    /// Review instructions the group's merge request reviews apply (YAML;
    /// empty for none).
    pub duo_code_review_instructions: String,
}

const GROUP_SQL: &str = "WITH RECURSIVE chain(id, parent_id, full_path, root) AS (
        SELECT id, parent_id, path, id FROM groups WHERE parent_id IS NULL
        UNION ALL
        SELECT g.id, g.parent_id, c.full_path || '/' || g.path, c.root FROM groups g JOIN chain c ON g.parent_id = c.id
    )
    SELECT g.id, g.name, g.path, g.description, g.visibility, g.parent_id, g.duo_features_enabled,
           g.experiment_and_beta_features, g.duo_workflow_mcp_enabled, g.created_at, c.full_path,
           g.duo_code_review_instructions
    FROM groups g JOIN chain c ON c.id = g.id";

fn group_from_row(row: &tokio_postgres::Row) -> Group {
    Group {
        id: row.get("id"),
        name: row.get("name"),
        path: row.get("path"),
        description: row.get("description"),
        visibility: row.get("visibility"),
        parent_id: row.get("parent_id"),
        duo_features_enabled: row.get("duo_features_enabled"),
        experiment_features_enabled: row.get("experiment_and_beta_features"),
        duo_workflow_mcp_enabled: row.get("duo_workflow_mcp_enabled"),
        created_at: row.get("created_at"),
        full_path: row.get("full_path"),
        duo_code_review_instructions: row.get("duo_code_review_instructions"),
    }
}

/// One group's default review instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReviewInstructions {
    pub group_id: i64,
    /// `acme/platform`.
    pub full_path: String,
    /// YAML; never empty here.
    pub text: String,
}

/// The default review instructions of the project's group and its
/// ancestors that have some, from the top-level group down (the order a
/// review applies them in, before the project's own).
pub async fn review_instructions_above_project(
    db: &impl Queries,
    project_id: i64,
) -> Result<Vec<GroupReviewInstructions>, tokio_postgres::Error> {
    let sql = format!(
        "WITH RECURSIVE up(id, depth) AS (
             SELECT group_id, 0 FROM projects WHERE id = $1
             UNION ALL
             SELECT g.parent_id, up.depth + 1 FROM groups g JOIN up ON g.id = up.id WHERE g.parent_id IS NOT NULL
         ), found AS ({GROUP_SQL})
         SELECT f.id, f.full_path, f.duo_code_review_instructions FROM found f JOIN up ON up.id = f.id
         WHERE f.duo_code_review_instructions <> '' ORDER BY up.depth DESC"
    );
    Ok(db
        .query(&sql, &[&project_id])
        .await?
        .iter()
        .map(|r| GroupReviewInstructions {
            group_id: r.get(0),
            full_path: r.get(1),
            text: r.get(2),
        })
        .collect())
}

/// Every group, oldest first.
pub async fn list(db: &impl Queries) -> Result<Vec<Group>, tokio_postgres::Error> {
    let sql = format!("{GROUP_SQL} ORDER BY g.id");
    Ok(db
        .query(&sql, &[])
        .await?
        .iter()
        .map(group_from_row)
        .collect())
}

pub async fn by_id(db: &impl Queries, id: i64) -> Result<Option<Group>, tokio_postgres::Error> {
    let sql = format!("{GROUP_SQL} WHERE g.id = $1");
    Ok(db
        .query_opt(&sql, &[&id])
        .await?
        .as_ref()
        .map(group_from_row))
}

/// A group to create.
#[derive(Debug, Clone, Copy)]
pub struct NewGroup<'a> {
    pub name: &'a str,
    pub path: &'a str,
    pub parent_id: Option<i64>,
    pub visibility: &'a str,
    /// The GitLab.com plan of a root group (`free`, `premium`, `ultimate`).
    pub plan: &'a str,
    pub description: &'a str,
    pub duo_features_enabled: bool,
    pub experiment_features_enabled: bool,
}

/// What creating a group came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupCreation {
    Created(i64),
    /// Another group has the path.
    PathTaken,
    /// The database refused the row (no such parent group, say).
    Refused,
}

/// Creates the group with `owner` as its owner, in one transaction.
pub async fn create(
    client: &mut deadpool_postgres::Client,
    new: &NewGroup<'_>,
    owner: i64,
) -> Result<GroupCreation, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let inserted = tx
        .query_opt(
            "INSERT INTO groups (name, path, parent_id, visibility, plan, description, duo_features_enabled, experiment_and_beta_features)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING id",
            &[
                &new.name,
                &new.path,
                &new.parent_id,
                &new.visibility,
                &new.plan,
                &new.description,
                &new.duo_features_enabled,
                &new.experiment_features_enabled,
            ],
        )
        .await;
    let id: i64 = match inserted {
        Ok(Some(row)) => row.get(0),
        Ok(None) => return Ok(GroupCreation::PathTaken),
        Err(e) if e.code().is_some() => return Ok(GroupCreation::Refused),
        Err(e) => return Err(e),
    };
    tx.execute(
        "INSERT INTO group_members (group_id, user_id, access_level) VALUES ($1, $2, 50) ON CONFLICT DO NOTHING",
        &[&id, &owner],
    )
    .await?;
    tx.commit().await?;
    Ok(GroupCreation::Created(id))
}

/// The group's parent and the parent's visibility (both `None` for a
/// top-level group); an error when there is no such group.
pub async fn parent_and_its_visibility(
    db: &impl Queries,
    id: i64,
) -> Result<(Option<i64>, Option<String>), tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT g.parent_id, p.visibility FROM groups g LEFT JOIN groups p ON p.id = g.parent_id WHERE g.id = $1",
            &[&id],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The visibilities of the group's direct subgroups and projects (each once).
pub async fn child_visibilities(
    db: &impl Queries,
    id: i64,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT visibility FROM groups WHERE parent_id = $1
             UNION SELECT visibility FROM projects WHERE group_id = $1",
            &[&id],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// What an owner changes about a group; `None` keeps the value.
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupChanges<'a> {
    pub name: Option<&'a str>,
    pub path: Option<&'a str>,
    pub description: Option<&'a str>,
    pub visibility: Option<&'a str>,
    pub duo_features_enabled: Option<bool>,
    pub experiment_features_enabled: Option<bool>,
    pub duo_workflow_mcp_enabled: Option<bool>,
    /// Already parsed as review instructions.
    pub duo_code_review_instructions: Option<&'a str>,
}

/// Applies `changes`; a taken path fails with the database's constraint error.
pub async fn update(
    db: &impl Queries,
    id: i64,
    changes: &GroupChanges<'_>,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE groups SET name = coalesce($2, name), path = coalesce($3, path),
            description = coalesce($4, description), visibility = coalesce($5, visibility),
            duo_features_enabled = coalesce($6, duo_features_enabled),
            experiment_and_beta_features = coalesce($7, experiment_and_beta_features),
            duo_workflow_mcp_enabled = coalesce($8, duo_workflow_mcp_enabled),
            duo_code_review_instructions = coalesce($9, duo_code_review_instructions)
         WHERE id = $1",
        &[
            &id,
            &changes.name,
            &changes.path,
            &changes.description,
            &changes.visibility,
            &changes.duo_features_enabled,
            &changes.experiment_features_enabled,
            &changes.duo_workflow_mcp_enabled,
            &changes.duo_code_review_instructions,
        ],
    )
    .await?;
    Ok(())
}
