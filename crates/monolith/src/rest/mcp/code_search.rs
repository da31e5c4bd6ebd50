//! `semantic_code_search`: the project's code index searched by meaning, with
//! the same gate as chat's code search (the caller reads the code, Duo is on,
//! excluded files never appear).

use serde_json::Value;

use super::McpCaller;
use super::tools::{ToolError, ToolResult};
use crate::app_state::AppState;
use crate::code_index::CodeIndex;
use crate::code_index::chat_context::{Outcome, Searched, search_project};
use crate::gateway_client::{GatewayClient, GatewaySettings};

fn code_index(state: &AppState) -> Result<CodeIndex, ToolError> {
    let settings = GatewaySettings {
        base_url: state.config.ai_gateway_url.clone(),
        instance_id: state.config.instance_id.clone(),
        issuer: state.config.external_url.to_string(),
        audience: state.config.gateway_audience.clone(),
        timeout: state.config.ai_gateway_timeout,
        enabled_feature_flags: Vec::new(),
    };
    let gateway = GatewayClient::with_shared_keys(state.keys.clone(), settings)
        .map_err(|e| ToolError::Refused(format!("the AI gateway client could not start: {e}")))?;
    Ok(CodeIndex {
        pool: state.pool.clone(),
        repositories: state.repositories.clone(),
        gateway,
        settings: state.config.code_index.clone(),
        models: state.models.clone(),
        policy: state.policy.clone(),
    })
}

pub async fn search(
    state: &AppState,
    caller: &McpCaller,
    project: i64,
    directory: Option<String>,
    query: &str,
) -> ToolResult {
    if query.trim().is_empty() || query.contains('\0') {
        return Err(ToolError::Arguments("semantic_query is empty".into()));
    }
    // The REST floor first: a project the caller cannot read is "not found",
    // worded as everywhere else.
    super::super::containers::readable_project(state, caller, project).await?;
    let index = code_index(state)?;
    let searched = search_project(
        &index,
        &state.policy,
        caller.actor(),
        project,
        directory,
        query,
    )
    .await
    .map_err(|e| ToolError::Refused(format!("the code search failed: {e} ({})", e.code())))?;
    match searched {
        Searched::Text(text) | Searched::Other(Outcome::Answer(text)) => Ok(Value::String(text)),
        Searched::Other(Outcome::Refused(code, detail)) => {
            Err(ToolError::Refused(format!("{detail} ({code})")))
        }
        Searched::Other(Outcome::Ready(_)) => {
            Err(ToolError::Refused("the code search found nothing".into()))
        }
    }
}
