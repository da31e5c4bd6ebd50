//! A real gRPC server playing the Duo Workflow service (the real one comes
//! with the workflow service crate): it records what the monolith sends and
//! runs a small script on each `ExecuteWorkflow` stream.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use contracts::duo_workflow::duo_workflow_server::{DuoWorkflow, DuoWorkflowServer};
use contracts::duo_workflow::*;
use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

/// What one `ExecuteWorkflow` stream does after the start request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// Reads the workflow and starts it through `runHTTPRequest`s (answered by
    /// the monolith), asks the client to read a file, sends a checkpoint,
    /// then ends the stream.
    Relay,
    /// Keeps the stream open until the client goes away.
    Hold,
    /// Sends a `GET` `runHTTPRequest` for each path (ids `h0`, `h1`, ...),
    /// then one for the workflow itself (`h-workflow`), each after the last
    /// was answered; then a checkpoint, and ends the stream.
    HttpPaths(&'static [&'static str]),
}

#[derive(Default, Debug)]
pub struct Seen {
    /// Metadata of each GenerateToken call.
    pub token_calls: Vec<HashMap<String, String>>,
    /// Metadata of each ExecuteWorkflow stream.
    pub streams: Vec<HashMap<String, String>>,
    /// Every client event, in order.
    pub events: Vec<ClientEvent>,
    /// Streams that ended (the client's side closed).
    pub ended: usize,
}

pub struct FakeService {
    pub url: String,
    pub seen: Arc<Mutex<Seen>>,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for FakeService {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

struct Svc {
    seen: Arc<Mutex<Seen>>,
    script: Script,
}

fn metadata_of(map: &tonic::metadata::MetadataMap) -> HashMap<String, String> {
    map.iter()
        .filter_map(|kv| match kv {
            tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned()))
            }
            _ => None,
        })
        .collect()
}

fn http_action(id: &str, method: &str, path: &str, body: Option<&str>) -> Action {
    Action {
        request_id: id.into(),
        action: Some(action::Action::RunHttpRequest(RunHttpRequest {
            method: method.into(),
            path: path.into(),
            body: body.map(str::to_owned),
        })),
    }
}

/// Waits for the client's answer to `id`, recording every event.
async fn answer_to(
    inbound: &mut Streaming<ClientEvent>,
    seen: &Arc<Mutex<Seen>>,
    id: &str,
) -> Option<ActionResponse> {
    while let Ok(Some(event)) = inbound.message().await {
        seen.lock().unwrap().events.push(event.clone());
        if let Some(client_event::Response::ActionResponse(r)) = event.response
            && r.request_id == id
        {
            return Some(r);
        }
    }
    None
}

type ActionStream = Pin<Box<dyn Stream<Item = Result<Action, Status>> + Send>>;

#[tonic::async_trait]
impl DuoWorkflow for Svc {
    type ExecuteWorkflowStream = ActionStream;

