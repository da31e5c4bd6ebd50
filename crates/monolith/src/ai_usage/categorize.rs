//! Categorising questions: the `ai_categorize_question` job on its own queue
//! ([`QUEUE`], below chat answers in priority) asks the AI gateway's
//! `categorize_question` prompt what a recorded question is about and stores
//! the answer on its usage record.
//!
//! The answer to the question went out before this job was even claimed.
//! The job sends nothing when the user no longer has Duo Chat, when Duo is off
//! for the group or project the question was asked in (or for the instance),
//! or when chat's model is switched off; it then stores why, as it does when
//! the gateway fails or answers something that is not a category. Only
//! database failures are retried. The question is never logged.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use job_queue::{EnqueueOptions, JobContext, JobError, JobHandler, Registry, WorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::UsageError;
use super::store::{self, Category};
use crate::ai_models::{Choice, Feature, ModelStore};
use crate::chat::completion::QuestionCategorizer;
use crate::gateway_client::{GatewayAuth, GatewayClient};
use crate::policy::{Ability, Actor, Policy, Subject};
use crate::queries::Queries;

/// The queue categorisation jobs run on.
pub const QUEUE: &str = "ai_categorize";
/// The gateway's prompt.
pub const PROMPT: &str = "categorize_question";
/// How long the gateway may take (its prompt's own limit is 5 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);
/// The categories the prompt may answer.
pub const CATEGORIES: &[&str] = &[
    "Code",
    "CI/CD",
    "Security",
    "Project management",
    "Documentation",
    "GitLab usage",
    "General programming",
    "Other",
];
const LABELS: &[&str] = &["follow_up", "needs_code", "about_gitlab", "off_topic"];

/// The job: categorise the question of one chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategorizeQuestion {
    pub request_id: Uuid,
}

impl job_queue::Job for CategorizeQuestion {
    const KIND: &'static str = "ai_categorize_question";
}

/// The categorisation job's values (once per request), for the statement
/// that queues it with the record it is for (see [`super::store::record_ctes`]).
pub fn job_values(request_id: Uuid) -> Result<job_queue::JobValues, job_queue::QueueError> {
    job_queue::JobValues::new(&CategorizeQuestion { request_id }, options(request_id))
}

fn options(request_id: Uuid) -> EnqueueOptions {
    EnqueueOptions {
        // Answers first: a waiting chat answer is always claimed before this.
        priority: -10,
        max_attempts: 3,
        ..EnqueueOptions::default()
            .queue(QUEUE)
            .dedupe(format!("ai_categorize:{request_id}"))
    }
}

/// Registers the job's handler and makes the worker claim from [`QUEUE`].
/// With no categorizer, queued jobs are finished with the reason noted.
/// The flag that turns categorisation off (an operator saving the model
/// call, or tests whose scripted model must not see a second request).
pub const FLAG: &str = "duo_chat_categorize_question";

/// Whether questions of this user are categorised; a flag that cannot be
/// read counts as on (its default).
pub async fn wanted_for(db: &impl crate::queries::Queries, user_id: i64) -> bool {
    match crate::features::store::Snapshot::read(db).await {
        Ok(flags) => wanted_in(&flags, user_id),
        Err(_) => true,
    }
}

/// [`wanted_for`] from flags already read.
pub fn wanted_in(flags: &crate::features::store::Snapshot, user_id: i64) -> bool {
    let actor = crate::features::FlagActor::User {
        id: user_id,
        admin: false,
    };
    flags.enabled(FLAG, &[actor])
}

pub fn register(
    registry: &mut Registry,
    queue: &mut WorkerConfig,
    categorizer: Option<Arc<dyn QuestionCategorizer>>,
) {
    registry.register(CategorizeHandler { categorizer });
    if !queue.queues.iter().any(|q| q == QUEUE) {
        queue.queues.push(QUEUE.to_owned());
    }
}

