//! Threads and messages in PostgreSQL (`ai_conversation_threads`,
//! `ai_conversation_messages`), with GitLab's thread rules and retention.

use std::sync::{Arc, Mutex, PoisonError};

use crate::queries::Queries;
use deadpool_postgres::Pool;
use serde_json::Value;
use uuid::Uuid;

use super::{ChatError, ConversationType, Role, StoredMessage, Thread};

/// The statement that stores a message (`$1`–`$7`) and touches its thread:
/// `$conflict` says what a second answer to the same request does,
/// `$more_ctes` what else it writes (a question's job), `$announce` what else
/// it returns or sends.
macro_rules! insert_message_sql {
    (@rest $more_ctes:expr, $announce:expr) => {
        concat!(
            " RETURNING id, created_at
             ), t AS (
                 UPDATE ai_conversation_threads SET last_updated_at = now()
                 WHERE id = $1 AND EXISTS (SELECT 1 FROM m)
             )",
            $more_ctes,
            " SELECT id, created_at",
            $announce,
            " FROM m"
        )
    };
    (@rest $announce:expr) => {
        insert_message_sql!(@rest "", $announce)
    };
    ($conflict:expr, $more_ctes:expr, $announce:expr) => {
        concat!(
            "WITH m AS (
                 INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid, error_details, extras)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ",
            $conflict,
            insert_message_sql!(@rest $more_ctes, $announce)
        )
    };
    ($conflict:expr, $announce:expr) => {
        insert_message_sql!($conflict, "", $announce)
    };
}

/// The CTE that queues a stored question's completion job (`$12` to `$19`,
/// see `job_queue::JobValues::params`), in the statement that stores it.
macro_rules! question_job_sql {
    () => {
        concat!(
            ", j AS (",
            job_queue::insert_job_sql!("m", "$12", "$13", "$14", "$15", "$16", "$17", "$18", "$19"),
            ")"
        )
    };
}

/// An answer stored once and announced, with the notification `$12` (its last
/// streamed chunk) sent first: the insert reads its values from the CTE that
/// sends it, so the chunk's NOTIFY is queued before the answer's.
macro_rules! insert_answer_after_chunk_sql {
    ($more_ctes:expr) => {
        concat!(
            "WITH c AS (SELECT pg_notify($8, $12)), m AS (
                 INSERT INTO ai_conversation_messages (thread_id, role, content, message_xid, request_xid, error_details, extras)
                 SELECT $1::bigint, $2::smallint, $3::text, $4::uuid, $5::uuid, $6::jsonb, $7::jsonb FROM c ",
            once_per_request_sql!(),
            insert_message_sql!(@rest $more_ctes, announce_sql!())
        )
    };
    () => {
        insert_answer_after_chunk_sql!("")
    };
}

/// A second answer to the same request stores nothing (a unique index).
macro_rules! once_per_request_sql {
    () => {
        "ON CONFLICT (request_xid) WHERE role = 2 AND request_xid IS NOT NULL DO NOTHING"
    };
}

/// The announcement's NOTIFY, with the row's id and time put in for its stand-ins.
macro_rules! announce_sql {
    () => {
        ", pg_notify($8, replace(replace($9, $10, id::text), $11, to_json(created_at)::text))"
    };
}

/// Stores `message` (its id and time are the database's) and, with an
/// `announcement` of it, sends that in the same statement: inside a
/// transaction the notification goes out at commit. The stored message.
pub async fn store_message(
    db: &impl Queries,
    message: &StoredMessage,
    error_details: Option<Value>,
    announcement: Option<&super::live::Announcement>,
) -> Result<StoredMessage, ChatError> {
    insert_message(
        db,
        message,
        error_details.as_ref(),
        false,
        announcement,
        None,
    )
    .await?
    .ok_or_else(|| ChatError::Internal("a stored message returned no row".into()))
}

/// Stores the assistant's answer unless one to its request is stored already
/// (a unique index allows one per request), announced as [`store_message`]
/// does; `None` when it was already there (and nothing is sent).
pub async fn store_answer_once(
    db: &impl Queries,
    message: &StoredMessage,
    error_details: Option<&Value>,
    announcement: Option<&super::live::Announcement>,
) -> Result<Option<StoredMessage>, ChatError> {
    Ok(insert_message(db, message, error_details, true, announcement, None).await?)
}

