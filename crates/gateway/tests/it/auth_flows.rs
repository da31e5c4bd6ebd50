//! Authentication end to end: real RSA keys, a real OIDC discovery + JWKS
//! server on loopback, and the actix middleware.

// Helpers outside `#[test]` functions are test code too.
#![expect(clippy::unwrap_used, reason = "test helpers fail loudly by design")]

use crate::app_support::closed_port_url;
use crate::key_support::{TestKey, generate_key, now};
use actix_web::{App, HttpResponse, HttpServer, test as atest, web};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use gateway::auth::{AuthError, Authenticator, GatewayUser};
use gateway::{ApiError, Config};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

const SERVICE: &str = "gitlab-ai-gateway";
const REALM: &str = "self-managed";
const INSTANCE: &str = "instance-1";
const ISSUER: &str = "http://gitlab.example";

static KEY_A: LazyLock<TestKey> = LazyLock::new(generate_key);
static KEY_B: LazyLock<TestKey> = LazyLock::new(generate_key);
static LOCAL_KEY: LazyLock<TestKey> = LazyLock::new(generate_key);

/// Claims of a valid instance token, with `overrides` merged in (null removes).
fn claims(overrides: Value) -> Value {
    let mut base = json!({
        "aud": SERVICE,
        "iss": ISSUER,
        "sub": INSTANCE,
        "exp": now() + 300,
        "iat": now(),
        "nbf": now() - 5,
        "gitlab_realm": REALM,
        "gitlab_instance_id": INSTANCE,
        "duo_seat_count": "12",
        "scopes": ["duo_chat", "documentation_search"],
    });
    for (k, v) in overrides.as_object().unwrap() {
        if v.is_null() {
            base.as_object_mut().unwrap().remove(k);
        } else {
            base[k] = v.clone();
        }
    }
    base
}

fn headers(token: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert("authorization", format!("Bearer {token}").parse().unwrap());
    h.insert("x-gitlab-authentication-type", "oidc".parse().unwrap());
    h.insert("x-gitlab-realm", REALM.parse().unwrap());
    h.insert("x-gitlab-instance-id", INSTANCE.parse().unwrap());
    h
}

/// An OIDC issuer on loopback whose JWKS tests can swap, counting discoveries.
struct Issuer {
    url: String,
    jwks: Arc<Mutex<Value>>,
    discoveries: Arc<AtomicUsize>,
}

impl Issuer {
    fn start(keys: Value) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let jwks = Arc::new(Mutex::new(keys));
        let discoveries = Arc::new(AtomicUsize::new(0));
        let (jwks_c, disc_c, url_c) = (jwks.clone(), discoveries.clone(), url.clone());
        let server = HttpServer::new(move || {
            let (jwks, disc, url) = (jwks_c.clone(), disc_c.clone(), url_c.clone());
            App::new()
                .route(
                    "/.well-known/openid-configuration",
                    web::get().to(move || {
                        disc.fetch_add(1, Ordering::SeqCst);
                        let body = json!({"issuer": url, "jwks_uri": format!("{url}/oauth/discovery/keys")});
                        async move { HttpResponse::Ok().json(body) }
                    }),
                )
                .route(
                    "/oauth/discovery/keys",
                    web::get().to(move || {
                        let body = jwks.lock().unwrap().clone();
                        async move { HttpResponse::Ok().json(body) }
                    }),
                )
        })
        .workers(1)
        .listen(listener)
        .unwrap()
        .run();
        actix_web::rt::spawn(server);
        Self {
            url,
            jwks,
            discoveries,
        }
    }

    fn set_keys(&self, keys: Value) {
        *self.jwks.lock().unwrap() = keys;
    }

    fn discoveries(&self) -> usize {
        self.discoveries.load(Ordering::SeqCst)
    }
}

fn jwks(keys: &[(&TestKey, &str)]) -> Value {
    json!({"keys": keys.iter().map(|(k, kid)| k.jwk(kid)).collect::<Vec<_>>()})
}

fn authenticator(vars: &[(&str, &str)]) -> Authenticator {
    let config = Config::for_tests(vars).unwrap();
    Authenticator::from_config(&config.auth).unwrap()
}

fn for_issuer(issuer: &Issuer) -> Authenticator {
    authenticator(&[
        ("AIGW_GITLAB_URL", &issuer.url),
        ("AIGW_AUTH__LEEWAY_SECONDS", "30"),
    ])
}

