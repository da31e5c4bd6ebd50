//! The chat types in GitLab's names and shapes.

use juniper::{FieldResult, GraphQLEnum, GraphQLInputObject, GraphQLObject, graphql_object};

use super::*;
use crate::chat;
use crate::chat::live::LiveMessage;
use crate::chat::{ConversationType, Role, StoredMessage};

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
    const ALL: [Self; 10] = [
        Self::File,
        Self::Snippet,
        Self::MergeRequest,
        Self::Issue,
        Self::Dependency,
        Self::LocalGit,
        Self::Terminal,
        Self::UserRule,
        Self::Repository,
        Self::Directory,
    ];

    /// The category of a stored (lower-case) name.
    pub(crate) fn from_wire(wire: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.wire() == wire)
    }

    pub(crate) fn wire(self) -> &'static str {
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

    /// The category the gateway knows, if any (GitLab's newer categories
    /// have no use in this agent yet and are left out of the question).
    pub(crate) fn contract(self) -> Option<contracts::ContextCategory> {
        use contracts::ContextCategory as C;
        Some(match self {
            Self::File => C::File,
            Self::Snippet => C::Snippet,
            Self::MergeRequest => C::MergeRequest,
            Self::Issue => C::Issue,
            Self::Dependency => C::Dependency,
            Self::LocalGit => C::LocalGit,
            Self::Terminal => C::Terminal,
            Self::UserRule => C::UserRule,
            Self::Repository => C::Repository,
            Self::Directory => C::Directory,
            Self::AgentUserEnvironment | Self::Attachments => return None,
        })
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
    pub id: juniper::ID,
    pub category: AdditionalContextCategory,
    pub content: String,
    pub metadata: Option<Json>,
}

/// Longest `metadata` accepted, as serialised JSON.
pub const MAX_CONTEXT_METADATA_BYTES: usize = 64 * 1024;
/// Deepest nesting of objects and arrays accepted in `metadata` (the
/// object itself is level 1).
pub const MAX_CONTEXT_METADATA_DEPTH: usize = 8;

impl AiAdditionalContextInput {
    /// `metadata` as the object it must be. GitLab's `JSON` scalar takes it
    /// as an object (what GitLab's editor extensions send) or as serialised
    /// JSON text (what our docs promise); both become the same object. A
    /// value that is not an object (or text holding one), or one too large or
    /// too deeply nested, is refused rather than dropped.
    pub fn metadata_object(&self) -> FieldResult<Option<serde_json::Value>> {
        let Some(metadata) = &self.metadata else {
            return Ok(None);
        };
        let refused = |why: String| {
            coded(
                format!("additionalContext.metadata {why}"),
                "ARGUMENT_ERROR",
            )
        };
        let too_large = || {
            refused(format!(
                "is too large (maximum is {MAX_CONTEXT_METADATA_BYTES} bytes)"
            ))
        };
        let value = match metadata.value() {
            // Serialised text: parsed once (text holding text is refused below).
            serde_json::Value::String(text) => {
                if text.len() > MAX_CONTEXT_METADATA_BYTES {
                    return Err(too_large());
                }
                serde_json::from_str(&text)
                    .map_err(|e| refused(format!("is not valid JSON text: {e}")))?
            }
            other => other,
        };
        match &value {
            serde_json::Value::Null => Ok(None),
            serde_json::Value::Object(_) => {
                if json_depth(&value) > MAX_CONTEXT_METADATA_DEPTH {
                    return Err(refused(format!(
                        "is nested too deeply (maximum depth is {MAX_CONTEXT_METADATA_DEPTH})"
                    )));
                }
                if value.to_string().len() > MAX_CONTEXT_METADATA_BYTES {
                    return Err(too_large());
                }
                Ok(Some(value))
            }
            _ => Err(refused(
                "must be a JSON object, or its serialised text".to_owned(),
            )),
        }
    }
}

