//! What a Duo Workflow run needs to reach the workflow service for one user:
//! the cloud-connector headers (a signed instance JWT scoped to the user's
//! unit primitives, realm, instance and global user id) and the model the
//! instance chose for the Duo Agent Platform feature.

use crate::queries::Queries;
use serde_json::{Value, json};

use crate::ai_models::{Choice, Feature, ModelStore};
use crate::config::Config;
use crate::identity::jwt::{SharedKeyRing, TokenSubject, claims_for, global_user_id};
use crate::policy::Policy;

/// The header carrying the model choice to the service.
pub const MODEL_METADATA_HEADER: &str = "x-gitlab-agent-platform-model-metadata";

/// The GitLab version we present ourselves as to the workflow service (its
/// client-capability checks start at 18.7).
pub const GITLAB_VERSION: &str = "18.7.0";

/// Why a run's access could not be put together.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// An admin switched the Duo Agent Platform feature off.
    #[error("Duo Agent Platform is disabled on this instance")]
    Disabled,
    #[error("{0}")]
    Internal(String),
}

/// The model metadata of the Duo Agent Platform feature, as GitLab serialises
/// it: GitLab-managed (`provider: gitlab`) or a self-hosted model. The API key
/// is included only when `with_key` (server-to-server, never to a client).
pub async fn model_metadata(
    db: &impl Queries,
    models: &ModelStore,
    with_key: bool,
) -> Result<Value, AccessError> {
    let choice = models
        .choice(db, Feature::DuoAgentPlatform)
        .await
        .map_err(|e| AccessError::Internal(e.to_string()))?;
    Ok(match choice {
        Choice::Disabled => return Err(AccessError::Disabled),
        Choice::Vendored => json!({
            "provider": "gitlab",
            "feature_setting": Feature::DuoAgentPlatform.key(),
            "identifier": Value::Null,
        }),
        Choice::SelfHosted(meta) => {
            let mut v = json!({
                "provider": meta.provider,
                "name": meta.name,
                "endpoint": meta.endpoint,
                "identifier": meta.identifier,
            });
            if with_key && let (Some(key), Some(obj)) = (meta.api_key, v.as_object_mut()) {
                obj.insert("api_key".into(), json!(key));
            }
            v
        }
    })
}

/// The endpoint of a self-hosted model in [`model_metadata`]'s answer: the
/// one the workflow token vouches for, so the service may call it.
pub fn self_hosted_endpoint(model: &Value) -> Option<&str> {
    if model["provider"].as_str() == Some("gitlab") {
        return None;
    }
    model["endpoint"].as_str().filter(|e| !e.is_empty())
}

/// GitLab's cloud-connector headers for a call made for `user_id`, with
/// lower-case names: `authorization` (an instance JWT whose scopes are the
/// unit primitives the user's seats grant, vouching for `model_endpoint`),
/// `x-gitlab-authentication-type`, realm, instance id, global user id, host
/// name and version.
pub async fn cloud_connector_headers(
    db: &impl Queries,
    policy: &Policy,
    keys: &SharedKeyRing,
    config: &Config,
    user_id: i64,
    model_endpoint: Option<&str>,
) -> Result<Vec<(String, String)>, AccessError> {
    use contracts::headers;
    let internal = |e: &dyn std::fmt::Display| AccessError::Internal(e.to_string());
    let scopes = policy
        .seat_unit_primitives(db, user_id)
        .await
        .map_err(|e| internal(&e))?;
    let realm: String = db
        .query_one("SELECT realm FROM instance_settings", &[])
        .await
        .map_err(|e| internal(&e))?
        .get(0);
    let claims = claims_for(TokenSubject {
        user_id,
        scopes: scopes.iter().map(|s| s.as_str().to_owned()).collect(),
        model_endpoints: model_endpoint.map(str::to_owned).into_iter().collect(),
        realm: &realm,
        instance_id: &config.instance_id,
        issuer: config.external_url.as_str(),
        audience: &config.gateway_audience,
    });
    let token = keys.sign(&claims).map_err(|e| internal(&e))?;
    Ok(vec![
        (headers::AUTHORIZATION.into(), format!("Bearer {token}")),
        (
            headers::AUTHENTICATION_TYPE.into(),
            headers::AUTHENTICATION_TYPE_OIDC.into(),
        ),
        (headers::REALM.into(), realm),
        (headers::INSTANCE_ID.into(), config.instance_id.clone()),
        (
            headers::GLOBAL_USER_ID.into(),
            global_user_id(&config.instance_id, user_id),
        ),
        (
            headers::HOST_NAME.into(),
            config
                .external_url
                .host_str()
                .unwrap_or_default()
                .to_owned(),
        ),
        (headers::VERSION.into(), GITLAB_VERSION.into()),
    ])
}

/// The workflow service's address as `direct_access` reports it (`host:port`).
pub fn service_base_url(url: &url::Url) -> String {
    match (url.host_str(), url.port_or_known_default()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_owned(),
        _ => url.to_string(),
    }
}

/// What a run needs to talk to the workflow service for `user_id`: the
/// service's token for the flow and the request metadata to send with it
/// (cloud-connector headers, the model header with a self-hosted model's
/// key, GitLab's base URL).
pub struct ServiceSession {
    pub token: super::service::ServiceToken,
    /// Without `authorization`: callers send the token their own way.
    pub headers: Vec<(String, String)>,
}

/// A service session for one run of `definition` by `user_id`.
#[allow(clippy::too_many_arguments)]
pub async fn service_session(
    db: &impl Queries,
    policy: &Policy,
    keys: &SharedKeyRing,
    config: &Config,
    models: &ModelStore,
    client: &super::service::ServiceClient,
    user_id: i64,
    definition: &str,
) -> Result<ServiceSession, AccessError> {
    let model = model_metadata(db, models, true).await?;
    let mut headers = cloud_connector_headers(
        db,
        policy,
        keys,
        config,
        user_id,
        self_hosted_endpoint(&model),
    )
    .await?;
    let token = client
        .generate_token(&headers, Some(definition))
        .await
        .map_err(|e| AccessError::Internal(e.to_string()))?;
    headers.retain(|(name, _)| name != contracts::headers::AUTHORIZATION);
    headers.push((MODEL_METADATA_HEADER.into(), model.to_string()));
    headers.push((
        "x-gitlab-base-url".into(),
        config
            .external_url
            .as_str()
            .trim_end_matches('/')
            .to_owned(),
    ));
    Ok(ServiceSession { token, headers })
}
