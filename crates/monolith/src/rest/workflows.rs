//! Duo Workflow's public REST API under `/api/v4/ai/duo_workflows` (GitLab's
//! `workflows.rb`): create and list the caller's workflows, the agent
//! privileges, `direct_access` and the service's tools. The internal API the
//! service and executors use lives in [`super::workflows_internal`], the
//! executor socket in [`super::workflows_socket`].

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::params::Params;
use super::workflow_access::{
    WorkflowCaller, find_workflow, workflow_caller, workflow_entities, workflow_entity,
};
use super::{ApiError, READ_SCOPES, WRITE_SCOPES, require_user};
use crate::app_state::AppState;
use crate::identity::users::{self, ServiceAccountUser};
use crate::policy::{Ability, Actor, Subject};
use crate::workflows::creation::{self, CreateContext, CreateError, CreateRequest};
use crate::workflows::store::{self, ListFilter, NewWorkflow};
use crate::workflows::{Caller, WorkflowError, privileges};

impl From<WorkflowError> for ApiError {
    fn from(e: WorkflowError) -> Self {
        match e {
            WorkflowError::NotFound => ApiError::RecordNotFound,
            WorkflowError::Param(msg) => ApiError::BadRequest(msg),
            WorkflowError::BadRequest(msg) => {
                ApiError::Invalid(json!(format!("400 Bad request - {msg}")))
            }
            WorkflowError::Refused(msg) => ApiError::Invalid(json!(msg)),
            WorkflowError::Invalid { field, message } => ApiError::invalid(field, message),
            WorkflowError::Conflict(msg) => ApiError::Conflict(msg),
            WorkflowError::CannotRun(msg) => ApiError::Unprocessable(msg),
            WorkflowError::Db(e) => ApiError::Internal(e.to_string()),
            WorkflowError::Queue(e) => ApiError::Internal(e.to_string()),
            WorkflowError::Stored(msg) => ApiError::Internal(msg),
        }
    }
}

pub(super) async fn agent_privileges(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    require_user(&state, &req, READ_SCOPES).await?;
    let all: Vec<Value> = privileges::ALL
        .iter()
        .map(|(id, name, description)| {
            json!({
                "id": id,
                "name": name,
                "description": description,
                "default_enabled": store::DEFAULT_AGENT_PRIVILEGES.contains(id),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "all_privileges": all })))
}

/// A project or group given by id or full path.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum IdOrPath {
    Id(i64),
    Path(String),
}

/// The project (or group) a request names, resolved and readable by the
/// caller; 404 as GitLab answers for both "missing" and "hidden".
pub(super) async fn resolve_container(
    state: &AppState,
    actor: Actor,
    project: Option<&IdOrPath>,
    namespace: Option<&IdOrPath>,
) -> Result<Option<Subject>, ApiError> {
    let db = state.pool.get().await?;
    let subject = match (project, namespace) {
        (Some(p), _) => {
            let id = match p {
                IdOrPath::Id(id) => Some(*id),
                IdOrPath::Path(text) => match text.parse::<i64>() {
                    Ok(id) => Some(id),
                    Err(_) => crate::namespaces::project_id_by_full_path(&*db, text).await?,
                },
            };
            let Some(id) = id else {
                return Err(ApiError::NotFound("Project"));
            };
            if !state
                .policy
                .can(
                    &*db,
                    Some(actor),
                    Ability::ReadProject,
                    Subject::Project(id),
                )
                .await?
            {
                return Err(ApiError::NotFound("Project"));
            }
            Subject::Project(id)
        }
        (None, Some(g)) => {
            let id = match g {
                IdOrPath::Id(id) => Some(*id),
                IdOrPath::Path(text) => match text.parse::<i64>() {
                    Ok(id) => Some(id),
                    Err(_) => crate::namespaces::group_id_by_full_path(&*db, text).await?,
                },
            };
            let Some(id) = id else {
                return Err(ApiError::NotFound("Namespace"));
            };
            if !state
                .policy
                .can(&*db, Some(actor), Ability::ReadGroup, Subject::Group(id))
                .await?
            {
                return Err(ApiError::NotFound("Namespace"));
            }
            Subject::Group(id)
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(subject))
}

#[derive(Debug, Deserialize)]
pub(super) struct CreateParams {
    project_id: Option<IdOrPath>,
    namespace_id: Option<IdOrPath>,
    goal: Option<String>,
    workflow_definition: Option<String>,
    agent_privileges: Option<Vec<i64>>,
    pre_approved_agent_privileges: Option<Vec<i64>>,
    allow_agent_to_request_user: Option<bool>,
    environment: Option<String>,
    image: Option<String>,
    additional_context: Option<Value>,
    /// Start a run in the product now (GitLab starts a CI workload).
    start_workflow: Option<bool>,
    source_branch: Option<String>,
    /// The IID of an issue of the project the workflow works on.
    issue_id: Option<i32>,
}

/// `POST /ai/duo_workflows/workflows`: 201 with the workflow.
pub(super) async fn create_workflow(
    state: web::Data<AppState>,
    req: HttpRequest,
    params: Params<CreateParams>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, WRITE_SCOPES).await?;
    let params = params.into_inner();
    let container = resolve_container(
        &state,
        who.actor,
        params.project_id.as_ref(),
        params.namespace_id.as_ref(),
    )
    .await?
    .ok_or_else(|| {
        ApiError::Invalid(json!(
            "400 Bad request - project_id or namespace_id must be provided"
        ))
    })?;
    let request = CreateRequest {
        workflow: NewWorkflow {
            container: Some(container),
            goal: params.goal,
            workflow_definition: params.workflow_definition,
            agent_privileges: params.agent_privileges,
            pre_approved_agent_privileges: params.pre_approved_agent_privileges,
            allow_agent_to_request_user: params.allow_agent_to_request_user,
            environment: params.environment,
            image: params.image,
            additional_context: params.additional_context,
            source_branch: params.source_branch,
            ..NewWorkflow::default()
        },
        start: params.start_workflow.unwrap_or(false),
        issue_iid: params.issue_id,
    };
    let context = CreateContext {
        pool: &state.pool,
        policy: &state.policy,
        config: &state.config,
        repositories: &state.repositories,
    };
    let created = creation::create(
        &context,
        who.actor,
        who.caller().service_account_id,
        request,
    )
    .await?;
    let db = state.pool.get().await?;
    let mut body = workflow_entity(&state, &*db, &created.workflow).await?;
    if let Some((started, page)) = &created.run {
        body["workload"] = started.workload_json(page);
    }
    Ok(HttpResponse::Created().json(body))
}

