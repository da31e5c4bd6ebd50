//! Signing in to the web pages over real HTTP: sessions, CSRF on the form and on
//! GraphQL, no session fixation, the failed-attempt limit, the security headers
//! and policy checks on pages.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use monolith::config::Realm;
use monolith::policy::access;
use reqwest::redirect::Policy as Redirects;
use serde_json::{Value, json};
use support::{Fx, Server};

/// A minimal browser: keeps the cookies the server sets, follows no redirects.
pub(crate) struct Browser {
    http: reqwest::Client,
    cookies: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

pub(crate) fn browser() -> Browser {
    Browser {
        http: reqwest::Client::builder()
            .redirect(Redirects::none())
            .build()
            .unwrap(),
        cookies: Default::default(),
    }
}

impl Browser {
    pub(crate) fn cookie_header(&self) -> String {
        let jar = self.cookies.lock().unwrap();
        jar.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub(crate) fn set_cookie(&self, name: &str, value: &str) {
        self.cookies
            .lock()
            .unwrap()
            .insert(name.to_owned(), value.to_owned());
    }

    fn keep_cookies(&self, res: &reqwest::Response) {
        let mut jar = self.cookies.lock().unwrap();
        for header in res.headers().get_all("set-cookie") {
            let text = header.to_str().unwrap();
            let pair = text.split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            if value.is_empty() || text.contains("Max-Age=0") {
                jar.remove(name);
            } else {
                jar.insert(name.to_owned(), value.to_owned());
            }
        }
    }

    pub(crate) fn get(&self, url: String) -> Req<'_> {
        Req {
            browser: self,
            builder: self.http.get(url).header("Cookie", self.cookie_header()),
        }
    }

    pub(crate) fn post(&self, url: String) -> Req<'_> {
        Req {
            browser: self,
            builder: self.http.post(url).header("Cookie", self.cookie_header()),
        }
    }
}

pub(crate) struct Req<'a> {
    browser: &'a Browser,
    builder: reqwest::RequestBuilder,
}

impl Req<'_> {
    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.builder = self.builder.header(name, value);
        self
    }
    pub(crate) fn form(mut self, fields: &[(&str, &str)]) -> Self {
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        self.builder = self
            .builder
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body);
        self
    }
    pub(crate) fn json(mut self, body: &Value) -> Self {
        self.builder = self.builder.json(body);
        self
    }
    pub(crate) async fn send(self) -> reqwest::Result<reqwest::Response> {
        let res = self.builder.send().await?;
        self.browser.keep_cookies(&res);
        Ok(res)
    }
}

/// A browser signed in as one user, with the session's form token: how the
/// admin and other page tests read pages and send forms.
pub(crate) struct SignedIn {
    pub(crate) browser: Browser,
    pub(crate) csrf: String,
    base: String,
}

