//! The `DuoWorkflow` gRPC service: the RPC handlers, the per-workflow lock,
//! and the server with GitLab's limits, keep-alive, TLS and health.

use super::auth::{HEADER_MODEL_METADATA, MintedToken, WorkflowAuth, WorkflowCaller, may_run_flow};
use super::engine::{Flow, Run, RunError, Services};
use super::link::{ExecutorLink, MAX_ACTION_BYTES};
use super::model_choice::{AgentModelMetadata, ModelChoice};
use super::tools::{CATALOGUE, UnitPrimitives, unit_primitive};
use contracts::duo_workflow::duo_workflow_server::{DuoWorkflow, DuoWorkflowServer};
use contracts::duo_workflow::{
    Action, Capability, ClientEvent, GenerateTokenRequest, GenerateTokenResponse, Kind,
    ListCapabilitiesRequest, ListCapabilitiesResponse, ListFlowsRequest, ListFlowsResponse,
    ListToolsRequest, ListToolsResponse, Struct, ValidateFlowConfigRequest,
    ValidateFlowConfigResponse, Value as ProtoValue, client_event,
};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

/// Capabilities this service announces (`ListCapabilities`, `GenerateToken`).
pub const CAPABILITIES: [&str; 1] = ["tool_call_approval"];
/// How long a new stream may take to send its start request.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Actions buffered towards a slow executor.
const OUTBOUND_BUFFER: usize = 16;

/// Workflows with a running stream in this process.
#[derive(Default)]
pub struct RunningWorkflows {
    ids: Mutex<HashSet<String>>,
}

/// Removes its workflow from [`RunningWorkflows`] when dropped.
pub struct RunLock {
    running: Arc<RunningWorkflows>,
    key: String,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        self.running
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

impl RunningWorkflows {
    fn acquire(self: &Arc<Self>, key: String) -> Option<RunLock> {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if !ids.insert(key.clone()) {
            return None;
        }
        Some(RunLock {
            running: self.clone(),
            key,
        })
    }