impl From<CreateError> for ApiError {
    fn from(e: CreateError) -> Self {
        match e {
            CreateError::Forbidden => ApiError::Forbidden,
            CreateError::IssueNotFound => ApiError::NotFound("Issue"),
            CreateError::BadRequest(message) => ApiError::BadRequest(message),
            CreateError::Workflow(e) => e.into(),
            CreateError::Policy(e) => e.into(),
        }
    }
}

/// `DELETE /ai/duo_workflows/workflows/:id`: 204; 409 while a run of it is
/// queued or running. Its checkpoints, events and hidden ref go with it.
pub(super) async fn delete_workflow(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, WRITE_SCOPES).await?;
    let workflow = find_workflow(&state, &who, &path).await?;
    let db = state.pool.get().await?;
    crate::workflows::runs::delete_workflow(&*db, &state.repositories, &workflow, who.caller())
        .await?;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    page: Option<usize>,
    per_page: Option<usize>,
    project_id: Option<i64>,
    workflow_definition: Option<String>,
    status_group: Option<String>,
    environment: Option<String>,
}

/// `GET /ai/duo_workflows/workflows`: the caller's own workflows, newest first.
pub(super) async fn list_workflows(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, READ_SCOPES).await?;
    let q = query.into_inner();
    let environment = match q.environment.as_deref() {
        None => None,
        Some(name) => Some(store::environment_code(name).ok_or_else(|| {
            ApiError::BadRequest("environment does not have a valid value".into())
        })?),
    };
    let db = state.pool.get().await?;
    // Bounded: a user's list is read whole (at most this many) and paged here.
    let workflows = store::list_for_user(
        &*db,
        who.actor.id,
        &ListFilter {
            project_id: q.project_id,
            workflow_definition: q.workflow_definition,
            status_group: q.status_group,
            environment,
            limit: 1000,
        },
    )
    .await?;
    let items = workflow_entities(&state, &*db, &workflows).await?;
    Ok(super::pagination::paged(
        &req,
        super::pagination::PageParams::new(q.page, q.per_page),
        items,
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct DirectAccessParams {
    workflow_definition: Option<String>,
    project_id: Option<IdOrPath>,
    namespace_id: Option<IdOrPath>,
    root_namespace_id: Option<IdOrPath>,
    /// Our addition: the workflow the tokens are for; one that runs as the
    /// instance's service account gets a composite token.
    workflow_id: Option<i64>,
}

/// The answer when the workflow service cannot mint a token.
fn service_unavailable(e: &crate::workflows::service::ServiceError) -> HttpResponse {
    tracing::warn!(error = %e, "workflow service call failed");
    HttpResponse::BadGateway().json(json!({
        "message": "502 Bad Gateway - the Duo Workflow service is unavailable"
    }))
}

fn service_client(state: &AppState) -> Result<crate::workflows::service::ServiceClient, ApiError> {
    crate::workflows::service::ServiceClient::new(
        &state.config.duo_workflow.service_url,
        state.config.duo_workflow.service_timeout,
    )
    .map_err(|e| ApiError::Internal(e.to_string()))
}

/// 403 unless the caller may use Duo Workflow: in the named project or group,
/// or (none named) through their seat.
async fn authorize_platform(
    state: &AppState,
    who: &WorkflowCaller,
    container: Option<Subject>,
) -> Result<(), ApiError> {
    let db = state.pool.get().await?;
    let allowed = match container {
        Some(container) => {
            state
                .policy
                .can_run_duo_workflow_as(&*db, who.actor, who.service_account, container)
                .await?
        }
        None => {
            state
                .policy
                .may_use_duo_agent_platform(&*db, who.actor)
                .await?
        }
    };
    if allowed {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// `POST /ai/duo_workflows/direct_access`: what an executor needs to run a
/// workflow: this instance's URL with a fresh `ai_workflows` token (2 hours),
/// the workflow service's address with a token it minted for the user, the
/// cloud-connector headers and the model metadata (never an API key).
pub(super) async fn direct_access(
    state: web::Data<AppState>,
    req: HttpRequest,
    params: Params<DirectAccessParams>,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, WRITE_SCOPES).await?;
    let p = params.into_inner();
    let container = resolve_container(
        &state,
        who.actor,
        p.project_id.as_ref(),
        p.namespace_id.as_ref().or(p.root_namespace_id.as_ref()),
    )
    .await?;
    authorize_platform(&state, &who, container).await?;
    {
        let client = state.pool.get().await?;
        if !crate::rate_limit::take(
            &client,
            who.actor.id,
            "duo_workflow_direct_access",
            state.config.duo_workflow.direct_access_rate_limit,
            std::time::Duration::from_secs(60),
        )
        .await?
        {
            return Ok(HttpResponse::TooManyRequests().json(json!({
                "message": { "error": "This endpoint has been requested too many times. Try again later." }
            })));
        }
    }
    let workflow = match p.workflow_id {
        Some(id) => Some(find_workflow(&state, &who, &id.to_string()).await?),
        None => None,
    };
    let db = state.pool.get().await?;
    let model = match crate::workflows::access::model_metadata(&*db, &state.models, false).await {
        Ok(model) => model,
        Err(crate::workflows::access::AccessError::Disabled) => {
            return Err(ApiError::ForbiddenBecause(
                "Duo Agent Platform is disabled on this instance",
            ));
        }
        Err(e) => return Err(ApiError::Internal(e.to_string())),
    };
    let headers = crate::workflows::access::cloud_connector_headers(
        &*db,
        &state.policy,
        &state.keys,
        &state.config,
        who.actor.id,
        crate::workflows::access::self_hosted_endpoint(&model),
    )
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    let client = service_client(&state)?;
    let service_token = match client
        .generate_token(&headers, p.workflow_definition.as_deref())
        .await
    {
        Ok(token) => token,
        Err(e) => return Ok(service_unavailable(&e)),
    };
    let minted = match workflow.as_ref().and_then(|w| w.service_account_id) {
        Some(bot) => {
            crate::identity::oauth::mint_composite(
                &*db,
                bot,
                who.actor.id,
                crate::identity::oauth::COMPOSITE_TOKEN_LIFETIME,
            )
            .await?
        }
        None => {
            crate::identity::oauth::mint(
                &*db,
                who.actor.id,
                crate::identity::oauth::USER_TOKEN_LIFETIME,
            )
            .await?
        }
    };
    crate::workflows::audit(
        &*db,
        workflow.as_ref().map(|w| w.id),
        "ai_workflows_token_created",
        Caller {
            user_id: who.actor.id,
            service_account_id: workflow.as_ref().and_then(|w| w.service_account_id),
        },
        json!({ "expires_at": minted.expires_at }),
    )
    .await?;
    // The executor presents the service token itself; every other
    // cloud-connector header goes along as GitLab names them.
    let mut header_map = serde_json::Map::new();
    for (name, value) in &headers {
        if name == contracts::headers::AUTHORIZATION {
            continue;
        }
        header_map.insert(title_case(name), json!(value));
    }
    header_map.insert(
        title_case(crate::workflows::access::MODEL_METADATA_HEADER),
        json!(model.to_string()),
    );
    let service_url = &state.config.duo_workflow.service_url;
    Ok(HttpResponse::Created().json(json!({
        "gitlab_rails": {
            "base_url": state.config.external_url.as_str().trim_end_matches('/'),
            "token": minted.token,
            "token_expires_at": minted.expires_at,
        },
        "duo_workflow_service": {
            "base_url": crate::workflows::access::service_base_url(service_url),
            "token": service_token.token,
            "token_expires_at": service_token.expires_at,
            "headers": header_map,
            "secure": service_url.scheme() == "https",
        },
        "duo_workflow_executor": {
            "executor_binary_url": Value::Null,
            "executor_binary_urls": {},
            "version": env!("CARGO_PKG_VERSION"),
        },
        "workflow_metadata": {
            "extended_logging": false,
            "is_team_member": false,
            "tool_approval_for_session_enabled": false,
        },
        "model_metadata": model,
        "server_capabilities": service_token.server_capabilities,
    })))
}

/// `x-gitlab-realm` → `X-Gitlab-Realm`.
fn title_case(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// `GET /ai/duo_workflows/list_tools`: the workflow service's tools.
pub(super) async fn list_tools(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let who = workflow_caller(&state, &req, READ_SCOPES).await?;
    authorize_platform(&state, &who, None).await?;
    let db = state.pool.get().await?;
    let headers = crate::workflows::access::cloud_connector_headers(
        &*db,
        &state.policy,
        &state.keys,
        &state.config,
        who.actor.id,
        None,
    )
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    match service_client(&state)?.list_tools(&headers).await {
        Ok(tools) => Ok(HttpResponse::Ok().json(json!({ "tools": tools }))),
        Err(e) => Ok(service_unavailable(&e)),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct ServiceAccountParams {
    name: Option<String>,
    username: Option<String>,
    email: Option<String>,
}

fn service_account_json(account: &ServiceAccountUser) -> Value {
    json!({
        "id": account.id,
        "username": account.username,
        "name": account.name,
        "email": account.email,
    })
}

/// `POST /service_accounts` (GitLab's instance service accounts; admins): a
/// user that acts for humans under composite identity and cannot sign in.
pub(super) async fn create_service_account(
    state: web::Data<AppState>,
    req: HttpRequest,
    params: Params<ServiceAccountParams>,
) -> Result<HttpResponse, ApiError> {
    super::require_admin(&state, &req, WRITE_SCOPES).await?;
    let p = params.into_inner();
    let suffix = hex::encode(uuid::Uuid::new_v4().as_bytes())
        .chars()
        .take(16)
        .collect::<String>();
    let username = p
        .username
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| format!("service_account_{suffix}"));
    if username.len() > 255
        || !username
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(ApiError::invalid("username", "is invalid"));
    }
    let name = p
        .name
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "Service account user".into());
    let email = p
        .email
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| format!("{username}@noreply.service-accounts.local"));
    let db = state.pool.get().await?;
    let account = users::create_service_account(&*db, &username, &name, &email)
        .await?
        .ok_or_else(|| ApiError::invalid("username", "has already been taken"))?;
    Ok(HttpResponse::Created().json(service_account_json(&account)))
}

#[derive(Debug, Deserialize)]
pub(super) struct WorkflowServiceAccountParams {
    user_id: Option<i64>,
}

/// `PUT /ai/duo_workflows/service_account {user_id}` (our addition; admins):
/// the service account remote (`ambient`) workflows run as; `null` unsets it.
pub(super) async fn set_workflow_service_account(
    state: web::Data<AppState>,
    req: HttpRequest,
    params: Params<WorkflowServiceAccountParams>,
) -> Result<HttpResponse, ApiError> {
    super::require_admin(&state, &req, WRITE_SCOPES).await?;
    let user_id = params.into_inner().user_id;
    let db = state.pool.get().await?;
    if let Some(id) = user_id {
        match users::is_service_account(&*db, id).await? {
            None => return Err(ApiError::NotFound("User")),
            Some(false) => {
                return Err(ApiError::invalid(
                    "user_id",
                    "must be a service account user",
                ));
            }
            Some(true) => {}
        }
    }
    crate::instance::set_workflow_service_account_id(&*db, user_id).await?;
    Ok(HttpResponse::Ok().json(json!({ "service_account_id": user_id })))
}

/// `GET /ai/duo_workflows/service_account` (admins).
pub(super) async fn show_workflow_service_account(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    super::require_admin(&state, &req, READ_SCOPES).await?;
    let db = state.pool.get().await?;
    let id = crate::instance::workflow_service_account_id(&*db).await?;
    Ok(HttpResponse::Ok().json(json!({ "service_account_id": id })))
}
