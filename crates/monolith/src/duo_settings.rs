//! What an instance administrator changes about Duo: the instance's Duo
//! settings (on or off, the AI gateway URL, experiment and beta features,
//! Duo Workflow's use of MCP servers and their allow-list), Duo
//! seats (who holds which add-on), the Duo switch of each group and project,
//! and which events start Duo's work in a project (its triggers).
//! Plain functions on a database client, shared by the REST API and the admin
//! pages; who may call them is the policy module's decision, made by the caller.
//!
//! Turning a Duo switch also brings the code index in line
//! ([`crate::code_index::switches`]): off drops what is indexed below the
//! switch, on indexes it again. `index_attempts` is the attempts of the
//! indexing jobs that queues (`DUO_CODE_INDEX_MAX_ATTEMPTS`).

use crate::queries::Queries;

use crate::namespaces::FULL_PATHS;
use crate::policy::DuoSwitchScope;
use crate::policy::add_ons::AddOn;

/// Longest AI gateway URL accepted.
pub const MAX_URL_CHARS: usize = 255;
/// Most rows a list returns (users, groups, projects).
pub const LIST_LIMIT: i64 = 500;
/// Seats an instance-wide purchase made on first assignment holds.
const DEFAULT_PURCHASE_SEATS: i32 = 100;

#[derive(Debug, thiserror::Error)]
pub enum DuoSettingsError {
    /// Bad input, with the sentence to show.
    #[error("{0}")]
    Invalid(String),
    #[error("No seats available")]
    NoSeatsLeft,
    #[error("User not found")]
    UnknownUser,
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("database error: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// Following the switch in the code index failed (the switch is saved).
    #[error("code index: {0}")]
    CodeIndex(#[from] crate::code_index::CodeIndexError),
}

/// The instance's Duo settings as an admin edits them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceDuoSettings {
    pub duo_features_enabled: bool,
    /// `None`: the configured `AI_GATEWAY_URL` applies.
    pub ai_gateway_url: Option<String>,
    /// GitLab's `instance_level_ai_beta_features_enabled`.
    pub experiment_features_enabled: bool,
    /// Duo Workflow may use MCP servers (where the top-level group allows it).
    pub duo_workflow_mcp_enabled: bool,
    /// The servers it may connect to: `*` or URL prefixes
    /// ([`crate::instance::checked_mcp_allowed_servers`]).
    pub duo_workflow_mcp_allowed_servers: Vec<String>,
}

pub async fn instance_settings(db: &impl Queries) -> Result<InstanceDuoSettings, DuoSettingsError> {
    let row = db
        .query_one(
            "SELECT duo_features_enabled, ai_gateway_url, instance_level_ai_beta_features_enabled,
                    duo_workflow_mcp_enabled, duo_workflow_mcp_allowed_servers
             FROM instance_settings",
            &[],
        )
        .await?;
    Ok(InstanceDuoSettings {
        duo_features_enabled: row.get(0),
        ai_gateway_url: row.get(1),
        experiment_features_enabled: row.get(2),
        duo_workflow_mcp_enabled: row.get(3),
        duo_workflow_mcp_allowed_servers: row.get(4),
    })
}

/// A gateway URL as stored: blank means unset; otherwise an http(s) URL with a
/// host, at most [`MAX_URL_CHARS`] characters.
pub fn checked_gateway_url(text: &str) -> Result<Option<String>, DuoSettingsError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if text.chars().count() > MAX_URL_CHARS {
        return Err(DuoSettingsError::Invalid(format!(
            "AI gateway URL is too long (maximum is {MAX_URL_CHARS} characters)"
        )));
    }
    match url::Url::parse(text) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
            Ok(Some(text.to_owned()))
        }
        _ => Err(DuoSettingsError::Invalid(
            "AI gateway URL must be an http(s) URL, such as https://aigw.example.com".into(),
        )),
    }
}

