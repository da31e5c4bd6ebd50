//! The PostgreSQL job queue and pub/sub tables, exactly as the `job-queue` crate
//! defines them (its SQL is idempotent).

pub fn migration() -> String {
    job_queue::MIGRATION_SQL.to_owned()
}
