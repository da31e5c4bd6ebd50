//! Instance-wide settings (one row).

use deadpool_postgres::Pool;

use crate::config::Config;
use crate::db::DbError;

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