/// Runs `ai_categorize_question` jobs.
pub struct CategorizeHandler {
    pub categorizer: Option<Arc<dyn QuestionCategorizer>>,
}

#[async_trait]
impl JobHandler for CategorizeHandler {
    type Job = CategorizeQuestion;

    async fn run(&self, ctx: JobContext, job: CategorizeQuestion) -> Result<(), JobError> {
        match &self.categorizer {
            Some(categorizer) => categorizer
                .categorize(&ctx.pool, job.request_id)
                .await
                .map_err(JobError::retryable),
            None => {
                let db = ctx.pool.get().await.map_err(JobError::retryable)?;
                skip(&*db, job.request_id, "no categorizer configured")
                    .await
                    .map_err(JobError::retryable)
            }
        }
    }
}

/// Categorises questions through the AI gateway, for their users.
#[derive(Clone)]
pub struct Categorizer {
    gateway: GatewayClient,
    policy: Policy,
    models: ModelStore,
    timeout: Duration,
}

impl Categorizer {
    pub fn new(gateway: GatewayClient, policy: Policy, models: ModelStore) -> Self {
        Self {
            gateway,
            policy,
            models,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same categorizer with another limit on the gateway's answer.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Categorises one question: stores its category, or why there is none.
    /// `Err` only for database failures.
    pub async fn run(&self, pool: &Pool, request_id: Uuid) -> Result<(), UsageError> {
        let db = pool.get().await?;
        let Some(pending) = store::pending_question(&*db, request_id).await? else {
            return Ok(());
        };
        if pending.done {
            return Ok(());
        }
        let prepared = match self.prepare(&*db, request_id, &pending).await? {
            Ok(prepared) => prepared,
            Err(reason) => return skip(&*db, request_id, reason).await,
        };
        // Not holding a connection while the gateway thinks.
        drop(db);
        let outcome = tokio::time::timeout(
            self.timeout,
            self.gateway.prompt(
                &prepared.auth,
                PROMPT,
                prepared.inputs,
                prepared.model.metadata(),
            ),
        )
        .await;
        let db = pool.get().await?;
        let text = match outcome {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => {
                let reason = format!("gateway: {} {e}", e.code());
                return skip(&*db, request_id, &reason).await;
            }
            Err(_) => return skip(&*db, request_id, "gateway: no answer in time").await,
        };
        match parse_category(&text) {
            Some(category) => {
                store::store_category(&*db, request_id, &category).await?;
                tracing::info!(%request_id, category = %category.category, "question categorised");
                Ok(())
            }
            None => skip(&*db, request_id, "the model's answer is not a category").await,
        }
    }

    /// The gateway call for the question, or why none may be made.
    async fn prepare(
        &self,
        db: &impl Queries,
        request_id: Uuid,
        pending: &store::PendingQuestion,
    ) -> Result<Result<Prepared, &'static str>, UsageError> {
        let policy_error = |e: crate::policy::PolicyError| UsageError::Invalid(e.to_string());
        let Some(user) = crate::identity::users::active(db, pending.user_id).await? else {
            return Ok(Err("the user is no longer active"));
        };
        let actor = Actor::user(user.id, user.admin);
        if !self
            .policy
            .can(db, Some(actor), Ability::AccessDuoChat, Subject::Global)
            .await
            .map_err(policy_error)?
        {
            return Ok(Err("the user no longer has Duo Chat"));
        }
        let container = match (pending.project_id, pending.namespace_id) {
            (Some(project), _) => Some(Subject::Project(project)),
            (None, Some(group)) => Some(Subject::Group(group)),
            (None, None) => None,
        };
        if let Some(container) = container
            && !Policy::duo_switched_on(db, container)
                .await
                .map_err(policy_error)?
        {
            return Ok(Err("Duo is off where the question was asked"));
        }
        let model = self
            .models
            .choice(db, Feature::DuoChat)
            .await
            .map_err(|e| UsageError::Invalid(e.to_string()))?;
        if model == Choice::Disabled {
            return Ok(Err("Duo Chat's model is switched off"));
        }
        let messages = crate::chat::messages_since_reset(db, pending.thread_id, Uuid::nil())
            .await
            .map_err(|e| UsageError::Invalid(e.to_string()))?;
        let Some(position) = messages
            .iter()
            .position(|m| m.is_user && m.request_xid == Some(request_id))
        else {
            return Ok(Err("the question is no longer stored"));
        };
        let previous_answer = messages[..position]
            .iter()
            .rev()
            .find(|m| !m.is_user && !m.has_errors)
            .map(|m| m.content.clone())
            .unwrap_or_default();
        let scopes = self
            .policy
            .seat_unit_primitives(db, actor.id)
            .await
            .map_err(policy_error)?;
        let (realm, gateway_url) = crate::gateway_client::instance_route(db).await?;
        let mut inputs = Map::new();
        inputs.insert(
            "question".into(),
            Value::String(messages[position].content.clone()),
        );
        inputs.insert("previous_answer".into(), Value::String(previous_answer));
        Ok(Ok(Prepared {
            auth: GatewayAuth {
                user_id: actor.id,
                scopes: scopes.iter().map(|s| s.as_str().to_owned()).collect(),
                realm,
                request_id,
                gateway_url,
            },
            inputs,
            model,
        }))
    }
}

struct Prepared {
    auth: GatewayAuth,
    inputs: Map<String, Value>,
    model: Choice,
}

#[async_trait]
impl QuestionCategorizer for Categorizer {
    async fn categorize(&self, pool: &Pool, request_id: Uuid) -> Result<(), String> {
        self.run(pool, request_id).await.map_err(|e| e.to_string())
    }
}

async fn skip(db: &impl Queries, request_id: Uuid, reason: &str) -> Result<(), UsageError> {
    tracing::info!(%request_id, reason, "question not categorised");
    store::skip_category(db, request_id, reason).await
}

/// The category in the model's answer: the first JSON object in it, with a
/// category from [`CATEGORIES`]; other fields are kept when they look right.
pub fn parse_category(text: &str) -> Option<Category> {
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    let object: Value = serde_json::from_str(text.get(start..=end)?).ok()?;
    let category = object.get("category")?.as_str()?;
    let category = CATEGORIES
        .iter()
        .find(|c| c.eq_ignore_ascii_case(category.trim()))?;
    let short = |key: &str, max: usize| {
        object
            .get(key)
            .and_then(Value::as_str)
            .map(|s| s.trim().chars().take(max).collect::<String>())
            .filter(|s| !s.is_empty())
    };
    let labels = object
        .get("labels")
        .and_then(Value::as_array)
        .map(|labels| {
            labels
                .iter()
                .filter_map(Value::as_str)
                .filter(|l| LABELS.contains(l))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Some(Category {
        category: (*category).to_owned(),
        detailed_category: short("detailed_category", 200),
        language: short("language", 16)
            .filter(|l| l.chars().all(|c| c.is_ascii_alphabetic() || c == '-')),
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_read_from_the_first_object_and_checked() {
        let parsed = parse_category(
            "Sure: {\"category\": \"ci/cd\", \"detailed_category\": \"Cache keys\", \"language\": \"en\", \"labels\": [\"needs_code\", \"made_up\"]}",
        )
        .unwrap();
        assert_eq!(parsed.category, "CI/CD");
        assert_eq!(parsed.detailed_category.as_deref(), Some("Cache keys"));
        assert_eq!(parsed.language.as_deref(), Some("en"));
        assert_eq!(parsed.labels, vec!["needs_code"]);

        assert_eq!(parse_category("{\"category\": \"Cooking\"}"), None);
        assert_eq!(parse_category("no json here"), None);
        assert_eq!(parse_category("{\"category\": 3}"), None);
    }
}
