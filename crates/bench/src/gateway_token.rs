//! A token the gateway checks as it checks the monolith's: an RS256 key made
//! for the run (given to the gateway as its validation key) and one token
//! signed with it, sent with the headers its claims must match.

use anyhow::Context;
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::{KeyPair, KeySize};
use base64::Engine;
use reqwest::header::{HeaderMap, HeaderValue};

/// The gateway's name for a key given in `AIGW_SELF_SIGNED_JWT__VALIDATION_KEY`.
const KID: &str = "gitlab-ai-gateway_validation_key";
const AUDIENCE: &str = "gitlab-ai-gateway";
const INSTANCE: &str = "bench-instance";
const USER: &str = "bench-user";

pub struct SigningKey {
    /// PKCS#8 PEM, what the gateway's variable takes.
    pub private_pem: String,
}

impl SigningKey {
    pub fn generate() -> anyhow::Result<Self> {
        let pair = KeyPair::generate(KeySize::Rsa2048).context("generating an RSA key")?;
        let der = AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(&pair)
            .context("encoding the RSA key")?;
        let body = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .filter_map(|c| std::str::from_utf8(c).ok())
            .collect();
        Ok(Self {
            private_pem: format!(
                "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
                lines.join("\n")
            ),
        })
    }

    /// An hour's token for one user of one instance, allowed to chat, with
    /// the request headers that go with it.
    pub fn request_headers(&self) -> anyhow::Result<HeaderMap> {
        let now = jsonwebtoken::get_current_timestamp();
        let claims = serde_json::json!({
            "iss": "http://bench.gitlab.invalid",
            "sub": INSTANCE,
            "aud": AUDIENCE,
            "iat": now,
            "nbf": now.saturating_sub(5),
            "exp": now + 3600,
            "jti": format!("bench-{now}"),
            "gitlab_realm": "self-managed",
            "gitlab_instance_id": INSTANCE,
            "gitlab_global_user_id": USER,
            "scopes": ["duo_chat", "explain_code"],
        });
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = Some(KID.to_owned());
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(self.private_pem.as_bytes())
            .context("reading the bench's own key")?;
        let token = jsonwebtoken::encode(&header, &claims, &key).context("signing a token")?;
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("authorization", format!("Bearer {token}")),
            ("x-gitlab-authentication-type", "oidc".to_owned()),
            ("x-gitlab-realm", "self-managed".to_owned()),
            ("x-gitlab-instance-id", INSTANCE.to_owned()),
            ("x-gitlab-global-user-id", USER.to_owned()),
        ] {
            headers.insert(name, HeaderValue::from_str(&value)?);
        }
        Ok(headers)
    }
}
