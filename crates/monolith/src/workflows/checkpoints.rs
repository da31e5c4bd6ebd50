//! LangGraph checkpoints of a workflow (GitLab's `thread_ts`/`parent_ts`
//! naming), plain or zlib+base64 compressed on the wire, and the checkpoint
//! writes an interrupted graph resumes from.
//!
//! Each new checkpoint must continue the chain: its `parent_ts` is the
//! `thread_ts` of the newest checkpoint of the same namespace (none for the
//! first). A checkpoint is stored whole or not at all, under a lock on its
//! workflow, so two writers cannot both extend the same parent.
//!
//! A checkpoint body is JSON text ([`RawValue`]) from the request to the
//! database and back: it is checked once (syntax, an object, size, no NUL)
//! and never built into a tree or serialized again. A long run's state is
//! hundreds of kilobytes, and a `jsonb` column spent more time parsing it
//! than the rest of the request took; the column is `text` (still
//! compressed by PostgreSQL), which nothing queries inside.

use std::io::Read;

use crate::queries::Queries;
use base64::Engine;
use serde_json::Value;
use serde_json::value::RawValue;

use super::checkpoint_record::{CHECKPOINT_COLUMNS, from_row};
pub use super::checkpoint_record::{Checkpoint, CheckpointWrite, get, latest, list};
use super::record::Workflow;
use super::store::sanitize_model_metadata;
use super::{WorkflowError, live};

/// Longest `thread_ts`, `parent_ts`, `task`, `channel` and `write_type`.
pub const MAX_TS_CHARS: usize = 255;
/// Longest checkpoint namespace.
pub const MAX_NS_CHARS: usize = 4096;
/// Largest `data` of one checkpoint write (GitLab's limit).
pub const MAX_WRITE_DATA_CHARS: usize = 10_000;
/// Most writes in one batch.
pub const MAX_WRITES_PER_BATCH: usize = 100;
/// Zlib level GitLab compresses with ("fast and good").
const COMPRESS_LEVEL: u32 = 6;

/// A checkpoint as posted (GitLab's parameters).
#[derive(Debug, Clone, Default)]
pub struct NewCheckpoint {
    pub thread_ts: String,
    pub parent_ts: Option<String>,
    pub checkpoint_ns: Option<String>,
    pub checkpoint: Option<Box<RawValue>>,
    pub compressed_checkpoint: Option<String>,
    pub metadata: Value,
    pub model_metadata_json: Option<String>,
}

