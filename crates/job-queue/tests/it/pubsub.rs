//! Pub/sub across two listener connections (two "replicas").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed fixture fails the test"
)]

use std::time::Duration;

use devdb::TestDb;
use job_queue::pubsub::{MAX_INLINE_BYTES, Subscriber, publish, publish_to};
use serde_json::json;
use tokio::time::timeout;

/// The next message on `rx`, within 5 s.
async fn next(rx: &mut tokio::sync::broadcast::Receiver<serde_json::Value>) -> serde_json::Value {
    timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap()
}

/// Payloads stored in the table (too large for a notification).
async fn stored_messages(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM pubsub_messages", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_large_messages_reach_both_replicas_in_order() {
    let db = TestDb::with_sql(job_queue::MIGRATION_SQL).await.unwrap();
    let replica_a = Subscriber::connect(db.url(), 64).await.unwrap();
    let replica_b = Subscriber::connect(db.url(), 64).await.unwrap();
    let mut rx_a = replica_a.subscribe("chunks:42");
    let mut rx_b = replica_b.subscribe("chunks:42");
    let mut other = replica_a.subscribe("chunks:other");

    let big = "x".repeat(MAX_INLINE_BYTES * 3);
    let sent = vec![
        json!({"seq": 0, "text": "hello"}),
        json!({"seq": 1, "text": big}),
        json!({"seq": 2, "text": "world"}),
        json!({"seq": 3, "text": big.clone() + "!"}),
        json!({"seq": 4}),
    ];
    let publisher = db.client().await.unwrap();
    for message in &sent {
        publish(&publisher, "chunks:42", message).await.unwrap();
    }

    for rx in [&mut rx_a, &mut rx_b] {
        for expected in &sent {
            let got = next(rx).await;
            assert_eq!(&got, expected);
        }
    }
    assert!(
        other.try_recv().is_err(),
        "a message leaked to another topic"
    );

    let stored = stored_messages(&publisher).await;
    assert_eq!(stored, 2, "only the large payloads go through the table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reconnects_after_its_connection_is_killed() {
    let db = TestDb::with_sql(job_queue::MIGRATION_SQL).await.unwrap();
    let replica = Subscriber::connect(db.url(), 16).await.unwrap();
    let mut rx = replica.subscribe("t");
    let admin = db.client().await.unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    // Publish until one gets through the new connection (bounded by a deadline).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        publish(&admin, "t", &json!({"ping": true})).await.unwrap();
        if let Ok(Ok(v)) = timeout(Duration::from_millis(200), rx.recv()).await {
            assert_eq!(v, json!({"ping": true}));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never reconnected");
    }
}

#[tokio::test]
async fn abandoned_topics_are_forgotten() {
    let db = TestDb::with_sql(job_queue::MIGRATION_SQL).await.unwrap();
    let subscriber = Subscriber::connect(db.url(), 4).await.unwrap();
    let kept = subscriber.subscribe("kept");
    for n in 0..1000 {
        // One topic per request, dropped when the request is over.
        drop(subscriber.subscribe(&format!("request:{n}")));
    }
    assert!(
        subscriber.topic_count() < 200,
        "{} topics tracked",
        subscriber.topic_count()
    );
    assert_eq!(subscriber.receiver_count("kept"), 1);

    // A topic that survived a clean-up still delivers.
    let publisher = db.client().await.unwrap();
    publish(&publisher, "kept", &json!({"still": "here"}))
        .await
        .unwrap();
    let mut kept = kept;
    let got = next(&mut kept).await;
    assert_eq!(got, json!({"still": "here"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_notification_for_several_topics_reaches_each_once() {
    let db = TestDb::with_sql(job_queue::MIGRATION_SQL).await.unwrap();
    let replica_a = Subscriber::connect(db.url(), 16).await.unwrap();
    let replica_b = Subscriber::connect(db.url(), 16).await.unwrap();
    let mut user_a = replica_a.subscribe("user:1");
    let mut client_a = replica_a.subscribe("client:1:tab");
    let mut client_b = replica_b.subscribe("client:1:tab");
    let mut other = replica_b.subscribe("user:2");
    let publisher = db.client().await.unwrap();

    let small = json!({"answer": "short"});
    let large = json!({"answer": "y".repeat(MAX_INLINE_BYTES * 2)});
    // The client topic named twice is still sent to once.
    for message in [&small, &large] {
        publish_to(
            &publisher,
            "user:1",
            &["client:1:tab", "client:1:tab"],
            message,
        )
        .await
        .unwrap();
    }
    // A marker after both: everything before it has been delivered when it arrives.
    publish(&publisher, "client:1:tab", &json!({"end": true}))
        .await
        .unwrap();

    for rx in [&mut user_a, &mut client_a, &mut client_b] {
        for expected in [&small, &large] {
            let got = next(rx).await;
            assert_eq!(&got, expected);
        }
    }
    for rx in [&mut client_a, &mut client_b] {
        let got = next(rx).await;
        assert_eq!(
            got,
            json!({"end": true}),
            "a duplicate arrived before the marker"
        );
    }
    assert!(
        user_a.try_recv().is_err(),
        "the user topic got a copy twice"
    );
    assert!(
        other.try_recv().is_err(),
        "a message leaked to another topic"
    );

    let stored = stored_messages(&publisher).await;
    assert_eq!(
        stored, 1,
        "the large payload is stored once for both topics"
    );
}
