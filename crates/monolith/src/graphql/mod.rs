//! GitLab's Duo Chat GraphQL API at `/api/graphql` (juniper), with GitLab's type
//! names so GitLab's own clients validate against it.

use std::pin::Pin;
use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use futures::{Stream, StreamExt};
use juniper::{
    FieldError, FieldResult, GraphQLEnum, GraphQLInputObject, GraphQLObject, GraphQLScalar,
    RootNode, graphql_object, graphql_subscription, graphql_value,
};

use crate::app_state::AppState;
use crate::chat::live::{self, LiveHub, LiveMessage};
use crate::chat::{self, ChatError, ChatService, ConversationType, Role, StoredMessage};
use crate::gid;
use crate::identity::tokens::AuthenticatedUser;
use crate::policy::{Actor, Policy};
use crate::rest::{self, ApiError};

/// Deepest selection nesting accepted.
pub const MAX_QUERY_DEPTH: usize = 12;
/// Most fields (selections) accepted in one document.
pub const MAX_QUERY_COMPLEXITY: usize = 250;
/// Largest query document accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 20_000;

#[derive(Clone)]
pub struct GqlContext {
    pub chat: Arc<ChatService>,
    pub policy: Policy,
    pub pool: deadpool_postgres::Pool,
    pub user: Option<Actor>,
    pub username: Option<String>,
    /// Whether the token may run mutations: GitLab lets `read_api` tokens
    /// query only; `aiAction` needs `api` or `ai_features`.
    pub may_mutate: bool,
    pub live: Arc<LiveHub>,
}

impl juniper::Context for GqlContext {}

impl GqlContext {
    fn new(state: &AppState, user: Option<AuthenticatedUser>) -> Self {
        GqlContext {
            chat: state.chat.clone(),
            policy: state.policy.clone(),
            pool: state.pool.clone(),
            user: user.as_ref().map(Actor::from),
            may_mutate: user
                .as_ref()
                .is_some_and(|u| u.has_any_scope(&["api", "ai_features"])),
            username: user.map(|u| u.username),
            live: state.live.clone(),
        }
    }
}

macro_rules! id_scalar {
    ($rust:ident, $name:literal) => {
        #[derive(Debug, Clone, PartialEq, GraphQLScalar)]
        #[graphql(name = $name, transparent)]
        pub struct $rust(pub String);
    };
}

id_scalar!(AiModelId, "AiModelID");
id_scalar!(AiAgentVersionId, "AiAgentVersionID");
id_scalar!(AiConversationThreadId, "AiConversationThreadID");
id_scalar!(ProjectId, "ProjectID");
id_scalar!(NamespaceId, "NamespaceID");
id_scalar!(GroupId, "GroupID");
id_scalar!(UserId, "UserID");
id_scalar!(Time, "Time");
// Arbitrary JSON, carried as its serialised text.
id_scalar!(Json, "JSON");

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "AiConversationsThreadsConversationType")]
pub enum ConversationTypeEnum {
    DuoChatLegacy,
    DuoCodeReview,
    DuoQuickChat,
    DuoChat,
}

impl From<ConversationTypeEnum> for ConversationType {
    fn from(v: ConversationTypeEnum) -> Self {
        match v {
            ConversationTypeEnum::DuoChatLegacy => ConversationType::DuoChatLegacy,
            ConversationTypeEnum::DuoCodeReview => ConversationType::DuoCodeReview,
            ConversationTypeEnum::DuoQuickChat => ConversationType::DuoQuickChat,
            ConversationTypeEnum::DuoChat => ConversationType::DuoChat,
        }
    }
}

