//! The executor socket (Workhorse's role in GitLab): `GET
//! /api/v4/ai/duo_workflows/ws` upgrades to a WebSocket whose text frames are
//! protojson `ClientEvent`s (up) and `Action`s (down). The first frame must be
//! a `startRequest`; the monolith then takes the workflow's run lease (one
//! live run per workflow), opens the service's `ExecuteWorkflow` stream with
//! the user's service token and cloud-connector headers, and relays. The
//! service's `runHTTPRequest` actions are answered here with a token minted
//! for this run, so the user's own permissions apply and a browser needs no
//! API token: a path under `/api/v4/` (or `/api/graphql`) that passes the
//! shared check (`contracts::api_request`, also the executor's) is requested
//! from this instance, any other gets an error reply, and none goes to the
//! client. Every other action goes to the client.

use std::net::SocketAddr;
use std::pin::pin;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use actix_ws::{CloseCode, CloseReason};
use contracts::api_request;
use contracts::duo_workflow::{
    Action, ActionResponse, ClientEvent, HttpResponse as ActionHttpResponse, RunHttpRequest,
    action, action_response, client_event,
};
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::ApiError;
use super::workflow_access::{INTERNAL_SCOPES, WorkflowCaller, find_workflow, workflow_caller};
use crate::app_state::AppState;
use crate::identity::oauth::{self, MintedToken};
use crate::policy::Actor;
use crate::workflows::access::{self, MODEL_METADATA_HEADER};
use crate::workflows::lease::{self, Lease};
use crate::workflows::protojson;
use crate::workflows::service::{ServiceClient, ServiceError};
use crate::workflows::store::Workflow;
use crate::workflows::{Caller, audit};

/// Largest frame either way (the service's message limit).
const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;
/// How long a client may take to send its `startRequest`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one `runHTTPRequest` answered here may take.
const LOCAL_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest body of a `runHTTPRequest` answered here.
const MAX_LOCAL_BODY_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;
/// Close code for "another run holds this workflow" (4000+ is ours; the
/// reason says it).
const CLOSE_LOCKED: u16 = 4409;

#[derive(Debug, Deserialize)]
pub(super) struct SocketQuery {
    /// Our addition: name the workflow up front to be refused with 409 before
    /// the upgrade when another run holds it.
    workflow_id: Option<String>,
}

/// One run's resources, released when the run ends.
struct Run {
    workflow: Workflow,
    lease: Lease,
    token: MintedToken,
    caller: Caller,
}