/// [`store_answer_once`] with an announcement, writing `record` in the same
/// statement when this answer is the one stored (see
/// [`super::completion::AnswerRecord`]). When the record's part is refused
/// (a constraint: another run of the job writing its own record at that
/// moment, say), the answer is stored alone and `false` says the record is
/// still to be written: a record never costs an answer.
pub async fn store_answer_recording(
    db: &impl Queries,
    message: &StoredMessage,
    error_details: Option<&Value>,
    announcement: &super::live::Announcement,
    record: &dyn super::completion::AnswerRecord,
) -> Result<(Option<StoredMessage>, bool), ChatError> {
    let with_record = Also::Record(record);
    match insert_message(
        db,
        message,
        error_details,
        true,
        Some(announcement),
        Some(with_record),
    )
    .await
    {
        Ok(stored) => Ok((stored, true)),
        Err(e) if e.code().is_some_and(|code| code.code().starts_with("23")) => {
            tracing::debug!(error = %e, "the record written with the answer was refused; storing the answer alone");
            Ok((
                store_answer_once(db, message, error_details, Some(announcement)).await?,
                false,
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// An answer's statement with a record's CTEs, numbered after the answer's
/// own parameters: built once per kind of statement and kept (a few
/// kilobytes each; a handful of kinds).
fn answer_with_record_sql(
    chunk_before: bool,
    record: &dyn super::completion::AnswerRecord,
) -> Arc<str> {
    type Kept = Vec<((bool, &'static str, usize), Arc<str>)>;
    static KEPT: Mutex<Kept> = Mutex::new(Vec::new());
    let (kind, variant) = record.variant();
    let key = (chunk_before, kind, variant);
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, sql)) = kept.iter().find(|(k, _)| *k == key) {
        return sql.clone();
    }
    let sql: Arc<str> = if chunk_before {
        format!(
            insert_answer_after_chunk_sql!("{more}"),
            more = format!(", {}", record.ctes(13, "m"))
        )
    } else {
        format!(
            insert_message_sql!(once_per_request_sql!(), "{more}", announce_sql!()),
            more = format!(", {}", record.ctes(12, "m"))
        )
    }
    .into();
    kept.push((key, sql.clone()));
    sql
}

async fn insert_message(
    db: &impl Queries,
    message: &StoredMessage,
    error_details: Option<&Value>,
    once_per_request: bool,
    announcement: Option<&super::live::Announcement>,
    also: Option<Also<'_>>,
) -> Result<Option<StoredMessage>, tokio_postgres::Error> {
    let role = message.role as i16;
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &message.thread_id,
        &role,
        &message.content,
        &message.message_xid,
        &message.request_xid,
        &error_details,
        &message.extras,
    ];
    // A chunk sent before the message: only answers have one.
    let chunk_before = announcement
        .and_then(|a| a.chunk_before.as_ref())
        .filter(|_| once_per_request);
    // What else the statement writes: a question's job (announced questions
    // only), an answer's record (announced answers only); otherwise their
    // parameters make the statement fail rather than go unwritten.
    let built;
    let sql = match (once_per_request, announcement, chunk_before, &also) {
        (true, Some(_), _, Some(Also::Record(record))) => {
            built = answer_with_record_sql(chunk_before.is_some(), *record);
            &*built
        }
        (_, Some(_), Some(_), _) => insert_answer_after_chunk_sql!(),
        (false, Some(_), None, Some(Also::Job(_))) => {
            insert_message_sql!("", question_job_sql!(), announce_sql!())
        }
        (false, None, _, _) => insert_message_sql!("", ""),
        (true, None, _, _) => insert_message_sql!(once_per_request_sql!(), ""),
        (false, Some(_), _, _) => insert_message_sql!("", announce_sql!()),
        (true, Some(_), None, _) => insert_message_sql!(once_per_request_sql!(), announce_sql!()),
    };
    if let Some(a) = announcement {
        params.extend([
            &job_queue::pubsub::PUBSUB_CHANNEL as &(dyn tokio_postgres::types::ToSql + Sync),
            &a.text,
            &a.id_stand_in,
            &a.created_at_stand_in,
        ]);
    }
    if let Some(chunk) = chunk_before {
        params.push(chunk);
    }
    // Always bound: a statement chosen without its part then fails loudly.
    let also_params = also.as_ref().map(Also::params).unwrap_or_default();
    params.extend(also_params.iter().copied());
    let row = db.query_opt(sql, &params).await?;
    Ok(row.map(|row| StoredMessage {
        id: row.get(0),
        created_at: row.get(1),
        ..message.clone()
    }))
}

/// What a message's statement writes besides the message.
enum Also<'a> {
    /// A question's completion job.
    Job(&'a job_queue::JobValues),
    /// An answer's record.
    Record(&'a dyn super::completion::AnswerRecord),
}

impl<'a> Also<'a> {
    /// Its parameters, bound after the message's and its announcement's.
    fn params(&self) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
        match self {
            Also::Job(job) => job.params().to_vec(),
            Also::Record(record) => record.params(),
        }
    }
}

/// Stores a question with its announcement and its completion job in one
/// statement: all three happen, or none (a live job for the same request
/// fails the statement). The stored question.
pub async fn store_question_with_job(
    db: &impl Queries,
    question: &StoredMessage,
    announcement: &super::live::Announcement,
    job: &job_queue::JobValues,
) -> Result<StoredMessage, ChatError> {
    insert_message(
        db,
        question,
        None,
        false,
        Some(announcement),
        Some(Also::Job(job)),
    )
    .await?
    .ok_or_else(|| ChatError::Internal("a stored question returned no row".into()))
}

/// What a completion job finds when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionStart {
    /// No answer stored yet and the thread is there: answer it.
    Answer,
    /// An answer to the request is stored already (a re-run after a crash).
    AlreadyAnswered,
    /// The thread is gone (retention or `/clear`): nothing to answer.
    ThreadGone,
}

/// Whether the request still needs its answer, in one round trip.
pub async fn completion_start(
    db: &impl Queries,
    request_xid: Uuid,
    thread_id: i64,
) -> Result<CompletionStart, ChatError> {
    let row = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM ai_conversation_messages WHERE request_xid = $1 AND role = 2),
                    EXISTS (SELECT 1 FROM ai_conversation_threads WHERE id = $2)",
            &[&request_xid, &thread_id],
        )
        .await?;
    let (answered, thread): (bool, bool) = (row.get(0), row.get(1));
    Ok(if answered {
        CompletionStart::AlreadyAnswered
    } else if !thread {
        CompletionStart::ThreadGone
    } else {
        CompletionStart::Answer
    })
}

/// One message of a thread as the agent's history needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryRow {
    pub id: i64,
    pub is_user: bool,
    pub content: String,
    pub request_xid: Option<Uuid>,
    /// The message was stored with errors (a failed answer).
    pub has_errors: bool,
}

