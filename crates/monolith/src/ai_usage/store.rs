//! The SQL of one question's usage: its event and facts, and its category.

use std::sync::OnceLock;

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

/// How many parameters [`record_ctes`] binds without a categorisation job
/// (the job adds [`JOB_PARAMS`]).
pub const RECORD_PARAMS: usize = 15;
const JOB_PARAMS: usize = 8;

/// The common table expressions that record a question's usage, numbering
/// their parameters from `$first` in [`UsageRecord::params`]' order: the
/// facts are updated if the request has a record, else the event and the
/// facts are inserted, and with `categorize` the new record's categorisation
/// job is queued in the same statement (never for an updated one).
///
/// `answer` names a CTE of the same statement (an answer's insert): the
/// usage is then written only when that CTE stored a row, so a run whose
/// answer lost to another run's leaves the record to that run.
///
/// Two runs racing each other (an expired lease) may both find no record;
/// the unique `request_id` then fails the second one's statement whole, its
/// event included ([`is_race`]). So a question never gets two events,
/// without a lock. CTE names start with `usage_`.
pub fn record_ctes(first: usize, answer: Option<&str>, categorize: bool) -> String {
    let p = |i: usize| format!("${}", first + i);
    let stored = answer
        .map(|cte| format!(" AND EXISTS (SELECT 1 FROM {cte})"))
        .unwrap_or_default();
    let mut sql = format!(
        "usage_updated AS (
             UPDATE ai_chat_question_usage
             SET slash_command = {slash}, tools = {tools}, error_code = {code}, input_tokens = {input},
                 output_tokens = {output}, tokens_estimated = {estimated}, first_token_ms = {first_token},
                 total_ms = {total}
             WHERE request_id = {request}{stored}
             RETURNING 1
         ), usage_event AS (
             INSERT INTO ai_usage_events (event, user_id, project_id, namespace_id, \"timestamp\")
             SELECT {event}, {user}, {project},
                    coalesce({group}, (SELECT group_id FROM projects WHERE id = {project})), {at}
             WHERE NOT EXISTS (SELECT 1 FROM usage_updated){stored}
             RETURNING id
         ), usage_question AS (
             INSERT INTO ai_chat_question_usage
                 (event_id, request_id, thread_id, slash_command, tools, error_code, input_tokens,
                  output_tokens, tokens_estimated, first_token_ms, total_ms)
             SELECT id, {request}, {thread}, {slash}, {tools}, {code}, {input}, {output}, {estimated},
                    {first_token}, {total}
             FROM usage_event
             RETURNING 1
         )",
        event = p(0),
        user = p(1),
        project = p(2),
        group = p(3),
        at = p(4),
        request = p(5),
        thread = p(6),
        slash = p(7),
        tools = p(8),
        code = p(9),
        input = p(10),
        output = p(11),
        estimated = p(12),
        first_token = p(13),
        total = p(14),
    );
    if categorize {
        let j = |i: usize| p(RECORD_PARAMS + i);
        sql.push_str(&format!(
            concat!(
                ", usage_categorize AS (",
                job_queue::insert_job_sql!(
                    "usage_event",
                    "{queue}",
                    "{kind}",
                    "{payload}",
                    "{priority}",
                    "{delay}",
                    "{attempts}",
                    "{dedupe}",
                    "{trace}"
                ),
                ")"
            ),
            queue = j(0),
            kind = j(1),
            payload = j(2),
            priority = j(3),
            delay = j(4),
            attempts = j(5),
            dedupe = j(6),
            trace = j(7),
        ));
    }
    sql
}

/// One question's usage record, ready to be written: its facts, and the
/// categorisation job a new record queues (none when categorisation is off).
#[derive(Debug, Clone)]
pub struct UsageRecord {
    pub facts: QuestionFacts,
    project_id: Option<i64>,
    group_id: Option<i64>,
    categorize: Option<job_queue::JobValues>,
}

impl UsageRecord {
    /// The record of `facts`, queueing `categorize` when it is new (see
    /// `categorize::job_values`).
    pub fn new(facts: QuestionFacts, categorize: Option<job_queue::JobValues>) -> Self {
        Self {
            categorize,
            ..Self::without_categorisation(facts)
        }
    }

    fn without_categorisation(facts: QuestionFacts) -> Self {
        let (project_id, group_id) = match facts.container {
            Some(Subject::Project(id)) => (Some(id), None),
            Some(Subject::Group(id)) => (None, Some(id)),
            _ => (None, None),
        };
        Self {
            facts,
            project_id,
            group_id,
            categorize: None,
        }
    }

    /// Whether a new record queues the categorisation.
    pub fn categorizes(&self) -> bool {
        self.categorize.is_some()
    }

    /// The parameters, in [`record_ctes`]' order.
    pub fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        let facts = &self.facts;
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            Vec::with_capacity(RECORD_PARAMS + JOB_PARAMS);
        params.extend([
            &DUO_CHAT_EVENT as &(dyn tokio_postgres::types::ToSql + Sync),
            &facts.user_id,
            &self.project_id,
            &self.group_id,
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
        ]);
        if let Some(job) = &self.categorize {
            params.extend(job.params());
        }
        params
    }
}

/// Records the question's event and facts. A second record for the same
/// request (a retried job) replaces the facts and keeps the event. `true`
/// when this call created the record. See [`record_ctes`].
pub async fn record_question(
    db: &impl Queries,
    facts: &QuestionFacts,
) -> Result<bool, tokio_postgres::Error> {
    write_record(db, &UsageRecord::without_categorisation(facts.clone())).await
}

/// [`record_question`] with the categorisation queued when the record asks
/// for it, in the same statement.
pub async fn write_record(
    db: &impl Queries,
    record: &UsageRecord,
) -> Result<bool, tokio_postgres::Error> {
    static SQL: [OnceLock<String>; 2] = [OnceLock::new(), OnceLock::new()];
    let categorize = record.categorizes();
    let sql = SQL[usize::from(categorize)].get_or_init(|| {
        format!(
            "WITH {} SELECT count(*) > 0 FROM usage_question",
            record_ctes(1, None, categorize)
        )
    });
    let row = db.query_one(sql, &record.params()).await?;
    Ok(row.get(0))
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