async fn message(auth: &Authenticator, h: &http::HeaderMap) -> String {
    auth.authenticate(h).await.unwrap_err().to_string()
}

#[actix_web::test]
async fn a_valid_token_yields_its_scopes_and_claims() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    let token = KEY_A.sign(Some("a"), &claims(json!({})));
    let user = auth.authenticate(&headers(&token)).await.unwrap();
    assert!(!user.is_debug);
    assert!(user.can_str("duo_chat"));
    assert!(user.can_str("documentation_search"));
    assert!(!user.can_str("complete_code"));
    assert_eq!(user.claims.gitlab_realm.as_deref(), Some(REALM));
    assert_eq!(user.claims.gitlab_instance_id.as_deref(), Some(INSTANCE));
    assert_eq!(user.claims.subject.as_deref(), Some(INSTANCE));
    assert_eq!(user.claims.issuer.as_deref(), Some(ISSUER));
    assert_eq!(user.claims.duo_seat_count.as_deref(), Some("12"));
}

#[actix_web::test]
async fn time_and_audience_rules() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    let forbidden = "Forbidden by auth provider";
    let cases = [
        ("expired", json!({"exp": now() - 120}), false),
        ("expired within leeway", json!({"exp": now() - 10}), true),
        ("not yet valid", json!({"nbf": now() + 120}), false),
        (
            "not yet valid within leeway",
            json!({"nbf": now() + 10}),
            true,
        ),
        ("wrong audience", json!({"aud": "someone-else"}), false),
        (
            "audience list containing ours",
            json!({"aud": ["x", SERVICE]}),
            true,
        ),
        ("no audience", json!({"aud": null}), false),
        ("no expiry", json!({"exp": null}), false),
    ];
    for (name, overrides, accepted) in cases {
        let token = KEY_A.sign(Some("a"), &claims(overrides));
        let result = auth.authenticate(&headers(&token)).await;
        match (accepted, result) {
            (true, Ok(_)) => {}
            (false, Err(err)) => assert_eq!(err.to_string(), forbidden, "{name}"),
            (want, got) => panic!("{name}: expected accepted={want}, got {got:?}"),
        }
    }
}

#[actix_web::test]
async fn forged_tokens_are_refused() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    let body = URL_SAFE_NO_PAD.encode(claims(json!({})).to_string());

    let none_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT","kid":"a"}"#);
    let none_token = format!("{none_header}.{body}.");

    // The classic confusion attack: HMAC keyed with the public key.
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("a".into());
    let hs_token = jsonwebtoken::encode(
        &hs,
        &claims(json!({})),
        &EncodingKey::from_secret(KEY_A.public_pem.as_bytes()),
    )
    .unwrap();

    let wrong_key = KEY_B.sign(Some("a"), &claims(json!({})));
    let wrong_key_no_kid = KEY_B.sign(None, &claims(json!({})));
    let valid = KEY_A.sign(Some("a"), &claims(json!({})));
    let (head, _) = valid.rsplit_once('.').unwrap();
    let stripped_signature = format!("{head}.");

    for (name, token) in [
        ("alg none", none_token),
        ("HS256 with the public key", hs_token),
        ("signed by another key", wrong_key),
        ("another key, no kid", wrong_key_no_kid),
        ("signature removed", stripped_signature),
        ("garbage", "not.a.jwt".to_owned()),
        ("empty", String::new()),
    ] {
        assert_eq!(
            message(&auth, &headers(&token)).await,
            "Forbidden by auth provider",
            "{name}"
        );
    }
    // A token without kid signed by a known key is still fine.
    let no_kid = KEY_A.sign(None, &claims(json!({})));
    assert!(auth.authenticate(&headers(&no_kid)).await.is_ok());
}

#[actix_web::test]
async fn keys_are_cached_between_requests() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    for _ in 0..3 {
        let token = KEY_A.sign(Some("a"), &claims(json!({})));
        auth.authenticate(&headers(&token)).await.unwrap();
    }
    assert_eq!(issuer.discoveries(), 1);
}

