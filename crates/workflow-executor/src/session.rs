//! One workflow session: streams to the service, replies to actions, shows
//! checkpoints, asks for approvals and reconnects with the answer.

use crate::actions::ActionRunner;
use contracts::duo_workflow::duo_workflow_client::DuoWorkflowClient;
use contracts::duo_workflow::{
    Approval, ClientEvent, HeartbeatRequest, NewCheckpoint, StartWorkflowRequest, action, approval,
    client_event,
};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::Value;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// How to reach the service.
#[derive(Debug, Clone)]
pub struct ServiceTarget {
    /// `http://host:port` or `https://host:port`.
    pub url: String,
    pub token: String,
    /// Extra metadata (the `x-gitlab-*` headers from `direct_access`).
    pub headers: Vec<(String, String)>,
    /// A PEM CA certificate for TLS (else the system's roots).
    pub ca_pem: Option<Vec<u8>>,
}

/// What the user decides when the service asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Approve,
    Reject(Option<String>),
    /// Nobody could answer: leave the workflow paused.
    Unanswered,
}

/// Asks for approvals (the terminal, or `--approve` rules).
pub trait Approver: Send {
    /// `request` describes the pending tool calls or the plan.
    fn decide(&mut self, status: &str, request: &PendingRequest) -> Decision;
}

/// What is waiting for approval, from the last checkpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PendingRequest {
    /// (tool name, JSON arguments) of each call waiting.
    pub tool_calls: Vec<(String, Value)>,
    pub plan: Vec<String>,
}

