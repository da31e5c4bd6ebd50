//! The PostgreSQL job queue and pub/sub tables, exactly as the `job-queue` crate
//! defines them (its SQL is idempotent).

pub fn migration() -> String {
    job_queue::SCHEMA_V1_SQL.to_owned()
}
