-- Second schema step (job_queue::CLAIM_ORDER_SQL). Idempotent.
-- Pending jobs indexed in claim order: a claim reads the first row of this index
-- instead of collecting and sorting every pending job of the queue.
CREATE INDEX IF NOT EXISTS background_jobs_pending_order
    ON background_jobs (priority DESC, run_at, id) WHERE state = 'pending';
DROP INDEX IF EXISTS background_jobs_claimable;