#[actix_web::test]
async fn rotated_keys_are_picked_up_and_refetches_are_rate_limited() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    let old = KEY_A.sign(Some("a"), &claims(json!({})));
    auth.authenticate(&headers(&old)).await.unwrap();
    assert_eq!(issuer.discoveries(), 1);

    // The issuer rotates: the new key is published next to the old one.
    issuer.set_keys(jwks(&[(&KEY_A, "a"), (&KEY_B, "b")]));
    let new = KEY_B.sign(Some("b"), &claims(json!({})));
    auth.authenticate(&headers(&new)).await.unwrap();
    assert_eq!(issuer.discoveries(), 2);
    // Tokens in flight with the old key still pass, from the cache.
    auth.authenticate(&headers(&old)).await.unwrap();
    assert_eq!(issuer.discoveries(), 2);

    // A made-up kid right afterwards does not cause another fetch.
    let unknown = KEY_B.sign(Some("made-up"), &claims(json!({})));
    assert_eq!(
        message(&auth, &headers(&unknown)).await,
        "Forbidden by auth provider"
    );
    assert_eq!(issuer.discoveries(), 2);
}

#[actix_web::test]
async fn unknown_kid_is_refused_after_a_refetch() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer).with_min_refresh_interval(Duration::ZERO);
    let token = KEY_B.sign(Some("b"), &claims(json!({})));
    assert_eq!(
        message(&auth, &headers(&token)).await,
        "Forbidden by auth provider"
    );
    // Initial fetch plus the refetch for the unknown kid.
    assert_eq!(issuer.discoveries(), 2);
}

#[actix_web::test]
async fn an_unreachable_issuer_does_not_hide_the_others() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let dead = closed_port_url();
    let auth = authenticator(&[
        ("AIGW_GITLAB_URL", &dead),
        ("AIGW_CUSTOMER_PORTAL_URL", &issuer.url),
    ]);
    let token = KEY_A.sign(Some("a"), &claims(json!({})));
    auth.authenticate(&headers(&token)).await.unwrap();
}

#[actix_web::test]
async fn no_keys_at_all_is_a_server_error() {
    let auth = authenticator(&[("AIGW_GITLAB_URL", &closed_port_url())]);
    let token = KEY_A.sign(Some("a"), &claims(json!({})));
    let err = auth.authenticate(&headers(&token)).await.unwrap_err();
    assert!(matches!(err, AuthError::NoKeys), "{err:?}");
    let api: ApiError = err.into();
    assert!(matches!(api, ApiError::Internal(_)));
}

fn local_key_authenticator() -> Authenticator {
    authenticator(&[
        ("AIGW_GITLAB_URL", &closed_port_url()),
        ("AIGW_SELF_SIGNED_JWT__SIGNING_KEY", &LOCAL_KEY.private_pem),
    ])
}

#[actix_web::test]
async fn self_signed_tokens_use_the_local_key_and_the_global_user_id() {
    let auth = local_key_authenticator();
    let kid = format!("{SERVICE}_signing_key");
    let token = LOCAL_KEY.sign(
        Some(&kid),
        &claims(json!({"iss": SERVICE, "sub": "user-77", "scopes": ["complete_code"]})),
    );
    let mut h = headers(&token);
    h.insert("x-gitlab-global-user-id", "user-77".parse().unwrap());
    let user = auth.authenticate(&h).await.unwrap();
    assert!(user.can_str("complete_code"));

    h.insert("x-gitlab-global-user-id", "user-78".parse().unwrap());
    assert_eq!(
        message(&auth, &h).await,
        "Header mismatch 'X-Gitlab-Global-User-Id'"
    );
}

#[actix_web::test]
async fn a_global_user_id_claim_must_match_its_header() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    let token = KEY_A.sign(
        Some("a"),
        &claims(json!({"gitlab_global_user_id": "user-uuid-1"})),
    );
    let mut h = headers(&token);
    h.insert("x-gitlab-global-user-id", "user-uuid-1".parse().unwrap());
    assert!(auth.authenticate(&h).await.is_ok());
    h.insert("x-gitlab-global-user-id", "user-uuid-2".parse().unwrap());
    assert_eq!(
        message(&auth, &h).await,
        "Header mismatch 'X-Gitlab-Global-User-Id'"
    );
    h.remove("x-gitlab-global-user-id");
    assert_eq!(
        message(&auth, &h).await,
        "Header mismatch 'X-Gitlab-Global-User-Id'"
    );
}

