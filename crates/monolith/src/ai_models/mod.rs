//! Which model answers each AI feature: self-hosted model definitions (their API
//! keys sealed at rest, never shown again) and, per feature, the gateway's default
//! model ("vendored"), a self-hosted model, or off. The monolith sends the choice
//! to the gateway as `model_metadata` (and to the workflow service as
//! `x-gitlab-agent-platform-model-metadata`); the gateway calls the model.

use std::sync::Arc;

use crate::queries::Queries;
use contracts::ModelMetadata;

use crate::identity::secret_box::{SecretBox, SecretBoxError};

/// Longest name, endpoint or identifier (the gateway's limit for each field).
pub const MAX_FIELD_CHARS: usize = ModelMetadata::MAX_FIELD_LEN;

/// The features whose model an admin chooses, with GitLab's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    DuoChat,
    ExplainCode,
    WriteTests,
    RefactorCode,
    FixCode,
    TroubleshootJob,
    SummarizeComments,
    CodeEmbeddings,
    DuoAgentPlatform,
}

impl Feature {
    pub const ALL: [Feature; 9] = [
        Feature::DuoChat,
        Feature::ExplainCode,
        Feature::WriteTests,
        Feature::RefactorCode,
        Feature::FixCode,
        Feature::TroubleshootJob,
        Feature::SummarizeComments,
        Feature::CodeEmbeddings,
        Feature::DuoAgentPlatform,
    ];

    /// The stored (and wire, lower-case) name.
    pub fn key(self) -> &'static str {
        match self {
            Feature::DuoChat => "duo_chat",
            Feature::ExplainCode => "duo_chat_explain_code",
            Feature::WriteTests => "duo_chat_write_tests",
            Feature::RefactorCode => "duo_chat_refactor_code",
            Feature::FixCode => "duo_chat_fix_code",
            Feature::TroubleshootJob => "duo_chat_troubleshoot_job",
            Feature::SummarizeComments => "duo_chat_summarize_comments",
            Feature::CodeEmbeddings => "code_embeddings",
            Feature::DuoAgentPlatform => "duo_agent_platform",
        }
    }

    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.key() == key)
    }

    pub fn title(self) -> &'static str {
        match self {
            Feature::DuoChat => "General chat",
            Feature::ExplainCode => "Explain code (/explain)",
            Feature::WriteTests => "Write tests (/tests)",
            Feature::RefactorCode => "Refactor code (/refactor)",
            Feature::FixCode => "Fix code (/fix)",
            Feature::TroubleshootJob => "Troubleshoot a job (/troubleshoot)",
            Feature::SummarizeComments => "Summarize comments (/summarize_comments)",
            Feature::CodeEmbeddings => "Code embeddings",
            Feature::DuoAgentPlatform => "Duo Workflow",
        }
    }

    pub fn main_feature(self) -> &'static str {
        match self {
            Feature::CodeEmbeddings => "Codebase search",
            Feature::DuoAgentPlatform => "Duo Agent Platform",
            _ => "Duo Chat",
        }
    }

    /// The feature a slash command's prompt belongs to.
    pub fn of_prompt(prompt_id: &str) -> Feature {
        match prompt_id.split('/').nth(1).unwrap_or("") {
            "explain_code" => Feature::ExplainCode,
            "write_tests" => Feature::WriteTests,
            "refactor_code" => Feature::RefactorCode,
            "fix_code" => Feature::FixCode,
            "troubleshoot_job" => Feature::TroubleshootJob,
            "summarize_comments" => Feature::SummarizeComments,
            _ => Feature::DuoChat,
        }
    }
}

/// Who serves a feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// The feature is switched off.
    Disabled,
    /// The gateway's own default model.
    Vendored,
    /// A self-hosted model defined here.
    SelfHosted,
}

impl Provider {
    pub fn key(self) -> &'static str {
        match self {
            Provider::Disabled => "disabled",
            Provider::Vendored => "vendored",
            Provider::SelfHosted => "self_hosted",
        }
    }

    pub fn from_key(key: &str) -> Option<Self> {
        match key {
            "disabled" => Some(Provider::Disabled),
            "vendored" => Some(Provider::Vendored),
            "self_hosted" => Some(Provider::SelfHosted),
            _ => None,
        }
    }
}

/// The model families a self-hosted model may be (GitLab's accepted models);
/// the gateway picks the prompt family by this name.
pub const ACCEPTED_MODELS: &[&str] = &[
    "mistral",
    "mixtral",
    "codestral",
    "llama3",
    "codellama",
    "codegemma",
    "deepseekcoder",
    "gpt",
    "claude_3",
    "general",
];

