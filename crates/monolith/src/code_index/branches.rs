//! Indexes of branches other than the default (seed 002, phase 2): a chat
//! question whose repository or directory context names `metadata.branch`
//! searches that branch.
//!
//! - On demand: the first question about a branch creates its row here and
//!   queues a [`super::indexer::CodeIndexBranchJob`]; until it ran, chat
//!   says the branch is being indexed.
//! - Bounded: at most `DUO_CODE_INDEX_MAX_BRANCHES` per project; creating
//!   one more evicts the least recently searched, its chunks with it.
//! - Cheap: a new branch starts from a copy of the default branch's chunks
//!   and indexes only what differs; any file whose blob is already embedded
//!   in the project is copied, never embedded again.
//! - Followed: a push re-runs the job of every indexed branch of the
//!   project; a branch that no longer exists loses its index.

use crate::queries::Queries;

use super::store::IndexState;

/// Why a branch name is refused before anything is looked up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadBranch {
    /// Not a string.
    #[error("the branch must be a name")]
    NotAName,
    /// What git (and GitLab) would refuse: the rules of
    /// [`crate::repositories::writer::check_branch_name`] (1 to 255 bytes,
    /// no NUL or other control character, `git check-ref-format`'s rules).
    #[error("{0}")]
    Invalid(String),
}

/// Checks a branch name as git would; returns it without a leading
/// `refs/heads/`.
pub fn validate_name(name: &str) -> Result<&str, BadBranch> {
    let name = name.strip_prefix("refs/heads/").unwrap_or(name);
    crate::repositories::writer::check_branch_name(name)
        .map_err(|e| BadBranch::Invalid(e.to_string()))?;
    Ok(name)
}

/// One branch's index row.
#[derive(Debug, Clone, PartialEq)]
pub struct BranchIndex {
    pub id: i64,
    pub project_id: i64,
    pub branch: String,
    pub state: IndexState,
    pub indexed_commit: Option<String>,
    pub embedding_model: Option<String>,
    pub chunk_count: i32,
    pub file_count: i32,
    pub last_error: Option<String>,
    pub last_error_code: Option<String>,
}

impl BranchIndex {
    /// Whether searches can be answered (as [`super::IndexStatus::searchable`]).
    pub fn searchable(&self) -> bool {
        match self.state {
            IndexState::Ready => true,
            IndexState::Failed => false,
            IndexState::Pending | IndexState::Indexing => {
                self.indexed_commit.is_some() && self.embedding_model.is_some()
            }
        }
    }
}

const COLUMNS: &str = "id, project_id, branch, state, indexed_commit, embedding_model, \
    chunk_count, file_count, last_error, last_error_code";

fn from_row(row: &tokio_postgres::Row) -> BranchIndex {
    BranchIndex {
        id: row.get(0),
        project_id: row.get(1),
        branch: row.get(2),
        state: IndexState::parse(row.get(3)),
        indexed_commit: row.get(4),
        embedding_model: row.get(5),
        chunk_count: row.get(6),
        file_count: row.get(7),
        last_error: row.get(8),
        last_error_code: row.get(9),
    }
}

pub async fn find(
    db: &impl Queries,
    project_id: i64,
    branch: &str,
) -> Result<Option<BranchIndex>, tokio_postgres::Error> {
    let row = db
        .query_opt(
            &format!(
                "SELECT {COLUMNS} FROM code_index_branches WHERE project_id = $1 AND branch = $2"
            ),
            &[&project_id, &branch],
        )
        .await?;
    Ok(row.as_ref().map(from_row))
}

/// The project's branch indexes, most recently searched first.
pub async fn of_project(
    db: &impl Queries,
    project_id: i64,
) -> Result<Vec<BranchIndex>, tokio_postgres::Error> {
    let rows = db
        .query(
            &format!(
                "SELECT {COLUMNS} FROM code_index_branches WHERE project_id = $1
                 ORDER BY last_used_at DESC, id DESC"
            ),
            &[&project_id],
        )
        .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// Marks the branch searched now (it moves to the back of the eviction
/// order), creating its row (pending) when missing; then evicts the least
/// recently searched branches beyond `keep`. The row, and the names evicted.
pub async fn use_branch(
    db: &impl Queries,
    project_id: i64,
    branch: &str,
    keep: usize,
) -> Result<(BranchIndex, Vec<String>), tokio_postgres::Error> {
    let row = db
        .query_one(
            &format!(
                "INSERT INTO code_index_branches (project_id, branch) VALUES ($1, $2)
                 ON CONFLICT (project_id, branch) DO UPDATE SET last_used_at = now()
                 RETURNING {COLUMNS}"
            ),
            &[&project_id, &branch],
        )
        .await?;
    let used = from_row(&row);
    // Never the one just used, whatever the clocks say.
    let evicted = db
        .query(
            "DELETE FROM code_index_branches WHERE id IN (
                 SELECT id FROM code_index_branches WHERE project_id = $1 AND id <> $2
                 ORDER BY last_used_at DESC, id DESC OFFSET $3)
             RETURNING branch",
            &[&project_id, &used.id, &(keep.saturating_sub(1) as i64)],
        )
        .await?;
    let evicted: Vec<String> = evicted.iter().map(|r| r.get(0)).collect();
    if !evicted.is_empty() {
        tracing::info!(project_id, ?evicted, "branch indexes evicted");
    }
    Ok((used, evicted))
}

