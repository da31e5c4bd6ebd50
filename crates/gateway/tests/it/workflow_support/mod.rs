//! Shared by the workflow service tests: the real gRPC server on loopback, a
//! test double of the monolith (OIDC keys and the internal workflow REST API
//! with GitLab's status machine and checkpoint store), tokens, and a test
//! executor built on the real `workflow-executor` library.
#![allow(dead_code)]
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test support: failing loudly is the point"
)]

use crate::key_support::{TestKey, generate_key, now};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use contracts::duo_workflow::duo_workflow_client::DuoWorkflowClient;
use contracts::duo_workflow::{
    ClientEvent, NewCheckpoint, StartWorkflowRequest, action, client_event,
};
use fake_provider::FakeProvider;
use gateway::Config;
use gateway::app_state::AppState;
use gateway::workflow_service::WorkflowService;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use workflow_executor::session::{
    self, Approver, Decision, PendingRequest, Reporter, Session, SessionEnd,
};
use workflow_executor::{ActionRunner, GitLabTarget, Limits, ServiceTarget, Workspace};

pub const REALM: &str = "self-managed";
pub const INSTANCE: &str = "instance-1";
pub const USER: &str = "user-7";
/// The `ai_workflows` OAuth token the monolith double accepts.
pub const GITLAB_TOKEN: &str = "glpat-workflow-token";
/// The scopes a caller needs to run the chat flow.
pub const CHAT_SCOPES: &[&str] = &["duo_chat", "duo_agent_platform"];

/// The monolith's signing key (published in its JWKS).
pub static MONOLITH_KEY: LazyLock<TestKey> = LazyLock::new(generate_key);
/// The gateway's own key (`AIGW_SELF_SIGNED_JWT__SIGNING_KEY`).
pub static SERVICE_KEY: LazyLock<TestKey> = LazyLock::new(generate_key);

/// A token as the monolith mints it for the gateway, with these scopes.
pub fn monolith_token(scopes: &[&str]) -> String {
    monolith_token_vouching(scopes, &[])
}

/// A monolith token that also vouches for these self-hosted model endpoints
/// (the `model_endpoints` claim).
pub fn monolith_token_vouching(scopes: &[&str], model_endpoints: &[&str]) -> String {
    let claims = json!({
        "model_endpoints": model_endpoints,
        "aud": "gitlab-ai-gateway",
        "iss": "http://monolith.test",
        "sub": INSTANCE,
        "exp": now() + 300,
        "iat": now(),
        "nbf": now() - 5,
        "gitlab_realm": REALM,
        "gitlab_instance_id": INSTANCE,
        "gitlab_global_user_id": USER,
        "scopes": scopes,
    });
    MONOLITH_KEY.sign(Some("monolith-1"), &claims)
}

pub fn metadata_headers() -> Vec<(String, String)> {
    vec![
        ("x-gitlab-realm".into(), REALM.into()),
        ("x-gitlab-instance-id".into(), INSTANCE.into()),
        ("x-gitlab-global-user-id".into(), USER.into()),
    ]
}

/// One workflow in the monolith double.
#[derive(Debug, Clone)]
pub struct StoredWorkflow {
    pub status: String,
    pub project_id: i64,
    pub definition: String,
    pub privileges: Vec<i64>,
    pub pre_approved: Vec<i64>,
    /// Stored checkpoints, oldest first.
    pub checkpoints: Vec<Value>,
    /// `status_event`s accepted, in order.
    pub events: Vec<String>,
    pub model_metadata_json: Option<String>,
    /// What the monolith's MCP switches say for the workflow.
    pub mcp_enabled: bool,
}

#[derive(Default)]
pub struct MonolithState {
    pub workflows: BTreeMap<i64, StoredWorkflow>,
    /// Method and path of every workflow API request.
    pub requests: Vec<String>,
    /// When set, each checkpoint POST takes a permit first (and keeps it):
    /// a test holds writes back to see the run go on without them.
    pub checkpoint_gate: Option<Arc<tokio::sync::Semaphore>>,
}

/// The monolith's side for the service: OIDC discovery and JWKS, and the
/// internal workflow REST API (`ai_workflows` token), with GitLab's status
/// machine and messages.
#[derive(Clone)]
pub struct Monolith {
    pub url: String,
    pub state: Arc<Mutex<MonolithState>>,
}