impl PendingRequest {
    fn from_checkpoint(checkpoint: &NewCheckpoint) -> Self {
        let Ok(value) = serde_json::from_str::<Value>(&checkpoint.checkpoint) else {
            return Self::default();
        };
        let values = &value["channel_values"];
        let tool_calls = values["ui_chat_log"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["message_type"] == "request" && e["status"] == "pending")
            .filter_map(|e| {
                let info = e.get("tool_info")?;
                Some((info["name"].as_str()?.to_owned(), info["args"].clone()))
            })
            .collect();
        let plan = values["plan"]["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["description"].as_str().map(str::to_owned))
            .collect();
        Self { tool_calls, plan }
    }
}

/// How a finished run ended: its `workflow_end` entry says whether it
/// changed nothing (sub type `no_changes`).
fn finished(checkpoint: &NewCheckpoint) -> SessionEnd {
    let Ok(value) = serde_json::from_str::<Value>(&checkpoint.checkpoint) else {
        return SessionEnd::Finished;
    };
    let end = value["channel_values"]["ui_chat_log"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find(|e| e["message_type"] == "workflow_end");
    match end {
        Some(e) if e["message_sub_type"] == "no_changes" => {
            SessionEnd::FinishedWithoutChanges(e["content"].as_str().unwrap_or_default().to_owned())
        }
        _ => SessionEnd::Finished,
    }
}

/// Prints what happens (the terminal UI, or nothing in tests).
pub trait Reporter: Send {
    fn checkpoint(&mut self, checkpoint: &NewCheckpoint);
    fn action(&mut self, action: &action::Action);
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEnd {
    Finished,
    /// Finished, but a software development run changed nothing: the
    /// service's last word on it.
    FinishedWithoutChanges(String),
    /// Left paused: an approval nobody could give.
    Paused(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot reach the workflow service at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("the workflow service refused the run ({code:?}): {message}")]
    Refused { code: Code, message: String },
    #[error("the workflow {0}")]
    Ended(String),
    #[error("bad option: {0}")]
    Options(String),
}

/// Options for [`run`].
pub struct Session<'a> {
    pub target: ServiceTarget,
    pub workflow_id: String,
    pub goal: String,
    pub workflow_definition: String,
    pub runner: ActionRunner,
    pub approver: &'a mut dyn Approver,
    pub reporter: &'a mut dyn Reporter,
    /// Reconnects after a dropped connection (not after refusals).
    pub max_reconnects: u32,
}

async fn connect(target: &ServiceTarget) -> Result<DuoWorkflowClient<Channel>, SessionError> {
    let connect_error = |reason: String| SessionError::Connect {
        url: target.url.clone(),
        reason,
    };
    let mut endpoint = Endpoint::from_shared(target.url.clone())
        .map_err(|e| connect_error(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(45))
        .keep_alive_while_idle(true);
    if target.url.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        tls = match &target.ca_pem {
            Some(pem) => tls.ca_certificate(tonic::transport::Certificate::from_pem(pem)),
            None => tls.with_native_roots(),
        };
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| connect_error(e.to_string()))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| connect_error(e.to_string()))?;
    Ok(DuoWorkflowClient::new(channel)
        .max_decoding_message_size(4 * 1024 * 1024)
        .max_encoding_message_size(4 * 1024 * 1024))
}

fn request_with_metadata<T>(
    target: &ServiceTarget,
    body: T,
) -> Result<tonic::Request<T>, SessionError> {
    let mut request = tonic::Request::new(body);
    let metadata = request.metadata_mut();
    let bad = |name: &str| SessionError::Options(format!("header {name} is not valid metadata"));
    let bearer = MetadataValue::try_from(format!("Bearer {}", target.token))
        .map_err(|_| bad("authorization"))?;
    metadata.insert("authorization", bearer);
    metadata.insert(
        "x-gitlab-authentication-type",
        MetadataValue::from_static("oidc"),
    );
    // The run continues this process's trace in the workflow service.
    for (name, value) in duo_telemetry::current_headers() {
        let value = MetadataValue::try_from(value.as_str()).map_err(|_| bad(name))?;
        metadata.insert(MetadataKey::from_static(name), value);
    }
    for (name, value) in &target.headers {
        let key =
            MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(|_| bad(name))?;
        let value = MetadataValue::try_from(value.as_str()).map_err(|_| bad(name))?;
        metadata.insert(key, value);
    }
    Ok(request)
}

/// Runs the workflow to its end: through approval pauses (reconnecting with
/// the answer) and dropped connections (resumed from the newest checkpoint).
pub async fn run(session: Session<'_>) -> Result<SessionEnd, SessionError> {
    let Session {
        target,
        workflow_id,
        goal,
        workflow_definition,
        runner,
        approver,
        reporter,
        max_reconnects,
    } = session;
    let mut approval: Option<Approval> = None;
    let mut first = true;
    let mut reconnects = 0;
    loop {
        let start = StartWorkflowRequest {
            client_version: env!("CARGO_PKG_VERSION").to_owned(),
            workflow_id: workflow_id.clone(),
            workflow_definition: workflow_definition.clone(),
            goal: if first { goal.clone() } else { String::new() },
            client_capabilities: vec!["command_timeout".to_owned()],
            mcp_tools: runner
                .mcp
                .as_ref()
                .map(|hub| hub.offered())
                .unwrap_or_default(),
            approval: approval.take(),
            ..StartWorkflowRequest::default()
        };
        let outcome = stream_once(&target, start, &runner, reporter).await;
        first = false;
        let last = match outcome {
            Ok(last) => last,
            Err(StreamError::Dropped(reason)) if reconnects < max_reconnects => {
                reconnects += 1;
                tracing::warn!(%reason, reconnects, "connection lost; resuming from the newest checkpoint");
                tokio::time::sleep(Duration::from_millis(500 * u64::from(reconnects))).await;
                continue;
            }
            Err(StreamError::Dropped(reason)) => {
                return Err(SessionError::Connect {
                    url: target.url.clone(),
                    reason,
                });
            }
            Err(StreamError::Session(err)) => return Err(err),
        };
        let Some(last) = last else {
            return Err(SessionError::Ended(
                "stream ended before any checkpoint".to_owned(),
            ));
        };
        match last.status.as_str() {
            "FINISHED" => return Ok(finished(&last)),
            "TOOL_CALL_APPROVAL_REQUIRED" | "PLAN_APPROVAL_REQUIRED" => {
                let pending = PendingRequest::from_checkpoint(&last);
                let decision = approver.decide(&last.status, &pending);
                approval = Some(match decision {
                    Decision::Approve => Approval {
                        user_decision: Some(approval::UserDecision::Approval(
                            approval::Approved::default(),
                        )),
                    },
                    Decision::Reject(message) => Approval {
                        user_decision: Some(approval::UserDecision::Rejection(
                            approval::Rejected { message },
                        )),
                    },
                    Decision::Unanswered => return Ok(SessionEnd::Paused(last.status)),
                });
            }
            "FAILED" => {
                return Err(SessionError::Ended(format!(
                    "failed: {}",
                    last.errors.join("; ")
                )));
            }
            "STOPPED" => return Err(SessionError::Ended("was stopped".to_owned())),
            other => {
                return Err(SessionError::Ended(format!(
                    "stream ended while the workflow was {other}"
                )));
            }
        }
    }
}

enum StreamError {
    /// The connection broke: worth resuming.
    Dropped(String),
    Session(SessionError),
}

/// One `ExecuteWorkflow` stream; returns the last checkpoint notification.
async fn stream_once(
    target: &ServiceTarget,
    start: StartWorkflowRequest,
    runner: &ActionRunner,
    reporter: &mut dyn Reporter,
) -> Result<Option<NewCheckpoint>, StreamError> {
    let mut client = connect(target)
        .await
        .map_err(|e| StreamError::Dropped(e.to_string()))?;
    let (outbound, receiver) = mpsc::channel::<ClientEvent>(16);
    let _ = outbound
        .send(ClientEvent {
            response: Some(client_event::Response::StartRequest(start)),
        })
        .await;
    let request = request_with_metadata(target, ReceiverStream::new(receiver))
        .map_err(StreamError::Session)?;
    let response = client.execute_workflow(request).await.map_err(|status| {
        if matches!(status.code(), Code::Unavailable | Code::Unknown) {
            StreamError::Dropped(status.message().to_owned())
        } else {
            StreamError::Session(SessionError::Refused {
                code: status.code(),
                message: status.message().to_owned(),
            })
        }
    })?;
    let mut actions = response.into_inner();
    let _heartbeat = AbortOnDrop({
        let outbound = outbound.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_secs(60));
            interval.tick().await;
            loop {
                interval.tick().await;
                let timestamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(0);
                let beat = ClientEvent {
                    response: Some(client_event::Response::Heartbeat(HeartbeatRequest {
                        timestamp,
                    })),
                };
                if outbound.send(beat).await.is_err() {
                    return;
                }
            }
        })
    });
    let mut last = None;
    // Actions run side by side: the service stores checkpoints while its
    // next step goes on, so a checkpoint's HTTP call must not hold up the
    // step's own action (replies carry their request id). The service waits
    // for each tool action before sending the next, so those stay in order.
    let mut running = FuturesUnordered::new();
    loop {
        let message = tokio::select! {
            Some(reply) = running.next(), if !running.is_empty() => {
                if let Some(reply) = reply {
                    let event = ClientEvent {
                        response: Some(client_event::Response::ActionResponse(reply)),
                    };
                    if outbound.send(event).await.is_err() {
                        return Err(StreamError::Dropped("the stream closed".to_owned()));
                    }
                }
                continue;
            }
            message = actions.message() => message,
        };
        match message {
            Ok(Some(action)) => {
                let Some(kind) = action.action else {
                    continue;
                };
                let kind = match kind {
                    action::Action::NewCheckpoint(checkpoint) => {
                        reporter.checkpoint(&checkpoint);
                        last = Some(checkpoint);
                        continue;
                    }
                    kind => kind,
                };
                reporter.action(&kind);
                let request_id = action.request_id;
                running.push(async move { runner.perform(&request_id, &kind).await });
            }
            Ok(None) => {
                // Let actions under way finish (a half-written file helps no
                // one); their replies have nowhere to go.
                while running.next().await.is_some() {}
                return Ok(last);
            }
            Err(status) => {
                return Err(match status.code() {
                    Code::Unavailable | Code::Unknown | Code::Cancelled => {
                        StreamError::Dropped(status.message().to_owned())
                    }
                    code => StreamError::Session(SessionError::Refused {
                        code,
                        message: status.message().to_owned(),
                    }),
                });
            }
        }
    }
}

/// Ends the heartbeat task with the stream, also when the stream's future is
/// dropped midway: the task holds a sender, and a live sender would keep the
/// stream open towards the service.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
