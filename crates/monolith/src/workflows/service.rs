//! The monolith's client of the Duo Workflow service (gRPC, service
//! `DuoWorkflow` without a package, so methods are `/DuoWorkflow/<Rpc>`):
//! `GenerateToken` for `direct_access`, and the `ExecuteWorkflow` stream the
//! executor socket relays. Every call carries the cloud-connector metadata of
//! the user it is made for.

use std::time::Duration;

use contracts::duo_workflow::{Action, ClientEvent, GenerateTokenRequest, GenerateTokenResponse};
use futures::Stream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint};

/// Why a call to the service failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("invalid workflow service address: {0}")]
    Address(String),
    #[error("the workflow service is unreachable: {0}")]
    Unreachable(String),
    #[error("the workflow service answered {code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    #[error("invalid metadata {0}")]
    Metadata(String),
}

impl From<tonic::Status> for ServiceError {
    fn from(s: tonic::Status) -> Self {
        ServiceError::Status {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}

/// A token the service minted for one user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceToken {
    pub token: String,
    /// Seconds since the Unix epoch.
    pub expires_at: i64,
}

/// A lazily connected client; cheap to clone.
#[derive(Clone, Debug)]
pub struct ServiceClient {
    channel: Channel,
    timeout: Duration,
}

impl ServiceClient {
    /// A client for `url` (`http://host:port`); connects on first use.
    pub fn new(url: &url::Url, timeout: Duration) -> Result<Self, ServiceError> {
        let endpoint = Endpoint::from_shared(url.as_str().trim_end_matches('/').to_owned())
            .map_err(|e| ServiceError::Address(e.to_string()))?
            .connect_timeout(timeout)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_while_idle(true);
        Ok(Self {
            channel: endpoint.connect_lazy(),
            timeout,
        })
    }

    async fn ready(&self) -> Result<tonic::client::Grpc<Channel>, ServiceError> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        tokio::time::timeout(self.timeout, grpc.ready())
            .await
            .map_err(|_| ServiceError::Unreachable("timed out".into()))?
            .map_err(|e| ServiceError::Unreachable(e.to_string()))?;
        Ok(grpc)
    }

    /// `GenerateToken`: a service token for the user whose headers these are.
    pub async fn generate_token(
        &self,
        headers: &[(String, String)],
    ) -> Result<ServiceToken, ServiceError> {
        let mut grpc = self.ready().await?;
        let mut request = tonic::Request::new(GenerateTokenRequest::default());
        request.set_timeout(self.timeout);
        apply_metadata(request.metadata_mut(), headers)?;
        let codec = tonic_prost::ProstCodec::<GenerateTokenRequest, GenerateTokenResponse>::default();
        let response = grpc
            .unary(
                request,
                PathAndQuery::from_static("/DuoWorkflow/GenerateToken"),
                codec,
            )
            .await?
            .into_inner();
        Ok(ServiceToken {
            token: response.token,
            expires_at: response.expires_at,
        })
    }

    /// Opens `ExecuteWorkflow`: `outbound` goes up, the service's actions come back.
    pub async fn execute_workflow(
        &self,
        headers: &[(String, String)],
        outbound: impl Stream<Item = ClientEvent> + Send + 'static,
    ) -> Result<tonic::Streaming<Action>, ServiceError> {
        let mut grpc = self.ready().await?;
        let mut request = tonic::Request::new(outbound);
        apply_metadata(request.metadata_mut(), headers)?;
        let codec = tonic_prost::ProstCodec::<ClientEvent, Action>::default();
        Ok(grpc
            .streaming(
                request,
                PathAndQuery::from_static("/DuoWorkflow/ExecuteWorkflow"),
                codec,
            )
            .await?
            .into_inner())
    }
}

fn apply_metadata(map: &mut MetadataMap, headers: &[(String, String)]) -> Result<(), ServiceError> {
    for (name, value) in headers {
        let key = AsciiMetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
            .map_err(|_| ServiceError::Metadata(name.clone()))?;
        let value: AsciiMetadataValue = value
            .parse()
            .map_err(|_| ServiceError::Metadata(name.clone()))?;
        map.insert(key, value);
    }
    Ok(())
}
