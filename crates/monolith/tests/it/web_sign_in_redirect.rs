//! Where signing in sends the browser, over real HTTP with the real form: only
//! to a path on this site. Hostile `redirect_to` values (control characters,
//! backslashes, encoded slashes, `//host`, absolute URLs, dot segments that
//! leave `//host`) fall back to `/`, on the form page, on its POST and when a
//! signed-in browser opens the form; nothing answers 500.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;
use crate::web_sign_in::{browser, set_password, token_in};

use support::{Fx, Server};

const PASSWORD: &str = "correct horse battery";

/// `redirect_to` values (as the form carries them, decoded) that must never
/// leave this site or reach a header as they are.
const HOSTILE: &[&str] = &[
    "//evil.example",
    "///evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "/\t/evil.example",
    "/\n/evil.example",
    "/\r\nSet-Cookie: planted=1",
    "/\u{0085}/evil.example",
    "/\u{2028}/evil.example",
    "/%09/evil.example",
    "/%0a/evil.example",
    "/%2F/evil.example",
    "/%2f%2fevil.example",
    "/%252F/evil.example",
    "/%5Cevil.example",
    "/.//evil.example",
    "/%2e//evil.example",
    "/a/..//evil.example",
    "https://evil.example/",
    "http:evil.example",
    "javascript:alert(1)",
    "evil.example",
    " /-/chat",
    "/%",
    "",
];

/// The same kind of values as raw query strings of `GET /users/sign_in`.
const HOSTILE_QUERIES: &[&str] = &[
    "%2F%09%2Fevil.example",
    "/%09/evil.example",
    "/%0a/evil.example",
    "/%0d%0aSet-Cookie:%20planted=1",
    "//evil.example",
    "/%5Cevil.example",
    "%5C%5Cevil.example",
    "/%252F/evil.example",
    "/.//evil.example",
    "https://evil.example",
    "/%E2%80%A8/evil.example",
    "/%C2%85/evil.example",
];

/// `location` is a path on `base`'s origin, with nothing a browser would
/// read as another host.
fn assert_same_origin_path(base: &str, location: &str, what: &str) {
    assert!(location.starts_with('/'), "{what}: {location:?}");
    assert!(!location.starts_with("//"), "{what}: {location:?}");
    assert!(
        !location.chars().any(|c| c.is_control() || c == '\\'),
        "{what}: {location:?}"
    );
    let base = url::Url::parse(base).unwrap();
    assert_eq!(
        base.join(location).unwrap().origin(),
        base.origin(),
        "{what}: {location:?}"
    );
}

/// The `redirect_to` the sign-in page carries in its form.
fn carried(page: &str) -> String {
    token_in(page, "name=\"redirect_to\"")
}

async fn world() -> (Fx, Server) {
    let fx = Fx::new().await;
    let alice = fx.user("alice").await;
    set_password(&fx, alice.id, PASSWORD).await;
    let server = Server::start(&fx).await;
    (fx, server)
}

/// Signs alice in with `redirect_to` through the form; the answer's Location.
async fn sign_in_to(server: &Server, redirect_to: &str, password: &str) -> (u16, String, String) {
    let client = browser();
    let page = client
        .get(server.url("/users/sign_in"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = token_in(&page, "name=\"authenticity_token\"");
    let res = client
        .post(server.url("/users/sign_in"))
        .form(&[
            ("authenticity_token", csrf.as_str()),
            ("username", "alice"),
            ("password", password),
            ("redirect_to", redirect_to),
        ])
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let location = res
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, location, res.text().await.unwrap())
}

#[tokio::test]
async fn signing_in_redirects_only_to_paths_on_this_site() {
    let (_fx, server) = world().await;
    for value in HOSTILE {
        let (status, location, body) = sign_in_to(&server, value, PASSWORD).await;
        assert_eq!(status, 303, "{value:?}: {body}");
        assert_eq!(location, "/", "{value:?}");
        assert_same_origin_path(&server.base, &location, value);
    }
    // A refused password shows the form again, carrying the fallback.
    let (status, _, page) = sign_in_to(&server, "/\t/evil.example", "wrong").await;
    assert_eq!(status, 401);
    assert_eq!(carried(&page), "/");

    // Paths on this site are kept (normalised, and encoded as a header needs).
    for (value, kept) in [
        ("/-/chat", "/-/chat"),
        (
            "/acme/site/-/issues/1?tab=notes#note_2",
            "/acme/site/-/issues/1?tab=notes#note_2",
        ),
        (
            "/acme/site/-/blob/main/a%20b.rb",
            "/acme/site/-/blob/main/a%20b.rb",
        ),
        (
            "/acme/site/-/blob/main/a b.rb",
            "/acme/site/-/blob/main/a%20b.rb",
        ),
        ("/acme/../-/chat", "/-/chat"),
    ] {
        let (status, location, _) = sign_in_to(&server, value, PASSWORD).await;
        assert_eq!((status, location.as_str()), (303, kept), "{value:?}");
    }
}

#[tokio::test]
async fn the_form_page_never_carries_a_hostile_target_nor_fails() {
    let (_fx, server) = world().await;
    let anonymous = browser();
    let signed_in = browser();
    let page = signed_in
        .get(server.url("/users/sign_in"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = token_in(&page, "name=\"authenticity_token\"");
    let res = signed_in
        .post(server.url("/users/sign_in"))
        .form(&[
            ("authenticity_token", csrf.as_str()),
            ("username", "alice"),
            ("password", PASSWORD),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    assert_eq!(res.headers()["location"], "/", "no redirect_to");

    let encoded: Vec<String> = HOSTILE
        .iter()
        .map(|v| url::form_urlencoded::byte_serialize(v.as_bytes()).collect())
        .collect();
    let queries = HOSTILE_QUERIES
        .iter()
        .map(|q| (*q).to_owned())
        .chain(encoded);
    for query in queries {
        let url = server.url(&format!("/users/sign_in?redirect_to={query}"));
        // Signed out: the form, carrying the fallback.
        let res = anonymous.get(url.clone()).send().await.unwrap();
        assert_eq!(res.status(), 200, "{query}");
        let page = res.text().await.unwrap();
        assert_eq!(carried(&page), "/", "{query}");
        // Signed in: straight to the fallback.
        let res = signed_in.get(url).send().await.unwrap();
        assert_eq!(res.status(), 303, "{query}");
        let location = res.headers()["location"].to_str().unwrap();
        assert_eq!(location, "/", "{query}");
        assert_same_origin_path(&server.base, location, &query);
    }

    // A path of this site is carried as it is.
    let res = anonymous
        .get(server.url("/users/sign_in?redirect_to=%2Facme%2Fsite%2F-%2Fissues%2F1"))
        .send()
        .await
        .unwrap();
    assert_eq!(carried(&res.text().await.unwrap()), "/acme/site/-/issues/1");
}