#[actix_web::test]
async fn claims_must_match_headers() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    let token = KEY_A.sign(Some("a"), &claims(json!({})));

    let mut h = headers(&token);
    h.insert("x-gitlab-realm", "saas".parse().unwrap());
    assert_eq!(message(&auth, &h).await, "Header mismatch 'X-Gitlab-Realm'");

    let mut h = headers(&token);
    h.remove("x-gitlab-realm");
    assert_eq!(message(&auth, &h).await, "Header mismatch 'X-Gitlab-Realm'");

    let mut h = headers(&token);
    h.insert("x-gitlab-instance-id", "other".parse().unwrap());
    assert_eq!(
        message(&auth, &h).await,
        "Header mismatch 'X-Gitlab-Instance-Id'"
    );

    // sub is compared with the instance id for tokens from an instance.
    let sub_differs = KEY_A.sign(
        Some("a"),
        &claims(json!({"sub": "other", "gitlab_instance_id": null})),
    );
    assert_eq!(
        message(&auth, &headers(&sub_differs)).await,
        "Header mismatch 'X-Gitlab-Instance-Id'"
    );

    // Empty or missing claims are not compared.
    let sparse = KEY_A.sign(
        Some("a"),
        &claims(json!({"gitlab_realm": "", "gitlab_instance_id": null, "sub": null})),
    );
    let mut h = headers(&sparse);
    h.remove("x-gitlab-realm");
    h.remove("x-gitlab-instance-id");
    assert!(auth.authenticate(&h).await.is_ok());
}

#[actix_web::test]
async fn header_checks_come_first() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    let token = KEY_A.sign(Some("a"), &claims(json!({})));

    let mut h = headers(&token);
    h.remove("authorization");
    assert_eq!(
        message(&auth, &h).await,
        "No authorization header presented"
    );

    for value in ["Basic abc", "Token abc", "", "Bearer"] {
        let mut h = headers(&token);
        h.insert("authorization", value.parse().unwrap());
        let expected = if value == "Bearer" {
            // The scheme is right; the empty token fails later.
            "Forbidden by auth provider"
        } else {
            "Invalid authorization header"
        };
        assert_eq!(message(&auth, &h).await, expected, "{value:?}");
    }

    let mut h = headers(&token);
    h.insert("authorization", format!("bEaReR {token}").parse().unwrap());
    assert!(auth.authenticate(&h).await.is_ok(), "scheme is case-blind");

    for value in [None, Some("oauth"), Some("OIDC")] {
        let mut h = headers(&token);
        match value {
            None => h.remove("x-gitlab-authentication-type"),
            Some(v) => h.insert("x-gitlab-authentication-type", v.parse().unwrap()),
        };
        assert_eq!(
            message(&auth, &h).await,
            "Invalid authentication token type - only OIDC is supported",
            "{value:?}"
        );
    }
    // None of this needed the issuer.
    assert_eq!(issuer.discoveries(), 1);
}

#[actix_web::test]
async fn bypass_modes() {
    let everyone = authenticator(&[
        ("AIGW_GITLAB_URL", &closed_port_url()),
        ("AIGW_AUTH__BYPASS_EXTERNAL", "true"),
    ]);
    let user = everyone
        .authenticate(&http::HeaderMap::new())
        .await
        .unwrap();
    assert!(user.is_debug);
    assert!(user.can_str("anything_at_all"));

    let with_header = authenticator(&[
        ("AIGW_GITLAB_URL", &closed_port_url()),
        ("AIGW_AUTH__BYPASS_EXTERNAL_WITH_HEADER", "true"),
    ]);
    let mut h = http::HeaderMap::new();
    assert_eq!(
        message(&with_header, &h).await,
        "No authorization header presented"
    );
    h.insert("bypass-auth", "false".parse().unwrap());
    assert_eq!(
        message(&with_header, &h).await,
        "No authorization header presented"
    );
    h.insert("bypass-auth", "true".parse().unwrap());
    assert!(with_header.authenticate(&h).await.unwrap().is_debug);

    // Without the setting, the header means nothing.
    let strict = authenticator(&[("AIGW_GITLAB_URL", &closed_port_url())]);
    assert_eq!(
        message(&strict, &h).await,
        "No authorization header presented"
    );
}

