//! Duo Chat answers: the agent loop, its resource tools and the slash
//! commands. See `docs/chat-agent.md` for the whole path of a question.
//!
//! [`AgentResponder`] is the [`ChatResponder`] the worker calls for each
//! stored question. It loads the user, checks `access_duo_chat`, resolves the
//! page resource (dropped when the user cannot read it), loads the history,
//! then either runs a slash command or the ReAct loop against the AI gateway.

pub mod feature_flags;
pub mod history;
pub mod instance_links;
pub mod named_code;
pub mod named_resources;
pub mod react_executor;
pub mod repository_file;
pub mod settings_cache;
pub mod slash_commands;
pub mod tools;

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::queries::Queries;
use async_trait::async_trait;
use contracts::{
    AdditionalContext, AgentMessage, CurrentFile, DuoErrorCode, ResourceContext, UnitPrimitive,
};
use deadpool_postgres::Pool;
use serde_json::Value;
use uuid::Uuid;

use crate::chat::completion::{
    ChatAnswer, ChatResponder, ChunkSender, CompletionJob, ResponderError,
};
use crate::config::Config;
use crate::policy::add_ons::AddOnCatalogue;
use crate::policy::{Actor, ChatAuthError, Policy, PolicyError, Subject};

use crate::gateway_client::{GatewayAuth, GatewayClient, GatewaySettings};

/// Why the responder could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("signing keys: {0}")]
    Keys(#[from] crate::identity::jwt::JwtError),
    #[error("add-on catalogue: {0}")]
    AddOns(#[from] crate::policy::add_ons::AddOnConfigError),
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("secrets key: {0}")]
    Secrets(#[from] crate::identity::secret_box::SecretBoxError),
}

/// What every part of an answer shares: the database, the permission rules
/// and the gateway.
#[derive(Clone)]
pub struct Services {
    pub pool: Pool,
    pub policy: Policy,
    pub gateway: GatewayClient,
    /// This instance's URL: links to its resources start with it.
    pub external_url: url::Url,
    /// Which model serves each feature.
    pub models: crate::ai_models::ModelStore,
    /// The projects' repositories (read by `commit_reader`).
    pub repositories: crate::repositories::Repositories,
    /// Codebase search (repository and directory context, `codebase_search`).
    pub code_index: crate::code_index::CodeIndex,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("gateway", &self.gateway)
            .field("external_url", &self.external_url.as_str())
            .finish_non_exhaustive()
    }
}

/// One question with everything known about it, already authorized.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub actor: Actor,
    pub request_id: Uuid,
    pub question: String,
    /// The page resource, only when the user may read it.
    pub resource: Option<Subject>,
    pub current_file: Option<CurrentFile>,
    /// The text around the selection, when the client sent it.
    pub file_content: String,
    /// The file the question is about, when the project's Duo context
    /// exclusion rules left it out (`current_file` is then empty).
    pub excluded_file: Option<String>,
    pub additional_context: Vec<AdditionalContext>,
    pub history: Vec<AgentMessage>,
    /// Unit primitives of the user's seats.
    pub scopes: BTreeSet<UnitPrimitive>,
    /// The feature flags on for this question (announced to the gateway).
    pub feature_flags: Vec<String>,
    pub auth: GatewayAuth,
    /// The model chosen for the feature this question uses (chat, or the slash
    /// command's feature); sent to the gateway as `model_metadata`.
    pub model: crate::ai_models::Choice,
}

impl RequestContext {
    pub fn has_scope(&self, primitive: UnitPrimitive) -> bool {
        self.scopes.contains(&primitive)
    }

    pub fn feature_enabled(&self, flag: &str) -> bool {
        self.feature_flags.iter().any(|f| f == flag)
    }
}

#[derive(Clone)]
pub struct AgentResponder {
    services: Arc<Services>,
    /// The tools the agent may run (all of them unless a caller narrowed it).
    tools: Arc<tools::ToolBox>,
    /// Flags announced instead of the evaluated ones (tests of version skew).
    pinned_flags: Option<Arc<Vec<String>>>,
    /// The flags and model choices of the current settings generation.
    settings: Arc<settings_cache::SettingsCache>,
}

