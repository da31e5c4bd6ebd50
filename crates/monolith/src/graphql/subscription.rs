//! The subscription root: `aiCompletionResponse`.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use juniper::{FieldError, FieldResult, graphql_subscription};

use super::*;
use crate::chat::live::{self, LiveMessage};

type AiMessageStream = Pin<Box<dyn Stream<Item = Result<AiMessage, FieldError>> + Send>>;

pub struct Subscription;

#[graphql_subscription]
#[graphql(context = GqlContext)]
impl Subscription {
    /// A Duo Workflow session's status changes and new checkpoints.
    async fn workflow_events_updated(
        ctx: &GqlContext,
        workflow_id: AiDuoWorkflowsWorkflowId,
    ) -> FieldResult<super::workflows::DuoWorkflowEventStream> {
        super::workflows::events_updated(ctx, workflow_id).await
    }

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
                .authorize_resource(&*db, user, &resource.0)
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
