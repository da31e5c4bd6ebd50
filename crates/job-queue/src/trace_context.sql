-- Step 3: the W3C `traceparent` of whoever enqueued the job, so the run
-- continues the enqueuer's trace. Idempotent.
ALTER TABLE background_jobs ADD COLUMN IF NOT EXISTS trace_context TEXT;