pub async fn update_instance_settings(
    db: &impl Queries,
    settings: &InstanceDuoSettings,
    index_attempts: i32,
) -> Result<(), DuoSettingsError> {
    let url = match &settings.ai_gateway_url {
        Some(u) => checked_gateway_url(u)?,
        None => None,
    };
    let servers =
        crate::instance::checked_mcp_allowed_servers(&settings.duo_workflow_mcp_allowed_servers)
            .map_err(|e| DuoSettingsError::Invalid(format!("Allowed MCP servers: {e}")))?;
    db.execute(
        "UPDATE instance_settings SET duo_features_enabled = $1, ai_gateway_url = $2,
            instance_level_ai_beta_features_enabled = $3, duo_workflow_mcp_enabled = $4,
            duo_workflow_mcp_allowed_servers = $5, updated_at = now()",
        &[
            &settings.duo_features_enabled,
            &url,
            &settings.experiment_features_enabled,
            &settings.duo_workflow_mcp_enabled,
            &servers,
        ],
    )
    .await?;
    follow_duo_switch(db, DuoSwitchScope::Instance, index_attempts).await
}

/// Brings the code index in line with the switches under `scope` (after
/// any write that may have turned one; harmless when none changed).
pub async fn follow_duo_switch(
    db: &impl Queries,
    scope: DuoSwitchScope,
    index_attempts: i32,
) -> Result<(), DuoSettingsError> {
    crate::code_index::switches::follow_duo_switch(db, scope, index_attempts).await?;
    Ok(())
}

// ---- seats ----------------------------------------------------------------------

/// A seat just assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatAssignment {
    pub add_on: AddOn,
    pub user_id: i64,
    pub purchase_id: i64,
}

/// Assigns the user a seat of `add_on` from the instance-wide purchase (made on
/// first use). Run it in a transaction: the purchase row is locked while its
/// seats are counted. Assigning a seat the user holds already is a no-op.
pub async fn assign_seat(
    db: &impl Queries,
    add_on: AddOn,
    user_id: i64,
) -> Result<SeatAssignment, DuoSettingsError> {
    let user = db
        .query_opt(
            "SELECT 1 FROM users WHERE id = $1 AND state = 'active' AND NOT service_account",
            &[&user_id],
        )
        .await?;
    if user.is_none() {
        return Err(DuoSettingsError::UnknownUser);
    }
    let purchase: i64 = match db
        .query_opt(
            "SELECT id FROM add_on_purchases WHERE add_on = $1 AND namespace_id IS NULL AND expires_on >= current_date
             ORDER BY id LIMIT 1 FOR UPDATE",
            &[&add_on.as_str()],
        )
        .await?
    {
        Some(r) => r.get(0),
        None => db
            .query_one(
                "INSERT INTO add_on_purchases (add_on, quantity, expires_on) VALUES ($1, $2, current_date + 365) RETURNING id",
                &[&add_on.as_str(), &DEFAULT_PURCHASE_SEATS],
            )
            .await?
            .get(0),
    };
    let row = db
        .query_one(
            "SELECT p.quantity,
                    (SELECT count(*) FROM add_on_seat_assignments WHERE purchase_id = p.id),
                    EXISTS (SELECT 1 FROM add_on_seat_assignments WHERE purchase_id = p.id AND user_id = $2)
             FROM add_on_purchases p WHERE p.id = $1",
            &[&purchase, &user_id],
        )
        .await?;
    let (quantity, used, holds): (i32, i64, bool) = (row.get(0), row.get(1), row.get(2));
    if !holds && used >= i64::from(quantity) {
        return Err(DuoSettingsError::NoSeatsLeft);
    }
    db.execute(
        "INSERT INTO add_on_seat_assignments (purchase_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&purchase, &user_id],
    )
    .await?;
    Ok(SeatAssignment {
        add_on,
        user_id,
        purchase_id: purchase,
    })
}