/// The provider the gateway calls a family's models through: self-hosted
/// models are served OpenAI-compatibly (vLLM, Ollama, the bundled server);
/// Claude goes to Anthropic.
pub fn provider_of(family: &str) -> &'static str {
    if family == "claude_3" {
        "anthropic"
    } else {
        "openai"
    }
}

/// The families served through the same provider as `family`.
fn same_provider_families(family: &str) -> Vec<&'static str> {
    let provider = provider_of(family);
    ACCEPTED_MODELS
        .iter()
        .copied()
        .filter(|f| provider_of(f) == provider)
        .collect()
}

/// A model family as people write it (GitLab's `modelDisplayName`).
pub fn family_display_name(family: &str) -> &'static str {
    match family {
        "mistral" => "Mistral",
        "mixtral" => "Mixtral",
        "codestral" => "Codestral",
        "llama3" => "Llama 3",
        "codellama" => "Code Llama",
        "codegemma" => "CodeGemma",
        "deepseekcoder" => "DeepSeek Coder",
        "gpt" => "GPT",
        "claude_3" => "Claude 3",
        _ => "General",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    #[error("{0}")]
    Invalid(String),
    #[error("Self-hosted model not found")]
    NotFound,
    #[error("Cannot delete a self-hosted model that features still use: {0}")]
    InUse(String),
    #[error(transparent)]
    Secret(#[from] SecretBoxError),
    #[error("database error: {0}")]
    Db(#[from] tokio_postgres::Error),
}

/// A self-hosted model definition (its key never leaves the store in clear
/// except towards the gateway).
#[derive(Debug, Clone, PartialEq)]
pub struct SelfHostedModel {
    pub id: i64,
    pub name: String,
    pub model: String,
    pub endpoint: String,
    pub identifier: Option<String>,
    pub has_api_token: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// What an admin enters to define or change a model.
#[derive(Debug, Clone, Default)]
pub struct ModelInput {
    pub name: String,
    pub model: String,
    pub endpoint: String,
    pub identifier: Option<String>,
    /// `None` keeps the stored key (on update); `Some("")` removes it.
    pub api_token: Option<String>,
}

impl ModelInput {
    fn validate(&self) -> Result<(), ModelsError> {
        let name = self.name.trim();
        if name.is_empty() {
            return Err(ModelsError::Invalid("Name can't be blank".into()));
        }
        for (field, value) in [
            ("Name", Some(self.name.as_str())),
            ("Endpoint", Some(self.endpoint.as_str())),
            ("Identifier", self.identifier.as_deref()),
            ("API token", self.api_token.as_deref()),
        ] {
            if let Some(v) = value {
                if v.chars().count() > MAX_FIELD_CHARS {
                    return Err(ModelsError::Invalid(format!(
                        "{field} is too long (maximum is {MAX_FIELD_CHARS} characters)"
                    )));
                }
                if v.contains('\0') {
                    return Err(ModelsError::Invalid(format!("{field} is invalid")));
                }
            }
        }
        if !ACCEPTED_MODELS.contains(&self.model.as_str()) {
            return Err(ModelsError::Invalid(format!(
                "Model is not one of: {}",
                ACCEPTED_MODELS.join(", ")
            )));
        }
        match url::Url::parse(&self.endpoint) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
            _ => Err(ModelsError::Invalid(
                "Endpoint must be an http(s) URL".into(),
            )),
        }
    }
}

/// One feature's setting.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureSetting {
    pub feature: Feature,
    pub provider: Provider,
    pub self_hosted_model: Option<SelfHostedModel>,
}

/// How a feature is served, resolved for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    Disabled,
    Vendored,
    /// With the key opened, ready to send to the gateway.
    SelfHosted(ModelMetadata),
}

impl Choice {
    pub fn metadata(&self) -> Option<&ModelMetadata> {
        match self {
            Choice::SelfHosted(m) => Some(m),
            _ => None,
        }
    }
}

/// Reads and changes the model choices; holds the box that seals API keys.
#[derive(Clone, Debug)]
pub struct ModelStore {
    secrets: Arc<SecretBox>,
}

const MODEL_COLUMNS: &str =
    "id, name, model, endpoint, identifier, api_token_sealed IS NOT NULL, created_at, updated_at";

fn model_from_row(row: &tokio_postgres::Row) -> SelfHostedModel {
    SelfHostedModel {
        id: row.get(0),
        name: row.get(1),
        model: row.get(2),
        endpoint: row.get(3),
        identifier: row.get(4),
        has_api_token: row.get(5),
        created_at: row.get(6),
        updated_at: row.get(7),
    }
}

