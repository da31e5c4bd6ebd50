//! The SQL of one question's usage: its event and facts, and its category.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{DUO_CHAT_EVENT, UsageError};
use crate::policy::Subject;
use crate::queries::Queries;

/// Everything recorded about one answered question.
#[derive(Debug, Clone, PartialEq)]
pub struct QuestionFacts {
    pub request_id: Uuid,
    pub thread_id: i64,
    pub user_id: i64,
    /// The group or project of the page resource the answer used.
    pub container: Option<Subject>,
    /// When the answer was started.
    pub at: DateTime<Utc>,
    pub slash_command: Option<String>,
    pub tools: Vec<String>,
    pub error_code: Option<String>,
    pub input_tokens: i32,
    pub output_tokens: i32,
    pub tokens_estimated: bool,
    pub first_token_ms: Option<i32>,
    pub total_ms: i32,
}

/// The error of a [`record_question`] that lost a race to another run.
pub fn is_race(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

/// Records the question's event and facts. A second record for the same
/// request (a retried job) replaces the facts and keeps the event. `true`
/// when this call created the record.
///
/// One statement: the facts are updated if the request has a record, else
/// the event and the facts are inserted. Two runs racing each other (an
/// expired lease) may both find no record; the unique `request_id` then
/// fails the second one's statement whole, its event included
/// ([`is_race`]), and that run tries again and finds the record to update.
/// So a question never gets two events, without a lock.
pub async fn record_question(
    db: &impl Queries,
    facts: &QuestionFacts,
) -> Result<bool, tokio_postgres::Error> {
    let (project_id, group_id) = match facts.container {
        Some(Subject::Project(id)) => (Some(id), None),
        Some(Subject::Group(id)) => (None, Some(id)),
        _ => (None, None),
    };
    let inserted = db
        .execute(
            "WITH updated AS (
                 UPDATE ai_chat_question_usage
                 SET slash_command = $8, tools = $9, error_code = $10, input_tokens = $11,
                     output_tokens = $12, tokens_estimated = $13, first_token_ms = $14,
                     total_ms = $15
                 WHERE request_id = $6
                 RETURNING 1
             ), e AS (
                 INSERT INTO ai_usage_events (event, user_id, project_id, namespace_id, \"timestamp\")
                 SELECT $1, $2, $3,
                        coalesce($4, (SELECT group_id FROM projects WHERE id = $3)), $5
                 WHERE NOT EXISTS (SELECT 1 FROM updated)
                 RETURNING id
             )
             INSERT INTO ai_chat_question_usage
                 (event_id, request_id, thread_id, slash_command, tools, error_code, input_tokens,
                  output_tokens, tokens_estimated, first_token_ms, total_ms)
             SELECT id, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 FROM e",
            &[
                &DUO_CHAT_EVENT,
                &facts.user_id,
                &project_id,
                &group_id,
                &facts.at,
                &facts.request_id,
                &facts.thread_id,
                &facts.slash_command,
                &facts.tools,
                &facts.error_code,
                &facts.input_tokens,
                &facts.output_tokens,
                &facts.tokens_estimated,
                &facts.first_token_ms,
                &facts.total_ms,
            ],
        )
        .await?;
    Ok(inserted > 0)
}

/// What the categorisation job needs to know about a recorded question.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingQuestion {
    pub thread_id: i64,
    pub user_id: i64,
    pub project_id: Option<i64>,
    pub namespace_id: Option<i64>,
    /// Categorised already, or given up on.
    pub done: bool,
}

pub async fn pending_question(
    db: &impl Queries,
    request_id: Uuid,
) -> Result<Option<PendingQuestion>, UsageError> {
    let row = db
        .query_opt(
            "SELECT q.thread_id, e.user_id, e.project_id, e.namespace_id,
                    q.categorized_at IS NOT NULL
             FROM ai_chat_question_usage q JOIN ai_usage_events e ON e.id = q.event_id
             WHERE q.request_id = $1",
            &[&request_id],
        )
        .await?;
    Ok(row.map(|r| PendingQuestion {
        thread_id: r.get(0),
        user_id: r.get(1),
        project_id: r.get(2),
        namespace_id: r.get(3),
        done: r.get(4),
    }))
}

/// A question's category, as the `categorize_question` prompt gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Category {
    pub category: String,
    pub detailed_category: Option<String>,
    pub language: Option<String>,
    pub labels: Vec<String>,
}

pub async fn store_category(
    db: &impl Queries,
    request_id: Uuid,
    category: &Category,
) -> Result<(), UsageError> {
    db.execute(
        "UPDATE ai_chat_question_usage
         SET category = $2, detailed_category = $3, language = $4, labels = $5,
             categorized_at = now(), category_skipped = NULL
         WHERE request_id = $1",
        &[
            &request_id,
            &category.category,
            &category.detailed_category,
            &category.language,
            &category.labels,
        ],
    )
    .await?;
    Ok(())
}

/// Gives up on categorising the question, saying why (never its content).
pub async fn skip_category(
    db: &impl Queries,
    request_id: Uuid,
    reason: &str,
) -> Result<(), UsageError> {
    let reason: String = reason.chars().take(200).collect();
    db.execute(
        "UPDATE ai_chat_question_usage
         SET categorized_at = now(), category_skipped = $2
         WHERE request_id = $1 AND category IS NULL",
        &[&request_id, &reason],
    )
    .await?;
    Ok(())
}