impl AgentResponder {
    pub fn from_config(config: &Config, pool: Pool) -> Result<Self, AgentError> {
        let catalogue = AddOnCatalogue::load(&config.add_ons_file)?;
        let keys = crate::identity::jwt::KeyRing::load_or_create(&config.signing_key_dir)?;
        let secrets =
            crate::identity::secret_box::SecretBox::load_or_create(&config.signing_key_dir)?;
        // The feature flags each question announces are evaluated per
        // question (`feature_flags`), not configured here.
        let settings = GatewaySettings::from_config(config);
        let gateway = GatewayClient::new(keys, settings)?;
        let repositories = crate::repositories::Repositories::new(
            config.repositories_dir.clone(),
            config.git_max_concurrent,
        );
        let models = crate::ai_models::ModelStore::new(Arc::new(secrets));
        let policy = Policy::new(Arc::new(catalogue));
        Ok(Self::new(Services {
            code_index: crate::code_index::CodeIndex {
                pool: pool.clone(),
                repositories: repositories.clone(),
                gateway: gateway.clone(),
                settings: config.code_index.clone(),
                models: models.clone(),
                policy: policy.clone(),
            },
            pool,
            policy,
            gateway,
            external_url: config.external_url.clone(),
            models,
            repositories,
        }))
    }

    pub fn new(services: Services) -> Self {
        Self {
            services: Arc::new(services),
            tools: Arc::new(tools::ToolBox::standard()),
            pinned_flags: None,
            settings: Arc::default(),
        }
    }

    /// Runs the agent with these tools only (an older monolith lacking a
    /// newer tool behaves like this).
    pub fn with_tools(mut self, tools: tools::ToolBox) -> Self {
        self.tools = Arc::new(tools);
        self
    }

    /// Announces these feature flags on every question instead of the ones
    /// evaluated for it (the gateway gates some tools on them).
    pub fn with_enabled_feature_flags(mut self, flags: Vec<String>) -> Self {
        self.pinned_flags = Some(Arc::new(flags));
        self
    }

    /// Gives up on a gateway that stays silent for `timeout` (A1000).
    pub fn with_gateway_timeout(self, timeout: std::time::Duration) -> Result<Self, AgentError> {
        let mut services = (*self.services).clone();
        services.gateway = services.gateway.with_timeout(timeout)?;
        Ok(Self {
            services: Arc::new(services),
            tools: self.tools,
            pinned_flags: self.pinned_flags,
            settings: self.settings,
        })
    }

    pub fn services(&self) -> &Services {
        &self.services
    }

    /// Answers one question. Coded failures come back as a failed
    /// [`ChatAnswer`]; only infrastructure failures are errors.
    pub async fn answer(
        &self,
        question: &CompletionJob,
        chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        let ctx = match self.prepare(question).await {
            Ok(ctx) => ctx,
            Err(Refusal::Code(code, detail)) => return Ok(ChatAnswer::failed(code, detail)),
            Err(Refusal::Answer(text)) => {
                let _ = chunks.send(text.clone());
                return Ok(ChatAnswer::text(text));
            }
            Err(Refusal::Transient(e)) => return Err(ResponderError::Transient(e)),
        };
        crate::ai_usage::note_resource(ctx.resource);
        // Every gateway call of this question announces its flags.
        let services = &self.services.with_feature_flags(&ctx.feature_flags);
        if let Some(command) = slash_commands::SlashCommand::parse(&ctx.question) {
            crate::ai_usage::note_slash_command(command.name.word());
            if ctx.model == crate::ai_models::Choice::Disabled {
                let text = format!(
                    "`/{}` is turned off on this instance by an administrator.",
                    command.name.word()
                );
                let _ = chunks.send(text.clone());
                return Ok(ChatAnswer::text(text));
            }
            return Ok(slash_commands::run(services, &ctx, command, &chunks).await);
        }
        Ok(
            react_executor::ReactExecutor::new(services, &ctx, &self.tools)
                .run(&chunks)
                .await,
        )
    }

