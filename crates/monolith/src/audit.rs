//! The audit log of what agents did through the MCP server: one row per tool
//! call (who, which tool, the outcome, the time), never its content.

use crate::queries::Queries;

/// The kind of token a call came with: the table `token_id` points into
/// (the two number their ids apart, so the id alone is ambiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    PersonalAccessToken,
    OAuthAccessToken,
}

impl TokenKind {
    /// As the `token_kind` column stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::PersonalAccessToken => "personal_access_token",
            TokenKind::OAuthAccessToken => "oauth_access_token",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpToolCall {
    pub user_id: i64,
    pub token_id: i64,
    pub token_kind: TokenKind,
    pub tool: String,
    /// `ok`, `refused`, `timeout`, `invalid_arguments` or `error`.
    pub outcome: &'static str,
    pub duration_ms: i32,
}

pub async fn record_mcp_tool_call(
    db: &impl Queries,
    call: &McpToolCall,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "INSERT INTO mcp_tool_calls (user_id, token_id, token_kind, tool, outcome, duration_ms)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            &call.user_id,
            &call.token_id,
            &call.token_kind.as_str(),
            &call.tool,
            &call.outcome,
            &call.duration_ms,
        ],
    )
    .await?;
    Ok(())
}

/// Several calls in one statement, in their order.
pub async fn record_mcp_tool_calls(
    db: &impl Queries,
    calls: &[McpToolCall],
) -> Result<(), tokio_postgres::Error> {
    let column = |f: fn(&McpToolCall) -> i64| calls.iter().map(f).collect::<Vec<i64>>();
    let text = |f: fn(&McpToolCall) -> &str| calls.iter().map(f).collect::<Vec<&str>>();
    let users = column(|c| c.user_id);
    let tokens = column(|c| c.token_id);
    let kinds = text(|c| c.token_kind.as_str());
    let tools = text(|c| &c.tool);
    let outcomes = text(|c| c.outcome);
    let durations: Vec<i32> = calls.iter().map(|c| c.duration_ms).collect();
    db.execute(
        "INSERT INTO mcp_tool_calls (user_id, token_id, token_kind, tool, outcome, duration_ms)
         SELECT u, t, k, tool, o, d
         FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::int[])
              WITH ORDINALITY AS c (u, t, k, tool, o, d, n)
         ORDER BY n",
        &[&users, &tokens, &kinds, &tools, &outcomes, &durations],
    )
    .await?;
    Ok(())
}
