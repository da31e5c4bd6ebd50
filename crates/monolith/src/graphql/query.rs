//! The query root: the signed-in user, chat messages and threads.

use juniper::{FieldResult, graphql_object};

use super::*;
use crate::chat::Role;

pub struct Query;

#[graphql_object]
#[graphql(context = GqlContext)]
impl Query {
    /// Self-hosted model definitions (admins); `id` narrows to one.
    async fn ai_self_hosted_models(
        ctx: &GqlContext,
        id: Option<AiSelfHostedModelId>,
    ) -> FieldResult<super::ai_models::AiSelfHostedModelConnection> {
        super::ai_models::self_hosted_models(ctx, id).await
    }

    /// The model chosen for each AI feature (admins); `selfHostedModelId`
    /// narrows to the features that model serves.
    async fn ai_feature_settings(
        ctx: &GqlContext,
        self_hosted_model_id: Option<AiSelfHostedModelId>,
    ) -> FieldResult<super::ai_models::AiFeatureSettingConnection> {
        super::ai_models::feature_settings(ctx, self_hosted_model_id).await
    }

    /// Duo Workflow sessions: one by id, or the caller's own.
    async fn duo_workflow_workflows(
        ctx: &GqlContext,
        workflow_id: Option<AiDuoWorkflowsWorkflowId>,
        project_path: Option<juniper::ID>,
        #[graphql(name = "type")] workflow_type: Option<String>,
        first: Option<i32>,
    ) -> FieldResult<super::workflows::DuoWorkflowConnection> {
        super::workflows::workflows(ctx, workflow_id, project_path, workflow_type, first).await
    }

    /// A Duo Workflow session's history (its checkpoints), newest first.
    async fn duo_workflow_events(
        ctx: &GqlContext,
        workflow_id: AiDuoWorkflowsWorkflowId,
    ) -> FieldResult<super::workflows::DuoWorkflowEventConnection> {
        super::workflows::events(ctx, workflow_id).await
    }

    /// A group by its full path, with its AI analytics.
    async fn group(
        ctx: &GqlContext,
        full_path: juniper::ID,
    ) -> FieldResult<Option<super::ai_usage::Group>> {
        super::ai_usage::group(ctx, &full_path).await
    }

    /// A project by its full path, with its AI analytics.
    async fn project(
        ctx: &GqlContext,
        full_path: juniper::ID,
    ) -> FieldResult<Option<super::ai_usage::Project>> {
        super::ai_usage::project(ctx, &full_path).await
    }

    fn current_user(ctx: &GqlContext) -> Option<CurrentUser> {
        Some(CurrentUser {
            actor: ctx.user?,
            username: ctx.username.clone()?,
        })
    }

    async fn ai_messages(
        ctx: &GqlContext,
        request_ids: Option<Vec<juniper::ID>>,
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
                request_ids
                    .map(|ids| ids.iter().map(|i| i.to_string()).collect::<Vec<_>>())
                    .as_deref(),
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
                    tool: false,
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
