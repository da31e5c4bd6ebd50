//! Against the real private cluster (or DATABASE_URL).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use devdb::{TestDb, cluster_url};

const SQL: &str = "CREATE TABLE widgets (id bigint PRIMARY KEY, name text NOT NULL);
                   INSERT INTO widgets VALUES (1, 'seeded');";

#[tokio::test]
async fn each_test_database_is_migrated_and_isolated() {
    let a = TestDb::with_sql(SQL).await.unwrap();
    let b = TestDb::with_sql(SQL).await.unwrap();
    assert_ne!(a.name(), b.name());

    let ca = a.client().await.unwrap();
    let cb = b.client().await.unwrap();
    ca.execute("INSERT INTO widgets VALUES (2, 'only in a')", &[])
        .await
        .unwrap();
    let count_a: i64 = ca
        .query_one("SELECT count(*) FROM widgets", &[])
        .await
        .unwrap()
        .get(0);
    let count_b: i64 = cb
        .query_one("SELECT count(*) FROM widgets", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!((count_a, count_b), (2, 1));
}

#[tokio::test]
async fn dropping_removes_the_database() {
    let db = TestDb::with_sql(SQL).await.unwrap();
    let name = db.name().to_owned();
    let pool = db.pool(2).unwrap();
    let conn = pool.get().await.unwrap();
    conn.execute("SELECT 1", &[]).await.unwrap();
    drop(conn);
    drop(pool);
    drop(db);

    let admin = tokio_postgres::connect(&cluster_url().await.unwrap(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(admin.1);
    let exists = admin
        .0
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .unwrap();
    assert!(exists.is_none(), "{name} still exists");
}

#[tokio::test]
async fn custom_migration_runs_once_per_key_and_clones_concurrently() {
    let key = format!("custom-migration-test-{}", std::process::id());
    let mut handles = Vec::new();
    for _ in 0..6 {
        let key = key.clone();
        handles.push(tokio::spawn(async move {
            TestDb::new(&key, |url: String| async move {
                let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                c.batch_execute("CREATE TABLE runs (n int); INSERT INTO runs VALUES (1);")
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .unwrap()
        }));
    }
    let mut dbs = Vec::new();
    for h in handles {
        dbs.push(h.await.unwrap());
    }
    for db in &dbs {
        let c = db.client().await.unwrap();
        let n: i64 = c
            .query_one("SELECT count(*) FROM runs", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "the migration ran more than once into the template");
    }
}