    /// The model choice of `feature` and the feature flags (none read when
    /// flags are pinned) as of settings `generation`: kept from an earlier
    /// answer of the same generation, else read (together) and kept.
    async fn settings_of(
        &self,
        db: &impl crate::queries::Queries,
        generation: i64,
        feature: crate::ai_models::Feature,
    ) -> Result<
        (
            crate::ai_models::Choice,
            Arc<crate::features::store::Snapshot>,
        ),
        Refusal,
    > {
        let kept_model = self.settings.choice(generation, feature);
        let kept_flags = match self.pinned_flags {
            Some(_) => Some(Arc::default()),
            None => self.settings.flags(generation),
        };
        let (model, flags) = tokio::join!(
            async {
                match kept_model {
                    Some(choice) => Ok(choice),
                    None => {
                        let choice = self.services.models.choice(db, feature).await?;
                        self.settings
                            .keep_choice(generation, feature, choice.clone());
                        Ok(choice)
                    }
                }
            },
            async {
                match kept_flags {
                    Some(flags) => Ok(flags),
                    None => {
                        let flags = Arc::new(crate::features::store::Snapshot::read(db).await?);
                        self.settings.keep_flags(generation, flags.clone());
                        Ok(flags)
                    }
                }
            },
        );
        let model: Result<_, crate::ai_models::ModelsError> = model;
        let flags: Result<_, tokio_postgres::Error> = flags;
        Ok((
            model.map_err(Refusal::transient)?,
            flags.map_err(Refusal::transient)?,
        ))
    }

