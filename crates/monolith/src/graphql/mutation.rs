//! The mutation root. Every mutation needs an `api` token
//! ([`TokenAccess::require_write`]), except the AI ones a Duo client makes
//! with an `ai_features` token: `aiAction`, `aiChatFeedback` and
//! `deleteConversationThread` ([`TokenAccess::require_ai`]).

use juniper::{FieldResult, graphql_object};

use super::*;
use crate::chat;

pub struct Mutation;

#[graphql_object]
#[graphql(context = GqlContext)]
impl Mutation {
    async fn ai_self_hosted_model_create(
        ctx: &GqlContext,
        input: super::ai_models::AiSelfHostedModelCreateInput,
    ) -> FieldResult<super::ai_models::AiSelfHostedModelPayload> {
        super::ai_models::create_model(ctx, input).await
    }

    async fn ai_self_hosted_model_update(
        ctx: &GqlContext,
        input: super::ai_models::AiSelfHostedModelUpdateInput,
    ) -> FieldResult<super::ai_models::AiSelfHostedModelPayload> {
        super::ai_models::update_model(ctx, input).await
    }

    async fn ai_self_hosted_model_delete(
        ctx: &GqlContext,
        input: super::ai_models::AiSelfHostedModelDeleteInput,
    ) -> FieldResult<super::ai_models::AiSelfHostedModelPayload> {
        super::ai_models::delete_model(ctx, input).await
    }

    async fn ai_feature_setting_update(
        ctx: &GqlContext,
        input: super::ai_models::AiFeatureSettingUpdateInput,
    ) -> FieldResult<super::ai_models::AiFeatureSettingUpdatePayload> {
        super::ai_models::update_feature_setting(ctx, input).await
    }

    /// Creates a Duo Workflow (and, with `startWorkflow`, starts its run in
    /// the product), as `POST /ai/duo_workflows/workflows` does.
    async fn ai_duo_workflow_create(
        ctx: &GqlContext,
        input: super::workflows::AiDuoWorkflowCreateInput,
    ) -> FieldResult<super::workflows::AiDuoWorkflowCreatePayload> {
        super::workflows::create(ctx, input).await
    }

    /// Deletes one of the signed-in user's conversation threads and its
    /// messages. An unknown thread and someone else's get the same answer.
    async fn delete_conversation_thread(
        ctx: &GqlContext,
        input: DeleteConversationThreadInput,
    ) -> FieldResult<DeleteConversationThreadPayload> {
        let Some(user) = ctx.user else {
            return Err(coded("Unauthorized", "UNAUTHENTICATED"));
        };
        ctx.access.require_ai()?;
        let not_available = || {
            coded(
                "The resource that you are attempting to access does not exist or you don't have permission to perform this action",
                "RESOURCE_NOT_AVAILABLE",
            )
        };
        let thread_id = parse_thread_id(&input.thread_id).map_err(|_| not_available())?;
        let db = ctx.pool.get().await.map_err(internal)?;
        if !chat::delete_thread(&*db, user.id, thread_id)
            .await
            .map_err(chat_field_error)?
        {
            return Err(not_available());
        }
        Ok(DeleteConversationThreadPayload {
            success: true,
            errors: vec![],
            client_mutation_id: input.client_mutation_id,
        })
    }

    /// Thumbs up or down on an answer, with an optional reason.
    async fn ai_chat_feedback(
        ctx: &GqlContext,
        input: AiChatFeedbackInput,
    ) -> FieldResult<AiChatFeedbackPayload> {
        let Some(user) = ctx.user else {
            return Err(coded("Unauthorized", "UNAUTHENTICATED"));
        };
        ctx.access.require_ai()?;
        let not_found = || AiChatFeedbackPayload {
            errors: vec!["Message not found".to_owned()],
        };
        let Ok(message_xid) = uuid::Uuid::parse_str(&input.message_id) else {
            return Ok(not_found());
        };
        let db = ctx.pool.get().await.map_err(internal)?;
        let reason = input.reason.unwrap_or_default();
        let recorded = chat::record_feedback(&*db, user.id, message_xid, input.helpful, &reason)
            .await
            .map_err(chat_field_error)?;
        Ok(if recorded {
            AiChatFeedbackPayload { errors: vec![] }
        } else {
            not_found()
        })
    }

    async fn ai_action(ctx: &GqlContext, input: AiActionInput) -> FieldResult<AiActionPayload> {
        let client_mutation_id = input.client_mutation_id.clone();
        if ctx.user.is_some() {
            ctx.access.require_ai()?;
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
                .filter_map(|c| {
                    let category = c.category.contract()?;
                    let metadata = match c.metadata_object() {
                        Ok(Some(serde_json::Value::Object(map))) => Some(map),
                        Ok(_) => None,
                        Err(e) => return Some(Err(e)),
                    };
                    Some(Ok(chat::AdditionalContext {
                        category,
                        id: Some(c.id.to_string()),
                        content: Some(c.content),
                        metadata,
                    }))
                })
                .collect::<FieldResult<_>>()?,
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