/// Drops a branch's index (the branch was deleted, or became the default).
pub async fn drop_branch(db: &impl Queries, id: i64) -> Result<u64, tokio_postgres::Error> {
    db.execute("DELETE FROM code_index_branches WHERE id = $1", &[&id])
        .await
}

pub async fn set_state(
    db: &impl Queries,
    id: i64,
    state: IndexState,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE code_index_branches SET state = $2, updated_at = now() WHERE id = $1",
        &[&id, &state.as_str()],
    )
    .await?;
    Ok(())
}

/// Records the model the branch's vectors come from (at the first answer,
/// so a crashed run's successor reuses what this one stored).
pub async fn set_model(
    db: &impl Queries,
    id: i64,
    model: &str,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE code_index_branches SET embedding_model = $2 WHERE id = $1",
        &[&id, &model],
    )
    .await?;
    Ok(())
}

/// Records a failure, as [`super::store::record_error`] does for the default branch.
pub async fn record_error(
    db: &impl Queries,
    id: i64,
    code: &str,
    error: &str,
    final_attempt: bool,
) -> Result<(), tokio_postgres::Error> {
    let state = if final_attempt { "failed" } else { "indexing" };
    db.execute(
        "UPDATE code_index_branches SET state = $2, last_error = $3, last_error_code = $4,
             updated_at = now()
         WHERE id = $1",
        &[&id, &state, &error, &code],
    )
    .await?;
    Ok(())
}

/// Marks a branch run finished at `commit`, with the counts taken from its chunks.
pub async fn finish(
    db: &impl Queries,
    id: i64,
    commit: &str,
    model: &str,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE code_index_branches SET state = 'ready', indexed_commit = $2, embedding_model = $3,
             chunk_count = (SELECT count(*) FROM code_chunks WHERE branch_id = $1),
             file_count = (SELECT count(DISTINCT path) FROM code_chunks WHERE branch_id = $1),
             last_error = NULL, last_error_code = NULL, updated_at = now(), indexed_at = now()
         WHERE id = $1",
        &[&id, &commit, &model],
    )
    .await?;
    Ok(())
}

/// In a transaction that writes a branch's chunks: locks its row against
/// eviction, deletion and [`super::store::forget`] until the transaction
/// ends; `false` when the row is gone (the run must stop).
pub async fn hold(db: &impl Queries, id: i64) -> Result<bool, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM code_index_branches WHERE id = $1 FOR SHARE",
            &[&id],
        )
        .await?
        .is_some())
}

/// Starts a branch's index from a copy of the default branch's chunks (all
/// of one model); the branch run then indexes only what differs from
/// `commit`, the default branch's indexed commit.
pub async fn seed_from_default(
    db: &impl Queries,
    id: i64,
    project_id: i64,
    model: &str,
    commit: &str,
) -> Result<u64, tokio_postgres::Error> {
    db.execute("DELETE FROM code_chunks WHERE branch_id = $1", &[&id])
        .await?;
    let copied = db
        .execute(
            "INSERT INTO code_chunks (project_id, path, blob_id, language, start_line, end_line,
                 start_byte, end_byte, symbol, content, embedding_model, embedding, dimensions,
                 search_text, branch_id)
             SELECT project_id, path, blob_id, language, start_line, end_line, start_byte,
                 end_byte, symbol, content, embedding_model, embedding, dimensions, search_text, $2
             FROM code_chunks
             WHERE project_id = $1 AND branch_id IS NULL AND embedding_model = $3",
            &[&project_id, &id, &model],
        )
        .await?;
    db.execute(
        "UPDATE code_index_branches SET indexed_commit = $2, embedding_model = $3,
             updated_at = now()
         WHERE id = $1",
        &[&id, &commit, &model],
    )
    .await?;
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_follow_git_rules() {
        for good in [
            "feature/x",
            "fix-1.2",
            "refs/heads/topic",
            "a@b",
            "UPPER_case",
        ] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        assert_eq!(validate_name("refs/heads/topic"), Ok("topic"));
        for bad in [
            "",
            "a..b",
            "a b",
            "x\0y",
            "x~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[b",
            "a\\b",
            "-x",
            "/x",
            "x/",
            "x.",
            "x.lock",
            "a/.hidden",
            "a//b",
            "@",
            "a@{1}",
            "tab\there",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name(&"b".repeat(256)).is_err());
        assert!(validate_name(&"b".repeat(255)).is_ok());
    }
}
