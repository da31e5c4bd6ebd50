//! Shared by the tests that sign tokens: RSA keys generated once per test
//! process, as PEM (what `AIGW_SELF_SIGNED_JWT__SIGNING_KEY` takes) and as a
//! JWK (what an issuer publishes), and RS256 tokens signed with them.
#![allow(dead_code)]
#![expect(
    clippy::unwrap_used,
    reason = "test support: failing loudly is the point"
)]

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair as RsaKeyPair, KeySize};
use aws_lc_rs::signature::KeyPair as _;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

pub struct TestKey {
    pub private_pem: String,
    pub public_pem: String,
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// A new RSA-2048 key (slow: keep it in a `LazyLock`).
pub fn generate_key() -> TestKey {
    let pair = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let private = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&pair).unwrap();
    let public = AsDer::<aws_lc_rs::encoding::PublicKeyX509Der>::as_der(pair.public_key()).unwrap();
    TestKey {
        private_pem: pem("PRIVATE KEY", private.as_ref()),
        public_pem: pem("PUBLIC KEY", public.as_ref()),
    }
}

impl TestKey {
    /// The public key as a JWKS entry, with key id `kid`.
    pub fn jwk(&self, kid: &str) -> Value {
        let encoding = EncodingKey::from_rsa_pem(self.private_pem.as_bytes()).unwrap();
        let mut jwk = Jwk::from_encoding_key(&encoding, Algorithm::RS256).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        let mut value = serde_json::to_value(jwk).unwrap();
        value["use"] = json!("sig");
        value
    }

    /// An RS256 token of `claims`, naming `kid` in its header when given.
    pub fn sign(&self, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = kid.map(str::to_owned);
        let key = EncodingKey::from_rsa_pem(self.private_pem.as_bytes()).unwrap();
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }
}

/// Now, in the seconds of `exp`, `iat` and `nbf`.
pub fn now() -> i64 {
    jsonwebtoken::get_current_timestamp() as i64
}