#[actix_web::test]
async fn signature_bypass_still_checks_algorithm_audience_and_time() {
    let auth = authenticator(&[
        ("AIGW_GITLAB_URL", &closed_port_url()),
        ("AIGW_AUTH__BYPASS_JWT_SIGNATURE", "true"),
    ]);
    // Signed by a key nobody knows: accepted, and no key set is needed.
    let token = KEY_B.sign(Some("nobody"), &claims(json!({})));
    let user = auth.authenticate(&headers(&token)).await.unwrap();
    assert!(!user.is_debug);
    assert!(user.can_str("duo_chat"));

    let body = URL_SAFE_NO_PAD.encode(claims(json!({})).to_string());
    let none_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
    for (name, token) in [
        ("alg none", format!("{none_header}.{body}.")),
        (
            "expired",
            KEY_B.sign(None, &claims(json!({"exp": now() - 120}))),
        ),
        (
            "wrong audience",
            KEY_B.sign(None, &claims(json!({"aud": "other"}))),
        ),
        (
            "not yet valid",
            KEY_B.sign(None, &claims(json!({"nbf": now() + 120}))),
        ),
    ] {
        assert_eq!(
            message(&auth, &headers(&token)).await,
            "Forbidden by auth provider",
            "{name}"
        );
    }
    // Header matching still applies.
    let mut h = headers(&token);
    h.insert("x-gitlab-realm", "saas".parse().unwrap());
    assert_eq!(message(&auth, &h).await, "Header mismatch 'X-Gitlab-Realm'");
}

#[test]
fn an_invalid_local_key_is_a_configuration_error() {
    let config = Config::for_tests(&[("AIGW_SELF_SIGNED_JWT__SIGNING_KEY", "not a key")]).unwrap();
    let err = Authenticator::from_config(&config.auth).unwrap_err();
    assert!(
        err.to_string()
            .contains("AIGW_SELF_SIGNED_JWT__SIGNING_KEY"),
        "{err}"
    );
    assert!(
        !err.to_string().contains("not a key"),
        "no secret in the message"
    );
}

// ---- middleware ----

async fn whoami(user: GatewayUser) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "debug": user.is_debug,
        "scopes": user.scopes,
    }))
}

macro_rules! app {
    ($auth:expr) => {
        atest::init_service(
            App::new()
                .app_data(web::Data::new($auth))
                .wrap(actix_web::middleware::from_fn(
                    gateway::auth::middleware::authenticate_request,
                ))
                .route("/monitoring/healthz", web::get().to(HttpResponse::Ok))
                .route("/monitoring/ready", web::get().to(HttpResponse::Ok))
                .route("/metrics", web::get().to(HttpResponse::Ok))
                .route("/v1/whoami", web::get().to(whoami)),
        )
        .await
    };
}

fn request(path: &str, headers: &http::HeaderMap) -> atest::TestRequest {
    let mut req = atest::TestRequest::get().uri(path);
    for (name, value) in headers {
        req = req.insert_header((name.as_str(), value.to_str().unwrap()));
    }
    req
}

#[actix_web::test]
async fn middleware_lets_health_and_metrics_through_and_guards_the_rest() {
    let auth = authenticator(&[("AIGW_GITLAB_URL", &closed_port_url())]);
    let app = app!(auth);
    for path in ["/monitoring/healthz", "/monitoring/ready", "/metrics"] {
        let resp =
            atest::call_service(&app, atest::TestRequest::get().uri(path).to_request()).await;
        assert_eq!(resp.status(), 200, "{path}");
    }
    let resp = atest::call_service(
        &app,
        atest::TestRequest::get().uri("/v1/whoami").to_request(),
    )
    .await;
    assert_eq!(resp.status(), 401);
    let body: Value = atest::read_body_json(resp).await;
    assert_eq!(body, json!({"error": "No authorization header presented"}));
    // A look-alike path is not exempt.
    let resp = atest::call_service(
        &app,
        atest::TestRequest::get()
            .uri("/monitoring/healthz/../../v1/whoami")
            .to_request(),
    )
    .await;
    assert_ne!(resp.status(), 200);
}

#[actix_web::test]
async fn middleware_hands_the_user_to_handlers() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let app = app!(for_issuer(&issuer));
    let token = KEY_A.sign(Some("a"), &claims(json!({"scopes": ["duo_chat"]})));
    let resp =
        atest::call_service(&app, request("/v1/whoami", &headers(&token)).to_request()).await;
    assert_eq!(resp.status(), 200);
    let body: Value = atest::read_body_json(resp).await;
    assert_eq!(body, json!({"debug": false, "scopes": ["duo_chat"]}));
}

