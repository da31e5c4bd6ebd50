//! Instance-wide settings (one row): the realm and rate limit the deployment
//! decides, the settings an administrator edits, and the Duo Workflow service
//! account. Plain functions on a database client; who may call them is the
//! caller's policy check.

use deadpool_postgres::Pool;

use crate::config::Config;
use crate::db::DbError;
use crate::queries::Queries;

/// Makes the stored instance settings agree with the configuration: the realm is
/// decided by the deployment, not by an API call.
pub async fn apply_config(pool: &Pool, config: &Config) -> Result<(), DbError> {
    let client = pool.get().await?;
    client
        .execute(
            "UPDATE instance_settings SET realm = $1, ai_action_api_rate_limit = $2, updated_at = now()",
            &[&config.realm.as_str(), &(i32::try_from(config.ai_action_rate_limit).unwrap_or(i32::MAX))],
        )
        .await?;
    Ok(())
}

/// The instance settings an administrator reads and edits through
/// `/application/settings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSettings {
    pub realm: String,
    /// `free`, `premium` or `ultimate`.
    pub instance_tier: String,
    pub duo_features_enabled: bool,
    /// `None`: the configured `AI_GATEWAY_URL` applies.
    pub ai_gateway_url: Option<String>,
    pub ai_action_api_rate_limit: i32,
    pub duo_chat_expiration_days: i32,
    pub instance_level_ai_beta_features_enabled: bool,
    /// The admin's switch for Duo Workflow using MCP servers.
    pub duo_workflow_mcp_enabled: bool,
    /// The MCP servers Duo Workflow may connect to (see [`checked_mcp_allowed_servers`]).
    pub duo_workflow_mcp_allowed_servers: Vec<String>,
    /// Review instructions every merge request review applies first (the
    /// YAML of `.gitlab/duo/mr-review-instructions.yaml`; empty for none).
    pub duo_code_review_instructions: String,
}

/// The instance settings (the one row).
pub async fn settings(db: &impl Queries) -> Result<InstanceSettings, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT realm, instance_tier, duo_features_enabled, ai_gateway_url,
                    ai_action_api_rate_limit, duo_chat_expiration_days,
                    instance_level_ai_beta_features_enabled,
                    duo_workflow_mcp_enabled, duo_workflow_mcp_allowed_servers,
                    duo_code_review_instructions
             FROM instance_settings",
            &[],
        )
        .await?;
    Ok(InstanceSettings {
        realm: row.get(0),
        instance_tier: row.get(1),
        duo_features_enabled: row.get(2),
        ai_gateway_url: row.get(3),
        ai_action_api_rate_limit: row.get(4),
        duo_chat_expiration_days: row.get(5),
        instance_level_ai_beta_features_enabled: row.get(6),
        duo_workflow_mcp_enabled: row.get(7),
        duo_workflow_mcp_allowed_servers: row.get(8),
        duo_code_review_instructions: row.get(9),
    })
}

/// A change of the instance settings; `None` keeps a setting as it is. The
/// caller has checked the values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettingsChange {
    pub instance_tier: Option<String>,
    pub duo_features_enabled: Option<bool>,
    pub ai_gateway_url: Option<String>,
    pub duo_chat_expiration_days: Option<i32>,
    pub instance_level_ai_beta_features_enabled: Option<bool>,
    pub duo_workflow_mcp_enabled: Option<bool>,
    /// Already checked with [`checked_mcp_allowed_servers`].
    pub duo_workflow_mcp_allowed_servers: Option<Vec<String>>,
    /// Already parsed as review instructions.
    pub duo_code_review_instructions: Option<String>,
}

/// Applies `change` to the instance settings.
pub async fn update_settings(
    db: &impl Queries,
    change: &SettingsChange,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE instance_settings SET
           instance_tier = coalesce($1, instance_tier),
           duo_features_enabled = coalesce($2, duo_features_enabled),
           ai_gateway_url = coalesce($3, ai_gateway_url),
           duo_chat_expiration_days = coalesce($4, duo_chat_expiration_days),
           instance_level_ai_beta_features_enabled = coalesce($5, instance_level_ai_beta_features_enabled),
           duo_workflow_mcp_enabled = coalesce($6, duo_workflow_mcp_enabled),
           duo_workflow_mcp_allowed_servers = coalesce($7, duo_workflow_mcp_allowed_servers),
           duo_code_review_instructions = coalesce($8, duo_code_review_instructions),
           updated_at = now()",
        &[
            &change.instance_tier,
            &change.duo_features_enabled,
            &change.ai_gateway_url,
            &change.duo_chat_expiration_days,
            &change.instance_level_ai_beta_features_enabled,
            &change.duo_workflow_mcp_enabled,
            &change.duo_workflow_mcp_allowed_servers,
            &change.duo_code_review_instructions,
        ],
    )
    .await?;
    Ok(())
}

// ---- the MCP allow-list ------------------------------------------------------------

