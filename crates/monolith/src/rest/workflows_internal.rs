//! Duo Workflow's internal REST API (GitLab's `workflows_internal.rb`): what
//! the workflow service and executors call with an `ai_workflows` token (or an
//! `api` one): the workflow, its status events, checkpoints, checkpoint writes
//! and events, and revoking the token itself.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::pagination::PageParams;
use super::params::Params;
use super::workflow_access::{INTERNAL_SCOPES, find_workflow, workflow_caller, workflow_entity};
use crate::app_state::AppState;
use crate::identity::oauth::{self, Revocation};
use crate::workflows::checkpoints::{self, NewCheckpoint, NewWrite};
use crate::workflows::{WorkflowError, events, store};

/// A run id given as the query parameter `name` (`run_id` on writes: the
/// lease the writing run holds; `takeover` on a lock: the run it replaces).
fn run_id_param(req: &HttpRequest, name: &str) -> Result<Option<uuid::Uuid>, ApiError> {
    let pairs =
        web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    pairs
        .get(name)
        .map(|text| {
            uuid::Uuid::parse_str(text)
                .map_err(|_| ApiError::BadRequest(format!("{name} is invalid")))
        })
        .transpose()
}

/// `POST /ai/duo_workflows/workflows/:id/run_lock[?takeover=<run id>]`: 201
/// `{run_id, ttl_seconds}` for a run the workflow service starts, 409 while
/// another run holds the workflow (a socket run, or another gRPC run) unless
/// `takeover` names that run. Each start gets a new run id.
pub(super) async fn take_run_lock(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let takeover = run_id_param(&req, "takeover")?;
    let workflow = find_workflow(&state, &who, &path).await?;
    let db = state.pool.get().await?;
    let ttl = state.config.duo_workflow.lock_lease;
    let lease = crate::workflows::lease::acquire_taking_over(&*db, workflow.id, ttl, takeover)
        .await?
        .ok_or_else(|| {
            ApiError::Conflict(format!(
                "Workflow {} is already running in another session",
                workflow.id
            ))
        })?;
    Ok(HttpResponse::Created().json(json!({
        "run_id": lease.holder,
        "ttl_seconds": ttl.as_secs(),
    })))
}

fn lease_of(workflow_id: i64, run_id: &str) -> Result<crate::workflows::lease::Lease, ApiError> {
    let holder = uuid::Uuid::parse_str(run_id).map_err(|_| ApiError::RecordNotFound)?;
    Ok(crate::workflows::lease::Lease {
        workflow_id,
        holder,
    })
}

/// `PUT /ai/duo_workflows/workflows/:id/run_lock/:run_id`: 200 while the run
/// still holds the workflow, 409 once it lost it.
pub(super) async fn renew_run_lock(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let (id, run_id) = path.into_inner();
    let workflow = find_workflow(&state, &who, &id).await?;
    let lease = lease_of(workflow.id, &run_id)?;
    let db = state.pool.get().await?;
    if !crate::workflows::lease::renew(&*db, &lease, state.config.duo_workflow.lock_lease).await? {
        return Err(ApiError::Conflict(format!(
            "This run no longer holds workflow {}",
            workflow.id
        )));
    }
    Ok(HttpResponse::Ok().json(json!({ "run_id": lease.holder })))
}

/// `DELETE /ai/duo_workflows/workflows/:id/run_lock/:run_id`: 204.
pub(super) async fn release_run_lock(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let (id, run_id) = path.into_inner();
    let workflow = find_workflow(&state, &who, &id).await?;
    let lease = lease_of(workflow.id, &run_id)?;
    let db = state.pool.get().await?;
    crate::workflows::lease::release(&*db, &lease).await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Deserialize)]
pub(super) struct RevokeParams {
    token: Option<String>,
}

/// `POST /ai/duo_workflows/revoke_token`: revokes one of the caller's
/// `ai_workflows` tokens (the service calls it when a run ends).
pub(super) async fn revoke_token(
    state: web::Data<AppState>,
    req: HttpRequest,
    params: Params<RevokeParams>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let token = params
        .into_inner()
        .token
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::BadRequest("token is missing".into()))?;
    let db = state.pool.get().await?;
    match oauth::revoke(&*db, who.actor.id, &token).await? {
        Revocation::Revoked => {
            crate::workflows::audit(
                &*db,
                None,
                "ai_workflows_token_revoked",
                who.caller(),
                json!({}),
            )
            .await?;
            Ok(HttpResponse::Ok().json(json!({ "message": "Token revoked" })))
        }
        Revocation::NotFound => Err(ApiError::Unauthorized),
        Revocation::NotOwner => Err(ApiError::ForbiddenBecause(
            "Token does not belong to the current user",
        )),
    }
}

/// `GET /ai/duo_workflows/workflows/:id`.
pub(super) async fn show(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let workflow = find_workflow(&state, &who, &path).await?;
    let db = state.pool.get().await?;
    Ok(HttpResponse::Ok().json(workflow_entity(&state, &*db, &workflow).await?))
}