    async fn prepare(&self, question: &CompletionJob) -> Result<RequestContext, Refusal> {
        let services = &self.services;
        let db = services.pool.get().await.map_err(Refusal::transient)?;
        // The model of the feature this question uses; a switched-off chat is
        // refused like chat without access, a switched-off command says so.
        let feature = slash_commands::SlashCommand::parse(&question.content)
            .and_then(|c| c.name.feature())
            .unwrap_or(crate::ai_models::Feature::DuoChat);
        // The reads that depend on nothing else go out together: the
        // connection pipelines them (one round trip). The access facts'
        // statement also reads the user's account, the instance's gateway
        // setting and the settings generation under which the flags and the
        // model choice kept from earlier answers still hold. Nothing read
        // here reaches the model unless the checks below pass.
        let (access, history) = tokio::join!(
            services.policy.chat_access_facts(&*db, question.user_id),
            history::load(&*db, question.thread_id, question.request_id),
        );
        let access = access.map_err(Refusal::transient)?;
        let generation = access.settings_generation();
        let actor = access
            .actor()
            .ok_or_else(|| Refusal::Code(DuoErrorCode::M3004, "unknown or inactive user".into()))?;
        let (realm, gateway_url) = access.gateway_settings();
        let (realm, gateway_url) = (
            realm.to_owned(),
            crate::gateway_client::gateway_url_setting(gateway_url),
        );
        // The seats' unit primitives are the gateway token's scopes too.
        let scopes = services
            .policy
            .authorize_chat_user_scopes_with(&*db, Some(actor), access)
            .await
            .map_err(Refusal::from_auth)?;
        let (model, flags) = self.settings_of(&*db, generation, feature).await?;
        if feature == crate::ai_models::Feature::DuoChat
            && model == crate::ai_models::Choice::Disabled
        {
            return Err(Refusal::Code(
                DuoErrorCode::M3004,
                "Duo Chat is switched off in the AI model settings".into(),
            ));
        }

        let resource = match question.resource_id.as_deref() {
            Some(text) => readable_resource(&services.policy, &*db, actor, text)
                .await
                .map_err(Refusal::transient)?,
            None => None,
        };
        let history = history.map_err(Refusal::transient)?;
        let feature_flags = match &self.pinned_flags {
            Some(pinned) => pinned.to_vec(),
            None => feature_flags::for_question(services, &*db, &flags, actor, resource)
                .await
                .map_err(Refusal::transient)?,
        };
        let (current_file, file_content) = match &question.current_file {
            Some(f) => (
                Some(CurrentFile {
                    file_path: f.file_name.clone(),
                    data: f.selected_text.clone(),
                    selected_code: true,
                }),
                format!(
                    "{}{}{}",
                    f.content_above_cursor.as_deref().unwrap_or(""),
                    f.selected_text,
                    f.content_below_cursor.as_deref().unwrap_or("")
                ),
            ),
            None => (None, String::new()),
        };
        // A file named but not sent: read it from the repository, if the user
        // may send that project's code to AI and its exclusion rules let it
        // through. A file sent along is held to the same rules.
        let mut excluded_file = None;
        let (current_file, file_content) = match &question.current_file {
            Some(f) if file_content.trim().is_empty() && !f.file_name.trim().is_empty() => {
                match repository_file::read(
                    &*db,
                    &services.policy,
                    &services.repositories,
                    &services.external_url,
                    actor,
                    resource,
                    &f.file_name,
                )
                .await
                .map_err(Refusal::transient)?
                {
                    repository_file::FileText::Text(text) => (
                        Some(CurrentFile {
                            file_path: f.file_name.clone(),
                            data: text.clone(),
                            selected_code: true,
                        }),
                        text,
                    ),
                    repository_file::FileText::Excluded => {
                        excluded_file = Some(f.file_name.clone());
                        (None, String::new())
                    }
                    repository_file::FileText::Unavailable => (current_file, file_content),
                }
            }
            Some(f)
                if !repository_file::sent_text_allowed(
                    &*db,
                    &services.policy,
                    &services.external_url,
                    actor,
                    resource,
                    None,
                    &f.file_name,
                )
                .await
                .map_err(Refusal::transient)? =>
            {
                excluded_file = Some(f.file_name.clone());
                (None, String::new())
            }
            _ => (current_file, file_content),
        };
        // Files named by the web pages' "Ask Duo about this file": read now,
        // through the policy, like the current file above.
        let items = match repository_file::fill_file_items(
            &*db,
            &services.policy,
            &services.repositories,
            &services.external_url,
            actor,
            resource,
            question.additional_context.clone(),
        )
        .await
        {
            Ok(items) => items,
            Err(repository_file::FileItemError::Unreadable) => {
                return Err(Refusal::Code(
                    DuoErrorCode::M3003,
                    "file context not readable".into(),
                ));
            }
            Err(repository_file::FileItemError::Failed(e)) => return Err(Refusal::transient(e)),
        };
        // Repository and directory context: searched now, before the agent
        // loop, so the gateway receives the hits inside the items' content.
        let additional_context = match crate::code_index::chat_context::prepare(
            &services.code_index,
            &services.policy,
            actor,
            &scopes,
            &question.content,
            items,
        )
        .await
        {
            Ok(crate::code_index::chat_context::Outcome::Ready(items)) => items,
            Ok(crate::code_index::chat_context::Outcome::Answer(text)) => {
                return Err(Refusal::Answer(text));
            }
            Ok(crate::code_index::chat_context::Outcome::Refused(code, detail)) => {
                return Err(Refusal::Code(code, detail));
            }
            Err(crate::code_index::CodeIndexError::Embedding(e)) => {
                return Err(Refusal::Code(e.code(), format!("codebase search: {e}")));
            }
            Err(e) => return Err(Refusal::transient(e)),
        };
        Ok(RequestContext {
            actor,
            request_id: question.request_id,
            question: question.content.clone(),
            resource,
            current_file,
            file_content,
            excluded_file,
            additional_context,
            history,
            auth: GatewayAuth {
                user_id: actor.id,
                scopes: scopes.iter().map(|s| s.as_str().to_owned()).collect(),
                realm,
                request_id: question.request_id,
                gateway_url,
            },
            scopes,
            feature_flags,
            model,
        })
    }

