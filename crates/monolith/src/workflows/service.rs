//! The monolith's client of the Duo Workflow service (gRPC, service
//! `DuoWorkflow` without a package, so methods are `/DuoWorkflow/<Rpc>`):
//! `GenerateToken` for `direct_access`, and the `ExecuteWorkflow` stream the
//! executor socket relays. Every call carries the cloud-connector metadata of
//! the user it is made for.

use std::time::Duration;

use contracts::duo_workflow::duo_workflow_client::DuoWorkflowClient;
use contracts::duo_workflow::{Action, ClientEvent, GenerateTokenRequest, ListToolsRequest};
use futures::Stream;
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
    /// What the service can do (`tool_call_approval`, ...).
    pub server_capabilities: Vec<String>,
}

/// Largest message either way (the service's limit).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

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

    fn client(&self) -> DuoWorkflowClient<Channel> {
        // The service's messages may be as large as 4 MiB each way.
        DuoWorkflowClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// `GenerateToken`: a service token for the user whose headers these are.
    pub async fn generate_token(
        &self,
        headers: &[(String, String)],
        workflow_definition: Option<&str>,
    ) -> Result<ServiceToken, ServiceError> {
        let mut request = tonic::Request::new(GenerateTokenRequest {
            workflow_definition: workflow_definition.map(str::to_owned),
            ..GenerateTokenRequest::default()
        });
        request.set_timeout(self.timeout);
        apply_metadata(request.metadata_mut(), headers)?;
        let response = self
            .call(self.client().generate_token(request))
            .await?
            .into_inner();
        Ok(ServiceToken {
            token: response.token,
            expires_at: response.expires_at,
            server_capabilities: response.server_capabilities,
        })
    }

    /// `ListTools`: the service's tools as OpenAI-style schemas (protojson).
    pub async fn list_tools(
        &self,
        headers: &[(String, String)],
    ) -> Result<serde_json::Value, ServiceError> {
        let mut request = tonic::Request::new(ListToolsRequest::default());
        request.set_timeout(self.timeout);
        apply_metadata(request.metadata_mut(), headers)?;
        let response = self
            .call(self.client().list_tools(request))
            .await?
            .into_inner();
        super::protojson::list_tools_to_json(&response)
            .map_err(|e| ServiceError::Unreachable(e.to_string()))
    }

    /// Opens `ExecuteWorkflow`: `outbound` goes up, the service's actions come back.
    pub async fn execute_workflow(
        &self,
        headers: &[(String, String)],
        outbound: impl Stream<Item = ClientEvent> + Send + 'static,
    ) -> Result<tonic::Streaming<Action>, ServiceError> {
        let mut request = tonic::Request::new(outbound);
        apply_metadata(request.metadata_mut(), headers)?;
        Ok(self
            .call(self.client().execute_workflow(request))
            .await?
            .into_inner())
    }

    /// A call bounded by the client's timeout; an unreachable service is
    /// told apart from one that answered with an error.
    async fn call<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, ServiceError> {
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(ServiceError::Unreachable("timed out".into())),
            Ok(Err(status)) if status.code() == tonic::Code::Unavailable => {
                Err(ServiceError::Unreachable(status.message().to_owned()))
            }
            Ok(Err(status)) => Err(status.into()),
            Ok(Ok(value)) => Ok(value),
        }
    }
}

fn apply_metadata(map: &mut MetadataMap, headers: &[(String, String)]) -> Result<(), ServiceError> {
    // The call continues the current trace (the socket's handshake request).
    for (name, value) in duo_telemetry::current_headers() {
        if let Ok(value) = value.parse::<AsciiMetadataValue>() {
            map.insert(AsciiMetadataKey::from_static(name), value);
        }
    }
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