/// Takes every seat of `add_on` from the user; false when they held none.
pub async fn unassign_seat(
    db: &impl Queries,
    add_on: AddOn,
    user_id: i64,
) -> Result<bool, DuoSettingsError> {
    let removed = db
        .execute(
            "DELETE FROM add_on_seat_assignments a USING add_on_purchases p
             WHERE p.id = a.purchase_id AND p.add_on = $1 AND a.user_id = $2",
            &[&add_on.as_str(), &user_id],
        )
        .await?;
    Ok(removed > 0)
}

/// A user as the seats page lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatHolder {
    pub user_id: i64,
    pub username: String,
    pub name: String,
    pub admin: bool,
    /// Add-ons of which the user holds a seat valid today.
    pub add_ons: Vec<AddOn>,
}

/// Users the seats page lists at once.
pub const SEAT_PAGE_ROWS: usize = 100;
/// Longest search text taken.
pub const MAX_SEARCH_CHARS: usize = 100;

/// Active people (no service accounts), by username, with their valid seats:
/// the first [`SEAT_PAGE_ROWS`] whose username or name contains `search`
/// (any case), and whether there are more.
pub async fn seat_holders(
    db: &impl Queries,
    search: &str,
) -> Result<(Vec<SeatHolder>, bool), DuoSettingsError> {
    let search: String = search.trim().chars().take(MAX_SEARCH_CHARS).collect();
    let pattern = format!(
        "%{}%",
        search
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    let limit = i64::try_from(SEAT_PAGE_ROWS + 1).unwrap_or(i64::MAX);
    let rows = db
        .query(
            "SELECT u.id, u.username, u.name, u.admin,
                    coalesce(array_agg(DISTINCT p.add_on) FILTER (WHERE p.id IS NOT NULL), '{}')
             FROM users u
             LEFT JOIN add_on_seat_assignments a ON a.user_id = u.id
             LEFT JOIN add_on_purchases p ON p.id = a.purchase_id
                   AND p.started_on <= current_date AND p.expires_on >= current_date
             WHERE u.state = 'active' AND NOT u.service_account
               AND (u.username ILIKE $2 OR u.name ILIKE $2)
             GROUP BY u.id ORDER BY u.username LIMIT $1",
            &[&limit, &pattern],
        )
        .await?;
    let more = rows.len() > SEAT_PAGE_ROWS;
    let holders = rows
        .iter()
        .take(SEAT_PAGE_ROWS)
        .map(|r| SeatHolder {
            user_id: r.get(0),
            username: r.get(1),
            name: r.get(2),
            admin: r.get(3),
            add_ons: r
                .get::<_, Vec<String>>(4)
                .iter()
                .filter_map(|a| AddOn::parse(a))
                .collect(),
        })
        .collect();
    Ok((holders, more))
}

/// Seats of one add-on: bought (valid purchases) and assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeatCount {
    pub add_on: AddOn,
    pub purchased: i64,
    pub assigned: i64,
}

pub async fn seat_counts(db: &impl Queries) -> Result<Vec<SeatCount>, DuoSettingsError> {
    let mut out = Vec::new();
    for add_on in [AddOn::DuoPro, AddOn::DuoEnterprise] {
        let row = db
            .query_one(
                "SELECT coalesce(sum(p.quantity), 0)::bigint,
                        (SELECT count(*) FROM add_on_seat_assignments a JOIN add_on_purchases q ON q.id = a.purchase_id
                         WHERE q.add_on = $1 AND q.started_on <= current_date AND q.expires_on >= current_date)
                 FROM add_on_purchases p
                 WHERE p.add_on = $1 AND p.started_on <= current_date AND p.expires_on >= current_date",
                &[&add_on.as_str()],
            )
            .await?;
        out.push(SeatCount {
            add_on,
            purchased: row.get(0),
            assigned: row.get(1),
        });
    }
    Ok(out)
}

// ---- group and project switches -------------------------------------------------

