//! Gateway JWTs verified the way the gateway does it: fetch the discovery document
//! and the JWKS over HTTP, pick the key by `kid`, check signature, audience, issuer
//! and expiry; also across a key rotation.
// Helpers outside #[test] functions panic on failure too, like the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use monolith::identity::jwt::{GatewayClaims, KeyRing, TokenSubject, claims_for};
use serde_json::Value;
use support::{Fx, Server};

async fn verify(server: &Server, token: &str) -> Result<GatewayClaims, String> {
    verify_with_issuer(server, token, None).await
}

async fn verify_with_issuer(
    server: &Server,
    token: &str,
    issuer: Option<&str>,
) -> Result<GatewayClaims, String> {
    let http = reqwest::Client::new();
    let discovery: Value = http
        .get(server.url("/.well-known/openid-configuration"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let jwks: Value = http
        .get(discovery["jwks_uri"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kid = decode_header(token)
        .map_err(|e| e.to_string())?
        .kid
        .ok_or("no kid")?;
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .ok_or_else(|| format!("kid {kid} not published"))?;
    let key =
        DecodingKey::from_rsa_components(jwk["n"].as_str().unwrap(), jwk["e"].as_str().unwrap())
            .unwrap();
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_audience(&["gitlab-ai-gateway"]);
    validation.set_issuer(&[issuer.unwrap_or(discovery["issuer"].as_str().unwrap())]);
    decode::<GatewayClaims>(token, &key, &validation)
        .map(|d| d.claims)
        .map_err(|e| e.to_string())
}

/// The web role's state (what signs gateway tokens) for `server`'s issuer.
fn signing_state(fx: &Fx, server: &Server) -> monolith::app_state::AppState {
    let url = fx.db.url().to_string();
    let config = monolith::config::Config::from_lookup(|k| match k {
        "DATABASE_URL" => Some(url.clone()),
        "DUO_EXTERNAL_URL" => Some(server.base.clone()),
        "DUO_SIGNING_KEY_DIR" => Some(support::test_key_dir()),
        _ => None,
    })
    .unwrap();
    monolith::app_state::AppState::new(
        fx.pool.clone(),
        config,
        monolith::policy::add_ons::AddOnCatalogue::built_in().unwrap(),
    )
    .unwrap()
}

fn subject(issuer: &str) -> TokenSubject<'_> {
    TokenSubject {
        user_id: 7,
        scopes: vec!["duo_chat".into(), "documentation_search".into()],
        model_endpoints: Vec::new(),
        realm: "self-managed",
        instance_id: "instance-1",
        issuer,
        audience: "gitlab-ai-gateway",
    }
}

#[tokio::test]
async fn tokens_verify_against_the_served_jwks_across_rotation() {
    let fx = Fx::new().await;
    let server = Server::start(&fx).await;
    let dir = std::env::temp_dir().join(format!("duo-jwt-test-{}", uuid::Uuid::new_v4()));
    // The server reads the shared test key directory; sign with the same ring.
    let mut ring = KeyRing::load_or_create(std::path::Path::new(&support::test_key_dir())).unwrap();
    let issuer = server.base.clone() + "/";
    let old = ring.sign(&claims_for(subject(&issuer))).unwrap();
    let claims = verify(&server, &old).await.unwrap();
    assert_eq!(claims.scopes, vec!["duo_chat", "documentation_search"]);
    assert_eq!(claims.gitlab_realm, "self-managed");
    assert_eq!(claims.aud, "gitlab-ai-gateway");
    assert!(claims.exp > claims.iat && claims.exp - claims.iat <= 3600);

    // A token from an unrelated key is refused.
    let stranger = KeyRing::load_or_create(&dir).unwrap();
    let forged = stranger.sign(&claims_for(subject(&issuer))).unwrap();
    assert!(verify(&server, &forged).await.is_err());

    // Rotation: a new key signs, the old one stays published, so both verify once the
    // server has reloaded its ring.
    let old_kid = ring.active_kid().unwrap().to_string();
    let new_kid = ring.rotate().unwrap();
    assert_ne!(old_kid, new_kid);
    // A server started before the rotation picks the new key up from the directory.
    let from_running = ring.sign(&claims_for(subject(&issuer))).unwrap();
    assert!(verify(&server, &from_running).await.is_ok());
    let served = Server::start(&fx).await;
    let new = ring
        .sign(&claims_for(subject(&(served.base.clone() + "/"))))
        .unwrap();
    assert!(verify(&served, &new).await.is_ok());
    // The token signed before the rotation still verifies against the new JWKS.
    assert!(
        verify_with_issuer(&served, &old, Some(&server.base))
            .await
            .is_ok()
    );
    let jwks: Value = reqwest::get(served.url("/oauth/discovery/keys"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kids: Vec<&str> = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k["kid"].as_str())
        .collect();
    assert!(
        kids.contains(&old_kid.as_str()) && kids.contains(&new_kid.as_str()),
        "{kids:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn user_tokens_carry_the_seats_unit_primitives() {
    let fx = Fx::new().await;
    let pro = fx.user("pro").await;
    fx.seat(pro, "duo_pro", false).await;
    let nobody = fx.user("nobody").await;
    let server = Server::start(&fx).await;
    let state = signing_state(&fx, &server);
    let token = state.gateway_token(pro.id).await.unwrap();
    let claims = verify(&server, &token).await.unwrap();
    assert!(claims.scopes.contains(&"duo_chat".to_string()));
    assert!(!claims.scopes.contains(&"ask_issue".to_string()));
    assert_eq!(claims.gitlab_realm, "self-managed");
    assert_eq!(claims.gitlab_instance_id, state.config.instance_id);
    let empty = verify(&server, &state.gateway_token(nobody.id).await.unwrap())
        .await
        .unwrap();
    assert!(empty.scopes.is_empty());
    // Instance-issued: the subject is the instance, never the user.
    assert_eq!(claims.sub, state.config.instance_id);
    assert_eq!(empty.sub, state.config.instance_id);
    assert_ne!(claims.jti, empty.jti);
}

#[tokio::test]
async fn a_running_web_role_signs_with_a_key_rotated_by_another_process() {
    let fx = Fx::new().await;
    let pro = fx.user("pro").await;
    fx.seat(pro, "duo_pro", false).await;
    let dir = std::env::temp_dir().join(format!("duo-jwt-rotate-{}", uuid::Uuid::new_v4()));
    let url = fx.db.url().to_string();
    let key_dir = dir.display().to_string();
    let config = monolith::config::Config::from_lookup(|k| match k {
        "DATABASE_URL" => Some(url.clone()),
        "DUO_SIGNING_KEY_DIR" => Some(key_dir.clone()),
        _ => None,
    })
    .unwrap();
    let state = monolith::app_state::AppState::new(
        fx.pool.clone(),
        config,
        monolith::policy::add_ons::AddOnCatalogue::built_in().unwrap(),
    )
    .unwrap();
    let kid_of = |token: &str| decode_header(token).unwrap().kid.unwrap();
    let before = kid_of(&state.gateway_token(pro.id).await.unwrap());
    let published = |jwks: Value| -> Vec<String> {
        jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kid"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(published(state.keys.jwks().unwrap()), vec![before.clone()]);

    // What `duo-monolith rotate-keys` does, from another process's point of view.
    let rotated = KeyRing::load_or_create(&dir).unwrap().rotate().unwrap();
    let after = kid_of(&state.gateway_token(pro.id).await.unwrap());
    assert_eq!(after, rotated);
    // Both keys are published: tokens signed before the rotation still verify.
    assert_eq!(published(state.keys.jwks().unwrap()), vec![before, rotated]);
    let _ = std::fs::remove_dir_all(dir);
}

/// Checks an RS256 token with nothing but the RSA primitive and the JWKS
/// numbers (no JWT library): PKCS#1 v1.5 over SHA-256 of `header.payload`.
/// Returns the payload's claims as plain JSON.
fn verify_independently(jwks: &Value, token: &str) -> Result<Value, String> {
    use base64::Engine;
    use rsa::{BigUint, Pkcs1v15Sign, RsaPublicKey};
    use sha2::Digest;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not three parts".into());
    };
    let header: Value = serde_json::from_slice(&b64.decode(header).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if header["alg"] != "RS256" {
        return Err(format!("alg {}", header["alg"]));
    }
    let jwk = jwks["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["kid"] == header["kid"]))
        .ok_or("kid not published")?;
    let number = |field: &str| -> Result<BigUint, String> {
        let text = jwk[field].as_str().ok_or(format!("no {field}"))?;
        Ok(BigUint::from_bytes_be(
            &b64.decode(text).map_err(|e| e.to_string())?,
        ))
    };
    let key = RsaPublicKey::new(number("n")?, number("e")?).map_err(|e| e.to_string())?;
    let signed = &token[..token.rfind('.').ok_or("no signature")?];
    // EMSA-PKCS1-v1_5 signs DigestInfo(SHA-256, digest): RFC 8017's fixed
    // ASN.1 prefix followed by the 32-byte hash.
    const SHA256_DIGEST_INFO: [u8; 19] = [
        0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01,
        0x05, 0x00, 0x04, 0x20,
    ];
    let mut digest_info = SHA256_DIGEST_INFO.to_vec();
    digest_info.extend_from_slice(&sha2::Sha256::digest(signed.as_bytes()));
    let signature = b64.decode(signature).map_err(|e| e.to_string())?;
    key.verify(Pkcs1v15Sign::new_unprefixed(), &digest_info, &signature)
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&b64.decode(payload).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn tokens_verify_with_the_bare_rsa_primitive() {
    let fx = Fx::new().await;
    let user = fx.user("pro").await;
    fx.seat(user, "duo_pro", false).await;
    let server = Server::start(&fx).await;
    let state = signing_state(&fx, &server);
    let token = state.gateway_token(user.id).await.unwrap();
    let jwks: Value = reqwest::get(server.url("/oauth/discovery/keys"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    let claims = verify_independently(&jwks, &token).unwrap();
    assert_eq!(claims["aud"], "gitlab-ai-gateway");
    assert_eq!(claims["iss"], server.base.trim_end_matches('/'));
    assert_eq!(claims["sub"], state.config.instance_id.as_str());
    assert_eq!(
        claims["gitlab_instance_id"],
        state.config.instance_id.as_str()
    );
    assert_eq!(claims["gitlab_realm"], "self-managed");
    assert_eq!(
        claims["gitlab_global_user_id"],
        monolith::identity::jwt::global_user_id(&state.config.instance_id, user.id).as_str()
    );
    let scopes: Vec<&str> = claims["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(scopes.contains(&"duo_chat"), "{scopes:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let exp = claims["exp"].as_u64().unwrap();
    assert!(
        exp > now && exp <= now + 3600,
        "short expiry: {exp} vs {now}"
    );

    // One flipped bit in the payload breaks the signature.
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let mut payload = parts[1].clone().into_bytes();
    payload[5] = if payload[5] == b'A' { b'B' } else { b'A' };
    parts[1] = String::from_utf8(payload).unwrap();
    assert!(verify_independently(&jwks, &parts.join(".")).is_err());
}

#[test]
fn a_gateway_token_is_reused_for_the_same_subject_and_key_only() {
    use monolith::identity::jwt::SharedKeyRing;
    let dir = std::env::temp_dir().join(format!("duo-jwt-reuse-{}", uuid::Uuid::new_v4()));
    let ring = SharedKeyRing::new(KeyRing::load_or_create(&dir).unwrap());
    let subject = |user_id: i64, scopes: &[&str], endpoints: &[&str]| TokenSubject {
        user_id,
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        model_endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
        realm: "self-managed",
        instance_id: "instance-1",
        issuer: "https://gitlab.example",
        audience: "gitlab-ai-gateway",
    };
    let claims_of = |token: &str| -> Value {
        let payload = token.split('.').nth(1).unwrap();
        serde_json::from_slice(
            &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, payload)
                .unwrap(),
        )
        .unwrap()
    };

    let first = ring.token_for(subject(1, &["duo_chat"], &[])).unwrap();
    // The same subject gets the same token (no second signature) ...
    assert_eq!(
        ring.token_for(subject(1, &["duo_chat"], &[])).unwrap(),
        first
    );
    // ... and any other subject its own, saying what it is.
    for (other, scopes, endpoints) in [
        (2, &["duo_chat"][..], &[][..]),
        (1, &["duo_chat", "ask_issue"][..], &[][..]),
        (1, &[][..], &[][..]),
        (1, &["duo_chat"][..], &["http://model.example/v1"][..]),
    ] {
        let token = ring.token_for(subject(other, scopes, endpoints)).unwrap();
        assert_ne!(token, first);
        let claims = claims_of(&token);
        assert_eq!(claims["scopes"], serde_json::json!(scopes));
        let expected_user = monolith::identity::jwt::global_user_id("instance-1", other);
        assert_eq!(claims["gitlab_global_user_id"], expected_user.as_str());
        if endpoints.is_empty() {
            assert!(claims.get("model_endpoints").is_none());
        } else {
            assert_eq!(claims["model_endpoints"], serde_json::json!(endpoints));
        }
    }
    // A directory listed well after its last change is not listed again
    // while its time stays: backdate it, so the next use settles.
    std::fs::File::open(&dir)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        ring.token_for(subject(1, &["duo_chat"], &[])).unwrap(),
        first
    );
    // A key rotated in by another process signs the next token at once.
    let rotated = KeyRing::load_or_create(&dir).unwrap().rotate().unwrap();
    let after = ring.token_for(subject(1, &["duo_chat"], &[])).unwrap();
    assert_ne!(after, first);
    assert_eq!(decode_header(&after).unwrap().kid.unwrap(), rotated);

    // Without a reuse window every call signs anew.
    let fresh = SharedKeyRing::with_reuse(
        KeyRing::load_or_create(&dir).unwrap(),
        std::time::Duration::ZERO,
    );
    let one = fresh.token_for(subject(1, &["duo_chat"], &[])).unwrap();
    let two = fresh.token_for(subject(1, &["duo_chat"], &[])).unwrap();
    assert_ne!(claims_of(&one)["jti"], claims_of(&two)["jti"]);
    let _ = std::fs::remove_dir_all(dir);
}
