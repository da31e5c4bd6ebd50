//! The `duo-workflow-executor` binary against a scripted workflow service (a
//! real gRPC server on loopback sending the actions a test gives, one at a
//! time, and recording each reply) and a GitLab stand-in (a real HTTP server
//! recording every request it gets).
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test support fails loudly"
)]

use contracts::duo_workflow::duo_workflow_server::{DuoWorkflow, DuoWorkflowServer};
use contracts::duo_workflow::*;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

/// The service token the executor presents (a secret the tests look for).
pub const SERVICE_TOKEN: &str = "svc-secret-token-4d1f";
/// The GitLab token given with `--token`.
pub const GITLAB_TOKEN: &str = "glpat-secret-token-9b2c";

type ActionStream = Pin<Box<dyn futures::Stream<Item = Result<Action, Status>> + Send>>;

struct Scripted {
    actions: Arc<Mutex<Option<oneshot::Receiver<Vec<Action>>>>>,
    replies: Arc<Mutex<Vec<ActionResponse>>>,
}

#[tonic::async_trait]
impl DuoWorkflow for Scripted {
    type ExecuteWorkflowStream = ActionStream;

    async fn execute_workflow(
        &self,
        request: Request<Streaming<ClientEvent>>,
    ) -> Result<Response<ActionStream>, Status> {
        let mut inbound = request.into_inner();
        let script = self.actions.lock().unwrap().take();
        let replies = self.replies.clone();
        let (tx, rx) = mpsc::channel::<Result<Action, Status>>(4);
        tokio::spawn(async move {
            let Ok(Some(first)) = inbound.message().await else {
                return;
            };
            if !matches!(
                first.response,
                Some(client_event::Response::StartRequest(_))
            ) {
                return;
            }
            let actions = match script {
                Some(script) => script.await.unwrap_or_default(),
                None => Vec::new(),
            };
            for action in actions {
                let id = action.request_id.clone();
                if tx.send(Ok(action)).await.is_err() {
                    return;
                }
                while let Ok(Some(event)) = inbound.message().await {
                    if let Some(client_event::Response::ActionResponse(reply)) = event.response
                        && reply.request_id == id
                    {
                        replies.lock().unwrap().push(reply);
                        break;
                    }
                }
            }
            let _ = tx
                .send(Ok(Action {
                    request_id: "done".into(),
                    action: Some(action::Action::NewCheckpoint(NewCheckpoint {
                        status: "FINISHED".into(),
                        checkpoint: "{}".into(),
                        ..NewCheckpoint::default()
                    })),
                }))
                .await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn generate_token(
        &self,
        _: Request<GenerateTokenRequest>,
    ) -> Result<Response<GenerateTokenResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn list_capabilities(
        &self,
        _: Request<ListCapabilitiesRequest>,
    ) -> Result<Response<ListCapabilitiesResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn list_tools(
        &self,
        _: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn list_flows(
        &self,
        _: Request<ListFlowsRequest>,
    ) -> Result<Response<ListFlowsResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn validate_flow_config(
        &self,
        _: Request<ValidateFlowConfigRequest>,
    ) -> Result<Response<ValidateFlowConfigResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

/// One request the GitLab stand-in received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// `METHOD /path?query` as it arrived on the wire.
    pub line: String,
    pub authorization: Option<String>,
}

/// A plain HTTP/1.1 server: `/api/v4/redirect` answers 302 to `/admin`,
/// every other path 200 with a small JSON body.
pub struct GitLab {
    pub url: String,
    pub received: Arc<Mutex<Vec<Received>>>,
}

impl GitLab {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buffer = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match socket.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buffer[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let mut lines = head.split("\r\n");
                    let request_line = lines.next().unwrap_or_default();
                    let line = request_line
                        .rsplit_once(' ')
                        .map_or(request_line, |(l, _)| l)
                        .to_owned();
                    let authorization = lines.find_map(|l| {
                        l.split_once(':')
                            .filter(|(name, _)| name.eq_ignore_ascii_case("authorization"))
                            .map(|(_, value)| value.trim().to_owned())
                    });
                    let redirect = line.ends_with(" /api/v4/redirect");
                    log.lock().unwrap().push(Received {
                        line,
                        authorization,
                    });
                    let response = if redirect {
                        "HTTP/1.1 302 Found\r\nLocation: /admin\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
                    } else {
                        let body = r#"{"ok":true}"#;
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self { url, received }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// What one executor run did.
pub struct Run {
    pub exit_code: Option<i32>,
    pub stderr: String,
    /// Replies in the order the actions were sent.
    pub replies: Vec<ActionResponse>,
}

impl Run {
    /// The (response, error) text of reply `index` (plain text or HTTP).
    pub fn reply(&self, index: usize) -> (String, String) {
        let reply = self.replies.get(index).unwrap_or_else(|| {
            panic!(
                "no reply {index} ({} replies); executor log:\n{}",
                self.replies.len(),
                self.stderr
            )
        });
        match reply.response_type.clone().expect("a response") {
            action_response::ResponseType::PlainTextResponse(text) => (text.response, text.error),
            action_response::ResponseType::HttpResponse(http) => (http.body, http.error),
            other => (format!("{other:?}"), String::new()),
        }
    }

    pub fn http(&self, index: usize) -> HttpResponse {
        match self.replies[index].response_type.clone() {
            Some(action_response::ResponseType::HttpResponse(http)) => http,
            other => panic!("reply {index} is not HTTP: {other:?}"),
        }
    }
}

/// An action with an id of its position.
pub fn numbered(actions: Vec<action::Action>) -> Vec<Action> {
    actions
        .into_iter()
        .enumerate()
        .map(|(n, action)| Action {
            request_id: format!("a{n}"),
            action: Some(action),
        })
        .collect()
}

pub fn command(program: &str, arguments: &[&str]) -> action::Action {
    action::Action::RunCommand(RunCommandAction {
        program: program.into(),
        arguments: arguments.iter().map(|a| (*a).to_owned()).collect(),
        flags: Vec::new(),
        timeout: Some(30),
    })
}

/// Runs the executor binary in `workspace` against a scripted service; the
/// actions are built from the executor's process id (for `/proc` checks).
/// `env` is added to the executor's own environment.
pub async fn run_executor(
    workspace: &Path,
    gitlab_url: &str,
    env: &[(&str, &str)],
    actions: impl FnOnce(u32) -> Vec<action::Action>,
) -> Run {
    let (give, script) = oneshot::channel();
    let replies = Arc::new(Mutex::new(Vec::new()));
    let service = Scripted {
        actions: Arc::new(Mutex::new(Some(script))),
        replies: replies.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service_url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(DuoWorkflowServer::new(service))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
    });
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_duo-workflow-executor"))
        .args(["--gitlab-url", gitlab_url, "--token", GITLAB_TOKEN])
        .args(["--workflow-id", "1"])
        .args(["--service-url", &service_url])
        .args(["--service-token", SERVICE_TOKEN])
        .arg("--workspace")
        .arg(workspace)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    give.send(numbered(actions(pid))).unwrap();
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the executor finished in time")
        .unwrap();
    let _ = stop.send(());
    let replies = replies.lock().unwrap().clone();
    Run {
        exit_code: output.status.code(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        replies,
    }
}
