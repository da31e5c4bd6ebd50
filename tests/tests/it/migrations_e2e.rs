//! Replicas starting together never race on migrations: each `duo-monolith
//! migrate` (and `web`, `worker`, which migrate the same way) takes a
//! PostgreSQL advisory lock first. The test holds that lock itself, starts
//! several real `migrate` processes on a fresh database, sees every one of
//! them wait for it without touching the schema, then lets them go: all exit
//! 0 and every migration is applied exactly once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use std::time::{Duration, Instant};

use e2e_tests::{Service, binary, repo_root};

/// The lock `monolith::db::migrate_exclusively` takes.
const LOCK_KEY: &str = "hashtextextended('duo_migrations', 0)";

#[tokio::test]
async fn migrate_processes_started_together_wait_for_one_another_and_apply_each_migration_once()
{
    let db = devdb::TestDb::with_sql("SELECT 1").await.unwrap();
    let holder = db.client().await.unwrap();
    holder
        .execute(&format!("SELECT pg_advisory_lock({LOCK_KEY})"), &[])
        .await
        .unwrap();

    let monolith = binary("duo-monolith").unwrap();
    let env = vec![("DATABASE_URL".to_owned(), db.url().to_owned())];
    let mut replicas: Vec<Service> = (0..3)
        .map(|_| Service::spawn("migrate", &monolith, &["migrate"], &env).unwrap())
        .collect();

    // All three queue on the lock (not granted), and none has begun.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting: i64 = holder
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 3 {
            break;
        }
        for replica in &mut replicas {
            assert!(
                replica.exited().is_none(),
                "a replica did not wait for the lock:\n{}",
                replica.log_tail(20)
            );
        }
        assert!(Instant::now() < deadline, "{waiting} replicas wait for the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let history: Option<String> = holder
        .query_one("SELECT to_regclass('refinery_schema_history')::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(history, None, "migrated while another held the lock");

    holder
        .execute(&format!("SELECT pg_advisory_unlock({LOCK_KEY})"), &[])
        .await
        .unwrap();
    for replica in &mut replicas {
        let exit = replica.wait_exit(Duration::from_secs(60)).await.unwrap();
        assert!(exit.success(), "{exit}:\n{}", replica.log_tail(20));
    }

    let applied: Vec<(i32, i64)> = holder
        .query(
            "SELECT version, count(*) FROM refinery_schema_history GROUP BY version ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let files = std::fs::read_dir(repo_root().join("crates/monolith/migrations"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('V'))
        .count();
    assert_eq!(applied.len(), files, "{applied:?}");
    assert!(applied.iter().all(|(_, n)| *n == 1), "{applied:?}");
}
