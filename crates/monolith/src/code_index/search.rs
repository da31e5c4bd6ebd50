//! Retrieval over one project's chunks: vector kNN (cosine) and PostgreSQL
//! full-text search, fused by reciprocal rank, at most two chunks per file.
//!
//! Callers authorize first (`read_code` and Duo on the project); the search
//! then post-filters by the project's current exclusion globs, which may have
//! changed since the chunks were stored.

use std::collections::HashMap;

use crate::queries::Queries;

use super::filters::Exclusions;

/// Reciprocal rank fusion's constant (the usual 60: ranks past the first
/// few count little, and neither list dominates).
const RRF_K: f64 = 60.0;
/// Candidates taken from each list before fusing.
const CANDIDATES: i64 = 50;
/// Chunks per file in the final list: a long file does not crowd out others.
const PER_FILE: usize = 2;

/// Which lists to use (the bench compares them; chat uses [`Retrieval::Fused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retrieval {
    Fused,
    VectorOnly,
    TextOnly,
}

/// Where to search: a project, or one directory of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub project_id: i64,
    /// A directory (`src/auth`); only paths below it match (`src` never
    /// matches `src2/`).
    pub directory: Option<String>,
}

impl Scope {
    /// The `LIKE` pattern of the directory, with a trailing slash and the
    /// pattern characters escaped.
    fn path_pattern(&self) -> Option<String> {
        directory_pattern(self.directory.as_deref()?)
    }
}

/// The `LIKE` pattern of everything below `dir` (trailing slash added,
/// pattern characters escaped); `None` for the repository's root.
pub fn directory_pattern(dir: &str) -> Option<String> {
    let dir = dir.trim().trim_matches('/');
    if dir.is_empty() {
        return None;
    }
    let escaped = dir
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    Some(format!("{escaped}/%"))
}

/// One chunk found.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub path: String,
    pub start_line: i32,
    pub end_line: i32,
    pub content: String,
    pub score: f64,
}

/// The question's embedding and the model that made it.
#[derive(Debug, Clone)]
pub struct QueryVector {
    pub model: String,
    pub vector: Vec<f32>,
}

/// Searches `scope` of the default branch's index for `question`; `vector`
/// is the question's embedding (needed unless `mode` is [`Retrieval::TextOnly`]).
pub async fn search(
    db: &mut deadpool_postgres::Object,
    scope: &Scope,
    question: &str,
    vector: Option<&QueryVector>,
    mode: Retrieval,
    limit: usize,
    exclusions: &Exclusions,
) -> Result<Vec<Hit>, tokio_postgres::Error> {
    search_on(db, scope, None, question, vector, mode, limit, exclusions).await
}

/// [`search`] in one index: the default branch's (`None`) or the branch
/// index with this id (`code_index_branches.id`).
#[allow(clippy::too_many_arguments)]
pub async fn search_on(
    db: &mut deadpool_postgres::Object,
    scope: &Scope,
    branch: Option<i64>,
    question: &str,
    vector: Option<&QueryVector>,
    mode: Retrieval,
    limit: usize,
    exclusions: &Exclusions,
) -> Result<Vec<Hit>, tokio_postgres::Error> {
    let pattern = scope.path_pattern();
    let mut lists: Vec<Vec<(i64, Hit)>> = Vec::new();
    if mode != Retrieval::TextOnly
        && let Some(v) = vector
    {
        lists.push(vector_candidates(db, scope.project_id, branch, pattern.as_deref(), v).await?);
    }
    if mode != Retrieval::VectorOnly
        && let Some(query) = text_query(question)
    {
        lists.push(
            text_candidates(&***db, scope.project_id, branch, pattern.as_deref(), &query).await?,
        );
    }
    Ok(fuse(lists, limit, exclusions))
}

async fn vector_candidates(
    db: &mut deadpool_postgres::Object,
    project_id: i64,
    branch: Option<i64>,
    pattern: Option<&str>,
    query: &QueryVector,
) -> Result<Vec<(i64, Hit)>, tokio_postgres::Error> {
    let literal = super::store::vector_literal(&query.vector);
    let dims = query.vector.len() as i32;
    // The 384-dimension expression matches the HNSW index; other sizes are
    // searched exactly (still filtered by project first).
    let distance = if dims == 384 {
        "embedding::vector(384) <=> $4::text::vector(384)"
    } else {
        "embedding <=> $4::text::vector"
    };
    let sql = format!(
        "SELECT id, path, start_line, end_line, content FROM code_chunks
         WHERE project_id = $1 AND embedding_model = $2 AND dimensions = $3
           AND ($5::text IS NULL OR path LIKE $5) AND {on}
         ORDER BY {distance} LIMIT $6",
        on = super::store::on_index(7, branch)
    );
    let tx = db.transaction().await?;
    // With the HNSW index and a project filter, keep scanning until enough
    // rows pass the filter (pgvector 0.8), or a big project starves small ones.
    tx.batch_execute(
        "SET LOCAL hnsw.iterative_scan = relaxed_order; SET LOCAL hnsw.ef_search = 100",
    )
    .await?;
    let rows = tx
        .query(
            &sql,
            &[
                &project_id,
                &query.model,
                &dims,
                &literal,
                &pattern,
                &CANDIDATES,
                &branch,
            ],
        )
        .await?;
    tx.commit().await?;
    Ok(rows.iter().map(hit_from_row).collect())
}