/// What a sealed key is bound to: its model row.
fn seal_context(id: i64) -> String {
    format!("ai_self_hosted_models:{id}")
}

impl ModelStore {
    pub fn new(secrets: Arc<SecretBox>) -> Self {
        Self { secrets }
    }

    pub async fn list_models(
        &self,
        db: &impl Queries,
    ) -> Result<Vec<SelfHostedModel>, ModelsError> {
        let rows = db
            .query(
                &format!("SELECT {MODEL_COLUMNS} FROM ai_self_hosted_models ORDER BY id"),
                &[],
            )
            .await?;
        Ok(rows.iter().map(model_from_row).collect())
    }

    pub async fn model(&self, db: &impl Queries, id: i64) -> Result<SelfHostedModel, ModelsError> {
        db.query_opt(
            &format!("SELECT {MODEL_COLUMNS} FROM ai_self_hosted_models WHERE id = $1"),
            &[&id],
        )
        .await?
        .as_ref()
        .map(model_from_row)
        .ok_or(ModelsError::NotFound)
    }

    pub async fn create_model(
        &self,
        db: &impl Queries,
        input: &ModelInput,
    ) -> Result<SelfHostedModel, ModelsError> {
        input.validate()?;
        let row = db
            .query_opt(
                &format!(
                    "INSERT INTO ai_self_hosted_models (name, model, endpoint, identifier)
                     VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING RETURNING {MODEL_COLUMNS}"
                ),
                &[
                    &input.name.trim(),
                    &input.model,
                    &input.endpoint,
                    &input.identifier.as_deref().filter(|i| !i.is_empty()),
                ],
            )
            .await?
            .ok_or_else(|| ModelsError::Invalid("Name has already been taken".into()))?;
        let model = model_from_row(&row);
        self.store_token(db, model.id, input.api_token.as_deref())
            .await?;
        self.model(db, model.id).await
    }