    async fn execute_workflow(
        &self,
        request: Request<Streaming<ClientEvent>>,
    ) -> Result<Response<ActionStream>, Status> {
        self.seen
            .lock()
            .unwrap()
            .streams
            .push(metadata_of(request.metadata()));
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<Action, Status>>(16);
        let seen = self.seen.clone();
        let script = self.script;
        tokio::spawn(async move {
            let Ok(Some(first)) = inbound.message().await else {
                return;
            };
            seen.lock().unwrap().events.push(first.clone());
            let Some(client_event::Response::StartRequest(start)) = first.response else {
                let _ = tx
                    .send(Err(Status::invalid_argument(
                        "the first event must be a start request",
                    )))
                    .await;
                return;
            };
            if script == Script::Hold {
                while let Ok(Some(event)) = inbound.message().await {
                    seen.lock().unwrap().events.push(event);
                }
                seen.lock().unwrap().ended += 1;
                return;
            }
            let path = format!("/api/v4/ai/duo_workflows/workflows/{}", start.workflow_id);
            if let Script::HttpPaths(paths) = script {
                let ids = (0..paths.len()).map(|n| format!("h{n}"));
                let requests = ids
                    .zip(paths.iter().map(|p| (*p).to_owned()))
                    .chain([("h-workflow".to_owned(), path.clone())]);
                for (id, target) in requests {
                    let _ = tx.send(Ok(http_action(&id, "GET", &target, None))).await;
                    answer_to(&mut inbound, &seen, &id).await;
                }
                let _ = tx
                    .send(Ok(Action {
                        request_id: "cp-1".into(),
                        action: Some(action::Action::NewCheckpoint(NewCheckpoint {
                            status: "RUNNING".into(),
                            checkpoint: r#"{"channel_values":{"ui_chat_log":[]}}"#.into(),
                            ..NewCheckpoint::default()
                        })),
                    }))
                    .await;
                return;
            }
            let _ = tx.send(Ok(http_action("get-1", "GET", &path, None))).await;
            answer_to(&mut inbound, &seen, "get-1").await;
            let _ = tx
                .send(Ok(http_action(
                    "patch-1",
                    "PATCH",
                    &path,
                    Some(r#"{"status_event":"start"}"#),
                )))
                .await;
            answer_to(&mut inbound, &seen, "patch-1").await;
            let _ = tx
                .send(Ok(Action {
                    request_id: "read-1".into(),
                    action: Some(action::Action::RunReadFile(ReadFile {
                        filepath: "README.md".into(),
                        ..ReadFile::default()
                    })),
                }))
                .await;
            answer_to(&mut inbound, &seen, "read-1").await;
            let _ = tx
                .send(Ok(Action {
                    request_id: "cp-1".into(),
                    action: Some(action::Action::NewCheckpoint(NewCheckpoint {
                        status: "RUNNING".into(),
                        checkpoint: r#"{"channel_values":{"ui_chat_log":[]}}"#.into(),
                        goal: start.goal.clone(),
                        ..NewCheckpoint::default()
                    })),
                }))
                .await;
            // Dropping `tx` ends the stream with OK.
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn generate_token(
        &self,
        request: Request<GenerateTokenRequest>,
    ) -> Result<Response<GenerateTokenResponse>, Status> {
        let metadata = metadata_of(request.metadata());
        let user = metadata
            .get("x-gitlab-global-user-id")
            .cloned()
            .unwrap_or_default();
        self.seen.lock().unwrap().token_calls.push(metadata);
        Ok(Response::new(GenerateTokenResponse {
            token: format!("service-token-for-{user}"),
            expires_at: 1_900_000_000,
            server_capabilities: vec!["tool_call_approval".into()],
        }))
    }

    async fn list_capabilities(
        &self,
        _request: Request<ListCapabilitiesRequest>,
    ) -> Result<Response<ListCapabilitiesResponse>, Status> {
        Ok(Response::new(ListCapabilitiesResponse::default()))
    }

    async fn list_tools(
        &self,
        _request: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        let mut fields = std::collections::BTreeMap::new();
        fields.insert(
            "name".to_owned(),
            contracts::duo_workflow::Value {
                kind: Some(Kind::StringValue("read_file".into())),
            },
        );
        Ok(Response::new(ListToolsResponse {
            tools: vec![Struct { fields }],
            eval_dataset: Vec::new(),
        }))
    }

    async fn list_flows(
        &self,
        _request: Request<ListFlowsRequest>,
    ) -> Result<Response<ListFlowsResponse>, Status> {
        Ok(Response::new(ListFlowsResponse::default()))
    }

    async fn validate_flow_config(
        &self,
        _request: Request<ValidateFlowConfigRequest>,
    ) -> Result<Response<ValidateFlowConfigResponse>, Status> {
        Ok(Response::new(ValidateFlowConfigResponse::default()))
    }
}

/// Starts the fake service on a free loopback port.
pub async fn start(script: Script) -> FakeService {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop, stopped) = oneshot::channel::<()>();
    let svc = Svc {
        seen: seen.clone(),
        script,
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(DuoWorkflowServer::new(svc))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
    });
    FakeService {
        url: format!("http://{addr}"),
        seen,
        stop: Some(stop),
    }
}
