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
}

/// The instance settings (the one row).
pub async fn settings(db: &impl Queries) -> Result<InstanceSettings, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT realm, instance_tier, duo_features_enabled, ai_gateway_url,
                    ai_action_api_rate_limit, duo_chat_expiration_days,
                    instance_level_ai_beta_features_enabled
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
           updated_at = now()",
        &[
            &change.instance_tier,
            &change.duo_features_enabled,
            &change.ai_gateway_url,
            &change.duo_chat_expiration_days,
            &change.instance_level_ai_beta_features_enabled,
        ],
    )
    .await?;
    Ok(())
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