/// Most entries the MCP allow-list holds.
pub const MAX_MCP_ALLOWED_SERVERS: usize = 50;
/// Longest entry of the MCP allow-list, in characters.
pub const MAX_MCP_SERVER_CHARS: usize = 500;
/// The allow-list entry that lets Duo Workflow connect to any MCP server.
pub const ANY_MCP_SERVER: &str = "*";

/// Why an MCP allow-list was refused, to follow the setting's name
/// (`entry "ftp://x" must be …`, `has too many entries …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidMcpAllowList(pub String);

/// The MCP allow-list as stored: each entry trimmed, blank ones dropped,
/// duplicates dropped (first kept). Each must be `*` or an absolute http(s)
/// URL with a host, used as a prefix of the server URLs the executor may
/// connect to; it is stored as entered (not normalised), since the executor
/// compares prefixes of the URLs users write the same way.
pub fn checked_mcp_allowed_servers<S: AsRef<str>>(
    entries: &[S],
) -> Result<Vec<String>, InvalidMcpAllowList> {
    let mut out: Vec<String> = Vec::new();
    for entry in entries {
        let entry = entry.as_ref().trim();
        if entry.is_empty() || out.iter().any(|e| e == entry) {
            continue;
        }
        // Counted as it grows, so a huge list costs no more than a full one.
        if out.len() == MAX_MCP_ALLOWED_SERVERS {
            return Err(InvalidMcpAllowList(format!(
                "has too many entries (maximum is {MAX_MCP_ALLOWED_SERVERS})"
            )));
        }
        check_mcp_server_entry(entry)?;
        out.push(entry.to_owned());
    }
    Ok(out)
}

fn check_mcp_server_entry(entry: &str) -> Result<(), InvalidMcpAllowList> {
    // Shown back in the message: cut, so a huge entry makes no huge reply.
    let shown: String = entry.chars().take(80).collect();
    let invalid = |why: &str| Err(InvalidMcpAllowList(format!("entry {shown:?} {why}")));
    if entry.chars().count() > MAX_MCP_SERVER_CHARS {
        return invalid(&format!(
            "is too long (maximum is {MAX_MCP_SERVER_CHARS} characters)"
        ));
    }
    // NUL is a control character: it would cut the URL short in C code.
    if entry.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return invalid("must not contain spaces or control characters");
    }
    if entry == ANY_MCP_SERVER {
        return Ok(());
    }
    match url::Url::parse(entry) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        _ => invalid("must be * or an http(s) URL such as https://mcp.example.com/"),
    }
}

/// The service account remote workflows run as, as stored (whether it is
/// still an active service account is the workflows' question).
pub async fn workflow_service_account_id(
    db: &impl Queries,
) -> Result<Option<i64>, tokio_postgres::Error> {
    Ok(db
        .query_one(
            "SELECT duo_workflow_service_account_id FROM instance_settings",
            &[],
        )
        .await?
        .get(0))
}

/// Sets (or, with `None`, unsets) the service account remote workflows run
/// as; the caller has checked that it is one.
pub async fn set_workflow_service_account_id(
    db: &impl Queries,
    user_id: Option<i64>,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE instance_settings SET duo_workflow_service_account_id = $1, updated_at = now()",
        &[&user_id],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_allow_lists_are_trimmed_and_deduplicated() {
        let list = checked_mcp_allowed_servers(&[
            " https://mcp.example.com/ ",
            "",
            "http://127.0.0.1:8931/mcp",
            "https://mcp.example.com/",
            "*",
        ])
        .unwrap();
        assert_eq!(
            list,
            ["https://mcp.example.com/", "http://127.0.0.1:8931/mcp", "*"]
        );
        assert!(checked_mcp_allowed_servers::<&str>(&[]).unwrap().is_empty());
    }

    #[test]
    fn mcp_allow_list_entries_are_refused_with_a_reason() {
        for (entry, why) in [
            ("ftp://mcp.example.com", "http(s) URL"),
            ("mcp.example.com", "http(s) URL"),
            ("https://", "http(s) URL"),
            ("https://mcp.example.com/a b", "spaces"),
            ("https://mcp.example.com/\0", "control"),
            ("**", "http(s) URL"),
        ] {
            let e = checked_mcp_allowed_servers(&[entry]).unwrap_err();
            assert!(e.0.contains(why), "{entry:?}: {}", e.0);
        }
        let long = format!(
            "https://mcp.example.com/{}",
            "a".repeat(MAX_MCP_SERVER_CHARS)
        );
        assert!(
            checked_mcp_allowed_servers(&[long])
                .unwrap_err()
                .0
                .contains("too long")
        );
        let many: Vec<String> = (0..=MAX_MCP_ALLOWED_SERVERS)
            .map(|i| format!("https://mcp{i}.example.com/"))
            .collect();
        assert!(
            checked_mcp_allowed_servers(&many)
                .unwrap_err()
                .0
                .contains("too many")
        );
        assert_eq!(
            checked_mcp_allowed_servers(&many[..MAX_MCP_ALLOWED_SERVERS])
                .unwrap()
                .len(),
            MAX_MCP_ALLOWED_SERVERS
        );
    }
}