fn transition(event: &str, from: &str) -> Result<&'static str, String> {
    let awaiting = [
        "input_required",
        "plan_approval_required",
        "tool_call_approval_required",
    ];
    let to = match event {
        "start" if from == "created" => "running",
        "require_tool_call_approval" if from == "running" => "tool_call_approval_required",
        "require_plan_approval" if from == "running" => "plan_approval_required",
        "require_input" if from == "running" => "input_required",
        "pause" if from == "running" => "paused",
        "resume" if from == "paused" || awaiting.contains(&from) => "running",
        "retry" if ["running", "stopped", "failed"].contains(&from) => "running",
        "finish" if from == "running" => "finished",
        "drop" if from != "finished" && from != "failed" && from != "stopped" => "failed",
        "stop" if from != "finished" && from != "failed" && from != "stopped" => "stopped",
        "start"
        | "require_tool_call_approval"
        | "require_plan_approval"
        | "require_input"
        | "pause"
        | "resume"
        | "retry"
        | "finish"
        | "drop"
        | "stop" => {
            return Err(format!("Can not {event} workflow that has status {from}"));
        }
        other => {
            return Err(format!(
                "Can not update workflow status, unsupported event: {other}"
            ));
        }
    };
    Ok(to)
}

fn entity(id: i64, w: &StoredWorkflow) -> Value {
    json!({
        "id": id,
        "project_id": w.project_id,
        "status": w.status,
        "workflow_definition": w.definition,
        "agent_privileges": w.privileges,
        "pre_approved_agent_privileges": w.pre_approved,
        "mcp_enabled": w.mcp_enabled,
    })
}

