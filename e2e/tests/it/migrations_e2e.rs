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
async fn migrate_processes_started_together_wait_for_one_another_and_apply_each_migration_once() {
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
        assert!(
            Instant::now() < deadline,
            "{waiting} replicas wait for the lock"
        );
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

/// Migrations are forward-only, and a release never runs on a schema it does
/// not know: after a newer release migrated the database, an older
/// `migrate`, `web` or `worker` stops at start-up with an error naming the
/// unknown migration (deploy/README.md: rolling back past a migration means
/// restoring the database taken before the upgrade).
#[tokio::test]
async fn an_older_release_refuses_to_start_on_a_database_a_newer_one_migrated() {
    let db = devdb::TestDb::with_sql("SELECT 1").await.unwrap();
    let monolith = binary("duo-monolith").unwrap();
    let keys = std::env::temp_dir().join(format!("duo-older-release-{}", std::process::id()));
    let env = vec![
        ("DATABASE_URL".to_owned(), db.url().to_owned()),
        ("DUO_SIGNING_KEY_DIR".to_owned(), keys.display().to_string()),
    ];
    let mut first = Service::spawn("migrate", &monolith, &["migrate"], &env).unwrap();
    assert!(
        first
            .wait_exit(Duration::from_secs(60))
            .await
            .unwrap()
            .success()
    );

    // What a newer release leaves behind: one more applied migration.
    let client = db.client().await.unwrap();
    client
        .execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES (9999, 'from_a_newer_release', '2030-01-01T00:00:00Z', '1')",
            &[],
        )
        .await
        .unwrap();
    for role in ["migrate", "web", "worker"] {
        let mut older = Service::spawn("older", &monolith, &[role], &env).unwrap();
        let exit = older.wait_exit(Duration::from_secs(60)).await.unwrap();
        assert!(!exit.success(), "{role} started on an unknown schema");
        assert!(
            older.log_contains("from_a_newer_release"),
            "{role}: {}",
            older.log_tail(10)
        );
    }
    let _ = std::fs::remove_dir_all(keys);
}