/// How deeply objects and arrays nest in `value` (a scalar is 0).
fn json_depth(value: &serde_json::Value) -> usize {
    let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
        serde_json::Value::Object(map) => Box::new(map.values()),
        serde_json::Value::Array(items) => Box::new(items.iter()),
        _ => return 0,
    };
    1 + children.map(json_depth).max().unwrap_or(0)
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
    pub root_namespace_id: Option<NamespaceId>,
    pub thread_id: Option<AiConversationThreadId>,
    pub conversation_type: Option<ConversationTypeEnum>,
    pub client_mutation_id: Option<String>,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "DeleteConversationThreadInput")]
pub struct DeleteConversationThreadInput {
    pub thread_id: AiConversationThreadId,
    pub client_mutation_id: Option<String>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "DeleteConversationThreadPayload")]
pub struct DeleteConversationThreadPayload {
    pub success: bool,
    pub errors: Vec<String>,
    pub client_mutation_id: Option<String>,
}

/// Our addition: a verdict on an answer (GitLab's clients send theirs as
/// tracking events).
#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiChatFeedbackInput")]
pub struct AiChatFeedbackInput {
    /// The answer's `AiMessage.id`.
    pub message_id: juniper::ID,
    pub helpful: bool,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiChatFeedbackPayload")]
pub struct AiChatFeedbackPayload {
    pub errors: Vec<String>,
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
    pub id: juniper::ID,
    pub category: AdditionalContextCategory,
    pub content: String,
    pub metadata: Option<Json>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiMessageExtras")]
pub struct AiMessageExtras {
    pub sources: Option<Vec<Json>>,
    pub has_feedback: Option<bool>,
    pub additional_context: Option<Vec<AiAdditionalContext>>,
}

#[derive(Debug, Clone)]
pub struct AiMessage {
    pub stored: StoredMessage,
    /// Set on streamed chunks (1, 2, 3…), which are never stored.
    pub chunk_id: Option<i32>,
    /// A `TOOL` message (live only).
    pub tool: bool,
}

impl From<LiveMessage> for AiMessage {
    fn from(live: LiveMessage) -> Self {
        AiMessage {
            stored: live.message,
            chunk_id: live.chunk_id,
            tool: live.tool,
        }
    }
}

#[graphql_object]
#[graphql(name = "AiMessage", context = GqlContext)]
impl AiMessage {
    fn id(&self) -> Option<juniper::ID> {
        Some(juniper::ID::new(self.stored.message_xid.to_string()))
    }
    fn request_id(&self) -> Option<String> {
        self.stored.request_xid.map(|r| r.to_string())
    }
    fn content(&self) -> Option<String> {
        Some(self.stored.content.clone())
    }
    fn content_html(&self) -> Option<String> {
        if !self.stored.errors.is_empty() || self.chunk_id.is_some() || self.tool {
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
    fn errors(&self) -> Option<Vec<String>> {
        Some(self.stored.errors.clone())
    }
    fn error_code(&self) -> Option<String> {
        self.stored.error_code.clone()
    }
    #[graphql(name = "type")]
    fn message_type(&self) -> Option<AiMessageType> {
        self.tool.then_some(AiMessageType::Tool)
    }
    fn extras(&self) -> Option<AiMessageExtras> {
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
                    .filter_map(|c| {
                        Some(AiAdditionalContext {
                            id: juniper::ID::new(c["id"].as_str().unwrap_or_default()),
                            category: AdditionalContextCategory::from_wire(
                                c["category"].as_str()?,
                            )?,
                            content: c["content"].as_str().unwrap_or_default().to_owned(),
                            metadata: c
                                .get("metadata")
                                .filter(|m| !m.is_null())
                                .map(|m| Json(m.to_string())),
                        })
                    })
                    .collect()
            });
        Some(AiMessageExtras {
            sources,
            has_feedback: Some(self.stored.has_feedback),
            additional_context,
        })
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
    pub(crate) fn single_page() -> Self {
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
    pub(crate) actor: Actor,
    pub(crate) username: String,
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
            .authorize_chat_user(&*db, Some(self.actor))
            .await
            .is_ok())
    }
    async fn duo_chat_available_features(&self, ctx: &GqlContext) -> FieldResult<Vec<String>> {
        let db = ctx.pool.get().await.map_err(internal)?;
        ctx.policy
            .duo_chat_available_features(&*db, Some(self.actor))
            .await
            .map_err(internal)
    }
}
