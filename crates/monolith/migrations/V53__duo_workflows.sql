-- Duo Workflow: workflows, their checkpoints, checkpoint writes and events
-- (GitLab's duo_workflows_* tables), the ai_workflows OAuth tokens, the one-run
-- lease per workflow, service accounts for composite identity, and an audit
-- trail of who did what to a workflow.

-- Service accounts act for a human under composite identity.
ALTER TABLE users ADD COLUMN service_account boolean NOT NULL DEFAULT false;
-- The instance's Duo Workflow service account (remote flows run as it).
ALTER TABLE instance_settings
    ADD COLUMN duo_workflow_service_account_id bigint REFERENCES users(id) ON DELETE SET NULL;

-- Statuses: created 0, running 1, paused 2, finished 3, failed 4, stopped 5,
-- input_required 6, plan_approval_required 7, tool_call_approval_required 8.
-- Environments: ide 1, web 2, chat_partial 3, chat 4, ambient 5.
-- Privileges: read_write_files 1, read_only_gitlab 2, read_write_gitlab 3,
-- run_commands 4, use_git 5, run_mcp_tools 6, start_flows 7, read_only_files 8.
CREATE TABLE duo_workflows_workflows (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    project_id bigint REFERENCES projects(id) ON DELETE CASCADE,
    namespace_id bigint REFERENCES groups(id) ON DELETE CASCADE,
    service_account_id bigint REFERENCES users(id) ON DELETE SET NULL,
    goal text NOT NULL DEFAULT '' CHECK (length(goal) <= 16384),
    workflow_definition text NOT NULL DEFAULT 'software_development'
        CHECK (length(workflow_definition) BETWEEN 1 AND 255),
    status smallint NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 8),
    agent_privileges smallint[] NOT NULL DEFAULT '{1,2}',
    pre_approved_agent_privileges smallint[] NOT NULL DEFAULT '{1,2}',
    allow_agent_to_request_user boolean NOT NULL DEFAULT true,
    image text CHECK (length(image) <= 2048),
    environment smallint CHECK (environment BETWEEN 1 AND 5),
    summary text CHECK (length(summary) <= 1024),
    -- {tool_name: {call_args: [sha256 hex, ...]}}
    tool_call_approvals jsonb NOT NULL DEFAULT '{}'
        CHECK (octet_length(tool_call_approvals::text) <= 65536),
    -- The model of the session, without any API key (sticky across resumes).
    model_metadata_json text CHECK (length(model_metadata_json) <= 1024),
    -- [{Category, Content, ...}] given at creation.
    additional_context jsonb NOT NULL DEFAULT '[]'
        CHECK (octet_length(additional_context::text) <= 65536),
    issue_id bigint REFERENCES issues(id) ON DELETE SET NULL,
    merge_request_id bigint REFERENCES merge_requests(id) ON DELETE SET NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((project_id IS NULL) <> (namespace_id IS NULL)),
    CHECK (pre_approved_agent_privileges <@ agent_privileges),
    CHECK (agent_privileges <@ '{1,2,3,4,5,6,7,8}'::smallint[])
);
CREATE INDEX duo_workflows_workflows_user ON duo_workflows_workflows (user_id, id);
-- The stuck-workflow job scans active workflows by age.
CREATE INDEX duo_workflows_workflows_active ON duo_workflows_workflows (updated_at)
    WHERE status IN (0, 1);

CREATE TABLE duo_workflows_checkpoints (
    id bigserial PRIMARY KEY,
    workflow_id bigint NOT NULL REFERENCES duo_workflows_workflows(id) ON DELETE CASCADE,
    project_id bigint REFERENCES projects(id) ON DELETE CASCADE,
    namespace_id bigint REFERENCES groups(id) ON DELETE CASCADE,
    thread_ts text NOT NULL CHECK (length(thread_ts) BETWEEN 1 AND 255),
    parent_ts text CHECK (length(parent_ts) <= 255),
    -- LangGraph's namespace of nested subgraphs; '' is the flow's own lineage.
    checkpoint_ns text NOT NULL DEFAULT '' CHECK (length(checkpoint_ns) <= 4096),
    checkpoint jsonb NOT NULL,
    metadata jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workflow_id, thread_ts)
);
CREATE INDEX duo_workflows_checkpoints_newest
    ON duo_workflows_checkpoints (workflow_id, checkpoint_ns, id DESC);