/// Base64 of zlib-compressed JSON text, as GitLab sends `compressed_checkpoint`.
pub fn compress(json: &str) -> String {
    use std::io::Write;
    let mut encoder =
        flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(COMPRESS_LEVEL));
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(json.as_bytes());
    let bytes = encoder.finish().unwrap_or_default();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Opens a `compressed_checkpoint`, inflating at most `max_bytes` (a small
/// body must not grow into gigabytes).
pub fn decompress(text: &str, max_bytes: usize) -> Result<Box<RawValue>, WorkflowError> {
    let bad = |detail: &str| {
        WorkflowError::BadRequest(format!("Invalid compressed checkpoint data: {detail}"))
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|_| bad("invalid base64"))?;
    let mut inflated = Vec::new();
    flate2::read::ZlibDecoder::new(bytes.as_slice())
        .take(max_bytes as u64 + 1)
        .read_to_end(&mut inflated)
        .map_err(|e| bad(&e.to_string()))?;
    if inflated.len() > max_bytes {
        return Err(too_large(max_bytes));
    }
    let inflated = String::from_utf8(inflated).map_err(|_| bad("not UTF-8"))?;
    RawValue::from_string(inflated).map_err(|e| bad(&format!("not JSON ({e})")))
}

fn too_large(max_bytes: usize) -> WorkflowError {
    WorkflowError::BadRequest(format!(
        "Checkpoint is too large (the limit is {max_bytes} bytes)"
    ))
}

/// Whether JSON text holds an escaped NUL character (`\u0000`), which
/// GitLab's `jsonb` column cannot store. Valid JSON has no raw control
/// characters in its strings, so the escape is the only way one appears; a
/// `\\u0000` (an escaped backslash, then text) is not one.
pub fn has_nul_escape(json: &str) -> bool {
    let bytes = json.as_bytes();
    let mut from = 0;
    while let Some(found) = json[from..].find("u0000") {
        let at = from + found;
        let backslashes = bytes[..at]
            .iter()
            .rev()
            .take_while(|b| **b == b'\\')
            .count();
        if backslashes % 2 == 1 {
            return true;
        }
        from = at + 1;
    }
    false
}

/// Whether any string (or key) in `value` holds a NUL character, which
/// PostgreSQL's jsonb cannot store.
pub fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

fn check_text(field: &'static str, value: &str, max: usize) -> Result<(), WorkflowError> {
    if value.chars().count() > max {
        return Err(WorkflowError::invalid(
            field,
            format!("is too long (maximum is {max} characters)"),
        ));
    }
    if value.contains('\0') {
        return Err(WorkflowError::invalid(field, "contains a NUL character"));
    }
    Ok(())
}

/// The checkpoint body of a post, checked: exactly one of the two forms, a JSON
/// object, within `max_bytes`.
fn body_of(new: &mut NewCheckpoint, max_bytes: usize) -> Result<Box<RawValue>, WorkflowError> {
    let checkpoint = match (new.checkpoint.take(), &new.compressed_checkpoint) {
        (Some(v), _) if !is_blank(v.get()) => v,
        (_, Some(text)) if !text.trim().is_empty() => {
            if text.len() > max_bytes.saturating_mul(2) {
                return Err(too_large(max_bytes));
            }
            decompress(text, max_bytes)?
        }
        _ => {
            return Err(WorkflowError::BadRequest(
                "Either checkpoint or compressed_checkpoint must be provided".into(),
            ));
        }
    };
    if !checkpoint.get().trim_start().starts_with('{') {
        return Err(WorkflowError::Param("checkpoint is invalid".into()));
    }
    if checkpoint.get().len() > max_bytes {
        return Err(too_large(max_bytes));
    }
    if has_nul_escape(checkpoint.get()) {
        return Err(WorkflowError::BadRequest(
            "checkpoint contains a NUL character".into(),
        ));
    }
    Ok(checkpoint)
}

/// The length of `value` as compact JSON, counted without building the text.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Counting cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Rails' `present?` of JSON text: null, an empty object or a blank string
/// counts as absent.
fn is_blank(json: &str) -> bool {
    let json = json.trim();
    if json == "null" {
        return true;
    }
    if let Some(inside) = json.strip_prefix('{').and_then(|j| j.strip_suffix('}')) {
        return inside.trim().is_empty();
    }
    json.starts_with('"') && serde_json::from_str::<String>(json).is_ok_and(|s| s.trim().is_empty())
}

/// Stores a checkpoint (or, for a repeated post of the same checkpoint,
/// returns the stored one), touches the workflow, remembers its model and
/// tells the owner's subscribers, all in one transaction (four statements
/// between BEGIN and COMMIT when the chain simply grows).
pub async fn create(
    client: &mut deadpool_postgres::Client,
    workflow: &Workflow,
    mut new: NewCheckpoint,
    max_bytes: usize,
) -> Result<Checkpoint, WorkflowError> {
    if new.thread_ts.trim().is_empty() {
        return Err(WorkflowError::Param("thread_ts is missing".into()));
    }
    check_text("thread_ts", &new.thread_ts, MAX_TS_CHARS)?;
    if let Some(parent) = &new.parent_ts {
        check_text("parent_ts", parent, MAX_TS_CHARS)?;
    }
    let ns = new.checkpoint_ns.clone().unwrap_or_default();
    check_text("checkpoint_ns", &ns, MAX_NS_CHARS)?;
    if !new.metadata.is_object() {
        return Err(WorkflowError::Param("metadata is invalid".into()));
    }
    if json_len(&new.metadata) > max_bytes || has_nul(&new.metadata) {
        return Err(WorkflowError::Param("metadata is invalid".into()));
    }
    let checkpoint = body_of(&mut new, max_bytes)?;
    let parent_ts = new.parent_ts.clone().filter(|p| !p.is_empty());

    let tx = client.transaction().await?;
    // Taking the workflow's row lock (and touching it) orders concurrent
    // writers of one workflow: the chain check below sees every checkpoint
    // committed before it.
    let model_metadata = new
        .model_metadata_json
        .as_deref()
        .and_then(sanitize_model_metadata);
    let locked = tx
        .query_opt(
            "UPDATE duo_workflows_workflows
             SET updated_at = now(), model_metadata_json = coalesce($2, model_metadata_json)
             WHERE id = $1 RETURNING status",
            &[&workflow.id, &model_metadata],
        )
        .await?
        .ok_or(WorkflowError::NotFound)?;
    let latest: Option<String> = tx
        .query_opt(
            "SELECT thread_ts FROM duo_workflows_checkpoints
             WHERE workflow_id = $1 AND checkpoint_ns = $2 ORDER BY id DESC LIMIT 1",
            &[&workflow.id, &ns],
        )
        .await?
        .map(|r| r.get(0));
    if latest.as_deref() == Some(new.thread_ts.as_str()) || parent_ts != latest {
        // Not a plain next link: a retried post of a stored checkpoint (answered
        // as the first; dropping the transaction undoes the touch), a taken
        // thread_ts, or a broken chain.
        if let Some(existing) = tx
            .query_opt(
                &format!(
                    "SELECT {CHECKPOINT_COLUMNS} FROM duo_workflows_checkpoints
                     WHERE workflow_id = $1 AND thread_ts = $2"
                ),
                &[&workflow.id, &new.thread_ts],
            )
            .await?
        {
            let existing = from_row(&existing)?;
            if existing.parent_ts == parent_ts
                && existing.checkpoint_ns == ns
                && same_json(&existing.checkpoint, &checkpoint)
                && existing.metadata == new.metadata
            {
                return Ok(existing);
            }
            return Err(taken());
        }
        return Err(WorkflowError::BadRequest(match &latest {
            Some(ts) => format!("parent_ts must be the thread_ts of the latest checkpoint ({ts})"),
            None => "parent_ts must be empty for the first checkpoint".into(),
        }));
    }
    // Only the small columns come back: the body is already here.
    let row = tx
        .query_one(
            "INSERT INTO duo_workflows_checkpoints
               (workflow_id, project_id, namespace_id, thread_ts, parent_ts, checkpoint_ns, checkpoint, metadata)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             RETURNING id, created_at",
            &[
                &workflow.id,
                &workflow.project_id,
                &workflow.namespace_id,
                &new.thread_ts,
                &parent_ts,
                &ns,
                &checkpoint.get(),
                &new.metadata,
            ],
        )
        .await
        .map_err(|e| {
            // An older checkpoint already has this thread_ts.
            if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
                taken()
            } else {
                e.into()
            }
        })?;
    let stored = Checkpoint {
        id: row.get(0),
        workflow_id: workflow.id,
        thread_ts: new.thread_ts.clone(),
        parent_ts,
        checkpoint_ns: ns,
        checkpoint,
        metadata: new.metadata,
        created_at: row.get(1),
        writes: Vec::new(),
    };
    let status = super::Status::from_code(locked.get(0)).unwrap_or(workflow.status);
    live::publish_checkpoint(&tx, workflow, status, &stored).await?;
    tx.commit().await?;
    Ok(stored)
}

