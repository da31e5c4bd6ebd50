-- Core schema of the monolith. GitLab's access levels: guest 10, planner 15,
-- reporter 20, developer 30, maintainer 40, owner 50.

CREATE TABLE instance_settings (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    realm text NOT NULL DEFAULT 'self-managed' CHECK (realm IN ('saas', 'self-managed')),
    instance_tier text NOT NULL DEFAULT 'free' CHECK (instance_tier IN ('free', 'premium', 'ultimate')),
    duo_features_enabled boolean NOT NULL DEFAULT true,
    ai_gateway_url text,
    ai_action_api_rate_limit integer NOT NULL DEFAULT 160,
    duo_chat_expiration_days integer NOT NULL DEFAULT 30,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO instance_settings DEFAULT VALUES;

CREATE TABLE users (
    id bigserial PRIMARY KEY,
    username text NOT NULL UNIQUE,
    name text NOT NULL,
    email text NOT NULL UNIQUE,
    admin boolean NOT NULL DEFAULT false,
    state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'blocked', 'deactivated')),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE personal_access_tokens (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name text NOT NULL,
    -- SHA-256 of the token; the token itself is shown once and never stored.
    token_digest bytea NOT NULL UNIQUE,
    scopes text[] NOT NULL,
    expires_at date,
    revoked boolean NOT NULL DEFAULT false,
    last_used_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX personal_access_tokens_user ON personal_access_tokens (user_id);

CREATE TABLE groups (
    id bigserial PRIMARY KEY,
    parent_id bigint REFERENCES groups(id) ON DELETE CASCADE,
    name text NOT NULL,
    path text NOT NULL,
    description text NOT NULL DEFAULT '',
    visibility text NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'internal', 'public')),
    -- Only meaningful on root groups (GitLab.com plans are bought per root namespace).
    plan text NOT NULL DEFAULT 'free' CHECK (plan IN ('free', 'premium', 'ultimate')),
    duo_features_enabled boolean NOT NULL DEFAULT true,
    experiment_and_beta_features boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX groups_path_in_parent ON groups (coalesce(parent_id, 0), path);

CREATE TABLE projects (
    id bigserial PRIMARY KEY,
    group_id bigint NOT NULL REFERENCES groups(id) ON DELETE CASCADE,
    name text NOT NULL,
    path text NOT NULL,
    description text NOT NULL DEFAULT '',
    visibility text NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'internal', 'public')),
    duo_features_enabled boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (group_id, path)
);

CREATE TABLE group_members (
    group_id bigint NOT NULL REFERENCES groups(id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    access_level integer NOT NULL CHECK (access_level IN (5, 10, 15, 20, 30, 40, 50)),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, user_id)
);
CREATE INDEX group_members_user ON group_members (user_id);

CREATE TABLE project_members (
    project_id bigint NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    access_level integer NOT NULL CHECK (access_level IN (5, 10, 15, 20, 30, 40, 50)),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, user_id)
);
CREATE INDEX project_members_user ON project_members (user_id);

CREATE TABLE issues (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    iid integer NOT NULL,
    title text NOT NULL,
    description text NOT NULL DEFAULT '',
    author_id bigint NOT NULL REFERENCES users(id),
    confidential boolean NOT NULL DEFAULT false,
    state text NOT NULL DEFAULT 'opened' CHECK (state IN ('opened', 'closed')),
    labels text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, iid)
);