impl From<ConversationType> for ConversationTypeEnum {
    fn from(v: ConversationType) -> Self {
        match v {
            ConversationType::DuoChatLegacy => ConversationTypeEnum::DuoChatLegacy,
            ConversationType::DuoCodeReview => ConversationTypeEnum::DuoCodeReview,
            ConversationType::DuoQuickChat => ConversationTypeEnum::DuoQuickChat,
            ConversationType::DuoChat => ConversationTypeEnum::DuoChat,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "AiAdditionalContextCategory")]
pub enum AdditionalContextCategory {
    File,
    Snippet,
    MergeRequest,
    Issue,
    Dependency,
    LocalGit,
    Terminal,
    UserRule,
    Repository,
    Directory,
    AgentUserEnvironment,
    Attachments,
}

impl AdditionalContextCategory {
    fn wire(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Snippet => "snippet",
            Self::MergeRequest => "merge_request",
            Self::Issue => "issue",
            Self::Dependency => "dependency",
            Self::LocalGit => "local_git",
            Self::Terminal => "terminal",
            Self::UserRule => "user_rule",
            Self::Repository => "repository",
            Self::Directory => "directory",
            Self::AgentUserEnvironment => "agent_user_environment",
            Self::Attachments => "attachments",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "AiMessageRole")]
pub enum AiMessageRole {
    User,
    Assistant,
    System,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "AiMessageType")]
pub enum AiMessageType {
    Tool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "AiAction")]