CREATE INDEX duo_workflows_checkpoints_age ON duo_workflows_checkpoints (created_at);

CREATE TABLE duo_workflows_checkpoint_writes (
    id bigserial PRIMARY KEY,
    workflow_id bigint NOT NULL REFERENCES duo_workflows_workflows(id) ON DELETE CASCADE,
    project_id bigint REFERENCES projects(id) ON DELETE CASCADE,
    namespace_id bigint REFERENCES groups(id) ON DELETE CASCADE,
    thread_ts text NOT NULL CHECK (length(thread_ts) BETWEEN 1 AND 255),
    task text NOT NULL CHECK (length(task) BETWEEN 1 AND 255),
    idx integer NOT NULL,
    channel text NOT NULL CHECK (length(channel) BETWEEN 1 AND 255),
    write_type text NOT NULL CHECK (length(write_type) BETWEEN 1 AND 255),
    data text NOT NULL CHECK (length(data) <= 10000),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX duo_workflows_checkpoint_writes_thread
    ON duo_workflows_checkpoint_writes (workflow_id, thread_ts);
CREATE INDEX duo_workflows_checkpoint_writes_age ON duo_workflows_checkpoint_writes (created_at);

-- Event types: pause 0, resume 1, stop 2, message 3, response 4, require_input 5.
-- Event statuses: queued 0, delivered 1.
CREATE TABLE duo_workflows_events (
    id bigserial PRIMARY KEY,
    workflow_id bigint NOT NULL REFERENCES duo_workflows_workflows(id) ON DELETE CASCADE,
    project_id bigint REFERENCES projects(id) ON DELETE CASCADE,
    namespace_id bigint REFERENCES groups(id) ON DELETE CASCADE,
    event_type smallint NOT NULL CHECK (event_type BETWEEN 0 AND 5),
    event_status smallint NOT NULL DEFAULT 0 CHECK (event_status IN (0, 1)),
    message text NOT NULL DEFAULT '' CHECK (length(message) <= 16384),
    correlation_id_value uuid UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX duo_workflows_events_queued ON duo_workflows_events (workflow_id, id)
    WHERE event_status = 0;

-- OAuth access tokens with the ai_workflows scope (minted per direct_access and
-- per executor socket). Only SHA-256 digests are stored. A composite token is
-- owned by a service account and acts for `on_behalf_of_user_id`.
CREATE TABLE oauth_access_tokens (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    on_behalf_of_user_id bigint REFERENCES users(id) ON DELETE CASCADE,
    token_digest bytea NOT NULL UNIQUE,
    scopes text[] NOT NULL,
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz,
    last_used_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX oauth_access_tokens_expiry ON oauth_access_tokens (expires_at);

-- One live run per workflow: a lease renewed by its holder while the run lasts.
CREATE TABLE duo_workflows_run_leases (
    workflow_id bigint PRIMARY KEY REFERENCES duo_workflows_workflows(id) ON DELETE CASCADE,
    holder uuid NOT NULL,
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);

-- Who did what to a workflow; composite identity records both the human and
-- the service account.
CREATE TABLE duo_workflows_audit_events (
    id bigserial PRIMARY KEY,
    workflow_id bigint REFERENCES duo_workflows_workflows(id) ON DELETE SET NULL,
    action text NOT NULL,
    user_id bigint REFERENCES users(id) ON DELETE SET NULL,
    service_account_id bigint REFERENCES users(id) ON DELETE SET NULL,
    details jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX duo_workflows_audit_events_workflow ON duo_workflows_audit_events (workflow_id, id);