#[derive(Debug, Deserialize)]
pub(super) struct StatusParams {
    status_event: Option<String>,
}

/// `PATCH /ai/duo_workflows/workflows/:id {status_event}`: 200 with the
/// workflow (also when it already is in the target status), 400 with
/// GitLab's message when the event is unknown or not allowed now.
pub(super) async fn update_status(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    params: Params<StatusParams>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let event = params
        .into_inner()
        .status_event
        .ok_or_else(|| ApiError::BadRequest("status_event is missing".into()))?;
    let run_id = run_id_param(&req, "run_id")?;
    let workflow = find_workflow(&state, &who, &path).await?;
    let mut client = state.pool.get().await?;
    crate::workflows::lease::check_writer(&*client, workflow.id, run_id).await?;
    // A run's own token may restart its workflow only while its leg runs.
    let run_token = who.user.run.map(|_| who.user.token_id);
    let change =
        store::apply_status_event(&mut client, workflow.id, &event, who.caller(), run_token)
            .await?;
    Ok(HttpResponse::Ok().json(json!({
        "workflow": workflow_entity(&state, &*client, &change.workflow).await?,
        "message": change.message,
    })))
}

#[derive(Debug, Deserialize)]
pub(super) struct CheckpointParams {
    thread_ts: Option<String>,
    parent_ts: Option<String>,
    checkpoint_ns: Option<String>,
    /// Kept as the text it came in: checked, stored and served as it is.
    checkpoint: Option<Box<serde_json::value::RawValue>>,
    compressed_checkpoint: Option<String>,
    metadata: Option<Value>,
    /// A JSON text, as GitLab's service sends it (an object is taken too).
    model_metadata_json: Option<Value>,
}

/// `POST /ai/duo_workflows/workflows/:id/checkpoints`: 201 `{id, thread_ts, parent_ts}`.
pub(super) async fn create_checkpoint(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    params: Params<CheckpointParams>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let p = params.into_inner();
    let thread_ts = p
        .thread_ts
        .ok_or_else(|| ApiError::BadRequest("thread_ts is missing".into()))?;
    let metadata = p
        .metadata
        .ok_or_else(|| ApiError::BadRequest("metadata is missing".into()))?;
    let run_id = run_id_param(&req, "run_id")?;
    let workflow = find_workflow(&state, &who, &path).await?;
    crate::workflows::lease::check_writer(&*state.pool.get().await?, workflow.id, run_id).await?;
    let new = NewCheckpoint {
        thread_ts,
        parent_ts: p.parent_ts,
        checkpoint_ns: p.checkpoint_ns,
        checkpoint: p.checkpoint,
        compressed_checkpoint: p.compressed_checkpoint,
        metadata,
        model_metadata_json: p.model_metadata_json.map(|v| match v {
            Value::String(text) => text,
            other => other.to_string(),
        }),
    };
    let mut client = state.pool.get().await?;
    let stored = checkpoints::create(
        &mut client,
        &workflow,
        new,
        state.config.duo_workflow.max_checkpoint_bytes,
    )
    .await?;
    Ok(HttpResponse::Created().json(json!({
        "id": stored.id,
        "thread_ts": stored.thread_ts,
        "parent_ts": stored.parent_ts,
        "checkpoint_ns": stored.checkpoint_ns,
    })))
}

#[derive(Debug, Deserialize)]
pub(super) struct CheckpointQuery {
    page: Option<usize>,
    per_page: Option<usize>,
    accept_compressed: Option<String>,
    checkpoint_ns: Option<String>,
}

fn truthy(v: Option<&str>) -> Result<bool, ApiError> {
    match v {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(_) => Err(ApiError::BadRequest("accept_compressed is invalid".into())),
    }
}

/// `GET /ai/duo_workflows/workflows/:id/checkpoints`: newest first
/// (`per_page=1` is the latest), with their writes; `accept_compressed=true`
/// sends each body as `compressed_checkpoint`.
pub(super) async fn list_checkpoints(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<CheckpointQuery>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let q = query.into_inner();
    let compressed = truthy(q.accept_compressed.as_deref())?;
    let workflow = find_workflow(&state, &who, &path).await?;
    let page = PageParams::new(q.page, q.per_page).resolve();
    let offset = ((page.page - 1) * page.per_page) as i64;
    let db = state.pool.get().await?;
    let (list, total) = checkpoints::list(
        &*db,
        workflow.id,
        q.checkpoint_ns.as_deref(),
        offset,
        page.per_page as i64,
    )
    .await?;
    let items: Vec<_> = list
        .iter()
        .map(|c| checkpoints::to_json(c, compressed))
        .collect();
    let mut builder = HttpResponse::Ok();
    page.headers(&mut builder, &req, usize::try_from(total).unwrap_or(0));
    Ok(builder.json(items))
}