pub enum AiActionEnum {
    Chat,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiCurrentFileInput")]
pub struct AiCurrentFileInput {
    pub file_name: String,
    pub selected_text: String,
    pub content_above_cursor: Option<String>,
    pub content_below_cursor: Option<String>,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiAdditionalContextInput")]
pub struct AiAdditionalContextInput {
    pub id: String,
    pub category: AdditionalContextCategory,
    pub content: String,
    pub metadata: Option<Json>,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiChatInput")]
pub struct AiChatInput {
    pub content: String,
    pub resource_id: Option<AiModelId>,
    pub namespace_id: Option<NamespaceId>,
    pub agent_version_id: Option<AiAgentVersionId>,
    pub current_file: Option<AiCurrentFileInput>,
    pub additional_context: Option<Vec<AiAdditionalContextInput>>,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiActionInput")]
pub struct AiActionInput {
    pub chat: Option<AiChatInput>,
    pub client_subscription_id: Option<String>,
    pub platform_origin: Option<String>,
    pub project_id: Option<ProjectId>,
    pub root_namespace_id: Option<GroupId>,
    pub thread_id: Option<AiConversationThreadId>,
    pub conversation_type: Option<ConversationTypeEnum>,
    pub client_mutation_id: Option<String>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiActionPayload")]
pub struct AiActionPayload {
    pub request_id: Option<String>,
    pub thread_id: Option<AiConversationThreadId>,
    pub errors: Vec<String>,
    pub client_mutation_id: Option<String>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiAdditionalContext")]
pub struct AiAdditionalContext {
    pub id: String,
    pub category: String,
    pub content: String,
    pub metadata: Option<Json>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiMessageExtras")]
pub struct AiMessageExtras {
    pub sources: Option<Vec<Json>>,
    pub has_feedback: bool,
    pub additional_context: Option<Vec<AiAdditionalContext>>,
}

#[derive(Debug, Clone)]
pub struct AiMessage {
    pub stored: StoredMessage,
    /// Set on streamed chunks (1, 2, 3…), which are never stored.
    pub chunk_id: Option<i32>,
}

impl From<LiveMessage> for AiMessage {
    fn from(live: LiveMessage) -> Self {
        AiMessage {
            stored: live.message,
            chunk_id: live.chunk_id,
        }
    }
}

#[graphql_object]
#[graphql(name = "AiMessage", context = GqlContext)]
impl AiMessage {
    fn id(&self) -> Option<String> {
        Some(self.stored.message_xid.to_string())
    }
    fn request_id(&self) -> Option<String> {
        self.stored.request_xid.map(|r| r.to_string())
    }
    fn content(&self) -> Option<String> {
        Some(self.stored.content.clone())
    }
    fn content_html(&self) -> Option<String> {
        if !self.stored.errors.is_empty() || self.chunk_id.is_some() {
            return None;
        }
        Some(chat::render_markdown(&self.stored.content))
    }
    fn role(&self) -> AiMessageRole {
        match self.stored.role {
            Role::User => AiMessageRole::User,
            Role::Assistant => AiMessageRole::Assistant,
        }
    }
    fn timestamp(&self) -> Time {
        Time(
            self.stored
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        )
    }
    fn chunk_id(&self) -> Option<i32> {
        self.chunk_id
    }
    fn errors(&self) -> Vec<String> {
        self.stored.errors.clone()
    }
    fn error_code(&self) -> Option<String> {
        self.stored.error_code.clone()
    }
    #[graphql(name = "type")]
    fn message_type(&self) -> Option<AiMessageType> {
        None
    }
    fn extras(&self) -> AiMessageExtras {
        let extras = &self.stored.extras;
        let sources = extras
            .get("sources")
            .and_then(|s| s.as_array())
            .map(|a| a.iter().map(|v| Json(v.to_string())).collect());
        let additional_context = extras
            .get("additional_context")
            .and_then(|s| s.as_array())
            .map(|items| {
                items
                    .iter()
                    .map(|c| AiAdditionalContext {
                        id: c["id"].as_str().unwrap_or_default().to_owned(),
                        category: c["category"].as_str().unwrap_or_default().to_owned(),
                        content: c["content"].as_str().unwrap_or_default().to_owned(),
                        metadata: c
                            .get("metadata")
                            .filter(|m| !m.is_null())
                            .map(|m| Json(m.to_string())),
                    })
                    .collect()
            });
        AiMessageExtras {
            sources,
            has_feedback: self.stored.has_feedback,
            additional_context,
        }
    }
    fn agent_version_id(&self) -> Option<AiAgentVersionId> {
        None
    }
    fn thread_id(&self) -> Option<AiConversationThreadId> {
        Some(AiConversationThreadId(gid::format(
            "Ai::Conversation::Thread",
            self.stored.thread_id,
        )))
    }
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "PageInfo")]
pub struct PageInfo {
    pub end_cursor: Option<String>,
    pub start_cursor: Option<String>,
    pub has_next_page: bool,
    pub has_previous_page: bool,
}

impl PageInfo {
    fn single_page() -> Self {
        PageInfo {
            end_cursor: None,
            start_cursor: None,
            has_next_page: false,
            has_previous_page: false,
        }
    }
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiMessageConnection", context = GqlContext)]
pub struct AiMessageConnection {
    pub nodes: Vec<AiMessage>,
    pub page_info: PageInfo,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiConversationsThread")]
pub struct AiConversationsThread {
    pub id: AiConversationThreadId,
    pub conversation_type: ConversationTypeEnum,
    pub created_at: Time,
    pub last_updated_at: Time,
    pub title: Option<String>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiConversationsThreadConnection")]
pub struct AiConversationsThreadConnection {
    pub nodes: Vec<AiConversationsThread>,
    pub page_info: PageInfo,
}

pub struct CurrentUser {
    actor: Actor,
    username: String,
}

#[graphql_object]
#[graphql(name = "CurrentUser", context = GqlContext)]
impl CurrentUser {
    fn id(&self) -> UserId {
        UserId(gid::format("User", self.actor.id))
    }
    fn username(&self) -> &str {
        &self.username
    }
    async fn duo_chat_available(&self, ctx: &GqlContext) -> FieldResult<bool> {
        let db = ctx.pool.get().await.map_err(internal)?;
        Ok(ctx
            .policy
            .authorize_chat_user(&**db, Some(self.actor))
            .await
            .is_ok())
    }
    async fn duo_chat_available_features(&self, ctx: &GqlContext) -> FieldResult<Vec<String>> {
        let db = ctx.pool.get().await.map_err(internal)?;
        ctx.policy
            .duo_chat_available_features(&**db, Some(self.actor))
            .await
            .map_err(internal)
    }
}

fn coded(message: impl std::fmt::Display, code: &str) -> FieldError {
    FieldError::new(message, graphql_value!({ "code": code }))
}

fn internal<E: std::fmt::Display>(e: E) -> FieldError {
    tracing::error!(error = %e, "graphql resolver failed");
    coded("Internal server error", "INTERNAL_SERVER_ERROR")
}

fn parse_thread_id(id: &AiConversationThreadId) -> FieldResult<i64> {
    match gid::parse(&id.0) {
        Some(("Ai::Conversation::Thread", n)) => Ok(n),
        _ => Err(coded(
            format!("{} is not a valid AiConversationThreadID", id.0),
            "ARGUMENT_ERROR",
        )),
    }
}

pub struct Query;

#[graphql_object]
#[graphql(context = GqlContext)]
impl Query {
    fn current_user(ctx: &GqlContext) -> Option<CurrentUser> {
        Some(CurrentUser {
            actor: ctx.user?,
            username: ctx.username.clone()?,
        })
    }