async fn text_candidates(
    db: &impl Queries,
    project_id: i64,
    branch: Option<i64>,
    pattern: Option<&str>,
    query: &str,
) -> Result<Vec<(i64, Hit)>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT id, path, start_line, end_line, content FROM code_chunks,
             to_tsquery('english', $2) AS q
         WHERE project_id = $1 AND search_text @@ q
           AND ($3::text IS NULL OR path LIKE $3) AND {on}
         ORDER BY ts_rank(search_text, q, 1) DESC, id LIMIT $4",
        on = super::store::on_index(5, branch)
    );
    let rows = db
        .query(&sql, &[&project_id, &query, &pattern, &CANDIDATES, &branch])
        .await?;
    Ok(rows.iter().map(hit_from_row).collect())
}

fn hit_from_row(row: &tokio_postgres::Row) -> (i64, Hit) {
    (
        row.get(0),
        Hit {
            path: row.get(1),
            start_line: row.get(2),
            end_line: row.get(3),
            content: row.get(4),
            score: 0.0,
        },
    )
}

/// An OR query of the question's words (and the parts of its identifiers),
/// safe for `to_tsquery`: only letters, digits and `|`.
pub fn text_query(question: &str) -> Option<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in question.split(|c: char| !c.is_alphanumeric() && c != '_') {
        if word.is_empty() || word.len() > 64 {
            continue;
        }
        let mut candidates = vec![word.to_lowercase()];
        let parts = super::chunker::split_identifier(word);
        if parts.len() > 1 {
            candidates.extend(parts);
        }
        for term in candidates {
            let term: String = term.chars().filter(|c| c.is_alphanumeric()).collect();
            if term.chars().count() >= 2 && !terms.contains(&term) {
                terms.push(term);
            }
        }
        if terms.len() >= 32 {
            break;
        }
    }
    (!terms.is_empty()).then(|| terms.join(" | "))
}

/// Reciprocal rank fusion of the lists, at most [`PER_FILE`] chunks per
/// file, nothing the exclusion globs cover.
pub fn fuse(lists: Vec<Vec<(i64, Hit)>>, limit: usize, exclusions: &Exclusions) -> Vec<Hit> {
    let mut scores: HashMap<i64, (f64, Hit)> = HashMap::new();
    for list in lists {
        for (rank, (id, hit)) in list.into_iter().enumerate() {
            let add = 1.0 / (RRF_K + rank as f64 + 1.0);
            scores.entry(id).or_insert((0.0, hit)).0 += add;
        }
    }
    let mut ranked: Vec<(i64, f64, Hit)> = scores
        .into_iter()
        .map(|(id, (score, hit))| (id, score, hit))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut per_file: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, score, mut hit) in ranked {
        if exclusions.excludes(&hit.path) {
            continue;
        }
        let seen = per_file.entry(hit.path.clone()).or_default();
        if *seen >= PER_FILE {
            continue;
        }
        *seen += 1;
        hit.score = score;
        out.push(hit);
        if out.len() >= limit {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(path: &str) -> Hit {
        Hit {
            path: path.into(),
            start_line: 1,
            end_line: 2,
            content: String::new(),
            score: 0.0,
        }
    }

    #[test]
    fn fusion_rewards_agreement_and_caps_files() {
        let vector = vec![
            (1, hit("a.rs")),
            (2, hit("b.rs")),
            (3, hit("a.rs")),
            (4, hit("a.rs")),
        ];
        let text = vec![(2, hit("b.rs")), (5, hit("c.rs"))];
        let out = fuse(vec![vector, text], 10, &Exclusions::none());
        assert_eq!(out[0].path, "b.rs", "in both lists: first");
        assert_eq!(out.iter().filter(|h| h.path == "a.rs").count(), 2);
        let excluded = Exclusions::new(&["b.rs".to_owned()]).unwrap_or_else(|e| panic!("{e}"));
        let out = fuse(vec![vec![(2, hit("b.rs")), (5, hit("c.rs"))]], 1, &excluded);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].path, "c.rs");
    }

    #[test]
    fn text_queries_are_safe_or_queries() {
        assert_eq!(
            text_query("Where's the rateLimit? (a & b) !x").as_deref(),
            Some("where | the | ratelimit | rate | limit")
        );
        assert_eq!(text_query("?? !"), None);
    }

    #[test]
    fn directories_match_below_themselves_only() {
        let scope = Scope {
            project_id: 1,
            directory: Some("/src_1/".into()),
        };
        assert_eq!(scope.path_pattern().as_deref(), Some("src\\_1/%"));
        let whole = Scope {
            project_id: 1,
            directory: Some("/".into()),
        };
        assert_eq!(whole.path_pattern(), None);
    }
}