/// The thread's messages after its last `/reset`, oldest first, except those
/// of `current_request` (the question being answered).
pub async fn messages_since_reset(
    db: &impl Queries,
    thread_id: i64,
    current_request: Uuid,
) -> Result<Vec<HistoryRow>, ChatError> {
    let rows = db
        .query(
            "SELECT id, role, content, request_xid,
                    coalesce(jsonb_array_length(error_details -> 'errors'), 0) > 0
                       OR (error_details ->> 'code') IS NOT NULL
             FROM ai_conversation_messages
             WHERE thread_id = $1
               AND id > coalesce((SELECT max(id) FROM ai_conversation_messages
                                  WHERE thread_id = $1 AND role = 1 AND btrim(content) = '/reset'), 0)
               AND request_xid IS DISTINCT FROM $2
             ORDER BY id",
            &[&thread_id, &current_request],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| HistoryRow {
            id: r.get(0),
            is_user: r.get::<_, i16>(1) == 1,
            content: r.get(2),
            request_xid: r.get(3),
            has_errors: r.get::<_, Option<bool>>(4).unwrap_or(false),
        })
        .collect())
}

/// The stored `extras` (current file, additional context) of the question
/// `request_xid` asked in the thread; `Null` when there is no such question.
pub async fn question_extras(
    db: &impl Queries,
    thread_id: i64,
    request_xid: Uuid,
) -> Result<Value, ChatError> {
    Ok(db
        .query_opt(
            "SELECT extras FROM ai_conversation_messages
             WHERE thread_id = $1 AND request_xid = $2 AND role = 1 ORDER BY id LIMIT 1",
            &[&thread_id, &request_xid],
        )
        .await?
        .and_then(|r| r.get::<_, Option<Value>>(0))
        .unwrap_or(Value::Null))
}

