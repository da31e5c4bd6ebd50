//! The shared request budget (`rate_limit::take`): a window per user and
//! action that opens with its first request, checks racing from several
//! connections (replicas), and budgets that allow nothing.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::Fx;
use monolith::rate_limit::take;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_budget_is_spent_within_its_window_and_renewed_after_it() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    let bob = fx.user("bob").await;
    let db = fx.pool.get().await.unwrap();
    let mut taken = Vec::new();
    for _ in 0..4 {
        taken.push(take(&*db, alice.id, "ai_action", 3, HOUR).await.unwrap());
    }
    assert_eq!(taken, [true, true, true, false]);
    // Another user, and another action of the same user, have their own budgets.
    assert!(take(&*db, bob.id, "ai_action", 3, HOUR).await.unwrap());
    assert!(
        take(&*db, alice.id, "direct_access", 3, HOUR)
            .await
            .unwrap()
    );
    // A refused request is not counted.
    let used: i32 = db
        .query_one(
            "SELECT used FROM rate_limit_counters WHERE user_id = $1 AND action = 'ai_action'",
            &[&alice.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(used, 3);
    // The window ends (moved into the past rather than waited for): the next
    // request opens a new one, counted from one.
    db.execute(
        "UPDATE rate_limit_counters SET window_ends_at = now() - interval '1 second'
         WHERE user_id = $1 AND action = 'ai_action'",
        &[&alice.id],
    )
    .await
    .unwrap();
    let mut taken = Vec::new();
    for _ in 0..4 {
        taken.push(take(&*db, alice.id, "ai_action", 3, HOUR).await.unwrap());
    }
    assert_eq!(taken, [true, true, true, false]);
    let window_ends_in: f64 = db
        .query_one(
            "SELECT extract(epoch FROM window_ends_at - now())::float8 FROM rate_limit_counters
             WHERE user_id = $1 AND action = 'ai_action'",
            &[&alice.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        (3500.0..=3600.0).contains(&window_ends_in),
        "the new window lasts the configured hour: {window_ends_in}"
    );
}

#[tokio::test]
async fn replicas_racing_for_the_last_requests_take_exactly_the_budget() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    let mut racers = Vec::new();
    for _ in 0..8 {
        let pool = fx.pool.clone();
        racers.push(tokio::spawn(async move {
            let db = pool.get().await.unwrap();
            let mut granted = 0;
            for _ in 0..5 {
                if take(&*db, alice.id, "ai_action", 12, HOUR).await.unwrap() {
                    granted += 1;
                }
            }
            granted
        }));
    }
    let mut granted = 0;
    for racer in racers {
        granted += racer.await.unwrap();
    }
    assert_eq!(granted, 12, "40 attempts against a budget of 12");
}

#[tokio::test]
async fn a_budget_of_nothing_allows_nothing() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    let db = fx.pool.get().await.unwrap();
    assert!(!take(&*db, alice.id, "ai_action", 0, HOUR).await.unwrap());
    assert!(!take(&*db, alice.id, "ai_action", 0, HOUR).await.unwrap());
}