/// Whether two JSON texts hold the same value (a retried post may be
/// formatted differently); only the rare retry path parses them.
fn same_json(a: &RawValue, b: &RawValue) -> bool {
    a.get() == b.get()
        || matches!(
            (
                serde_json::from_str::<Value>(a.get()),
                serde_json::from_str::<Value>(b.get()),
            ),
            (Ok(x), Ok(y)) if x == y
        )
}

fn taken() -> WorkflowError {
    WorkflowError::BadRequest("thread_ts has already been taken".into())
}

/// One write as posted.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct NewWrite {
    pub task: Option<String>,
    pub idx: Option<i64>,
    pub channel: Option<String>,
    pub write_type: Option<String>,
    pub data: Option<String>,
}

/// Stores a batch of writes for `thread_ts`: all of them, or none when any is
/// invalid.
pub async fn create_writes(
    client: &mut deadpool_postgres::Client,
    workflow: &Workflow,
    thread_ts: &str,
    writes: &[NewWrite],
) -> Result<usize, WorkflowError> {
    if thread_ts.trim().is_empty() {
        return Err(WorkflowError::Param("thread_ts is missing".into()));
    }
    check_text("thread_ts", thread_ts, MAX_TS_CHARS)?;
    if writes.is_empty() {
        return Err(WorkflowError::Param("checkpoint_writes is empty".into()));
    }
    if writes.len() > MAX_WRITES_PER_BATCH {
        return Err(WorkflowError::BadRequest(format!(
            "checkpoint_writes has more than {MAX_WRITES_PER_BATCH} items"
        )));
    }
    let mut checked = Vec::with_capacity(writes.len());
    for (n, w) in writes.iter().enumerate() {
        let missing =
            |f: &str| WorkflowError::Param(format!("checkpoint_writes[{n}][{f}] is missing"));
        let task = w.task.clone().ok_or_else(|| missing("task"))?;
        let idx = w.idx.ok_or_else(|| missing("idx"))?;
        let channel = w.channel.clone().ok_or_else(|| missing("channel"))?;
        let write_type = w.write_type.clone().ok_or_else(|| missing("write_type"))?;
        let data = w.data.clone().ok_or_else(|| missing("data"))?;
        let idx = i32::try_from(idx)
            .map_err(|_| WorkflowError::Param(format!("checkpoint_writes[{n}][idx] is invalid")))?;
        for (field, value) in [
            ("task", &task),
            ("channel", &channel),
            ("write_type", &write_type),
        ] {
            if value.is_empty() {
                return Err(missing(field));
            }
            if value.chars().count() > MAX_TS_CHARS || value.contains('\0') {
                return Err(WorkflowError::Param(format!(
                    "checkpoint_writes[{n}][{field}] is invalid"
                )));
            }
        }
        if data.chars().count() > MAX_WRITE_DATA_CHARS || data.contains('\0') {
            return Err(WorkflowError::invalid(
                "data",
                format!("is too long (maximum is {MAX_WRITE_DATA_CHARS} characters)"),
            ));
        }
        checked.push((task, idx, channel, write_type, data));
    }
    let tx = client.transaction().await?;
    for (task, idx, channel, write_type, data) in &checked {
        tx.execute(
            "INSERT INTO duo_workflows_checkpoint_writes
               (workflow_id, project_id, namespace_id, thread_ts, task, idx, channel, write_type, data)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &workflow.id,
                &workflow.project_id,
                &workflow.namespace_id,
                &thread_ts,
                task,
                idx,
                channel,
                write_type,
                data,
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(checked.len())
}

/// Deletes checkpoints and writes older than `days`; returns how many
/// checkpoints went.
pub async fn apply_retention(db: &impl Queries, days: i32) -> Result<u64, WorkflowError> {
    let gone = db
        .execute(
            "DELETE FROM duo_workflows_checkpoints WHERE created_at < now() - make_interval(days => $1)",
            &[&days],
        )
        .await?;
    db.execute(
        "DELETE FROM duo_workflows_checkpoint_writes WHERE created_at < now() - make_interval(days => $1)",
        &[&days],
    )
    .await?;
    Ok(gone)
}

/// GitLab's checkpoint entity; `compressed` replaces `checkpoint` with
/// `compressed_checkpoint`. The body goes out as the text it was stored as.
pub fn to_json(c: &Checkpoint, compressed: bool) -> CheckpointEntity<'_> {
    let (checkpoint, compressed_checkpoint) = if compressed {
        (None, Some(compress(c.checkpoint.get())))
    } else {
        (Some(&*c.checkpoint), None)
    };
    CheckpointEntity {
        id: c.id,
        thread_ts: &c.thread_ts,
        parent_ts: c.parent_ts.as_deref(),
        checkpoint_ns: &c.checkpoint_ns,
        metadata: &c.metadata,
        checkpoint_writes: c
            .writes
            .iter()
            .map(|w| WriteEntity {
                id: w.id,
                thread_ts: &w.thread_ts,
                task: &w.task,
                idx: w.idx,
                channel: &w.channel,
                write_type: &w.write_type,
                data: &w.data,
            })
            .collect(),
        current_thread: 0,
        checkpoint,
        compressed_checkpoint,
    }
}

/// GitLab's checkpoint entity, as [`to_json`] makes it.
#[derive(Debug, serde::Serialize)]
pub struct CheckpointEntity<'a> {
    id: i64,
    thread_ts: &'a str,
    parent_ts: Option<&'a str>,
    checkpoint_ns: &'a str,
    metadata: &'a Value,
    checkpoint_writes: Vec<WriteEntity<'a>>,
    current_thread: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compressed_checkpoint: Option<String>,
}

