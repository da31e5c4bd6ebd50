-- Duo Workflow may use tools of MCP servers the user configured, when three
-- switches agree: the instance admin's (`duo_workflow_mcp_enabled`), the
-- instance allow-list of server URL prefixes (`*` for any server; empty: none)
-- and the top-level group's (GitLab keeps it in the group's AI settings).
-- The allow-list is checked on write (entry count, length, http(s) URLs) by
-- the application; the bounds here stop anything that slips past it.
ALTER TABLE instance_settings
    ADD COLUMN duo_workflow_mcp_enabled boolean NOT NULL DEFAULT false,
    ADD COLUMN duo_workflow_mcp_allowed_servers text[] NOT NULL DEFAULT '{}'
        CHECK (cardinality(duo_workflow_mcp_allowed_servers) <= 50);

ALTER TABLE groups
    ADD COLUMN duo_workflow_mcp_enabled boolean NOT NULL DEFAULT false;
