//! A database that drops every connection in the middle of a chat question:
//! the client gets a clear error, nothing is half-written (the question and
//! its completion job are one transaction), and the next question works.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use monolith::config::Realm;
use serde_json::{Value, json};
use support::chaos_proxy::ChaosProxy;
use support::{Fx, Server};

async fn ask(http: &reqwest::Client, url: &str, token: &str, question: &str) -> Value {
    let res = http
        .post(url)
        .bearer_auth(token)
        .json(&json!({
            "query": "mutation($q: String!) { aiAction(input: {chat: {content: $q}}) { requestId errors } }",
            "variables": { "q": question },
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

/// Stored questions, and those of them without exactly one completion job.
async fn questions_and_orphans(fx: &Fx) -> (i64, i64) {
    let db = fx.pool.get().await.unwrap();
    let row = db
        .query_one(
            "SELECT count(*),
                    count(*) FILTER (WHERE (SELECT count(*) FROM background_jobs j
                                             WHERE j.dedupe_key = 'chat_completion:' || m.request_xid::text) <> 1)
               FROM ai_conversation_messages m WHERE m.role = 1",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn connections_dropped_mid_question_lose_nothing_and_recover() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let user = fx.user("alice").await;
    fx.seat(user, "duo_pro", false).await;
    let token = fx.token(user, &["api"]).await;

    let mut url = url::Url::parse(fx.db.url()).unwrap();
    let proxy = ChaosProxy::start(url.port().unwrap()).await;
    url.set_port(Some(proxy.port)).unwrap();
    let pool = monolith::db::pool_for_url(url.as_str(), 4).unwrap();
    let server = Server::start_with_pool(&fx, pool).await;
    let http = reqwest::Client::new();
    let graphql = server.url("/api/graphql");

    let first = ask(&http, &graphql, &token, "first question").await;
    assert_eq!(first["data"]["aiAction"]["errors"], json!([]), "{first}");
    assert_eq!(questions_and_orphans(&fx).await, (1, 0));

    // The connection dies right when the question is being written, inside
    // the transaction that also enqueues its job.
    // Statements are prepared once per connection, so the question text (a
    // parameter of the INSERT) is what is sure to cross the wire then.
    proxy.cut_when_sent(b"second question");
    let (broken, ()) = tokio::join!(
        ask(&http, &graphql, &token, "second question"),
        proxy.wait_cut()
    );
    assert!(broken["data"]["aiAction"].is_null(), "{broken}");
    let error = &broken["errors"][0];
    assert_eq!(
        error["extensions"]["code"], "INTERNAL_SERVER_ERROR",
        "{broken}"
    );
    let message = error["message"].as_str().unwrap();
    assert!(
        !message.contains("INSERT") && !message.contains("postgres"),
        "internals leak into the error: {message}"
    );
    assert_eq!(
        questions_and_orphans(&fx).await,
        (1, 0),
        "the broken question must not be half-stored"
    );

    // The pool replaces the dead connections: the next question goes through.
    let third = ask(&http, &graphql, &token, "third question").await;
    assert_eq!(third["data"]["aiAction"]["errors"], json!([]), "{third}");
    assert_eq!(questions_and_orphans(&fx).await, (2, 0));
}