#[actix_web::test]
async fn every_401_message_through_the_middleware() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let app = app!(for_issuer(&issuer));
    let good = KEY_A.sign(Some("a"), &claims(json!({})));
    let expired = KEY_A.sign(Some("a"), &claims(json!({"exp": now() - 3600})));
    let other_sub = KEY_A.sign(
        Some("a"),
        &claims(json!({"sub": "x", "gitlab_instance_id": null})),
    );
    let self_signed = KEY_A.sign(Some("a"), &claims(json!({"iss": SERVICE, "sub": "user-1"})));

    type Edit = Box<dyn Fn(&mut http::HeaderMap)>;
    let table: Vec<(&str, String, Edit, &str)> = vec![
        (
            "no header",
            good.clone(),
            Box::new(|h| {
                h.remove("authorization");
            }),
            "No authorization header presented",
        ),
        (
            "basic scheme",
            good.clone(),
            Box::new(|h| {
                h.insert("authorization", "Basic Zm9v".parse().unwrap());
            }),
            "Invalid authorization header",
        ),
        (
            "no auth type",
            good.clone(),
            Box::new(|h| {
                h.remove("x-gitlab-authentication-type");
            }),
            "Invalid authentication token type - only OIDC is supported",
        ),
        (
            "expired",
            expired,
            Box::new(|_| {}),
            "Forbidden by auth provider",
        ),
        (
            "realm",
            good.clone(),
            Box::new(|h| {
                h.insert("x-gitlab-realm", "saas".parse().unwrap());
            }),
            "Header mismatch 'X-Gitlab-Realm'",
        ),
        (
            "instance",
            good.clone(),
            Box::new(|h| {
                h.insert("x-gitlab-instance-id", "i-2".parse().unwrap());
            }),
            "Header mismatch 'X-Gitlab-Instance-Id'",
        ),
        (
            "sub vs instance",
            other_sub,
            Box::new(|_| {}),
            "Header mismatch 'X-Gitlab-Instance-Id'",
        ),
        (
            "sub vs global user",
            self_signed,
            Box::new(|_| {}),
            "Header mismatch 'X-Gitlab-Global-User-Id'",
        ),
    ];
    for (name, token, edit, expected) in table {
        let mut h = headers(&token);
        edit(&mut h);
        let resp = atest::call_service(&app, request("/v1/whoami", &h).to_request()).await;
        assert_eq!(resp.status(), 401, "{name}");
        let body: Value = atest::read_body_json(resp).await;
        assert_eq!(body, json!({"error": expected}), "{name}");
    }
}

#[actix_web::test]
async fn middleware_answers_500_without_keys() {
    let app = app!(authenticator(&[("AIGW_GITLAB_URL", &closed_port_url())]));
    let token = KEY_A.sign(Some("a"), &claims(json!({})));
    let resp =
        atest::call_service(&app, request("/v1/whoami", &headers(&token)).to_request()).await;
    assert_eq!(resp.status(), 500);
    let body: Value = atest::read_body_json(resp).await;
    assert_eq!(body, json!({"detail": "Internal Server Error"}));
}

#[actix_web::test]
async fn an_expired_cache_is_fetched_again() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = authenticator(&[
        ("AIGW_GITLAB_URL", &issuer.url),
        ("AIGW_AUTH__JWKS_CACHE_SECONDS", "0"),
    ]);
    for _ in 0..2 {
        let token = KEY_A.sign(Some("a"), &claims(json!({})));
        auth.authenticate(&headers(&token)).await.unwrap();
    }
    assert_eq!(issuer.discoveries(), 2);
}

#[actix_web::test]
async fn concurrent_first_requests_fetch_once() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer);
    let token = KEY_A.sign(Some("a"), &claims(json!({})));
    let h = headers(&token);
    let results = futures::future::join_all((0..5).map(|_| auth.authenticate(&h))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(issuer.discoveries(), 1);
}