async fn workflow_api(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<Arc<Mutex<MonolithState>>>,
) -> HttpResponse {
    let path = req.path().to_owned();
    if req.method() == actix_web::http::Method::POST && path.ends_with("/checkpoints") {
        let gate = state.lock().unwrap().checkpoint_gate.clone();
        if let Some(gate) = gate {
            gate.acquire().await.unwrap().forget();
        }
    }
    let mut state = state.lock().unwrap();
    state
        .requests
        .push(format!("{} {}", req.method(), req.uri()));
    let authorized = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {GITLAB_TOKEN}"));
    if !authorized {
        return HttpResponse::Unauthorized().json(json!({"message": "401 Unauthorized"}));
    }
    // The code index behind `semantic_code_search`: one chunk, whatever
    // the question.
    if req.method() == actix_web::http::Method::GET && path.ends_with("/semantic_code_search") {
        return HttpResponse::Ok().json(json!([{
            "path": "README.md", "start_line": 1, "end_line": 1,
            "content": "Hello (indexed)", "score": 0.9,
        }]));
    }
    let rest = path
        .strip_prefix("/api/v4/ai/duo_workflows/workflows/")
        .unwrap_or_default();
    let mut parts = rest.split('/');
    let Some(id) = parts.next().and_then(|id| id.parse::<i64>().ok()) else {
        return HttpResponse::NotFound().json(json!({"message": "404 Not Found"}));
    };
    let Some(workflow) = state.workflows.get_mut(&id) else {
        return HttpResponse::NotFound().json(json!({"message": "404 Not found"}));
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match (req.method().as_str(), parts.next()) {
        ("GET", None) => HttpResponse::Ok().json(entity(id, workflow)),
        ("PATCH", None) => {
            let event = body["status_event"].as_str().unwrap_or_default().to_owned();
            match transition(&event, &workflow.status) {
                Ok(to) => {
                    workflow.status = to.to_owned();
                    workflow.events.push(event);
                    HttpResponse::Ok().json(json!({"workflow": entity(id, workflow)}))
                }
                Err(message) => HttpResponse::BadRequest().json(json!({"message": message})),
            }
        }
        ("POST", Some("checkpoints")) => {
            if body["checkpoint"].is_null() || body["thread_ts"].as_str().is_none() {
                return HttpResponse::BadRequest().json(
                    json!({"message": "Either checkpoint or compressed_checkpoint must be provided"}),
                );
            }
            if let Some(metadata) = body["model_metadata_json"].as_str() {
                workflow.model_metadata_json = Some(metadata.to_owned());
            }
            workflow.checkpoints.push(body.clone());
            HttpResponse::Created().json(json!({
                "id": workflow.checkpoints.len(),
                "thread_ts": body["thread_ts"],
                "parent_ts": body["parent_ts"],
                "checkpoint_ns": "",
            }))
        }
        ("GET", Some("checkpoints")) => {
            let per_page = req
                .query_string()
                .split('&')
                .find_map(|kv| kv.strip_prefix("per_page="))
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(20);
            let mut newest_first: Vec<Value> = workflow.checkpoints.clone();
            newest_first.sort_by(|a, b| {
                b["thread_ts"]
                    .as_str()
                    .unwrap_or_default()
                    .cmp(a["thread_ts"].as_str().unwrap_or_default())
            });
            newest_first.truncate(per_page);
            HttpResponse::Ok().json(newest_first)
        }
        _ => HttpResponse::NotFound().json(json!({"message": "404 Not Found"})),
    }
}

impl Monolith {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(MonolithState::default()));
        let data = web::Data::new(state.clone());
        let jwks = json!({"keys": [MONOLITH_KEY.jwk("monolith-1")]});
        let issuer = url.clone();
        let server = HttpServer::new(move || {
            let jwks = jwks.clone();
            let issuer = issuer.clone();
            App::new()
                .app_data(data.clone())
                .route(
                    "/.well-known/openid-configuration",
                    web::get().to(move || {
                        let body = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/oauth/discovery/keys")});
                        async move { HttpResponse::Ok().json(body) }
                    }),
                )
                .route(
                    "/oauth/discovery/keys",
                    web::get().to(move || {
                        let body = jwks.clone();
                        async move { HttpResponse::Ok().json(body) }
                    }),
                )
                .default_service(web::to(workflow_api))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        actix_web::rt::spawn(server);
        Self { url, state }
    }

    /// A workflow in status `created`.
    pub fn create_workflow(
        &self,
        definition: &str,
        privileges: &[i64],
        pre_approved: &[i64],
    ) -> i64 {
        let mut state = self.state.lock().unwrap();
        let id = state.workflows.len() as i64 + 1;
        state.workflows.insert(
            id,
            StoredWorkflow {
                status: "created".into(),
                project_id: 1,
                definition: definition.into(),
                privileges: privileges.to_vec(),
                pre_approved: pre_approved.to_vec(),
                checkpoints: Vec::new(),
                events: Vec::new(),
                model_metadata_json: None,
                mcp_enabled: false,
            },
        );
        id
    }

    /// Turns the monolith's MCP switches on for workflow `id`.
    pub fn enable_mcp(&self, id: i64) {
        let mut state = self.state.lock().unwrap();
        state.workflows.get_mut(&id).unwrap().mcp_enabled = true;
    }

    pub fn workflow(&self, id: i64) -> StoredWorkflow {
        self.state.lock().unwrap().workflows[&id].clone()
    }
}

/// The workflow service on loopback, over a real gateway state.
pub struct Service {
    pub url: String,
    pub service: WorkflowService,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Configuration: the monolith double as OIDC issuer, the service's own
/// key, fast retries, and `provider` variables (pick the model wire).
pub fn config(monolith: &Monolith, provider: &[(&str, String)]) -> Config {
    let mut vars: Vec<(&str, String)> = vec![
        ("AIGW_GITLAB_URL", monolith.url.clone()),
        (
            "AIGW_SELF_SIGNED_JWT__SIGNING_KEY",
            SERVICE_KEY.private_pem.clone(),
        ),
        (
            "AIGW_WORKFLOW_SERVICE__HTTP_RETRY_BASE_MILLISECONDS",
            "10".into(),
        ),
    ];
    vars.extend(provider.iter().cloned());
    let borrowed: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Config::for_tests(&borrowed).unwrap()
}

/// Anthropic at the fake provider.
pub fn anthropic(fake: &fake_provider::FakeProvider) -> Vec<(&'static str, String)> {
    vec![
        ("ANTHROPIC_API_KEY", "sk-test".into()),
        ("ANTHROPIC_BASE_URL", fake.url()),
    ]
}

/// An OpenAI-compatible server at the fake provider (and no Anthropic).
pub fn openai(fake: &fake_provider::FakeProvider) -> Vec<(&'static str, String)> {
    vec![("OPENAI_BASE_URL", fake.openai_base_url())]
}

impl Service {
    pub async fn start(config: Config) -> Self {
        let state = AppState::build(config).unwrap();
        let service = WorkflowService::build(&state).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = service.clone();
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            gateway::workflow_service::server::serve(
                serving,
                listener,
                None,
                shutdown,
                std::time::Duration::from_millis(100),
            )
            .await
            .unwrap();
        });
        Self {
            url,
            service,
            stop: Some(stop),
        }
    }

    pub fn target(&self, token: &str) -> ServiceTarget {
        ServiceTarget {
            url: self.url.clone(),
            token: token.to_owned(),
            headers: metadata_headers(),
            ca_pem: None,
        }
    }

    pub async fn client(&self) -> DuoWorkflowClient<Channel> {
        DuoWorkflowClient::connect(self.url.clone()).await.unwrap()
    }

    /// Waits (bounded) until no workflow runs in the service.
    pub async fn wait_idle(&self) {
        for _ in 0..500 {
            if self.service.running.count() == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("a workflow is still running");
    }
}

/// What most workflow service tests start with: the fake provider, the
/// monolith double and the service, configured by `provider` (given the
/// fake, it names the model wire: [`anthropic`], [`openai`]...).
pub async fn harness(
    provider: impl FnOnce(&FakeProvider) -> Vec<(&'static str, String)>,
) -> (FakeProvider, Monolith, Service) {
    let fake = FakeProvider::start().await.unwrap();
    let monolith = Monolith::start();
    let service = Service::start(config(&monolith, &provider(&fake))).await;
    (fake, monolith, service)
}

/// Waits (bounded) until the fake provider has received `count` requests.
pub async fn wait_for_requests(fake: &FakeProvider, count: usize) {
    for _ in 0..500 {
        if fake.requests().len() >= count {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!(
        "the fake provider got {} of {count} requests",
        fake.requests().len()
    );
}

/// A session of the test executor, ready to run: a caller with
/// [`CHAT_SCOPES`] on one workflow, its actions run in a workspace against
/// the monolith double. Tests change fields (the target's headers) first.
pub struct TestSession {
    pub target: ServiceTarget,
    pub workflow_id: String,
    pub goal: String,
    pub workflow_definition: String,
    pub runner: ActionRunner,
}

impl TestSession {
    /// Runs the session to its end, without reconnecting.
    pub async fn run(
        self,
        approver: &mut dyn Approver,
        reporter: &mut dyn Reporter,
    ) -> Result<SessionEnd, workflow_executor::SessionError> {
        session::run(Session {
            target: self.target,
            workflow_id: self.workflow_id,
            goal: self.goal,
            workflow_definition: self.workflow_definition,
            runner: self.runner,
            approver,
            reporter,
            max_reconnects: 0,
        })
        .await
    }
}

impl Service {
    /// A session on workflow `id` running `definition` towards `goal`.
    pub fn session(
        &self,
        monolith: &Monolith,
        workspace: &TempWorkspace,
        id: i64,
        definition: &str,
        goal: &str,
    ) -> TestSession {
        TestSession {
            target: self.target(&monolith_token(CHAT_SCOPES)),
            workflow_id: id.to_string(),
            goal: goal.to_owned(),
            workflow_definition: definition.to_owned(),
            runner: runner(&workspace.path, monolith),
        }
    }
}

/// A request with the usual metadata and `token`.
pub fn request<T>(body: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(body);
    let metadata = request.metadata_mut();
    metadata.insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    metadata.insert(
        "x-gitlab-authentication-type",
        MetadataValue::from_static("oidc"),
    );
    for (name, value) in metadata_headers() {
        metadata.insert(
            tonic::metadata::MetadataKey::from_bytes(name.as_bytes()).unwrap(),
            MetadataValue::try_from(value).unwrap(),
        );
    }
    request
}

/// A workspace directory removed when dropped.
pub struct TempWorkspace {
    pub path: PathBuf,
}

impl TempWorkspace {
    pub fn new(files: &[(&str, &str)]) -> Self {
        let path = std::env::temp_dir().join(format!(
            "workflow-ws-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&path).unwrap();
        for (name, content) in files {
            let file = path.join(name);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, content).unwrap();
        }
        Self { path }
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path.join(name)).unwrap()
    }
}

impl Drop for TempWorkspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub fn runner(workspace: &Path, monolith: &Monolith) -> ActionRunner {
    ActionRunner {
        workspace: Workspace::new(workspace).unwrap(),
        limits: Limits::default(),
        gitlab: Some(GitLabTarget {
            base_url: monolith.url.clone(),
            token: GITLAB_TOKEN.to_owned(),
            client: reqwest::Client::new(),
        }),
        mcp: None,
    }
}

/// Answers approvals from a script and records what it was asked; `check`
/// runs first (tests assert there that nothing was edited yet).
pub struct ScriptedApprover {
    pub decisions: Vec<Decision>,
    pub asked: Vec<(String, PendingRequest)>,
    pub check: Option<Box<dyn FnMut() + Send>>,
}

impl ScriptedApprover {
    pub fn new(decisions: Vec<Decision>) -> Self {
        Self {
            decisions,
            asked: Vec::new(),
            check: None,
        }
    }
}

impl Approver for ScriptedApprover {
    fn decide(&mut self, status: &str, request: &PendingRequest) -> Decision {
        if let Some(check) = self.check.as_mut() {
            check();
        }
        self.asked.push((status.to_owned(), request.clone()));
        if self.decisions.is_empty() {
            Decision::Unanswered
        } else {
            self.decisions.remove(0)
        }
    }
}

/// Records actions and checkpoint statuses; can signal when an action of a
/// given kind arrives.
#[derive(Default)]
pub struct Recorder {
    pub actions: Vec<String>,
    pub statuses: Vec<String>,
    pub request_ids: Vec<String>,
}

impl Reporter for Recorder {
    fn checkpoint(&mut self, checkpoint: &NewCheckpoint) {
        self.statuses.push(checkpoint.status.clone());
    }

    fn action(&mut self, action: &action::Action) {
        use action::Action as A;
        self.actions.push(match action {
            A::RunHttpRequest(r) => format!("{} {}", r.method, r.path),
            A::RunReadFile(r) => format!("read {}", r.filepath),
            A::RunEditFile(r) => format!("edit {}", r.filepath),
            A::RunWriteFile(r) => format!("write {}", r.filepath),
            A::RunCommand(r) => format!("run {} {}", r.program, r.arguments.join(" ")),
            other => format!("{other:?}"),
        });
    }
}

/// A raw stream: the test sends events itself and reads actions.
pub struct RawStream {
    pub events: mpsc::Sender<ClientEvent>,
    pub actions: tonic::Streaming<contracts::duo_workflow::Action>,
}

pub fn start_event(workflow_id: i64, definition: &str, goal: &str) -> ClientEvent {
    ClientEvent {
        response: Some(client_event::Response::StartRequest(StartWorkflowRequest {
            workflow_id: workflow_id.to_string(),
            workflow_definition: definition.to_owned(),
            goal: goal.to_owned(),
            ..StartWorkflowRequest::default()
        })),
    }
}

/// Opens `ExecuteWorkflow` with `first` as the first event.
pub async fn open_stream(
    service: &Service,
    token: &str,
    first: ClientEvent,
) -> Result<RawStream, tonic::Status> {
    open_stream_with(service, token, &[], first).await
}

/// [`open_stream`] with extra request metadata (the model header).
pub async fn open_stream_with(
    service: &Service,
    token: &str,
    extra: &[(&str, String)],
    first: ClientEvent,
) -> Result<RawStream, tonic::Status> {
    let (events, receiver) = mpsc::channel(16);
    events.send(first).await.unwrap();
    let mut client = service.client().await;
    let mut call = request(ReceiverStream::new(receiver), token);
    for (name, value) in extra {
        call.metadata_mut().insert(
            tonic::metadata::MetadataKey::from_bytes(name.as_bytes()).unwrap(),
            MetadataValue::try_from(value.as_str()).unwrap(),
        );
    }
    let response = client.execute_workflow(call).await?;
    Ok(RawStream {
        events,
        actions: response.into_inner(),
    })
}

/// Opens `ExecuteWorkflow` expecting a refusal: the status it ended with.
pub async fn refused(
    service: &Service,
    token: &str,
    extra: &[(&str, String)],
    first: ClientEvent,
) -> tonic::Status {
    match open_stream_with(service, token, extra, first).await {
        Ok(_) => panic!("the stream was accepted"),
        Err(status) => status,
    }
}

impl RawStream {
    /// Answers actions with `runner` until the stream ends; returns the
    /// final status and the actions seen.
    pub async fn serve(mut self, runner: &ActionRunner) -> (tonic::Status, Vec<String>) {
        let mut seen = Vec::new();
        loop {
            match self.actions.message().await {
                Ok(Some(action)) => {
                    let Some(kind) = action.action.as_ref() else {
                        continue;
                    };
                    seen.push(format!("{kind:?}").chars().take(60).collect());
                    if let Some(reply) = runner.perform(&action.request_id, kind).await {
                        let _ = self
                            .events
                            .send(ClientEvent {
                                response: Some(client_event::Response::ActionResponse(reply)),
                            })
                            .await;
                    }
                }
                Ok(None) => return (tonic::Status::ok(""), seen),
                Err(status) => return (status, seen),
            }
        }
    }
}