/// The `errors` and the error code a message's `error_details` hold.
pub(crate) fn errors_of(details: Option<&Value>) -> (Vec<String>, Option<String>) {
    let errors = details
        .and_then(|d| d.get("errors"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let error_code = details
        .and_then(|d| d.get("code"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    (errors, error_code)
}

pub(crate) fn message_from_row(row: &tokio_postgres::Row) -> StoredMessage {
    let details: Option<Value> = row.get(6);
    let (errors, error_code) = errors_of(details.as_ref());
    StoredMessage {
        id: row.get(0),
        thread_id: row.get(1),
        role: if row.get::<_, i16>(2) == 2 {
            Role::Assistant
        } else {
            Role::User
        },
        content: row.get(3),
        message_xid: row.get(4),
        request_xid: row.get(5),
        errors,
        error_code,
        extras: row.get::<_, Option<Value>>(7).unwrap_or(Value::Null),
        has_feedback: row.get(8),
        created_at: row.get(9),
    }
}

/// Deletes threads (and their messages) idle for more than `days`; returns how many.
pub async fn delete_idle_threads(db: &impl Queries, days: i32) -> Result<u64, ChatError> {
    Ok(db
        .execute(
            "DELETE FROM ai_conversation_threads WHERE last_updated_at < now() - make_interval(days => $1)",
            &[&days],
        )
        .await?)
}

/// Retention with the instance's configured number of days.
pub async fn apply_retention(pool: &Pool) -> Result<u64, ChatError> {
    let db = pool.get().await?;
    let days: i32 = db
        .query_one(
            "SELECT duo_chat_expiration_days FROM instance_settings",
            &[],
        )
        .await?
        .get(0);
    delete_idle_threads(&*db, days).await
}

pub(crate) fn thread_from_row(row: &tokio_postgres::Row) -> Thread {
    Thread {
        id: row.get(0),
        conversation_type: ConversationType::from_db(row.get(1)),
        created_at: row.get(2),
        last_updated_at: row.get(3),
        title: row.try_get::<_, Option<String>>(4).ok().flatten(),
    }
}

pub(crate) async fn find_thread(
    db: &impl Queries,
    user_id: i64,
    id: i64,
) -> Result<Option<Thread>, ChatError> {
    let row = db
        .query_opt(
            "SELECT id, conversation_type, created_at, last_updated_at FROM ai_conversation_threads
             WHERE id = $1 AND user_id = $2",
            &[&id, &user_id],
        )
        .await?;
    Ok(row.as_ref().map(thread_from_row))
}

pub(crate) async fn latest_thread(
    db: &impl Queries,
    user_id: i64,
    kind: ConversationType,
) -> Result<Option<Thread>, ChatError> {
    let row = db
        .query_opt(
            "SELECT id, conversation_type, created_at, last_updated_at FROM ai_conversation_threads
             WHERE user_id = $1 AND conversation_type = $2 ORDER BY last_updated_at DESC, id DESC LIMIT 1",
            &[&user_id, &(kind as i16)],
        )
        .await?;
    Ok(row.as_ref().map(thread_from_row))
}

pub(crate) async fn create_thread(
    db: &impl Queries,
    user_id: i64,
    kind: ConversationType,
) -> Result<Thread, ChatError> {
    let row = db
        .query_one(
            "INSERT INTO ai_conversation_threads (user_id, conversation_type) VALUES ($1, $2)
             RETURNING id, conversation_type, created_at, last_updated_at",
            &[&user_id, &(kind as i16)],
        )
        .await?;
    Ok(thread_from_row(&row))
}

/// What GitLab's write-mode thread rules need read before a thread is chosen
/// (see [`look_up_thread_for_write`]).
pub(crate) enum ThreadLookup {
    /// The thread the request names (`None`: not the user's, or none).
    Named(Option<Thread>),
    /// No thread and no type: the user's latest legacy thread, if any.
    Legacy(Option<Thread>),
    /// A type without a thread: a new thread of that type.
    New(ConversationType),
}

/// The reads of GitLab's write-mode thread rules, writing nothing (so they
/// may go out before the checks): an explicit thread must be the user's; no
/// thread and no type continues the legacy thread; a type alone starts a new
/// one. [`thread_for_write`] applies them.
pub(crate) async fn look_up_thread_for_write(
    db: &impl Queries,
    user_id: i64,
    thread_id: Option<i64>,
    conversation_type: Option<ConversationType>,
) -> Result<ThreadLookup, ChatError> {
    Ok(match (thread_id, conversation_type) {
        (Some(id), _) => ThreadLookup::Named(find_thread(db, user_id, id).await?),
        (None, Some(kind)) => ThreadLookup::New(kind),
        (None, None) => {
            ThreadLookup::Legacy(latest_thread(db, user_id, ConversationType::DuoChatLegacy).await?)
        }
    })
}

/// The thread a look-up leads to, created when the rules call for one.
pub(crate) async fn thread_for_write(
    db: &impl Queries,
    user_id: i64,
    lookup: ThreadLookup,
) -> Result<Thread, ChatError> {
    match lookup {
        ThreadLookup::Named(found) => found.ok_or(ChatError::ThreadNotFound),
        ThreadLookup::Legacy(Some(thread)) => Ok(thread),
        ThreadLookup::Legacy(None) => {
            create_thread(db, user_id, ConversationType::DuoChatLegacy).await
        }
        ThreadLookup::New(kind) => create_thread(db, user_id, kind).await,
    }
}

/// Longest feedback reason kept.
pub const MAX_FEEDBACK_REASON_CHARS: usize = 2000;

/// Records a user's verdict on an answer in one of their own threads; `false`
/// when there is no such answer for them (someone else's, or unknown: the same
/// answer, so nothing leaks). Feedback given twice keeps the last verdict.
pub async fn record_feedback(
    db: &impl Queries,
    user_id: i64,
    message_xid: Uuid,
    helpful: bool,
    reason: &str,
) -> Result<bool, ChatError> {
    let reason: String = reason.chars().take(MAX_FEEDBACK_REASON_CHARS).collect();
    let row = db
        .query_opt(
            "WITH m AS (
                 SELECT m.id FROM ai_conversation_messages m
                 JOIN ai_conversation_threads t ON t.id = m.thread_id
                 WHERE m.message_xid = $1 AND t.user_id = $2 AND m.role = 2
             ), f AS (
                 INSERT INTO ai_message_feedback (message_id, user_id, helpful, reason)
                 SELECT id, $2, $3, $4 FROM m
                 ON CONFLICT (message_id, user_id) DO UPDATE SET helpful = EXCLUDED.helpful, reason = EXCLUDED.reason
                 RETURNING message_id
             )
             UPDATE ai_conversation_messages SET has_feedback = true
             WHERE id IN (SELECT message_id FROM f) RETURNING id",
            &[&message_xid, &user_id, &helpful, &reason],
        )
        .await?;
    Ok(row.is_some())
}

/// Deletes one of the user's threads with its messages; `false` when the user
/// has no such thread (unknown or someone else's: the same answer).
pub async fn delete_thread(
    db: &impl Queries,
    user_id: i64,
    thread_id: i64,
) -> Result<bool, ChatError> {
    Ok(db
        .execute(
            "DELETE FROM ai_conversation_threads WHERE id = $1 AND user_id = $2",
            &[&thread_id, &user_id],
        )
        .await?
        == 1)
}