#[derive(Debug, serde::Serialize)]
struct WriteEntity<'a> {
    id: i64,
    thread_ts: &'a str,
    task: &'a str,
    idx: i32,
    channel: &'a str,
    write_type: &'a str,
    data: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn compression_round_trips_and_bounds_inflation() {
        let v = json!({"channel_values": {"ui_chat_log": ["x".repeat(1000)]}}).to_string();
        let text = compress(&v);
        assert_eq!(decompress(&text, 1 << 20).unwrap().get(), v);
        assert!(matches!(
            decompress(&text, 100),
            Err(WorkflowError::BadRequest(m)) if m.contains("too large")
        ));
        assert!(decompress("not base64!", 100).is_err());
        let not_zlib = base64::engine::general_purpose::STANDARD.encode(b"plain");
        assert!(decompress(&not_zlib, 100).is_err());
    }

    #[test]
    fn escaped_nul_is_found_and_an_escaped_backslash_is_not_one() {
        assert!(has_nul_escape(r#"{"a":"b\u0000"}"#));
        assert!(has_nul_escape(r#"{"k\u0000":1}"#));
        assert!(
            has_nul_escape(r#"{"a":"\\\u0000"}"#),
            "a backslash, then NUL"
        );
        assert!(
            !has_nul_escape(r#"{"a":"\\u0000"}"#),
            "a backslash, then text"
        );
        assert!(!has_nul_escape(r#"{"a":"u0000","b":"\u0001"}"#));
        // What serde_json reads agrees.
        for text in [r#"{"a":"\\\u0000"}"#, r#"{"a":"\\u0000"}"#] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(has_nul(&value), has_nul_escape(text), "{text}");
        }
    }

    #[test]
    fn a_retry_formatted_differently_is_the_same_checkpoint() {
        let raw = |text: &str| RawValue::from_string(text.to_owned()).unwrap();
        assert!(same_json(
            &raw(r#"{"a":1,"b":[2]}"#),
            &raw(r#"{ "b": [2], "a": 1 }"#)
        ));
        assert!(!same_json(&raw(r#"{"a":1}"#), &raw(r#"{"a":2}"#)));
    }

    #[test]
    fn blank_bodies_count_as_absent() {
        for blank in ["null", "{}", "{ \n }", "\"  \"", " null "] {
            assert!(is_blank(blank), "{blank}");
        }
        for present in [r#"{"a":1}"#, "[]", "0", r#""x""#] {
            assert!(!is_blank(present), "{present}");
        }
    }

    #[test]
    fn nul_anywhere_is_found() {
        assert!(has_nul(&json!({"a": ["b\u{0}"]})));
        assert!(has_nul(&json!({"k\u{0}": 1})));
        assert!(!has_nul(&json!({"a": [1, "b"]})));
    }
}
