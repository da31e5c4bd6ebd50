-- Which table `mcp_tool_calls.token_id` points into: personal access tokens
-- and OAuth access tokens number their ids apart, so an id alone names two
-- tokens. Rows written before this migration keep the default: the server
-- did not record the kind then.
ALTER TABLE mcp_tool_calls
    ADD COLUMN token_kind text NOT NULL DEFAULT 'personal_access_token'
        CHECK (token_kind IN ('personal_access_token', 'oauth_access_token'));
