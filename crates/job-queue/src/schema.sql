-- Job queue and pub/sub tables (job_queue::MIGRATION_SQL). Idempotent.
CREATE TABLE IF NOT EXISTS background_jobs (
    id               BIGSERIAL PRIMARY KEY,
    queue            TEXT        NOT NULL DEFAULT 'default',
    kind             TEXT        NOT NULL,
    payload          JSONB       NOT NULL DEFAULT '{}'::jsonb,
    priority         SMALLINT    NOT NULL DEFAULT 0,
    run_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts         INTEGER     NOT NULL DEFAULT 0,
    max_attempts     INTEGER     NOT NULL DEFAULT 5,
    last_error       TEXT,
    dedupe_key       TEXT,
    locked_by        TEXT,
    lease_expires_at TIMESTAMPTZ,
    state            TEXT        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'running', 'done', 'dead')),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ
);

-- A dedupe key is unique among live (pending or running) jobs only.
CREATE UNIQUE INDEX IF NOT EXISTS background_jobs_live_dedupe
    ON background_jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running');
CREATE INDEX IF NOT EXISTS background_jobs_claimable
    ON background_jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS background_jobs_leases
    ON background_jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS background_jobs_periodic_key
    ON background_jobs (dedupe_key) WHERE dedupe_key IS NOT NULL;

-- Wake idle workers whenever a job is inserted, whoever inserts it.
CREATE OR REPLACE FUNCTION background_jobs_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('background_jobs', NEW.queue);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS background_jobs_inserted ON background_jobs;
CREATE TRIGGER background_jobs_inserted AFTER INSERT ON background_jobs
    FOR EACH ROW EXECUTE FUNCTION background_jobs_notify();

-- Pub/sub payloads too large for NOTIFY travel by id through this table.
CREATE TABLE IF NOT EXISTS pubsub_messages (
    id         BIGSERIAL PRIMARY KEY,
    topic      TEXT        NOT NULL,
    payload    JSONB       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS pubsub_messages_created ON pubsub_messages (created_at);