    /// Changes a model. A stored key stays only while it goes where it went
    /// before: when the endpoint or the provider (through the family) changes
    /// and no new key is given, the stored key is dropped, so that a key
    /// entered for one host is never sent to another (by mistake, or by
    /// someone holding an admin's session but not the key).
    pub async fn update_model(
        &self,
        db: &impl Queries,
        id: i64,
        input: &ModelInput,
    ) -> Result<SelfHostedModel, ModelsError> {
        input.validate()?;
        // One statement compares with the stored row as it updates it, so a
        // concurrent change cannot slip between the comparison and the write.
        let updated = db
            .execute(
                "UPDATE ai_self_hosted_models SET name = $2, model = $3, endpoint = $4, identifier = $5,
                   api_token_sealed = CASE WHEN endpoint = $4 AND model = ANY($6) THEN api_token_sealed END,
                   updated_at = now()
                 WHERE id = $1",
                &[
                    &id,
                    &input.name.trim(),
                    &input.model,
                    &input.endpoint,
                    &input.identifier.as_deref().filter(|i| !i.is_empty()),
                    &same_provider_families(&input.model),
                ],
            )
            .await
            .map_err(|e| {
                if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
                    ModelsError::Invalid("Name has already been taken".into())
                } else {
                    ModelsError::Db(e)
                }
            })?;
        if updated == 0 {
            return Err(ModelsError::NotFound);
        }
        self.store_token(db, id, input.api_token.as_deref()).await?;
        self.model(db, id).await
    }

    async fn store_token(
        &self,
        db: &impl Queries,
        id: i64,
        token: Option<&str>,
    ) -> Result<(), ModelsError> {
        let Some(token) = token else { return Ok(()) };
        let sealed = if token.is_empty() {
            None
        } else {
            Some(self.secrets.seal(token, &seal_context(id))?)
        };
        db.execute(
            "UPDATE ai_self_hosted_models SET api_token_sealed = $2 WHERE id = $1",
            &[&id, &sealed],
        )
        .await?;
        Ok(())
    }

    /// Deletes a model no feature uses.
    pub async fn delete_model(
        &self,
        db: &impl Queries,
        id: i64,
    ) -> Result<SelfHostedModel, ModelsError> {
        let model = self.model(db, id).await?;
        let users: Vec<String> = db
            .query(
                "SELECT feature FROM ai_feature_settings WHERE ai_self_hosted_model_id = $1 ORDER BY feature",
                &[&id],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !users.is_empty() {
            return Err(ModelsError::InUse(users.join(", ")));
        }
        db.execute("DELETE FROM ai_self_hosted_models WHERE id = $1", &[&id])
            .await?;
        Ok(model)
    }

    /// Every feature's setting (features never set are vendored).
    pub async fn feature_settings(
        &self,
        db: &impl Queries,
    ) -> Result<Vec<FeatureSetting>, ModelsError> {
        let rows = db
            .query(
                "SELECT feature, provider, ai_self_hosted_model_id FROM ai_feature_settings",
                &[],
            )
            .await?;
        let models = self.list_models(db).await?;
        Ok(Feature::ALL
            .iter()
            .map(|feature| {
                let row = rows.iter().find(|r| r.get::<_, String>(0) == feature.key());
                let provider = row
                    .and_then(|r| Provider::from_key(&r.get::<_, String>(1)))
                    .unwrap_or(Provider::Vendored);
                let model_id: Option<i64> = row.and_then(|r| r.get(2));
                FeatureSetting {
                    feature: *feature,
                    provider,
                    self_hosted_model: model_id
                        .and_then(|id| models.iter().find(|m| m.id == id).cloned()),
                }
            })
            .collect())
    }

    /// Sets the provider (and model) of several features at once.
    pub async fn update_features(
        &self,
        db: &impl Queries,
        features: &[Feature],
        provider: Provider,
        model_id: Option<i64>,
    ) -> Result<(), ModelsError> {
        if features.is_empty() {
            return Err(ModelsError::Invalid("Features can't be blank".into()));
        }
        let model_id = match (provider, model_id) {
            (Provider::SelfHosted, Some(id)) => Some(self.model(db, id).await?.id),
            (Provider::SelfHosted, None) => {
                return Err(ModelsError::Invalid(
                    "Self-hosted model must be given for a self-hosted feature".into(),
                ));
            }
            (_, _) => None,
        };
        for feature in features {
            db.execute(
                "INSERT INTO ai_feature_settings (feature, provider, ai_self_hosted_model_id)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (feature) DO UPDATE
                   SET provider = EXCLUDED.provider, ai_self_hosted_model_id = EXCLUDED.ai_self_hosted_model_id, updated_at = now()",
                &[&feature.key(), &provider.key(), &model_id],
            )
            .await?;
        }
        Ok(())
    }

    /// How `feature` is served now, with a self-hosted model's key opened.
    pub async fn choice(&self, db: &impl Queries, feature: Feature) -> Result<Choice, ModelsError> {
        let row = db
            .query_opt(
                "SELECT s.provider, m.id, m.name, m.model, m.endpoint, m.identifier, m.api_token_sealed
                 FROM ai_feature_settings s LEFT JOIN ai_self_hosted_models m ON m.id = s.ai_self_hosted_model_id
                 WHERE s.feature = $1",
                &[&feature.key()],
            )
            .await?;
        let Some(row) = row else {
            return Ok(Choice::Vendored);
        };
        Ok(match Provider::from_key(&row.get::<_, String>(0)) {
            Some(Provider::Disabled) => Choice::Disabled,
            Some(Provider::SelfHosted) => {
                let id: Option<i64> = row.get(1);
                let Some(id) = id else {
                    return Ok(Choice::Disabled);
                };
                let sealed: Option<Vec<u8>> = row.get(6);
                let api_key = sealed
                    .map(|s| self.secrets.open(&s, &seal_context(id)))
                    .transpose()?;
                let family: String = row.get(3);
                Choice::SelfHosted(ModelMetadata {
                    provider: provider_of(&family).into(),
                    name: family,
                    endpoint: row.get(4),
                    api_key,
                    identifier: row.get(5),
                })
            }
            _ => Choice::Vendored,
        })
    }

    /// A model's metadata as it would be sent (for the connection test).
    pub async fn metadata_of(
        &self,
        db: &impl Queries,
        id: i64,
    ) -> Result<ModelMetadata, ModelsError> {
        let row = db
            .query_opt(
                "SELECT model, endpoint, identifier, api_token_sealed FROM ai_self_hosted_models WHERE id = $1",
                &[&id],
            )
            .await?
            .ok_or(ModelsError::NotFound)?;
        let sealed: Option<Vec<u8>> = row.get(3);
        let family: String = row.get(0);
        Ok(ModelMetadata {
            provider: provider_of(&family).into(),
            name: family,
            endpoint: row.get(1),
            identifier: row.get(2),
            api_key: sealed
                .map(|s| self.secrets.open(&s, &seal_context(id)))
                .transpose()?,
        })
    }
}
