-- Runs of workflows started in the product (GitLab's workloads): a run is
-- carried out in legs (one runner invocation each, until the flow finishes,
-- pauses for an approval or fails); each leg is a row.
CREATE TABLE duo_workflow_workloads (
    id bigserial PRIMARY KEY,
    workflow_id bigint NOT NULL REFERENCES duo_workflows_workflows(id) ON DELETE CASCADE,
    leg integer NOT NULL CHECK (leg >= 1),
    runner text NOT NULL CHECK (runner IN ('local', 'kubernetes')),
    state text NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'running', 'finished', 'paused', 'failed', 'cancelled')),
    -- The user's answer to the request the run paused on (legs after the first).
    answer text CHECK (answer IN ('approve', 'reject')),
    -- What to do instead, with a rejection.
    reject_message text CHECK (length(reject_message) <= 4096),
    token_id bigint REFERENCES oauth_access_tokens(id) ON DELETE SET NULL,
    failure_reason text CHECK (length(failure_reason) <= 4096),
    log_tail text CHECK (length(log_tail) <= 65536),
    -- The code checkpoint the leg pushed to the run's hidden ref.
    checkpoint_sha text CHECK (length(checkpoint_sha) <= 64),
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    UNIQUE (workflow_id, leg)
);
-- Admission counts running legs and orders queued ones.
CREATE INDEX duo_workflow_workloads_active ON duo_workflow_workloads (state, created_at)
    WHERE state IN ('queued', 'running');

-- Where a remote run starts from and what it produced.
ALTER TABLE duo_workflows_workflows
    ADD COLUMN source_branch text CHECK (length(source_branch) <= 255),
    ADD COLUMN result_branch text CHECK (length(result_branch) <= 255);

-- A run's token reaches only its own project and workflow.
ALTER TABLE oauth_access_tokens
    ADD COLUMN workflow_id bigint REFERENCES duo_workflows_workflows(id) ON DELETE CASCADE,
    ADD COLUMN project_id bigint REFERENCES projects(id) ON DELETE CASCADE;