    /// A queued job with its editor state. It travels in the job; jobs from
    /// before it did fall back to the stored message's `extras`.
    async fn with_stored_context<'j>(
        &self,
        job: &'j CompletionJob,
    ) -> Result<std::borrow::Cow<'j, CompletionJob>, ResponderError> {
        if job.context_in_job || job.current_file.is_some() || !job.additional_context.is_empty() {
            return Ok(std::borrow::Cow::Borrowed(job));
        }
        let db = self
            .services
            .pool
            .get()
            .await
            .map_err(|e| ResponderError::Transient(e.to_string()))?;
        let extras = crate::chat::question_extras(&*db, job.thread_id, job.request_id)
            .await
            .map_err(|e| ResponderError::Transient(e.to_string()))?;
        let mut filled = job.clone();
        filled.current_file = stored_current_file(&extras);
        filled.additional_context = extras
            .get("additional_context")
            .and_then(Value::as_array)
            .map(|items| crate::chat::known_context_values(items))
            .unwrap_or_default();
        Ok(std::borrow::Cow::Owned(filled))
    }
}

#[async_trait]
impl ChatResponder for AgentResponder {
    async fn respond(
        &self,
        job: &CompletionJob,
        chunks: ChunkSender,
    ) -> Result<ChatAnswer, ResponderError> {
        let question = self.with_stored_context(job).await?;
        let usage = crate::ai_usage::Recording::start(job);
        // Boxed: the answer's future is large, and `around` would otherwise
        // copy it whole at each hand-over.
        let answer = usage
            .around(Box::pin(self.answer(&question, usage.timed(chunks))))
            .await;
        usage
            .finish(&self.services.pool, &self.services.policy, answer)
            .await
    }

    fn categorizer(&self) -> Option<Arc<dyn crate::chat::completion::QuestionCategorizer>> {
        let s = &self.services;
        let categorizer = crate::ai_usage::Categorizer::new(
            s.gateway.clone(),
            s.policy.clone(),
            s.models.clone(),
        );
        Some(Arc::new(categorizer))
    }
}

/// Why a question is not even started.
enum Refusal {
    Code(DuoErrorCode, String),
    /// A plain answer instead of the agent's (a repository still being indexed).
    Answer(String),
    Transient(String),
}

impl Refusal {
    fn transient(e: impl std::fmt::Display) -> Self {
        Self::Transient(e.to_string())
    }

    fn from_auth(e: ChatAuthError) -> Self {
        match e {
            ChatAuthError::Denied(code) => Self::Code(code, "chat access denied".into()),
            ChatAuthError::Policy(p) => Self::transient(p),
        }
    }
}

/// The page resource named by `resourceId`, or `None` when it is the user,
/// unknown, not readable by the user, or in a group or project with Duo
/// features off (GitLab silently drops it; nothing of it reaches a prompt).
pub async fn readable_resource(
    policy: &Policy,
    db: &impl Queries,
    actor: Actor,
    gid_text: &str,
) -> Result<Option<Subject>, PolicyError> {
    Ok(
        match crate::chat::resource::authorize(policy, db, actor, gid_text).await? {
            crate::chat::resource::ChatResourceAccess::Item(subject) => Some(subject),
            _ => None,
        },
    )
}

fn stored_current_file(extras: &Value) -> Option<crate::chat::CurrentFile> {
    let file = extras.get("current_file")?;
    let text = |key: &str| file.get(key).and_then(Value::as_str).map(str::to_owned);
    Some(crate::chat::CurrentFile {
        file_name: text("file_name").unwrap_or_default(),
        selected_text: text("selected_text").unwrap_or_default(),
        content_above_cursor: text("content_above_cursor"),
        content_below_cursor: text("content_below_cursor"),
    })
}

/// The page resource as the gateway's `context` of the user message.
pub async fn page_context(
    services: &Services,
    ctx: &RequestContext,
) -> Result<Option<ResourceContext>, crate::work_items::AiReadError> {
    let Some(subject) = ctx.resource else {
        return Ok(None);
    };
    let db = match services.pool.get().await {
        Ok(db) => db,
        Err(e) => {
            tracing::debug!(error = %e, "no database connection for the page context");
            return Ok(None);
        }
    };
    crate::work_items::ai::page_context(
        &services.policy,
        &*db,
        ctx.actor,
        subject,
        &services.external_url,
    )
    .await
}