/// Signs `username` in (their password set to `password`) and reads the
/// session's form token from a page.
pub(crate) async fn signed_in(server: &Server, username: &str, password: &str) -> SignedIn {
    let browser = browser();
    let res = sign_in(&browser, server, username, password).await;
    assert_eq!(res.status(), 303, "signing in {username}");
    let page = browser
        .get(server.url("/-/chat"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = token_in(&page, "name=\"csrf-token\"");
    SignedIn {
        browser,
        csrf,
        base: server.url(""),
    }
}

impl SignedIn {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A page's status and HTML.
    pub(crate) async fn page(&self, path: &str) -> (u16, String) {
        let res = self.browser.get(self.url(path)).send().await.unwrap();
        let status = res.status().as_u16();
        (status, res.text().await.unwrap())
    }

    /// A form sent with the session's form token.
    pub(crate) async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> reqwest::Response {
        let mut all = vec![("authenticity_token", self.csrf.as_str())];
        all.extend_from_slice(fields);
        self.browser
            .post(self.url(path))
            .form(&all)
            .send()
            .await
            .unwrap()
    }
}

/// The value of `name="authenticity_token"` (or the csrf meta tag) in a page.
pub(crate) fn token_in(html: &str, marker: &str) -> String {
    let start = html
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in {html}"));
    let rest = &html[start..];
    let value = rest
        .find("value=\"")
        .or_else(|| rest.find("content=\""))
        .unwrap();
    let rest = &rest[value..];
    let open = rest.find('"').unwrap() + 1;
    let close = rest[open..].find('"').unwrap();
    rest[open..open + close].to_owned()
}

pub(crate) async fn set_password(fx: &Fx, user: i64, password: &str) {
    let hashed = monolith::identity::passwords::hash(password).unwrap();
    fx.exec(
        "UPDATE users SET encrypted_password = $2 WHERE id = $1",
        &[&user, &hashed],
    )
    .await;
}

pub(crate) async fn sign_in(
    client: &Browser,
    server: &Server,
    user: &str,
    password: &str,
) -> reqwest::Response {
    let form = client
        .get(server.url("/users/sign_in"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = token_in(&form, "name=\"authenticity_token\"");
    client
        .post(server.url("/users/sign_in"))
        .form(&[
            ("authenticity_token", csrf.as_str()),
            ("username", user),
            ("password", password),
            ("redirect_to", "/-/chat"),
        ])
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn signing_in_gives_a_fresh_session_that_graphql_accepts_with_its_csrf_token() {
    let fx = Fx::new().await;
    fx.instance(Realm::SelfManaged, "ultimate", true).await;
    let alice = fx.user("alice").await;
    fx.seat(alice, "duo_pro", false).await;
    set_password(&fx, alice.id, "correct horse battery").await;
    let server = Server::start(&fx).await;
    let client = browser();

    // Pages need a session.
    let res = client.get(server.url("/-/chat")).send().await.unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(
        res.headers()["location"],
        "/users/sign_in?redirect_to=%2F-%2Fchat"
    );

    let res = sign_in(&client, &server, "Alice", "correct horse battery").await;
    assert_eq!(res.status(), 303, "{:?}", res.text().await);
    assert_eq!(res.headers()["location"], "/-/chat");
    let cookie = res
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("_duo_session="))
        .unwrap();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Lax"), "{cookie}");
    let stored: i64 = fx
        .pool
        .get()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM web_sessions WHERE user_id = $1",
            &[&alice.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1);

    let page = client.get(server.url("/-/chat")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    let html = page.text().await.unwrap();
    assert!(!html.contains("<script>"), "no inline script");
    let csrf = token_in(&html, "name=\"csrf-token\"");

    let query = json!({ "query": "query { currentUser { username duoChatAvailable } }" });
    // The session alone is not enough for GraphQL: the CSRF token must come along.
    let refused = client
        .post(server.url("/api/graphql"))
        .json(&query)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let wrong = client
        .post(server.url("/api/graphql"))
        .header("X-CSRF-Token", &"0".repeat(64))
        .json(&query)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 403);
    let other_site = client
        .post(server.url("/api/graphql"))
        .header("X-CSRF-Token", &csrf)
        .header("Origin", "https://evil.example")
        .json(&query)
        .send()
        .await
        .unwrap();
    assert_eq!(other_site.status(), 403);
    let ok: Value = client
        .post(server.url("/api/graphql"))
        .header("X-CSRF-Token", &csrf)
        .json(&query)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ok["data"]["currentUser"]["username"], "alice", "{ok}");
    assert_eq!(ok["data"]["currentUser"]["duoChatAvailable"], true);

    // Signing out ends the session for good.
    let res = client
        .post(server.url("/users/sign_out"))
        .form(&[("authenticity_token", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(
        client
            .get(server.url("/-/chat"))
            .send()
            .await
            .unwrap()
            .status(),
        303
    );
}

#[tokio::test]
async fn a_planted_session_cookie_is_never_kept_and_forms_need_their_token() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    set_password(&fx, alice.id, "correct horse battery").await;
    let mallory = fx.user("mallory").await;
    let server = Server::start(&fx).await;
    let db = fx.pool.get().await.unwrap();

    // The sign-in form refuses a post without its token (login CSRF).
    let client = browser();
    let res = client
        .post(server.url("/users/sign_in"))
        .form(&[("username", "alice"), ("password", "correct horse battery")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    assert!(!client.cookie_header().contains("_duo_session"));

    // An attacker's own session, planted in the victim's browser, then the
    // victim signs in: the planted session ends and a new one starts.
    let planted = monolith::identity::sessions::create(&**db, mallory.id)
        .await
        .unwrap();
    let victim = browser();
    victim.set_cookie("_duo_session", &planted.cookie_value);
    let csrf = "ab".repeat(32);
    victim.set_cookie("_duo_signin_csrf", &csrf);
    let res = victim
        .post(server.url("/users/sign_in"))
        .form(&[
            ("authenticity_token", csrf.as_str()),
            ("username", "alice"),
            ("password", "correct horse battery"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert!(!victim.cookie_header().contains(&planted.cookie_value));
    let planted_now = monolith::identity::sessions::lookup(&**db, &planted.cookie_value)
        .await
        .unwrap();
    assert!(planted_now.is_none(), "the planted session was ended");
    let page = victim.get(server.url("/-/chat")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("@alice"));
}

#[tokio::test]
async fn failed_sign_ins_are_limited_per_username() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    set_password(&fx, alice.id, "correct horse battery").await;
    let server = Server::start(&fx).await;
    let client = browser();
    for _ in 0..5 {
        let res = sign_in(&client, &server, "alice", "wrong password").await;
        assert_eq!(res.status(), 401);
        let html = res.text().await.unwrap();
        assert!(html.contains("Invalid username or password."));
    }
    // Now even the right password is refused, without a check.
    let res = sign_in(&client, &server, "alice", "correct horse battery").await;
    assert_eq!(res.status(), 429);
    assert!(
        res.text()
            .await
            .unwrap()
            .contains("Too many sign-in attempts")
    );
    // Unknown users get the same answer as wrong passwords.
    let other = browser();
    let res = sign_in(&other, &server, "nobody", "whatever12").await;
    assert!(res.status() == 401 || res.status() == 429);
}

#[tokio::test]
async fn pages_show_only_what_the_user_may_read() {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    let bob = fx.user("bob").await;
    set_password(&fx, alice.id, "correct horse battery").await;
    set_password(&fx, bob.id, "another good one").await;
    let group = fx.group(None, "acme", "private", "ultimate").await;
    fx.group_member(group, alice, access::OWNER).await;
    let project = fx.project(group, "site", "private").await;
    let issue = fx.issue(project, alice, false).await;
    let iid: i32 = fx
        .pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT iid FROM issues WHERE id = $1", &[&issue])
        .await
        .unwrap()
        .get(0);
    let server = Server::start(&fx).await;

    let alice_client = browser();
    sign_in(&alice_client, &server, "alice", "correct horse battery").await;
    let page = alice_client
        .get(server.url(&format!("/acme/site/-/issues/{iid}")))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("Ask Duo"));
    assert!(
        html.contains(&format!("resource=gid%3A%2F%2Fgitlab%2FIssue%2F{issue}")),
        "{html}"
    );
    assert_eq!(
        alice_client
            .get(server.url("/acme/site"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // Bob is not a member: the same pages do not exist for him.
    let bob_client = browser();
    sign_in(&bob_client, &server, "bob", "another good one").await;
    for path in [
        format!("/acme/site/-/issues/{iid}"),
        "/acme/site".to_owned(),
        "/acme/nothing".to_owned(),
    ] {
        let res = bob_client.get(server.url(&path)).send().await.unwrap();
        assert_eq!(res.status(), 404, "{path}");
    }
}
