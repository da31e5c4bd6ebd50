//! The index's tables: one state row per project and the chunks.
//!
//! Chunks of the default branch have no `branch_id`; those of another
//! branch carry its row in `code_index_branches` (see [`super::branches`]).
//! The chunk functions take `branch: Option<i64>` to say which index they
//! write: `None` for the default branch.

use crate::queries::Queries;

use super::chunker::Chunk;

/// Where a project's index stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexState {
    Pending,
    Indexing,
    Ready,
    Failed,
}

impl IndexState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Indexing => "indexing",
            Self::Ready => "ready",
            Self::Failed => "failed",
        }
    }

    pub(super) fn parse(text: &str) -> Self {
        match text {
            "indexing" => Self::Indexing,
            "ready" => Self::Ready,
            "failed" => Self::Failed,
            _ => Self::Pending,
        }
    }
}

/// A project's index state row.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexStatus {
    pub project_id: i64,
    pub state: IndexState,
    pub indexed_commit: Option<String>,
    pub embedding_model: Option<String>,
    pub embedding_dimensions: Option<i32>,
    pub chunk_count: i32,
    pub file_count: i32,
    pub last_error: Option<String>,
    pub last_error_code: Option<String>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    pub indexed_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl IndexStatus {
    /// Whether searches can be answered (a stale index still answers; the
    /// next run brings it up to date).
    pub fn searchable(&self) -> bool {
        match self.state {
            IndexState::Ready => true,
            IndexState::Failed => false,
            IndexState::Pending | IndexState::Indexing => {
                self.indexed_commit.is_some() && self.embedding_model.is_some()
            }
        }
    }

    /// The state as the API shows it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "state": self.state.as_str(),
            "indexed_commit": self.indexed_commit,
            "embedding_model": self.embedding_model,
            "embedding_dimensions": self.embedding_dimensions,
            "chunk_count": self.chunk_count,
            "file_count": self.file_count,
            "last_error": self.last_error,
            "last_error_code": self.last_error_code,
            "updated_at": self.updated_at,
            "indexed_at": self.indexed_at,
        })
    }
}

const STATUS_COLUMNS: &str = "project_id, state, indexed_commit, embedding_model, \
    embedding_dimensions, chunk_count, file_count, last_error, last_error_code, updated_at, indexed_at";

fn status_from_row(row: &tokio_postgres::Row) -> IndexStatus {
    IndexStatus {
        project_id: row.get(0),
        state: IndexState::parse(row.get(1)),
        indexed_commit: row.get(2),
        embedding_model: row.get(3),
        embedding_dimensions: row.get(4),
        chunk_count: row.get(5),
        file_count: row.get(6),
        last_error: row.get(7),
        last_error_code: row.get(8),
        updated_at: row.get(9),
        indexed_at: row.get(10),
    }
}

pub async fn status(
    db: &impl Queries,
    project_id: i64,
) -> Result<Option<IndexStatus>, tokio_postgres::Error> {
    let row = db
        .query_opt(
            &format!("SELECT {STATUS_COLUMNS} FROM code_index_states WHERE project_id = $1"),
            &[&project_id],
        )
        .await?;
    Ok(row.as_ref().map(status_from_row))
}

/// Creates the state row (pending) when missing.
pub async fn ensure_status(
    db: &impl Queries,
    project_id: i64,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "INSERT INTO code_index_states (project_id) VALUES ($1) ON CONFLICT DO NOTHING",
        &[&project_id],
    )
    .await?;
    Ok(())
}

pub async fn set_state(
    db: &impl Queries,
    project_id: i64,
    state: IndexState,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "INSERT INTO code_index_states (project_id, state) VALUES ($1, $2)
         ON CONFLICT (project_id) DO UPDATE SET state = EXCLUDED.state, updated_at = now()",
        &[&project_id, &state.as_str()],
    )
    .await?;
    Ok(())
}

/// Records a failure; `final_attempt` marks the index failed, otherwise the
/// error is kept while the job retries.
pub async fn record_error(
    db: &impl Queries,
    project_id: i64,
    code: &str,
    error: &str,
    final_attempt: bool,
) -> Result<(), tokio_postgres::Error> {
    let state = if final_attempt { "failed" } else { "indexing" };
    db.execute(
        "INSERT INTO code_index_states (project_id, state, last_error, last_error_code)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (project_id) DO UPDATE SET state = EXCLUDED.state,
             last_error = EXCLUDED.last_error, last_error_code = EXCLUDED.last_error_code,
             updated_at = now()",
        &[&project_id, &state, &error, &code],
    )
    .await?;
    Ok(())
}

/// Marks a run finished at `commit`, with the counts taken from the chunks.
pub async fn finish(
    db: &impl Queries,
    project_id: i64,
    commit: &str,
    model: &str,
    dimensions: Option<i32>,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE code_index_states SET state = 'ready', indexed_commit = $2,
             embedding_model = $3, embedding_dimensions = COALESCE($4, embedding_dimensions),
             chunk_count = (SELECT count(*) FROM code_chunks
                 WHERE project_id = $1 AND branch_id IS NULL),
             file_count = (SELECT count(DISTINCT path) FROM code_chunks
                 WHERE project_id = $1 AND branch_id IS NULL),
             last_error = NULL, last_error_code = NULL, updated_at = now(), indexed_at = now()
         WHERE project_id = $1",
        &[&project_id, &commit, &model, &dimensions],
    )
    .await?;
    Ok(())
}