#[derive(Debug, Deserialize)]
pub(super) struct OneCheckpointQuery {
    accept_compressed: Option<String>,
}

/// `GET /ai/duo_workflows/workflows/:id/checkpoints/:checkpoint_id`.
pub(super) async fn show_checkpoint(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    query: web::Query<OneCheckpointQuery>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let compressed = truthy(query.accept_compressed.as_deref())?;
    let (id, checkpoint_id) = path.into_inner();
    let workflow = find_workflow(&state, &who, &id).await?;
    let checkpoint_id: i64 = checkpoint_id
        .parse()
        .map_err(|_| ApiError::RecordNotFound)?;
    let db = state.pool.get().await?;
    let checkpoint = checkpoints::get(&*db, workflow.id, checkpoint_id)
        .await?
        .ok_or(ApiError::RecordNotFound)?;
    Ok(HttpResponse::Ok().json(checkpoints::to_json(&checkpoint, compressed)))
}

#[derive(Debug, Deserialize)]
pub(super) struct WritesParams {
    thread_ts: Option<String>,
    checkpoint_writes: Option<Vec<NewWrite>>,
}

/// `POST /ai/duo_workflows/workflows/:id/checkpoint_writes_batch`: all or nothing.
pub(super) async fn create_writes(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    params: Params<WritesParams>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let p = params.into_inner();
    let thread_ts = p
        .thread_ts
        .ok_or_else(|| ApiError::BadRequest("thread_ts is missing".into()))?;
    let writes = p
        .checkpoint_writes
        .ok_or_else(|| ApiError::BadRequest("checkpoint_writes is missing".into()))?;
    let workflow = find_workflow(&state, &who, &path).await?;
    let mut client = state.pool.get().await?;
    checkpoints::create_writes(&mut client, &workflow, &thread_ts, &writes).await?;
    Ok(HttpResponse::Ok().json(json!({})))
}

#[derive(Debug, Deserialize)]
pub(super) struct EventParams {
    event_type: Option<String>,
    message: Option<String>,
    correlation_id: Option<String>,
}

/// `POST /ai/duo_workflows/workflows/:id/events`: 201 with the queued event.
pub(super) async fn create_event(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    params: Params<EventParams>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let p = params.into_inner();
    // Grape checks parameters before the workflow is looked up.
    if p.event_type.is_none() {
        return Err(WorkflowError::Param("event_type is missing".into()).into());
    }
    let workflow = find_workflow(&state, &who, &path).await?;
    let db = state.pool.get().await?;
    let event = events::create(
        &*db,
        &workflow,
        p.event_type.as_deref(),
        p.message.as_deref(),
        p.correlation_id.as_deref(),
    )
    .await?;
    drop(db);
    // A run of the product has no executor listening between its legs: the
    // product itself acts on the event (and marks it delivered).
    let reaction = crate::workflows::runs::react_to_event(
        &state.pool,
        &state.config,
        workflow.id,
        &event,
        who.caller(),
    )
    .await?;
    let mut body = events::to_json(&event);
    if reaction != crate::workflows::runs::EventReaction::None {
        body["event_status"] = "delivered".into();
    }
    Ok(HttpResponse::Created().json(body))
}

#[derive(Debug, Deserialize)]
pub(super) struct EventsQuery {
    page: Option<usize>,
    per_page: Option<usize>,
}

/// `GET /ai/duo_workflows/workflows/:id/events`: the queued events.
pub(super) async fn list_events(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let workflow = find_workflow(&state, &who, &path).await?;
    let page = PageParams::new(query.page, query.per_page).resolve();
    let db = state.pool.get().await?;
    let (list, total) = events::queued(
        &*db,
        workflow.id,
        ((page.page - 1) * page.per_page) as i64,
        page.per_page as i64,
    )
    .await?;
    let mut builder = HttpResponse::Ok();
    page.headers(&mut builder, &req, usize::try_from(total).unwrap_or(0));
    Ok(builder.json(list.iter().map(events::to_json).collect::<Vec<_>>()))
}

#[derive(Debug, Deserialize)]
pub(super) struct EventStatusParams {
    event_status: Option<String>,
}

/// `PUT /ai/duo_workflows/workflows/:id/events/:event_id {event_status}`.
pub(super) async fn update_event(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    params: Params<EventStatusParams>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, INTERNAL_SCOPES).await?;
    let (id, event_id) = path.into_inner();
    let workflow = find_workflow(&state, &who, &id).await?;
    let event_id: i64 = event_id.parse().map_err(|_| ApiError::RecordNotFound)?;
    let db = state.pool.get().await?;
    let event = events::set_status(
        &*db,
        workflow.id,
        event_id,
        params.into_inner().event_status.as_deref(),
    )
    .await?;
    Ok(HttpResponse::Ok().json(events::to_json(&event)))
}