    async fn ai_messages(
        ctx: &GqlContext,
        request_ids: Option<Vec<String>>,
        roles: Option<Vec<AiMessageRole>>,
        conversation_type: Option<ConversationTypeEnum>,
        thread_id: Option<AiConversationThreadId>,
        agent_version_id: Option<AiAgentVersionId>,
    ) -> FieldResult<AiMessageConnection> {
        let _ = agent_version_id;
        let thread = thread_id.as_ref().map(parse_thread_id).transpose()?;
        let roles: Option<Vec<Role>> = roles.map(|rs| {
            rs.into_iter()
                .filter_map(|r| match r {
                    AiMessageRole::User => Some(Role::User),
                    AiMessageRole::Assistant => Some(Role::Assistant),
                    AiMessageRole::System => None,
                })
                .collect()
        });
        let messages = ctx
            .chat
            .messages(
                ctx.user,
                thread,
                conversation_type.map(Into::into),
                request_ids.as_deref(),
                roles.as_deref(),
            )
            .await
            .map_err(chat_field_error)?;
        Ok(AiMessageConnection {
            nodes: messages
                .into_iter()
                .map(|stored| AiMessage {
                    stored,
                    chunk_id: None,
                })
                .collect(),
            page_info: PageInfo::single_page(),
        })
    }