/// Forgets the indexed commit so the next run walks the whole tree.
pub async fn request_full_walk(
    db: &impl Queries,
    project_id: i64,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "INSERT INTO code_index_states (project_id) VALUES ($1)
         ON CONFLICT (project_id) DO UPDATE SET indexed_commit = NULL, updated_at = now()",
        &[&project_id],
    )
    .await?;
    Ok(())
}

/// The error code a project's state carries while Duo is off for it
/// (GitLab's code for a Duo feature turned off where it is used): the mark
/// that turning Duo back on looks for to index the project again.
pub const DUO_OFF_CODE: &str = "M3002";
const DUO_OFF_TEXT: &str = "GitLab Duo features are turned off for this project";

/// Drops everything indexed of the projects (Duo was turned off for them):
/// their chunks and branch indexes go, their state is marked [`DUO_OFF_CODE`]. The state row
/// is written first: a run in flight holds it while it writes chunks
/// ([`hold_state`]), so this waits for that write and then removes it too,
/// and the run's next write sees Duo off and stops.
pub async fn forget(db: &impl Queries, project_ids: &[i64]) -> Result<u64, tokio_postgres::Error> {
    if project_ids.is_empty() {
        return Ok(0);
    }
    db.execute(
        "UPDATE code_index_states SET state = 'pending', indexed_commit = NULL,
             embedding_model = NULL, embedding_dimensions = NULL, chunk_count = 0, file_count = 0,
             last_error = $2, last_error_code = $3, updated_at = now()
         WHERE project_id = ANY($1)
           AND (state <> 'pending' OR indexed_commit IS NOT NULL OR chunk_count > 0
                OR last_error_code IS DISTINCT FROM $3)",
        &[&project_ids, &DUO_OFF_TEXT, &DUO_OFF_CODE],
    )
    .await?;
    // Branch indexes are asked for again by the next question about them.
    db.execute(
        "DELETE FROM code_index_branches WHERE project_id = ANY($1)",
        &[&project_ids],
    )
    .await?;
    db.execute(
        "DELETE FROM code_chunks WHERE project_id = ANY($1)",
        &[&project_ids],
    )
    .await
}

/// Of the projects, those whose index was dropped because Duo was off, now
/// unmarked (so each is returned once): Duo is back on for them.
pub async fn take_duo_off_marks(
    db: &impl Queries,
    project_ids: &[i64],
) -> Result<Vec<i64>, tokio_postgres::Error> {
    if project_ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = db
        .query(
            "UPDATE code_index_states SET last_error = NULL, last_error_code = NULL,
                 indexed_commit = NULL, updated_at = now()
             WHERE project_id = ANY($1) AND last_error_code = $2
             RETURNING project_id",
            &[&project_ids, &DUO_OFF_CODE],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// In a transaction that writes chunks: locks the project's state row
/// against [`forget`] until the transaction ends; `false` when there is no
/// row (the index was dropped under the run).
pub async fn hold_state(db: &impl Queries, project_id: i64) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM code_index_states WHERE project_id = $1 FOR SHARE",
            &[&project_id],
        )
        .await?
        .is_some())
}

/// A chunk ready to be stored.
#[derive(Debug, Clone)]
pub struct NewChunk {
    pub chunk: Chunk,
    pub language: String,
    pub embedding: Vec<f32>,
}

/// The condition that picks one index's chunks, its branch id bound to
/// `$param`: the default branch's say `branch_id IS NULL`, as its partial
/// indexes do, so the planner uses them.
pub fn on_index(param: usize, branch: Option<i64>) -> String {
    match branch {
        None => format!("(branch_id IS NULL AND ${param}::bigint IS NULL)"),
        Some(_) => format!("branch_id = ${param}"),
    }
}

/// Replaces a file's chunks in one index (none: the file left the index).
pub async fn replace_file(
    db: &impl Queries,
    project_id: i64,
    branch: Option<i64>,
    path: &str,
    blob_id: &str,
    model: &str,
    chunks: &[NewChunk],
) -> Result<(), tokio_postgres::Error> {
    remove_file(db, project_id, branch, path).await?;
    for c in chunks {
        let vector = vector_literal(&c.embedding);
        let dims = c.embedding.len() as i32;
        let words = super::chunker::search_words(path, &c.chunk.content);
        db.execute(
            "INSERT INTO code_chunks (project_id, path, blob_id, language, start_line, end_line,
                 start_byte, end_byte, symbol, content, embedding_model, embedding, dimensions,
                 search_text, branch_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::text::vector, $13,
                 to_tsvector('english', $14), $15)",
            &[
                &project_id,
                &path,
                &blob_id,
                &c.language,
                &(c.chunk.start_line as i32),
                &(c.chunk.end_line as i32),
                &(c.chunk.start_byte as i32),
                &(c.chunk.end_byte as i32),
                &c.chunk.symbol,
                &c.chunk.content,
                &model,
                &vector,
                &dims,
                &words,
                &branch,
            ],
        )
        .await?;
    }
    Ok(())
}