    pub fn count(&self) -> usize {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The service state; cheap to clone.
#[derive(Clone)]
pub struct WorkflowService {
    pub services: Arc<Services>,
    pub auth: Arc<WorkflowAuth>,
    pub running: Arc<RunningWorkflows>,
}

impl WorkflowService {
    async fn caller<T>(&self, request: &Request<T>) -> Result<WorkflowCaller, Status> {
        self.auth.authenticate(request.metadata()).await
    }

    /// The tonic service with GitLab's message limits.
    pub fn into_server(self) -> DuoWorkflowServer<Self> {
        DuoWorkflowServer::new(self)
            .max_decoding_message_size(MAX_ACTION_BYTES)
            .max_encoding_message_size(MAX_ACTION_BYTES)
    }
}

/// serde_json to protobuf `Struct` values.
pub fn to_proto_value(value: &Value) -> ProtoValue {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(contracts::duo_workflow::ListValue {
            values: items.iter().map(to_proto_value).collect(),
        }),
        Value::Object(_) => Kind::StructValue(to_struct(value)),
    };
    ProtoValue { kind: Some(kind) }
}

pub fn to_struct(value: &Value) -> Struct {
    Struct {
        fields: value
            .as_object()
            .map(|map| {
                map.iter()
                    .map(|(k, v)| (k.clone(), to_proto_value(v)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn flow_config(flow: Flow) -> Value {
    let agents: Vec<Value> = flow
        .agents()
        .iter()
        .map(|a| json!({"name": a.name, "prompt_id": a.prompt_id, "tools": a.tools}))
        .collect();
    json!({
        "flow_identifier": flow.name(),
        "version": "v1",
        "environment": if flow == Flow::Chat { "chat" } else { "ide" },
        "agents": agents,
    })
}

#[tonic::async_trait]
impl DuoWorkflow for WorkflowService {
    type ExecuteWorkflowStream = ReceiverStream<Result<Action, Status>>;

    async fn execute_workflow(
        &self,
        request: Request<Streaming<ClientEvent>>,
    ) -> Result<Response<Self::ExecuteWorkflowStream>, Status> {
        let caller = self.caller(&request).await?;
        // The run is one span of the executor's (or monolith's) trace.
        let run_span = tracing::info_span!(
            "workflow.run",
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.method = "ExecuteWorkflow",
            duo.workflow.definition = tracing::field::Empty,
        );
        if duo_telemetry::traces_enabled() {
            duo_telemetry::continue_from_headers(
                &run_span,
                &request.metadata().clone().into_headers(),
            );
        }
        let model = ModelChoice {
            metadata: AgentModelMetadata::parse(
                request
                    .metadata()
                    .get(HEADER_MODEL_METADATA)
                    .and_then(|v| v.to_str().ok()),
            ),
            vouched: caller.model_endpoints.clone(),
            debug: caller.is_debug,
        };
        // A header may name only an endpoint the token vouches for; refused
        // before anything runs (the gateway's keys never go there anyway).
        model
            .check(&self.services.providers)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        let unit_primitives = UnitPrimitives {
            held: caller.scopes.clone(),
            all: caller.is_debug,
        };
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(START_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::invalid_argument("no start request arrived"))??;
        let start = match first.and_then(|event| event.response) {
            Some(client_event::Response::StartRequest(start)) => start,
            _ => {
                return Err(Status::invalid_argument(
                    "the first event must be a start request",
                ));
            }
        };
        let flow = Flow::from_request(&start)?;
        if !may_run_flow(&caller, flow.name()) {
            return Err(Status::permission_denied(format!(
                "Unauthorized to execute {}",
                flow.name()
            )));
        }
        let lock = self
            .running
            .acquire(format!(
                "{}#{}",
                caller.lock_owner(),
                start.workflow_id.trim()
            ))
            .ok_or_else(|| {
                Status::aborted(format!(
                    "workflow {} is already running in another session",
                    start.workflow_id.trim()
                ))
            })?;
        let (outbound, receiver) = mpsc::channel(OUTBOUND_BUFFER);
        let (link, reader) =
            ExecutorLink::start(outbound, inbound, self.services.config.action_timeout);
        let services = self.services.clone();
        run_span.record("duo.workflow.definition", flow.name());
        tokio::spawn(
            async move {
                let workflow_id = start.workflow_id.clone();
                let outcome =
                    Run::execute(services, link.clone(), start, flow, model, unit_primitives).await;
                match outcome {
                    Ok(outcome) => {
                        tracing::info!(%workflow_id, ?outcome, "{}", outcome.message());
                    }
                    Err(RunError::HungUp) => {
                        tracing::info!(%workflow_id, "the executor hung up; the run is cancelled");
                    }
                    Err(err) => link.fail(err.status()).await,
                }
                reader.abort();
                drop(lock);
                // Dropping the last sender ends the stream with OK.
                drop(link);
            }
            .instrument(run_span),
        );
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn generate_token(
        &self,
        request: Request<GenerateTokenRequest>,
    ) -> Result<Response<GenerateTokenResponse>, Status> {
        let caller = self.caller(&request).await?;
        if let Some(definition) = request.get_ref().workflow_definition.as_deref()
            && Flow::named(definition).is_none()
        {
            return Err(Status::invalid_argument(format!(
                "Unknown workflow definition: {definition}"
            )));
        }
        let MintedToken { token, expires_at } = self.auth.mint(&caller)?;
        Ok(Response::new(GenerateTokenResponse {
            token,
            expires_at,
            server_capabilities: CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
        }))
    }

    async fn list_capabilities(
        &self,
        request: Request<ListCapabilitiesRequest>,
    ) -> Result<Response<ListCapabilitiesResponse>, Status> {
        self.caller(&request).await?;
        Ok(Response::new(ListCapabilitiesResponse {
            capabilities: CAPABILITIES
                .iter()
                .map(|name| Capability {
                    name: (*name).to_owned(),
                    metadata: String::new(),
                })
                .collect(),
        }))
    }

    async fn list_tools(
        &self,
        request: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        let caller = self.caller(&request).await?;
        Ok(Response::new(ListToolsResponse {
            // Not the tools whose feature needs a unit primitive the caller
            // lacks: no run of theirs is offered them.
            tools: CATALOGUE
                .iter()
                .filter(|tool| unit_primitive(&tool.name).is_none_or(|up| caller.can(up)))
                .map(|tool| to_struct(&tool.openai_schema()))
                .collect(),
            eval_dataset: Vec::new(),
        }))
    }

    async fn list_flows(
        &self,
        request: Request<ListFlowsRequest>,
    ) -> Result<Response<ListFlowsResponse>, Status> {
        self.caller(&request).await?;
        let wanted = request
            .get_ref()
            .filters
            .as_ref()
            .map(|f| f.flow_identifier.clone())
            .unwrap_or_default();
        let configs = [Flow::Chat, Flow::SoftwareDevelopment]
            .into_iter()
            .filter(|flow| wanted.is_empty() || wanted.iter().any(|w| w == flow.name()))
            .map(|flow| to_struct(&flow_config(flow)))
            .collect();
        Ok(Response::new(ListFlowsResponse { configs }))
    }

    async fn validate_flow_config(
        &self,
        request: Request<ValidateFlowConfigRequest>,
    ) -> Result<Response<ValidateFlowConfigResponse>, Status> {
        self.caller(&request).await?;
        Ok(Response::new(ValidateFlowConfigResponse {
            valid: false,
            errors: vec![
                "inline flow configurations are not supported by this service; use the chat or software_development flow".to_owned(),
            ],
        }))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("could not read the TLS files: {0}")]
    Tls(String),
    #[error("the workflow service failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("could not listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
}

/// GitLab's server options: keep-alive pings every 20 s, 24 KiB of metadata.
pub fn server_builder(
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
) -> Result<tonic::transport::Server, ServeError> {
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .http2_max_header_list_size(24 * 1024)
        .tcp_nodelay(true);
    if let Some((cert, key)) = tls {
        let cert = std::fs::read(&cert)
            .map_err(|e| ServeError::Tls(format!("{}: {e}", cert.display())))?;
        let key =
            std::fs::read(&key).map_err(|e| ServeError::Tls(format!("{}: {e}", key.display())))?;
        let identity = tonic::transport::Identity::from_pem(cert, key);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| ServeError::Tls(e.to_string()))?;
    }
    Ok(builder)
}

/// Serves the service and gRPC health on `listener` until `shutdown`
/// resolves; health turns NOT_SERVING first, then running streams get
/// `grace` to end.
pub async fn serve(
    service: WorkflowService,
    listener: tokio::net::TcpListener,
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<(), ServeError> {
    serve_draining(
        service,
        listener,
        tls,
        std::future::pending::<()>(),
        shutdown,
        grace,
    )
    .await
}

/// As [`serve`], but health already turns NOT_SERVING when `draining`
/// resolves (the gateway's readiness stopping at SIGTERM), while calls are
/// still accepted until `shutdown`: health checkers and load balancers move
/// new workflows elsewhere during the drain, as they do for the HTTP side.
pub async fn serve_draining(
    service: WorkflowService,
    listener: tokio::net::TcpListener,
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    draining: impl std::future::Future<Output = ()> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<(), ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<DuoWorkflowServer<WorkflowService>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let running = service.running.clone();
    let stopping = async move {
        tokio::pin!(shutdown);
        tokio::select! {
            () = draining => {
                set_not_serving(&reporter).await;
                (&mut shutdown).await;
            }
            () = &mut shutdown => {}
        }
        set_not_serving(&reporter).await;
        let deadline = tokio::time::Instant::now() + grace;
        while running.count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // The builder's `tcp_nodelay` applies only to listeners tonic opens
    // itself: without it here, each small message after another waited for
    // the executor's delayed ACK (about 40 ms a step).
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |accepted| {
            if let Ok(stream) = &accepted
                && let Err(e) = stream.set_nodelay(true)
            {
                tracing::debug!(error = %e, "could not turn Nagle's algorithm off");
            }
            accepted
        },
    );
    server_builder(tls)?
        .add_service(health)
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, stopping)
        .await?;
    Ok(())
}

async fn set_not_serving(reporter: &tonic_health::server::HealthReporter) {
    reporter
        .set_not_serving::<DuoWorkflowServer<WorkflowService>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
}

/// Binds `address` ("host:port").
pub async fn bind(address: &str) -> Result<tokio::net::TcpListener, ServeError> {
    let addr: Result<SocketAddr, _> = address.parse();
    let result = match addr {
        Ok(addr) => tokio::net::TcpListener::bind(addr).await,
        Err(_) => tokio::net::TcpListener::bind(address).await,
    };
    result.map_err(|source| ServeError::Bind {
        address: address.to_owned(),
        source,
    })
}