    async fn ai_conversation_threads(
        ctx: &GqlContext,
    ) -> FieldResult<AiConversationsThreadConnection> {
        let threads = ctx.chat.threads(ctx.user).await.map_err(chat_field_error)?;
        let time = |t: chrono::DateTime<chrono::Utc>| {
            Time(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        };
        Ok(AiConversationsThreadConnection {
            nodes: threads
                .into_iter()
                .map(|t| AiConversationsThread {
                    id: AiConversationThreadId(gid::format("Ai::Conversation::Thread", t.id)),
                    conversation_type: t.conversation_type.into(),
                    created_at: time(t.created_at),
                    last_updated_at: time(t.last_updated_at),
                    title: t.title,
                })
                .collect(),
            page_info: PageInfo::single_page(),
        })
    }
}

/// Errors that stop the whole field (as opposed to `errors` in the payload).
fn chat_field_error(e: ChatError) -> FieldError {
    match e {
        ChatError::Unauthenticated => coded(
            "The resource that you are attempting to access does not exist or you don't have permission to perform this action",
            "UNAUTHENTICATED",
        ),
        ChatError::RateLimited => coded(e.to_string(), "RATE_LIMITED"),
        ChatError::Invalid(msg) => coded(msg, "ARGUMENT_ERROR"),
        ChatError::ThreadNotFound => coded(e.to_string(), "THREAD_NOT_FOUND"),
        ChatError::ResourceNotFound => coded(e.to_string(), "RESOURCE_NOT_AVAILABLE"),
        ChatError::ResourceNotPermitted => coded(e.to_string(), "AI_NOT_PERMITTED"),
        ChatError::Denied(code) => coded(code.user_message(), &code.to_string()),
        ChatError::Internal(detail) => internal(detail),
    }
}

pub struct Mutation;

#[graphql_object]
#[graphql(context = GqlContext)]
impl Mutation {
    async fn ai_action(ctx: &GqlContext, input: AiActionInput) -> FieldResult<AiActionPayload> {
        let client_mutation_id = input.client_mutation_id.clone();
        if ctx.user.is_some() && !ctx.may_mutate {
            return Err(coded(
                "The token needs the api or ai_features scope to send chat questions",
                "INSUFFICIENT_SCOPE",
            ));
        }
        let Some(chat_input) = input.chat else {
            return Err(coded(
                "Only one method argument is required",
                "ARGUMENT_ERROR",
            ));
        };
        let thread_id = input.thread_id.as_ref().map(parse_thread_id).transpose()?;
        let request = chat::ChatRequest {
            content: chat_input.content,
            resource_id: chat_input.resource_id.map(|r| r.0),
            thread_id,
            conversation_type: input.conversation_type.map(Into::into),
            client_subscription_id: input.client_subscription_id,
            current_file: chat_input.current_file.map(|f| chat::CurrentFile {
                file_name: f.file_name,
                selected_text: f.selected_text,
                content_above_cursor: f.content_above_cursor,
                content_below_cursor: f.content_below_cursor,
            }),
            additional_context: chat_input
                .additional_context
                .unwrap_or_default()
                .into_iter()
                .map(|c| chat::AdditionalContext {
                    id: c.id,
                    category: c.category.wire().to_owned(),
                    content: c.content,
                    metadata: c.metadata.and_then(|m| serde_json::from_str(&m.0).ok()),
                })
                .collect(),
            platform_origin: input.platform_origin,
        };
        match ctx.chat.submit(ctx.user, request).await {
            Ok(accepted) => Ok(AiActionPayload {
                request_id: Some(accepted.request_id.to_string()),
                thread_id: Some(AiConversationThreadId(gid::format(
                    "Ai::Conversation::Thread",
                    accepted.thread_id,
                ))),
                errors: Vec::new(),
                client_mutation_id,
            }),
            // Refusals the user should read go into `errors`, with the code's text.
            Err(ChatError::Denied(code)) => Ok(AiActionPayload {
                request_id: None,
                thread_id: None,
                errors: vec![code.error_text(&ctx.chat_docs_base())],
                client_mutation_id,
            }),
            // GitLab answers this one from the service, not as a GraphQL error.
            Err(e @ ChatError::ResourceNotPermitted) => Ok(AiActionPayload {
                request_id: None,
                thread_id: None,
                errors: vec![e.to_string()],
                client_mutation_id,
            }),
            Err(e) => Err(chat_field_error(e)),
        }
    }
}

impl GqlContext {
    fn chat_docs_base(&self) -> String {
        self.chat.docs_base_url.clone()
    }
}

type AiMessageStream = Pin<Box<dyn Stream<Item = Result<AiMessage, FieldError>> + Send>>;

pub struct Subscription;

#[graphql_subscription]
#[graphql(context = GqlContext)]
impl Subscription {
    /// Chat messages of the signed-in user as they happen: with a
    /// `clientSubscriptionId`, the streamed chunks and then the full answer of that
    /// request; otherwise every full message (questions and answers) of `aiAction`.
    async fn ai_completion_response(
        ctx: &GqlContext,
        user_id: Option<UserId>,
        resource_id: Option<AiModelId>,
        agent_version_id: Option<AiAgentVersionId>,
        client_subscription_id: Option<String>,
        ai_action: Option<AiActionEnum>,
    ) -> FieldResult<AiMessageStream> {
        let _ = (agent_version_id, ai_action);
        let Some(user) = ctx.user else {
            return Err(coded("Unauthorized", "UNAUTHENTICATED"));
        };
        let own_id = gid::format("User", user.id);
        if user_id.as_ref().map(|u| u.0.as_str()) != Some(own_id.as_str()) {
            return Err(coded(
                "The resource that you are attempting to access does not exist or you don't have permission to perform this action",
                "RESOURCE_NOT_AVAILABLE",
            ));
        }
        if let Some(resource) = &resource_id {
            let db = ctx.pool.get().await.map_err(internal)?;
            ctx.chat
                .authorize_resource(&**db, user, &resource.0)
                .await
                .map_err(chat_field_error)?;
        }
        let topic = match client_subscription_id.as_deref() {
            Some(client_id) => live::client_topic(user.id, client_id),
            None => live::user_topic(user.id),
        };
        let receiver = ctx.live.subscribe(&topic).await.map_err(internal)?;
        let stream =
            tokio_stream::wrappers::BroadcastStream::new(receiver).filter_map(|item| async move {
                // A lagging receiver skips ahead; the stored answer stays readable.
                let value = item.ok()?;
                match serde_json::from_value::<LiveMessage>(value) {
                    Ok(live) => Some(Ok(AiMessage::from(live))),
                    Err(e) => {
                        tracing::warn!(error = %e, "ignoring a malformed live message");
                        None
                    }
                }
            });
        Ok(Box::pin(stream))
    }
}

pub type Schema = RootNode<Query, Mutation, Subscription>;

pub fn schema() -> Schema {
    Schema::new(Query, Mutation, Subscription)
}

/// Rough but safe limits on a document before it is executed: nesting depth of
/// selection sets, number of selected names, and size.
pub fn check_limits(query: &str) -> Result<(), (&'static str, String)> {
    if query.len() > MAX_QUERY_BYTES {
        return Err((
            "QUERY_TOO_LARGE",
            format!("Query is too large (maximum is {MAX_QUERY_BYTES} bytes)"),
        ));
    }
    let mut depth = 0usize;
    let mut max_depth = 0usize;
    let mut names = 0usize;
    let mut in_string = false;
    let mut in_comment = false;
    let mut prev_ident = false;
    let mut paren = 0usize;
    let mut chars = query.chars().peekable();
    while let Some(c) = chars.next() {
        if in_comment {
            in_comment = c != '\n';
            continue;
        }
        if in_string {
            if c == '\\' {
                chars.next();
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        let ident = c.is_ascii_alphanumeric() || c == '_';
        match c {
            '#' => in_comment = true,
            '"' => in_string = true,
            '{' => {
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            '}' => depth = depth.saturating_sub(1),
            '(' => paren += 1,
            ')' => paren = paren.saturating_sub(1),
            _ => {}
        }
        if ident && !prev_ident && depth > 0 && paren == 0 {
            names += 1;
        }
        prev_ident = ident;
    }
    // The operation's own braces count as one level.
    if max_depth > MAX_QUERY_DEPTH + 1 {
        return Err((
            "QUERY_TOO_DEEP",
            format!("Query has depth of {max_depth}, which exceeds max depth of {MAX_QUERY_DEPTH}"),
        ));
    }
    if names > MAX_QUERY_COMPLEXITY {
        return Err((
            "QUERY_TOO_COMPLEX",
            format!(
                "Query has complexity of {names}, which exceeds max complexity of {MAX_QUERY_COMPLEXITY}"
            ),
        ));
    }
    Ok(())
}

fn error_body(code: &str, message: &str) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({
        "errors": [{ "message": message, "extensions": { "code": code } }]
    }))
}

/// `POST /api/graphql`.
pub async fn handle(
    state: web::Data<AppState>,
    schema: web::Data<Schema>,
    req: HttpRequest,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let user = rest::optional_user(&state, &req).await?;
    if let Some(u) = &user
        && !u.has_any_scope(&["api", "read_api", "ai_features"])
    {
        return Err(ApiError::InsufficientScope(
            "api read_api ai_features".into(),
        ));
    }
    let batch: juniper::http::GraphQLBatchRequest = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return Ok(error_body(
                "BAD_REQUEST",
                &format!("Invalid JSON body: {e}"),
            ));
        }
    };
    let queries: Vec<&str> = match &batch {
        juniper::http::GraphQLBatchRequest::Single(r) => vec![r.query.as_str()],
        juniper::http::GraphQLBatchRequest::Batch(rs) => {
            rs.iter().map(|r| r.query.as_str()).collect()
        }
    };
    for q in queries {
        if let Err((code, message)) = check_limits(q) {
            return Ok(error_body(code, &message));
        }
    }
    let ctx = GqlContext::new(&state, user);
    let response = batch.execute(&schema, &ctx).await;
    // Successful responses go out as they are; only errors need patching.
    if response.is_ok() {
        return Ok(HttpResponse::Ok().json(response));
    }
    let mut body = serde_json::to_value(&response)
        .map_err(|e| ApiError::Internal(format!("serialising a GraphQL response: {e}")))?;
    add_missing_codes(&mut body);
    Ok(HttpResponse::Ok().json(body))
}

/// Juniper's own parse and validation errors carry no `extensions.code`;
/// every error we send must, so clients can branch on it. A response without
/// `data` failed before execution.
fn add_missing_codes(body: &mut serde_json::Value) {
    let responses: Vec<&mut serde_json::Value> = match body {
        serde_json::Value::Array(items) => items.iter_mut().collect(),
        single => vec![single],
    };
    for response in responses {
        let code = if response.get("data").is_some_and(|d| !d.is_null()) {
            "INTERNAL_SERVER_ERROR"
        } else {
            "GRAPHQL_VALIDATION_FAILED"
        };
        let Some(errors) = response.get_mut("errors").and_then(|e| e.as_array_mut()) else {
            continue;
        };
        for error in errors {
            let Some(error) = error.as_object_mut() else {
                continue;
            };
            let extensions = error
                .entry("extensions")
                .or_insert_with(|| serde_json::json!({}));
            if let Some(extensions) = extensions.as_object_mut() {
                extensions
                    .entry("code")
                    .or_insert_with(|| serde_json::json!(code));
            }
        }
    }
}

/// `GET /api/graphql`: a WebSocket upgrade opens a subscription socket; anything
/// else is an ordinary request.
pub async fn handle_get(
    state: web::Data<AppState>,
    schema: web::Data<Schema>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let upgrade = req
        .headers()
        .get(actix_web::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if upgrade {
        return open_socket(state, schema, req, payload).await;
    }
    let body = payload.to_bytes().await?;
    Ok(handle(state, schema, req, body).await?)
}

/// Why a subscription socket was refused at `connection_init`; the text is what
/// the client reads.
#[derive(Debug, thiserror::Error)]
pub enum SocketAuthError {
    #[error("Unauthorized: send a personal access token as Authorization: Bearer <token>")]
    Unauthorized,
    #[error("Forbidden: the token needs the api, read_api or ai_features scope")]
    InsufficientScope,
    #[error("Forbidden: the user is blocked")]
    Blocked,
    #[error("Internal server error")]
    Internal,
}

/// The token in a `connection_init` payload: `{"Authorization": "Bearer <t>"}`
/// (any case), or `{"PRIVATE-TOKEN": "<t>"}`.
fn token_from_init(params: &juniper::Variables) -> Option<String> {
    use juniper::ScalarValue;
    let text = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_scalar())
            .and_then(|v| v.try_to_string())
    };
    if let Some(token) = text("private-token") {
        return Some(token.trim().to_owned());
    }
    let auth = text("authorization")?;
    let (scheme, rest) = auth.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim().to_owned())
}

/// Opens a `graphql-transport-ws` (or legacy `graphql-ws`) socket. The user is the
/// owner of the token in the upgrade request's headers, or else of the one in
/// the `connection_init` payload; a socket without a valid token is refused.
async fn open_socket(
    state: web::Data<AppState>,
    schema: web::Data<Schema>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let header_user = rest::optional_user(&state, &req).await?;
    let state = state.get_ref().clone();
    let keep_alive = state.config.ws_keep_alive;
    let init = move |params: juniper::Variables| async move {
        let user = match header_user {
            Some(user) => user,
            None => {
                let token = token_from_init(&params).ok_or(SocketAuthError::Unauthorized)?;
                let db = state
                    .pool
                    .get()
                    .await
                    .map_err(|_| SocketAuthError::Internal)?;
                crate::identity::tokens::authenticate(&**db, &token)
                    .await
                    .map_err(|e| match e {
                        crate::identity::tokens::TokenError::Invalid => {
                            SocketAuthError::Unauthorized
                        }
                        crate::identity::tokens::TokenError::Blocked => SocketAuthError::Blocked,
                        _ => SocketAuthError::Internal,
                    })?
            }
        };
        if !user.has_any_scope(&["api", "read_api", "ai_features"]) {
            return Err(SocketAuthError::InsufficientScope);
        }
        Ok(
            juniper_graphql_ws::ConnectionConfig::new(GqlContext::new(&state, Some(user)))
                .with_keep_alive_interval(keep_alive)
                // juniper would otherwise close a socket whose client sends no
                // pings of its own within one interval; graphql-ws clients
                // (GitLab's among them) do not ping by default, so open tabs
                // would lose their subscription after 15 s of quiet.
                .with_keep_alive_timeout(std::time::Duration::ZERO),
        )
    };
    juniper_actix::subscriptions::ws_handler(req, payload, schema.into_inner(), init).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_catch_deep_and_wide_queries() {
        assert!(check_limits("query { currentUser { id } }").is_ok());
        let deep = format!("query {}{}", "{ a ".repeat(20), "}".repeat(20));
        assert_eq!(check_limits(&deep).unwrap_err().0, "QUERY_TOO_DEEP");
        let wide = format!("query {{ {} }}", "f ".repeat(300));
        assert_eq!(check_limits(&wide).unwrap_err().0, "QUERY_TOO_COMPLEX");
        // Braces inside strings do not count.
        assert!(check_limits(&format!("query {{ a(x: \"{}\") }}", "{".repeat(50))).is_ok());
    }

    #[tokio::test]
    async fn schema_uses_gitlab_type_names() {
        let schema = schema();
        for name in [
            "AiActionInput",
            "AiChatInput",
            "AiModelID",
            "AiConversationThreadID",
            "AiCurrentFileInput",
            "AiAdditionalContextInput",
            "AiConversationsThreadsConversationType",
            "AiMessageRole",
            "ProjectID",
            "UserID",
            "AiAction",
            "AiAgentVersionID",
        ] {
            let query = format!("{{ __type(name: \"{name}\") {{ name }} }}");
            let vars = juniper::Variables::new();
            let ctx = test_context();
            let (value, errors) = juniper::execute(&query, None, &schema, &vars, &ctx)
                .await
                .unwrap();
            assert!(errors.is_empty());
            assert!(
                value.to_string().contains(name),
                "{name} missing from schema"
            );
        }
    }

    fn test_context() -> GqlContext {
        let pool = crate::db::pool_for_url("postgres://nobody@127.0.0.1:1/none", 1).unwrap();
        let policy = Policy::new(Arc::new(
            crate::policy::add_ons::AddOnCatalogue::built_in().unwrap(),
        ));
        GqlContext {
            chat: Arc::new(ChatService {
                pool: pool.clone(),
                policy: policy.clone(),
                queue: Arc::new(chat::PgCompletionQueue { max_attempts: 1 }),
                rate_limit: 1,
                rate_window: std::time::Duration::from_secs(1),
                docs_base_url: String::new(),
            }),
            policy,
            pool,
            user: None,
            username: None,
            may_mutate: false,
            live: LiveHub::new("postgres://nobody@127.0.0.1:1/none"),
        }
    }
}
