//! The GraphQL explorer page over real HTTP: behind sign-in (an anonymous
//! visitor is sent to sign in and back), served with the same strict
//! Content-Security-Policy as every page (its script is ours, by URL, no
//! inline script), and the GraphQL requests it makes carry the session's
//! CSRF token: without it `/api/graphql` refuses the session's request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::{Fx, Server};

use monolith::config::Realm;
use reqwest::redirect::Policy as Redirects;
use serde_json::{Value, json};

/// A client that does not follow redirects, with a fresh session cookie for
/// `user` and its CSRF token.
pub(crate) async fn session_client(fx: &Fx, user: i64) -> (reqwest::Client, String, String) {
    let db = fx.pool.get().await.unwrap();
    let created = monolith::identity::sessions::create(&**db, user)
        .await
        .unwrap();
    let http = reqwest::Client::builder()
        .redirect(Redirects::none())
        .build()
        .unwrap();
    (
        http,
        format!("_duo_session={}", created.cookie_value),
        created.csrf_token,
    )
}

#[tokio::test]
async fn anonymous_visitors_are_sent_to_sign_in_and_back() {
    let fx = Fx::new().await;
    let server = Server::start(&fx).await;
    let res = reqwest::Client::builder()
        .redirect(Redirects::none())
        .build()
        .unwrap()
        .get(server.url("/-/graphql-explorer"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(
        res.headers()["location"],
        "/users/sign_in?redirect_to=%2F-%2Fgraphql-explorer"
    );
}

#[tokio::test]
async fn the_page_is_served_with_the_strict_policy_and_our_script_only() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let alice = fx.user("alice").await;
    let server = Server::start(&fx).await;
    let (http, cookie, _) = session_client(&fx, alice.id).await;
    let res = http
        .get(server.url("/-/graphql-explorer"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let csp = res.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(csp, monolith::web::layout::CONTENT_SECURITY_POLICY);
    assert!(csp.contains("script-src 'self';"), "{csp}");
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(res.headers()["x-frame-options"], "DENY");
    let html = res.text().await.unwrap();
    let script = monolith::web::assets::url("graphql_explorer.js");
    assert!(script.starts_with("/assets/graphql_explorer-"), "{script}");
    assert!(
        html.contains(&format!("<script type=\"module\" src=\"{script}\">")),
        "{html}"
    );
    // Every script element is ours by URL or a data block; none runs inline.
    for tag in html.split("<script").skip(1) {
        assert!(
            tag.starts_with(" type=\"module\" src=\"/assets/")
                || tag.starts_with(" type=\"application/json\""),
            "an inline script: <script{}",
            &tag[..tag.len().min(80)]
        );
    }
    assert!(html.contains("name=\"csrf-token\""));
    assert!(html.contains("id=\"query\""));
    assert!(html.contains("id=\"variables\""));
    let js = http.get(server.url(&script)).send().await.unwrap();
    assert_eq!(js.status(), 200);
    assert!(
        js.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert!(js.text().await.unwrap().contains("postGraphql"));
}

#[tokio::test]
async fn the_session_s_graphql_needs_the_csrf_token() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let alice = fx.user("alice").await;
    let server = Server::start(&fx).await;
    let (http, cookie, csrf) = session_client(&fx, alice.id).await;
    let body = json!({ "query": "query { currentUser { username } }" });
    let post = |token: Option<&str>| {
        let mut req = http
            .post(server.url("/api/graphql"))
            .header("Cookie", &cookie)
            .json(&body);
        if let Some(token) = token {
            req = req.header("X-CSRF-Token", token);
        }
        req.send()
    };
    let refused = post(None).await.unwrap();
    assert_eq!(refused.status(), 403);
    let text = refused.text().await.unwrap();
    assert!(text.contains("CSRF"), "{text}");
    let refused = post(Some("not-the-token")).await.unwrap();
    assert_eq!(refused.status(), 403);
    let answered = post(Some(&csrf)).await.unwrap();
    assert_eq!(answered.status(), 200);
    let answer: Value = answered.json().await.unwrap();
    assert_eq!(
        answer["data"]["currentUser"]["username"], "alice",
        "{answer}"
    );
}
