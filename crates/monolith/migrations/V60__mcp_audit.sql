-- Every tool call of the MCP server: who, which tool, how it ended and how
-- long it took. Never the arguments or the answer.
CREATE TABLE mcp_tool_calls (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    token_id bigint NOT NULL,
    tool text NOT NULL,
    outcome text NOT NULL,
    duration_ms integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mcp_tool_calls_user ON mcp_tool_calls (user_id, id DESC);
