//! The job queue's second schema step: pending jobs indexed in claim order.

pub fn migration() -> String {
    job_queue::CLAIM_ORDER_SQL.to_owned()
}