CREATE TABLE issue_assignees (
    issue_id bigint NOT NULL REFERENCES issues(id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    PRIMARY KEY (issue_id, user_id)
);

CREATE TABLE epics (
    id bigserial PRIMARY KEY,
    group_id bigint NOT NULL REFERENCES groups(id) ON DELETE CASCADE,
    iid integer NOT NULL,
    title text NOT NULL,
    description text NOT NULL DEFAULT '',
    author_id bigint NOT NULL REFERENCES users(id),
    confidential boolean NOT NULL DEFAULT false,
    state text NOT NULL DEFAULT 'opened' CHECK (state IN ('opened', 'closed')),
    labels text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (group_id, iid)
);

CREATE TABLE merge_requests (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    iid integer NOT NULL,
    title text NOT NULL,
    description text NOT NULL DEFAULT '',
    author_id bigint NOT NULL REFERENCES users(id),
    state text NOT NULL DEFAULT 'opened' CHECK (state IN ('opened', 'closed', 'merged', 'locked')),
    source_branch text NOT NULL,
    target_branch text NOT NULL DEFAULT 'main',
    diff text NOT NULL DEFAULT '',
    labels text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, iid)
);

CREATE TABLE ci_pipelines (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    ref text NOT NULL,
    sha text NOT NULL,
    status text NOT NULL CHECK (status IN ('created', 'pending', 'running', 'success', 'failed', 'canceled', 'skipped', 'manual')),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ci_builds (
    id bigserial PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    pipeline_id bigint NOT NULL REFERENCES ci_pipelines(id) ON DELETE CASCADE,
    name text NOT NULL,
    stage text NOT NULL,
    status text NOT NULL CHECK (status IN ('created', 'pending', 'running', 'success', 'failed', 'canceled', 'skipped', 'manual')),
    log text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);

CREATE TABLE notes (
    id bigserial PRIMARY KEY,
    noteable_type text NOT NULL CHECK (noteable_type IN ('Issue', 'Epic', 'MergeRequest')),
    noteable_id bigint NOT NULL,
    author_id bigint NOT NULL REFERENCES users(id),
    body text NOT NULL,
    -- GitLab's internal notes: visible to reporters and above only.
    internal boolean NOT NULL DEFAULT false,
    system boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notes_noteable ON notes (noteable_type, noteable_id);

CREATE TABLE add_on_purchases (
    id bigserial PRIMARY KEY,
    add_on text NOT NULL CHECK (add_on IN ('duo_pro', 'duo_enterprise')),
    -- NULL on self-managed instances (bought for the whole instance); the root
    -- group on GitLab.com.
    namespace_id bigint REFERENCES groups(id) ON DELETE CASCADE,
    quantity integer NOT NULL CHECK (quantity >= 0),
    started_on date NOT NULL DEFAULT current_date,
    expires_on date NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE add_on_seat_assignments (
    purchase_id bigint NOT NULL REFERENCES add_on_purchases(id) ON DELETE CASCADE,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (purchase_id, user_id)
);
CREATE INDEX add_on_seat_assignments_user ON add_on_seat_assignments (user_id);

-- Conversation types as GitLab numbers them: duo_chat_legacy 1, duo_code_review 2,
-- duo_quick_chat 3, duo_chat 4.
CREATE TABLE ai_conversation_threads (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    conversation_type smallint NOT NULL CHECK (conversation_type BETWEEN 1 AND 4),
    created_at timestamptz NOT NULL DEFAULT now(),
    last_updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ai_conversation_threads_user ON ai_conversation_threads (user_id, conversation_type, last_updated_at);
CREATE INDEX ai_conversation_threads_idle ON ai_conversation_threads (last_updated_at);

-- Roles: user 1, assistant 2.
CREATE TABLE ai_conversation_messages (
    id bigserial PRIMARY KEY,
    thread_id bigint NOT NULL REFERENCES ai_conversation_threads(id) ON DELETE CASCADE,
    role smallint NOT NULL CHECK (role IN (1, 2)),
    content text NOT NULL,
    message_xid uuid NOT NULL UNIQUE,
    request_xid uuid,
    error_details jsonb,
    extras jsonb,
    has_feedback boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ai_conversation_messages_thread ON ai_conversation_messages (thread_id, id);

-- One row per accepted rate-limited request; shared by every web replica.
CREATE TABLE rate_limit_events (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    action text NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rate_limit_events_lookup ON rate_limit_events (user_id, action, occurred_at);