/// A group's Duo switches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSwitch {
    pub id: i64,
    pub full_path: String,
    pub top_level: bool,
    pub duo_features_enabled: bool,
    /// Off here or on an ancestor means off for everything below.
    pub effective: bool,
    /// Only top-level groups carry it (as in GitLab).
    pub experiment_features_enabled: bool,
    /// Duo Workflow may use MCP servers here (top-level groups only).
    pub duo_workflow_mcp_enabled: bool,
}

/// A project's Duo switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectSwitch {
    pub id: i64,
    pub full_path: String,
    pub duo_features_enabled: bool,
    pub effective: bool,
}

pub async fn group_switches(db: &impl Queries) -> Result<Vec<GroupSwitch>, DuoSettingsError> {
    let rows = db
        .query(
            "WITH RECURSIVE chain(id, full_path, effective) AS (
                 SELECT id, path, duo_features_enabled FROM groups WHERE parent_id IS NULL
                 UNION ALL
                 SELECT g.id, c.full_path || '/' || g.path, c.effective AND g.duo_features_enabled
                 FROM groups g JOIN chain c ON g.parent_id = c.id
             )
             SELECT g.id, c.full_path, g.parent_id IS NULL, g.duo_features_enabled, c.effective,
                    g.experiment_and_beta_features, g.duo_workflow_mcp_enabled
             FROM groups g JOIN chain c ON c.id = g.id ORDER BY c.full_path LIMIT $1",
            &[&LIST_LIMIT],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| GroupSwitch {
            id: r.get(0),
            full_path: r.get(1),
            top_level: r.get(2),
            duo_features_enabled: r.get(3),
            effective: r.get(4),
            experiment_features_enabled: r.get(5),
            duo_workflow_mcp_enabled: r.get(6),
        })
        .collect())
}

pub async fn project_switches(db: &impl Queries) -> Result<Vec<ProjectSwitch>, DuoSettingsError> {
    let groups = group_switches(db).await?;
    let rows = db
        .query(
            &format!(
                "{FULL_PATHS} SELECT p.id, paths.full_path || '/' || p.path, p.duo_features_enabled, p.group_id
                 FROM projects p JOIN paths ON paths.id = p.group_id ORDER BY 2 LIMIT $1"
            ),
            &[&LIST_LIMIT],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let group: i64 = r.get(3);
            let own: bool = r.get(2);
            ProjectSwitch {
                id: r.get(0),
                full_path: r.get(1),
                duo_features_enabled: own,
                effective: own
                    && groups
                        .iter()
                        .find(|g| g.id == group)
                        .is_some_and(|g| g.effective),
            }
        })
        .collect())
}

/// Switches Duo features for a group (and so for everything below it).
pub async fn set_group_duo(
    db: &impl Queries,
    group_id: i64,
    enabled: bool,
    index_attempts: i32,
) -> Result<(), DuoSettingsError> {
    let n = db
        .execute(
            "UPDATE groups SET duo_features_enabled = $2 WHERE id = $1",
            &[&group_id, &enabled],
        )
        .await?;
    if n == 0 {
        return Err(DuoSettingsError::NotFound("Group"));
    }
    follow_duo_switch(db, DuoSwitchScope::Group(group_id), index_attempts).await
}

/// A switch only top-level groups have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopLevelGroupSwitch {
    /// Experiment and beta features.
    Experiments,
    /// Whether Duo Workflow may use MCP servers (GitLab's group AI setting
    /// `duo_workflow_mcp_enabled`).
    WorkflowMcp,
}

impl TopLevelGroupSwitch {
    fn column(self) -> &'static str {
        match self {
            Self::Experiments => "experiment_and_beta_features",
            Self::WorkflowMcp => "duo_workflow_mcp_enabled",
        }
    }

    fn only_top_level(self) -> &'static str {
        match self {
            Self::Experiments => "Experiment features can only be changed on a top-level group",
            Self::WorkflowMcp => {
                "MCP servers for Duo Workflow can only be allowed on a top-level group"
            }
        }
    }
}