/// Stores `path` in one index with the chunks already embedded for the same
/// blob under the same model anywhere in the project: the default branch or
/// another branch (a rename, a revert, a resumed run, a branch sharing the
/// file). `false` when there are none.
pub async fn reuse_blob(
    db: &impl Queries,
    project_id: i64,
    branch: Option<i64>,
    path: &str,
    blob_id: &str,
    model: &str,
) -> Result<bool, tokio_postgres::Error> {
    // The same place first (nothing to do), then the same path elsewhere
    // (copied whole, full-text words included).
    let existing = db
        .query_opt(
            "SELECT path, branch_id FROM code_chunks
             WHERE project_id = $1 AND blob_id = $2 AND embedding_model = $3
             ORDER BY (path = $4 AND branch_id IS NOT DISTINCT FROM $5) DESC, (path = $4) DESC
             LIMIT 1",
            &[&project_id, &blob_id, &model, &path, &branch],
        )
        .await?;
    let Some(row) = existing else {
        return Ok(false);
    };
    let (source, source_branch): (String, Option<i64>) = (row.get(0), row.get(1));
    if source == path && source_branch == branch {
        return Ok(true);
    }
    remove_file(db, project_id, branch, path).await?;
    if source == path {
        db.execute(
            "INSERT INTO code_chunks (project_id, path, blob_id, language, start_line, end_line,
                 start_byte, end_byte, symbol, content, embedding_model, embedding, dimensions,
                 search_text, branch_id)
             SELECT project_id, path, blob_id, language, start_line, end_line, start_byte,
                 end_byte, symbol, content, embedding_model, embedding, dimensions, search_text, $5
             FROM code_chunks
             WHERE project_id = $1 AND path = $2 AND blob_id = $3
               AND branch_id IS NOT DISTINCT FROM $4",
            &[&project_id, &path, &blob_id, &source_branch, &branch],
        )
        .await?;
        return Ok(true);
    }
    // Copied row by row: the full-text words include the path, which changed.
    let rows = db
        .query(
            "SELECT id, content FROM code_chunks
             WHERE project_id = $1 AND path = $2 AND blob_id = $3
               AND branch_id IS NOT DISTINCT FROM $4",
            &[&project_id, &source, &blob_id, &source_branch],
        )
        .await?;
    for row in rows {
        let (id, content): (i64, String) = (row.get(0), row.get(1));
        let words = super::chunker::search_words(path, &content);
        db.execute(
            "INSERT INTO code_chunks (project_id, path, blob_id, language, start_line, end_line,
                 start_byte, end_byte, symbol, content, embedding_model, embedding, dimensions,
                 search_text, branch_id)
             SELECT project_id, $2, blob_id, language, start_line, end_line, start_byte, end_byte,
                 symbol, content, embedding_model, embedding, dimensions,
                 to_tsvector('english', $3), $4
             FROM code_chunks WHERE id = $1",
            &[&id, &path, &words, &branch],
        )
        .await?;
    }
    Ok(true)
}

/// Removes a file's chunks from one index.
pub async fn remove_file(
    db: &impl Queries,
    project_id: i64,
    branch: Option<i64>,
    path: &str,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        &format!(
            "DELETE FROM code_chunks WHERE project_id = $1 AND path = $2 AND {}",
            on_index(3, branch)
        ),
        &[&project_id, &path, &branch],
    )
    .await?;
    Ok(())
}

/// Removes chunks of one index made by another model than `model` (after a
/// model change) and chunks of paths no longer in the tree.
pub async fn prune(
    db: &impl Queries,
    project_id: i64,
    branch: Option<i64>,
    model: &str,
    keep_paths: Option<&[String]>,
) -> Result<u64, tokio_postgres::Error> {
    let on = on_index(3, branch);
    let mut removed = db
        .execute(
            &format!(
                "DELETE FROM code_chunks WHERE project_id = $1 AND embedding_model <> $2 AND {on}"
            ),
            &[&project_id, &model, &branch],
        )
        .await?;
    if let Some(paths) = keep_paths {
        removed += db
            .execute(
                &format!(
                    "DELETE FROM code_chunks WHERE project_id = $1 AND NOT (path = ANY($2)) AND {on}"
                ),
                &[&project_id, &paths, &branch],
            )
            .await?;
    }
    Ok(removed)
}

/// pgvector's text form, `[1,2,3]`.
pub fn vector_literal(v: &[f32]) -> String {
    let mut out = String::with_capacity(v.len() * 10 + 2);
    out.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let x = if x.is_finite() { *x } else { 0.0 };
        out.push_str(&x.to_string());
    }
    out.push(']');
    out
}
