//! The job queue's third schema step: each job keeps its enqueuer's trace context.

pub fn migration() -> String {
    job_queue::TRACE_CONTEXT_SQL.to_owned()
}