fn is_upgrade(req: &HttpRequest) -> bool {
    req.headers()
        .get(actix_web::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The caller: a token with `api` or `ai_workflows`, or a signed-in browser
/// session of our own pages.
async fn socket_caller(state: &AppState, req: &HttpRequest) -> Result<WorkflowCaller, ApiError> {
    if crate::identity::request::presented_token(req).is_none()
        && let Some(session) = crate::identity::request::request_session(&state.pool, req).await?
    {
        if !crate::identity::request::same_origin(req, &state.config.external_url) {
            return Err(ApiError::ForbiddenBecause("cross-origin request"));
        }
        return Ok(WorkflowCaller {
            actor: Actor::from(&session.user),
            service_account: None,
            user: session.user,
        });
    }
    workflow_caller(state, req, INTERNAL_SCOPES).await
}

pub(super) async fn open(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
    query: web::Query<SocketQuery>,
) -> Result<HttpResponse, ApiError> {
    let who = socket_caller(&state, &req).await?;
    if !is_upgrade(&req) {
        return Err(ApiError::BadRequest(
            "this endpoint needs a WebSocket upgrade".into(),
        ));
    }
    let early = match query.workflow_id.as_deref() {
        Some(id) => Some(claim_run(&state, &who, id).await?),
        None => None,
    };
    let (response, session, stream) = match actix_ws::handle(&req, payload) {
        Ok(parts) => parts,
        Err(e) => {
            if let Some(run) = early {
                end_run(&state, run).await;
            }
            return Err(ApiError::BadRequest(e.to_string()));
        }
    };
    let local = req.app_config().local_addr();
    let state = state.into_inner();
    actix_web::rt::spawn(async move {
        let stream = stream
            .max_frame_size(MAX_FRAME_BYTES)
            .aggregate_continuations()
            .max_continuation_size(MAX_FRAME_BYTES);
        relay(state, who, early, session, stream, local).await;
    });
    Ok(response)
}

/// The workflow (owner or admin only; 404 otherwise), its run lease (409 when
/// held) and this run's token (a composite one when the workflow runs as a
/// service account).
async fn claim_run(state: &AppState, who: &WorkflowCaller, id: &str) -> Result<Run, ApiError> {
    let workflow = find_workflow(state, who, id).await?;
    let db = state.pool.get().await?;
    let lease = lease::acquire(&*db, workflow.id, state.config.duo_workflow.lock_lease)
        .await?
        .ok_or_else(|| {
            ApiError::Conflict(format!(
                "Workflow {} is already running in another session",
                workflow.id
            ))
        })?;
    let minted = match workflow.service_account_id {
        Some(bot) => {
            oauth::mint_composite(&*db, bot, workflow.user_id, oauth::COMPOSITE_TOKEN_LIFETIME)
                .await
        }
        None => oauth::mint(&*db, who.actor.id, oauth::USER_TOKEN_LIFETIME).await,
    };
    let token = match minted {
        Ok(token) => token,
        Err(e) => {
            let _ = lease::release(&*db, &lease).await;
            return Err(e.into());
        }
    };
    let caller = Caller {
        user_id: who.actor.id,
        service_account_id: workflow.service_account_id,
    };
    audit(
        &*db,
        Some(workflow.id),
        "duo_session_run_started",
        caller,
        json!({}),
    )
    .await?;
    Ok(Run {
        workflow,
        lease,
        token,
        caller,
    })
}

async fn end_run(state: &AppState, run: Run) {
    let Ok(db) = state.pool.get().await else {
        // The lease lapses by itself and the token expires.
        return;
    };
    let _ = lease::release(&*db, &run.lease).await;
    let _ = oauth::revoke_by_id(&*db, run.token.id).await;
    let _ = audit(
        &*db,
        Some(run.workflow.id),
        "duo_session_run_ended",
        run.caller,
        json!({}),
    )
    .await;
}

fn close_reason(code: CloseCode, text: &str) -> Option<CloseReason> {
    // A close frame's reason must fit in 123 bytes.
    let mut description: String = text.chars().take(120).collect();
    while description.len() > 123 {
        description.pop();
    }
    Some(CloseReason {
        code,
        description: Some(description),
    })
}

/// Reads the client's first text frame (answering pings meanwhile).
async fn first_text(
    session: &mut actix_ws::Session,
    stream: &mut (
             impl futures::Stream<Item = Result<actix_ws::AggregatedMessage, actix_ws::ProtocolError>>
             + Unpin
         ),
) -> Result<String, Option<CloseReason>> {
    loop {
        match stream.next().await {
            Some(Ok(actix_ws::AggregatedMessage::Text(text))) => return Ok(text.to_string()),
            Some(Ok(actix_ws::AggregatedMessage::Ping(bytes))) => {
                let _ = session.pong(&bytes).await;
            }
            Some(Ok(actix_ws::AggregatedMessage::Binary(_))) => {
                return Err(close_reason(
                    CloseCode::Unsupported,
                    "frames must be protojson text",
                ));
            }
            Some(Ok(actix_ws::AggregatedMessage::Pong(_))) => {}
            Some(Ok(actix_ws::AggregatedMessage::Close(_))) | None => return Err(None),
            Some(Err(e)) => return Err(close_reason(CloseCode::Protocol, &e.to_string())),
        }
    }
}

async fn relay(
    state: std::sync::Arc<AppState>,
    who: WorkflowCaller,
    early: Option<Run>,
    mut session: actix_ws::Session,
    stream: impl futures::Stream<Item = Result<actix_ws::AggregatedMessage, actix_ws::ProtocolError>>,
    local: SocketAddr,
) {
    let mut stream = pin!(stream);
    let first = tokio::time::timeout(START_TIMEOUT, first_text(&mut session, &mut stream)).await;
    let text = match first {
        Ok(Ok(text)) => text,
        Ok(Err(reason)) => {
            if let Some(run) = early {
                end_run(&state, run).await;
            }
            let _ = session.close(reason).await;
            return;
        }
        Err(_) => {
            if let Some(run) = early {
                end_run(&state, run).await;
            }
            let _ = session
                .close(close_reason(CloseCode::Policy, "no startRequest in time"))
                .await;
            return;
        }
    };
    let start = match protojson::client_event_from_json(&text) {
        Ok(event) => match &event.response {
            Some(client_event::Response::StartRequest(start)) => {
                let id = start.workflow_id.clone();
                Ok((event, id))
            }
            _ => Err("the first frame must be a startRequest".to_owned()),
        },
        Err(e) => Err(format!("invalid protojson ClientEvent: {e}")),
    };
    let (start_event, workflow_id) = match start {
        Ok(parts) => parts,
        Err(message) => {
            if let Some(run) = early {
                end_run(&state, run).await;
            }
            let _ = session
                .close(close_reason(CloseCode::Invalid, &message))
                .await;
            return;
        }
    };
    let run = match early {
        Some(run) if run.workflow.id.to_string() == workflow_id => run,
        Some(run) => {
            end_run(&state, run).await;
            let _ = session
                .close(close_reason(
                    CloseCode::Policy,
                    "startRequest names another workflow than workflow_id",
                ))
                .await;
            return;
        }
        None => match claim_run(&state, &who, &workflow_id).await {
            Ok(run) => run,
            Err(e) => {
                let (code, text) = match &e {
                    ApiError::Conflict(msg) => (CloseCode::Other(CLOSE_LOCKED), msg.clone()),
                    ApiError::RecordNotFound => {
                        (CloseCode::Policy, "404 Workflow Not Found".to_owned())
                    }
                    ApiError::Forbidden => (CloseCode::Policy, "403 Forbidden".to_owned()),
                    other => {
                        tracing::warn!(error = %other, "could not start a workflow run");
                        (CloseCode::Error, "could not start the workflow".to_owned())
                    }
                };
                let _ = session.close(close_reason(code, &text)).await;
                return;
            }
        },
    };
    let outcome = run_stream(&state, &run, start_event, &mut session, &mut stream, local).await;
    end_run(&state, run).await;
    let _ = session.close(outcome).await;
}

/// The metadata of the service stream: the cloud-connector headers with the
/// user's service token as bearer, and the model of the Duo Agent Platform.
/// On failure, the close the client gets.
async fn service_headers(
    state: &AppState,
    client: &ServiceClient,
    run: &Run,
) -> Result<Vec<(String, String)>, Option<CloseReason>> {
    let unavailable = |e: &dyn std::fmt::Display| {
        tracing::warn!(error = %e, "workflow service unavailable");
        close_reason(CloseCode::Error, "the workflow service is unavailable")
    };
    let db = state.pool.get().await.map_err(|e| unavailable(&e))?;
    let user = run.workflow.user_id;
    let model = match access::model_metadata(&*db, &state.models, true).await {
        Ok(model) => model,
        Err(e @ access::AccessError::Disabled) => {
            return Err(close_reason(CloseCode::Policy, &e.to_string()));
        }
        Err(e) => return Err(unavailable(&e)),
    };
    let mut headers = access::cloud_connector_headers(
        &*db,
        &state.policy,
        &state.keys,
        &state.config,
        user,
        access::self_hosted_endpoint(&model),
    )
    .await
    .map_err(|e| unavailable(&e))?;
    let token = client
        .generate_token(&headers, Some(&run.workflow.workflow_definition))
        .await
        .map_err(|e| unavailable(&e))?;
    for (name, value) in headers.iter_mut() {
        if name == contracts::headers::AUTHORIZATION {
            *value = format!("Bearer {}", token.token);
        }
    }
    headers.push((MODEL_METADATA_HEADER.into(), model.to_string()));
    headers.push((
        "x-gitlab-base-url".into(),
        state
            .config
            .external_url
            .as_str()
            .trim_end_matches('/')
            .to_owned(),
    ));
    headers.push(("x-gitlab-unidirectional-streaming".into(), "enabled".into()));
    Ok(headers)
}

async fn run_stream(
    state: &AppState,
    run: &Run,
    start: ClientEvent,
    session: &mut actix_ws::Session,
    stream: &mut (
             impl futures::Stream<Item = Result<actix_ws::AggregatedMessage, actix_ws::ProtocolError>>
             + Unpin
         ),
    local: SocketAddr,
) -> Option<CloseReason> {
    let client = match ServiceClient::new(
        &state.config.duo_workflow.service_url,
        state.config.duo_workflow.service_timeout,
    ) {
        Ok(c) => c,
        Err(e) => return close_reason(CloseCode::Error, &e.to_string()),
    };
    let headers = match service_headers(state, &client, run).await {
        Ok(h) => h,
        Err(close) => return close,
    };
    let (up, up_rx) = mpsc::channel::<ClientEvent>(64);
    if up.send(start).await.is_err() {
        return close_reason(CloseCode::Error, "relay failed");
    }
    let mut actions = match client
        .execute_workflow(&headers, tokio_stream::wrappers::ReceiverStream::new(up_rx))
        .await
    {
        Ok(actions) => actions,
        Err(ServiceError::Status { code, message }) => {
            return close_reason(CloseCode::Error, &format!("{code:?}: {message}"));
        }
        Err(e) => return close_reason(CloseCode::Error, &e.to_string()),
    };
    let http = reqwest::Client::builder()
        .timeout(LOCAL_REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build();
    let Ok(http) = http else {
        return close_reason(CloseCode::Error, "relay failed");
    };
    let lease_ttl = state.config.duo_workflow.lock_lease;
    let mut renew = tokio::time::interval((lease_ttl / 3).max(Duration::from_millis(200)));
    renew.tick().await;
    let mut stopping = pin!(state.lifecycle.stopped());
    loop {
        tokio::select! {
            frame = stream.next() => match frame {
                Some(Ok(actix_ws::AggregatedMessage::Text(text))) => {
                    match protojson::client_event_from_json(&text) {
                        Ok(event) => {
                            if up.send(event).await.is_err() {
                                return close_reason(CloseCode::Error, "the workflow service stream ended");
                            }
                        }
                        Err(e) => {
                            return close_reason(
                                CloseCode::Invalid,
                                &format!("invalid protojson ClientEvent: {e}"),
                            );
                        }
                    }
                }
                Some(Ok(actix_ws::AggregatedMessage::Binary(_))) => {
                    return close_reason(CloseCode::Unsupported, "frames must be protojson text");
                }
                Some(Ok(actix_ws::AggregatedMessage::Ping(bytes))) => {
                    let _ = session.pong(&bytes).await;
                }
                Some(Ok(actix_ws::AggregatedMessage::Pong(_))) => {}
                // The client left: ending the upstream tells the service.
                Some(Ok(actix_ws::AggregatedMessage::Close(_))) | None => return None,
                Some(Err(e)) => return close_reason(CloseCode::Protocol, &e.to_string()),
            },
            action = actions.message() => match action {
                Ok(Some(action)) => {
                    match local_request(&action) {
                        Some(Ok(request)) => {
                            if let Some(reply) = socket_lock_reply(&request, &run.lease, lease_ttl) {
                                if up.send(http_reply(action.request_id.clone(), reply)).await.is_err() {
                                    return close_reason(CloseCode::Error, "the workflow service stream ended");
                                }
                                continue;
                            }
                            let up = up.clone();
                            let http = http.clone();
                            let token = run.token.token.clone();
                            let request_id = action.request_id.clone();
                            actix_web::rt::spawn(async move {
                                let response = answer_locally(&http, local, &token, &request).await;
                                let _ = up.send(http_reply(request_id, response)).await;
                            });
                            continue;
                        }
                        Some(Err(error)) => {
                            let refusal = ActionHttpResponse {
                                error,
                                ..ActionHttpResponse::default()
                            };
                            if up.send(http_reply(action.request_id.clone(), refusal)).await.is_err() {
                                return close_reason(CloseCode::Error, "the workflow service stream ended");
                            }
                            continue;
                        }
                        None => {}
                    }
                    match protojson::action_to_json(&action) {
                        Ok(text) => {
                            if session.text(text).await.is_err() {
                                return None;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "could not render an action as protojson");
                        }
                    }
                }
                Ok(None) => return close_reason(CloseCode::Normal, "workflow stream ended"),
                Err(status) => {
                    return close_reason(
                        CloseCode::Error,
                        &format!("{:?}: {}", status.code(), status.message()),
                    );
                }
            },
            _ = renew.tick() => {
                let renewed = match state.pool.get().await {
                    Ok(db) => lease::renew(&*db, &run.lease, lease_ttl).await.unwrap_or(false),
                    Err(_) => true,
                };
                if !renewed {
                    return close_reason(CloseCode::Other(CLOSE_LOCKED), "the workflow's run lease was lost");
                }
            }
            _ = &mut stopping => {
                return close_reason(CloseCode::Restart, "Server restarting: reconnect");
            }
        }
    }
}

/// The `runHTTPRequest` of an action, answered here: the request when its
/// method and path pass the shared check, else the refusal's text.
fn local_request(action: &Action) -> Option<Result<RunHttpRequest, String>> {
    let Some(action::Action::RunHttpRequest(request)) = &action.action else {
        return None;
    };
    let checked = api_request::normalize_path(&request.path)
        .map_err(|e| format!("refusing the request path {:?}: {e}", request.path))
        .and_then(|_| api_request::allowed_method(&request.method).map_err(|e| e.to_string()));
    Some(checked.map(|_| request.clone()))
}

/// The answer to the service's run-lock requests for this socket's own
/// workflow: the socket already holds the lease (and renews it itself), so
/// the service's run is given the socket's run id; `None` for any other
/// request.
fn socket_lock_reply(
    request: &RunHttpRequest,
    lease: &Lease,
    ttl: std::time::Duration,
) -> Option<ActionHttpResponse> {
    let path = api_request::normalize_path(&request.path).ok()?;
    let (workflow_id, run_id) = lease::lock_path(path)?;
    if workflow_id != lease.workflow_id {
        return None;
    }
    let holder = lease.holder.to_string();
    let (status, body) = match (request.method.to_ascii_uppercase().as_str(), run_id) {
        ("POST", None) => (
            201,
            json!({ "run_id": holder, "ttl_seconds": ttl.as_secs() }).to_string(),
        ),
        ("PUT", Some(run)) if run == holder => (200, json!({ "run_id": holder }).to_string()),
        ("PUT", Some(_)) => (
            409,
            json!({ "message": format!("This run no longer holds workflow {workflow_id}") })
                .to_string(),
        ),
        // The socket gives its lease up when it closes.
        ("DELETE", Some(_)) => (204, String::new()),
        _ => return None,
    };
    Some(ActionHttpResponse {
        status_code: status,
        body,
        ..ActionHttpResponse::default()
    })
}

/// The client event carrying the answer to a `runHTTPRequest`.
fn http_reply(request_id: String, response: ActionHttpResponse) -> ClientEvent {
    ClientEvent {
        response: Some(client_event::Response::ActionResponse(ActionResponse {
            request_id,
            response_type: Some(action_response::ResponseType::HttpResponse(response)),
        })),
    }
}

/// Makes the service's request to this process (through its own listener,
/// so every check of a normal request applies) with the run's token.
async fn answer_locally(
    http: &reqwest::Client,
    local: SocketAddr,
    token: &str,
    request: &RunHttpRequest,
) -> ActionHttpResponse {
    let failed = |error: String| ActionHttpResponse {
        error,
        ..ActionHttpResponse::default()
    };
    // Checked by `local_request`; checked again here so that this function
    // alone never requests an unchecked path.
    let (path, method) = match (
        api_request::normalize_path(&request.path),
        api_request::allowed_method(&request.method),
    ) {
        (Ok(path), Ok(method)) => (path, method),
        (Err(e), _) | (_, Err(e)) => return failed(e.to_string()),
    };
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return failed(format!("unsupported method {method}"));
    };
    let url = format!("http://{local}{path}");
    let mut builder = http.request(method, url).bearer_auth(token);
    if let Some(body) = &request.body {
        builder = builder
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
    }
    let response = match builder.send().await {
        Ok(r) => r,
        Err(e) => return failed(e.to_string()),
    };
    let status = i32::from(response.status().as_u16());
    let headers = response
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(bytes) => {
                if body.len() + bytes.len() > MAX_LOCAL_BODY_BYTES {
                    return failed(format!("response larger than {MAX_LOCAL_BODY_BYTES} bytes"));
                }
                body.extend_from_slice(&bytes);
            }
            Err(e) => return failed(e.to_string()),
        }
    }
    ActionHttpResponse {
        headers,
        status_code: status,
        body: String::from_utf8_lossy(&body).into_owned(),
        error: String::new(),
    }
}
