//! Self-hosted models and per-feature model selection in GitLab's GraphQL
//! shapes (`aiSelfHostedModels`, `aiSelfHostedModelCreate/Update/Delete`,
//! `aiFeatureSettings`, `aiFeatureSettingUpdate`). Admins only; anyone else is
//! told the resource does not exist. API tokens go in, never come out.

use juniper::{FieldResult, GraphQLEnum, GraphQLInputObject, GraphQLObject};

use super::*;
use crate::ai_models::{self, Feature, ModelInput, ModelsError, Provider};

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "AiFeatures")]
pub enum AiFeaturesEnum {
    DuoChat,
    DuoChatExplainCode,
    DuoChatWriteTests,
    DuoChatRefactorCode,
    DuoChatFixCode,
    DuoChatTroubleshootJob,
    DuoChatSummarizeComments,
    CodeEmbeddings,
    DuoAgentPlatform,
}

impl AiFeaturesEnum {
    fn feature(self) -> Feature {
        match self {
            AiFeaturesEnum::DuoChat => Feature::DuoChat,
            AiFeaturesEnum::DuoChatExplainCode => Feature::ExplainCode,
            AiFeaturesEnum::DuoChatWriteTests => Feature::WriteTests,
            AiFeaturesEnum::DuoChatRefactorCode => Feature::RefactorCode,
            AiFeaturesEnum::DuoChatFixCode => Feature::FixCode,
            AiFeaturesEnum::DuoChatTroubleshootJob => Feature::TroubleshootJob,
            AiFeaturesEnum::DuoChatSummarizeComments => Feature::SummarizeComments,
            AiFeaturesEnum::CodeEmbeddings => Feature::CodeEmbeddings,
            AiFeaturesEnum::DuoAgentPlatform => Feature::DuoAgentPlatform,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "AiFeatureProviders")]
pub enum AiFeatureProvidersEnum {
    Disabled,
    Vendored,
    SelfHosted,
}

impl AiFeatureProvidersEnum {
    fn provider(self) -> Provider {
        match self {
            AiFeatureProvidersEnum::Disabled => Provider::Disabled,
            AiFeatureProvidersEnum::Vendored => Provider::Vendored,
            AiFeatureProvidersEnum::SelfHosted => Provider::SelfHosted,
        }
    }
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiSelfHostedModel")]
pub struct AiSelfHostedModel {
    pub id: AiSelfHostedModelId,
    pub name: String,
    /// The model family (`mistral`, `gpt`, `claude_3`, ...).
    pub model: String,
    /// The family as people write it (`Mistral`, `Claude 3`, ...).
    pub model_display_name: String,
    pub endpoint: String,
    pub identifier: Option<String>,
    pub has_api_token: bool,
    pub created_at: Time,
    pub updated_at: Option<Time>,
}

impl From<ai_models::SelfHostedModel> for AiSelfHostedModel {
    fn from(m: ai_models::SelfHostedModel) -> Self {
        Self {
            id: AiSelfHostedModelId(gid::format("Ai::SelfHostedModel", m.id)),
            name: m.name,
            model_display_name: ai_models::family_display_name(&m.model).to_owned(),
            model: m.model,
            endpoint: m.endpoint,
            identifier: m.identifier,
            has_api_token: m.has_api_token,
            created_at: Time(m.created_at.to_rfc3339()),
            updated_at: Some(Time(m.updated_at.to_rfc3339())),
        }
    }
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiSelfHostedModelConnection")]
pub struct AiSelfHostedModelConnection {
    pub nodes: Vec<AiSelfHostedModel>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiFeatureSetting")]
pub struct AiFeatureSetting {
    /// The feature, lower case as GitLab answers it (`duo_chat`).
    pub feature: String,
    pub title: String,
    pub main_feature: String,
    /// `disabled`, `vendored` or `self_hosted`.
    pub provider: String,
    pub self_hosted_model: Option<AiSelfHostedModel>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiFeatureSettingConnection")]
pub struct AiFeatureSettingConnection {
    pub nodes: Vec<AiFeatureSetting>,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiSelfHostedModelCreateInput")]
pub struct AiSelfHostedModelCreateInput {
    pub name: String,
    pub model: String,
    pub endpoint: String,
    pub api_token: Option<String>,
    pub identifier: Option<String>,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiSelfHostedModelUpdateInput")]
pub struct AiSelfHostedModelUpdateInput {
    pub id: AiSelfHostedModelId,
    pub name: String,
    pub model: String,
    pub endpoint: String,
    /// Leave out to keep the stored token (dropped all the same when
    /// `endpoint` changes, or `model` moves to another provider); an empty
    /// string removes it.
    pub api_token: Option<String>,
    pub identifier: Option<String>,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiSelfHostedModelDeleteInput")]
pub struct AiSelfHostedModelDeleteInput {
    pub id: AiSelfHostedModelId,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiSelfHostedModelPayload")]
pub struct AiSelfHostedModelPayload {
    pub self_hosted_model: Option<AiSelfHostedModel>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, GraphQLInputObject)]
#[graphql(name = "AiFeatureSettingUpdateInput")]
pub struct AiFeatureSettingUpdateInput {
    pub features: Vec<AiFeaturesEnum>,
    pub provider: AiFeatureProvidersEnum,
    pub ai_self_hosted_model_id: Option<AiSelfHostedModelId>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiFeatureSettingUpdatePayload")]
pub struct AiFeatureSettingUpdatePayload {
    pub ai_feature_settings: Vec<AiFeatureSetting>,
    pub errors: Vec<String>,
}

/// Admins only: anyone else gets GitLab's "does not exist" answer. Then the
/// token: configuration is read with `api` or `read_api`, never with an
/// `ai_features` token alone.
fn require_admin_read(ctx: &GqlContext) -> FieldResult<()> {
    require_admin(ctx)?;
    ctx.access.require_read()
}

/// Changes need an admin's `api` token: `ai_features` is for using AI, and
/// a leaked IDE token must not re-point models or their keys.
fn require_admin_write(ctx: &GqlContext) -> FieldResult<()> {
    require_admin(ctx)?;
    ctx.access.require_write()
}

fn require_admin(ctx: &GqlContext) -> FieldResult<()> {
    if crate::policy::Policy::administers_instance(ctx.user) {
        return Ok(());
    }
    Err(coded(
        "The resource that you are attempting to access does not exist or you don't have permission to perform this action",
        "RESOURCE_NOT_AVAILABLE",
    ))
}

fn model_id(id: &AiSelfHostedModelId) -> FieldResult<i64> {
    match gid::parse(&id.0) {
        Some(("Ai::SelfHostedModel", n)) => Ok(n),
        _ => Err(coded(
            format!("{} is not a valid AiSelfHostedModelID", id.0),
            "ARGUMENT_ERROR",
        )),
    }
}

/// Validation and conflicts go in `errors`; database failures stop the field.
fn payload_error(e: ModelsError) -> FieldResult<Vec<String>> {
    match e {
        ModelsError::Db(db) => Err(internal(db)),
        ModelsError::Secret(s) => Err(internal(s)),
        other => Ok(vec![other.to_string()]),
    }
}

fn setting_object(s: ai_models::FeatureSetting) -> AiFeatureSetting {
    AiFeatureSetting {
        feature: s.feature.key().to_owned(),
        title: s.feature.title().to_owned(),
        main_feature: s.feature.main_feature().to_owned(),
        provider: s.provider.key().to_owned(),
        self_hosted_model: s.self_hosted_model.map(Into::into),
    }
}

pub(crate) async fn self_hosted_models(
    ctx: &GqlContext,
    id: Option<AiSelfHostedModelId>,
) -> FieldResult<AiSelfHostedModelConnection> {
    require_admin_read(ctx)?;
    let wanted = id.as_ref().map(model_id).transpose()?;
    let db = ctx.pool.get().await.map_err(internal)?;
    let models = ctx.models.list_models(&*db).await.map_err(internal)?;
    Ok(AiSelfHostedModelConnection {
        nodes: models
            .into_iter()
            .filter(|m| wanted.is_none_or(|w| w == m.id))
            .map(Into::into)
            .collect(),
    })
}

pub(crate) async fn feature_settings(
    ctx: &GqlContext,
    self_hosted_model_id: Option<AiSelfHostedModelId>,
) -> FieldResult<AiFeatureSettingConnection> {
    require_admin_read(ctx)?;
    let wanted = self_hosted_model_id.as_ref().map(model_id).transpose()?;
    let db = ctx.pool.get().await.map_err(internal)?;
    let settings = ctx.models.feature_settings(&*db).await.map_err(internal)?;
    Ok(AiFeatureSettingConnection {
        nodes: settings
            .into_iter()
            .filter(|s| {
                wanted.is_none_or(|w| s.self_hosted_model.as_ref().is_some_and(|m| m.id == w))
            })
            .map(setting_object)
            .collect(),
    })
}

pub(crate) async fn create_model(
    ctx: &GqlContext,
    input: AiSelfHostedModelCreateInput,
) -> FieldResult<AiSelfHostedModelPayload> {
    require_admin_write(ctx)?;
    let db = ctx.pool.get().await.map_err(internal)?;
    let model_input = ModelInput {
        name: input.name,
        model: input.model,
        endpoint: input.endpoint,
        identifier: input.identifier,
        api_token: input.api_token,
    };
    Ok(match ctx.models.create_model(&*db, &model_input).await {
        Ok(m) => AiSelfHostedModelPayload {
            self_hosted_model: Some(m.into()),
            errors: vec![],
        },
        Err(e) => AiSelfHostedModelPayload {
            self_hosted_model: None,
            errors: payload_error(e)?,
        },
    })
}

pub(crate) async fn update_model(
    ctx: &GqlContext,
    input: AiSelfHostedModelUpdateInput,
) -> FieldResult<AiSelfHostedModelPayload> {
    require_admin_write(ctx)?;
    let id = model_id(&input.id)?;
    let db = ctx.pool.get().await.map_err(internal)?;
    let model_input = ModelInput {
        name: input.name,
        model: input.model,
        endpoint: input.endpoint,
        identifier: input.identifier,
        api_token: input.api_token,
    };
    Ok(
        match ctx.models.update_model(&*db, id, &model_input).await {
            Ok(m) => AiSelfHostedModelPayload {
                self_hosted_model: Some(m.into()),
                errors: vec![],
            },
            Err(e) => AiSelfHostedModelPayload {
                self_hosted_model: None,
                errors: payload_error(e)?,
            },
        },
    )
}

pub(crate) async fn delete_model(
    ctx: &GqlContext,
    input: AiSelfHostedModelDeleteInput,
) -> FieldResult<AiSelfHostedModelPayload> {
    require_admin_write(ctx)?;
    let id = model_id(&input.id)?;
    let db = ctx.pool.get().await.map_err(internal)?;
    Ok(match ctx.models.delete_model(&*db, id).await {
        Ok(m) => AiSelfHostedModelPayload {
            self_hosted_model: Some(m.into()),
            errors: vec![],
        },
        Err(e) => AiSelfHostedModelPayload {
            self_hosted_model: None,
            errors: payload_error(e)?,
        },
    })
}

pub(crate) async fn update_feature_setting(
    ctx: &GqlContext,
    input: AiFeatureSettingUpdateInput,
) -> FieldResult<AiFeatureSettingUpdatePayload> {
    require_admin_write(ctx)?;
    let model = input
        .ai_self_hosted_model_id
        .as_ref()
        .map(model_id)
        .transpose()?;
    let features: Vec<Feature> = input.features.iter().map(|f| f.feature()).collect();
    let db = ctx.pool.get().await.map_err(internal)?;
    if let Err(e) = ctx
        .models
        .update_features(&*db, &features, input.provider.provider(), model)
        .await
    {
        return Ok(AiFeatureSettingUpdatePayload {
            ai_feature_settings: vec![],
            errors: payload_error(e)?,
        });
    }
    let settings = ctx.models.feature_settings(&*db).await.map_err(internal)?;
    Ok(AiFeatureSettingUpdatePayload {
        ai_feature_settings: settings
            .into_iter()
            .filter(|s| features.contains(&s.feature))
            .map(setting_object)
            .collect(),
        errors: vec![],
    })
}