/// Turns `switch` of a top-level group on or off.
pub async fn set_top_level_group_switch(
    db: &impl Queries,
    group_id: i64,
    switch: TopLevelGroupSwitch,
    enabled: bool,
) -> Result<(), DuoSettingsError> {
    if !is_top_level(db, group_id).await? {
        return Err(DuoSettingsError::Invalid(switch.only_top_level().into()));
    }
    // The column is one of two constants, never input.
    let sql = format!("UPDATE groups SET {} = $2 WHERE id = $1", switch.column());
    db.execute(&sql, &[&group_id, &enabled]).await?;
    Ok(())
}

/// Whether the group has no parent; an error when there is no such group.
async fn is_top_level(db: &impl Queries, group_id: i64) -> Result<bool, DuoSettingsError> {
    let row = db
        .query_opt("SELECT parent_id FROM groups WHERE id = $1", &[&group_id])
        .await?
        .ok_or(DuoSettingsError::NotFound("Group"))?;
    Ok(row.get::<_, Option<i64>>(0).is_none())
}

/// Switches Duo features for one project.
pub async fn set_project_duo(
    db: &impl Queries,
    project_id: i64,
    enabled: bool,
    index_attempts: i32,
) -> Result<(), DuoSettingsError> {
    let n = db
        .execute(
            "UPDATE projects SET duo_features_enabled = $2 WHERE id = $1",
            &[&project_id, &enabled],
        )
        .await?;
    if n == 0 {
        return Err(DuoSettingsError::NotFound("Project"));
    }
    follow_duo_switch(db, DuoSwitchScope::Project(project_id), index_attempts).await
}

/// A project's own choice for one Duo trigger event (`event` as
/// `project_duo_triggers` names it); an event without one follows its
/// default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectTrigger {
    pub event: String,
    pub enabled: bool,
}

/// The trigger events the project switched on or off itself.
pub async fn project_triggers(
    db: &impl Queries,
    project_id: i64,
) -> Result<Vec<ProjectTrigger>, DuoSettingsError> {
    Ok(db
        .query(
            "SELECT event, enabled FROM project_duo_triggers WHERE project_id = $1 ORDER BY event",
            &[&project_id],
        )
        .await?
        .iter()
        .map(|r| ProjectTrigger {
            event: r.get(0),
            enabled: r.get(1),
        })
        .collect())
}

/// Switches the trigger `event` (one the table takes: `reviewer_assigned`,
/// `mention`, `pipeline_failed`) for the project, as `by`.
pub async fn set_project_trigger(
    db: &impl Queries,
    project_id: i64,
    event: &str,
    enabled: bool,
    by: i64,
) -> Result<(), DuoSettingsError> {
    db.execute(
        "INSERT INTO project_duo_triggers (project_id, event, enabled, updated_by_id) VALUES ($1, $2, $3, $4)
         ON CONFLICT (project_id, event) DO UPDATE
         SET enabled = EXCLUDED.enabled, updated_by_id = EXCLUDED.updated_by_id, updated_at = now()",
        &[&project_id, &event, &enabled, &by],
    )
    .await
    .map_err(|e| {
        if e.code().is_some() {
            DuoSettingsError::Invalid(format!("{event} is not a trigger event"))
        } else {
            e.into()
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_urls_are_checked() {
        assert_eq!(checked_gateway_url("  ").unwrap(), None);
        assert_eq!(
            checked_gateway_url(" https://aigw.example.com/ ").unwrap(),
            Some("https://aigw.example.com/".into())
        );
        assert!(checked_gateway_url("ftp://aigw.example.com").is_err());
        assert!(checked_gateway_url("not a url").is_err());
        assert!(checked_gateway_url(&format!("https://{}.com", "a".repeat(300))).is_err());
    }
}