#[actix_web::test]
async fn only_rs256_signature_keys_with_a_kid_are_trusted() {
    let mut enc_key = KEY_B.jwk("b");
    enc_key["use"] = json!("enc");
    let mut hs_declared = KEY_B.jwk("c");
    hs_declared["alg"] = json!("HS256");
    let mut no_kid = KEY_B.jwk("unused");
    no_kid.as_object_mut().unwrap().remove("kid");
    let keys = json!({"keys": [
        {"kty": "EC", "crv": "P-256", "kid": "ec", "x": "AAAA", "y": "AAAA"},
        {"kty": "weird"},
        enc_key,
        hs_declared,
        no_kid,
        KEY_A.jwk("a"),
    ]});
    let issuer = Issuer::start(keys);
    let auth = for_issuer(&issuer).with_min_refresh_interval(Duration::ZERO);
    let good = KEY_A.sign(Some("a"), &claims(json!({})));
    auth.authenticate(&headers(&good)).await.unwrap();
    for kid in [Some("b"), Some("c"), Some("ec"), None] {
        let token = KEY_B.sign(kid, &claims(json!({})));
        assert_eq!(
            message(&auth, &headers(&token)).await,
            "Forbidden by auth provider",
            "{kid:?}"
        );
    }
}

#[actix_web::test]
async fn a_checked_token_is_reused_only_while_its_key_stays_and_headers_still_match() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let auth = for_issuer(&issuer).with_min_refresh_interval(Duration::ZERO);
    let token = KEY_A.sign(Some("a"), &claims(json!({})));
    let first = auth.authenticate(&headers(&token)).await.unwrap();
    assert_eq!(auth.kept_tokens(), 1);
    let again = auth.authenticate(&headers(&token)).await.unwrap();
    assert_eq!(again.scopes, first.scopes);
    assert_eq!(again.claims.subject.as_deref(), Some(INSTANCE));
    assert_eq!(auth.kept_tokens(), 1, "the same token is kept once");
    // A kept token is still checked against this request's headers.
    let mut other_realm = headers(&token);
    other_realm.insert("x-gitlab-realm", "saas".parse().unwrap());
    assert_eq!(
        message(&auth, &other_realm).await,
        "Header mismatch 'X-Gitlab-Realm'"
    );
    // A token without a key id is checked every time, not kept.
    let no_kid = KEY_A.sign(None, &claims(json!({"sub": INSTANCE, "jti": "x"})));
    auth.authenticate(&headers(&no_kid)).await.unwrap();
    assert_eq!(auth.kept_tokens(), 1);
    // The issuer now names another key "a" (the old one leaked); an unknown
    // key id makes the gateway fetch the set again. The kept token was
    // verified with the replaced key, so it is checked again and refused.
    issuer.set_keys(jwks(&[(&KEY_B, "a")]));
    let unknown = KEY_B.sign(Some("made-up"), &claims(json!({})));
    assert_eq!(
        message(&auth, &headers(&unknown)).await,
        "Forbidden by auth provider"
    );
    assert_eq!(
        message(&auth, &headers(&token)).await,
        "Forbidden by auth provider"
    );
    let new = KEY_B.sign(Some("a"), &claims(json!({})));
    auth.authenticate(&headers(&new)).await.unwrap();
}

#[actix_web::test]
async fn a_kept_token_whose_key_was_replaced_is_refused_through_the_middleware() {
    let issuer = Issuer::start(jwks(&[(&KEY_A, "a")]));
    let app = app!(for_issuer(&issuer).with_min_refresh_interval(Duration::ZERO));
    let token = KEY_A.sign(Some("a"), &claims(json!({"scopes": ["duo_chat"]})));
    for _ in 0..2 {
        let resp =
            atest::call_service(&app, request("/v1/whoami", &headers(&token)).to_request()).await;
        assert_eq!(resp.status(), 200);
        let body: Value = atest::read_body_json(resp).await;
        assert_eq!(body, json!({"debug": false, "scopes": ["duo_chat"]}));
    }
    // The issuer names another key "a"; a token with an unknown kid makes
    // the gateway fetch the set again.
    issuer.set_keys(jwks(&[(&KEY_B, "a")]));
    let unknown = KEY_B.sign(Some("made-up"), &claims(json!({})));
    let resp =
        atest::call_service(&app, request("/v1/whoami", &headers(&unknown)).to_request()).await;
    assert_eq!(resp.status(), 401);
    let resp =
        atest::call_service(&app, request("/v1/whoami", &headers(&token)).to_request()).await;
    assert_eq!(resp.status(), 401);
    let body: Value = atest::read_body_json(resp).await;
    assert_eq!(body, json!({"error": "Forbidden by auth provider"}));
}
