//! One review of a merge request by the bot, as the worker runs it:
//!
//! 1. the requester's rights decide (they read the merge request, Duo is on
//!    for its project, their seat includes code review); a refusal is a
//!    note that says why, and nothing reaches a model;
//! 2. the diff is read from the repository with the commits GitLab's diff
//!    positions name; files the project's Duo exclusion rules exclude,
//!    deleted files and what does not fit the budget are skipped and named;
//! 3. instructions (instance, groups, then the project's file from the
//!    target branch) are matched to each file by glob;
//! 4. the bot's own open threads are checked first: a thread whose line the
//!    new push changed is resolved as fixed, the others are shown to the
//!    model so it does not repeat them;
//! 5. each file (or piece of a long one) is one model call, with the code
//!    the piece relies on from the project's code index (when it has one)
//!    and what developers said about earlier comments on the file or its
//!    language; comments land only on lines of the diff, never twice on the
//!    same line, and never again where developers dismissed them;
//! 6. one summary note says what was reviewed, skipped and resolved.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::{Map, json};
use uuid::Uuid;

use super::diff_lines::{self, DiffLine};
use super::feedback;
use super::instructions::{self, InstructionGroup, Source};
use super::posting::{self, BotAuthor};
use super::related::{RelatedCode, RelatedLimits};
use super::response;
use super::store::{self, OpenThread, Outcome};
use super::triggers::ReviewRequested;
use crate::gateway_client::GatewayAuth;
use crate::policy::{AiReader, NoCodeReview};
use crate::queries::Queries;
use crate::work_items::Kind;
use crate::work_items::position::Position;

/// The prompt the gateway runs for each file.
pub const PROMPT_ID: &str = "review_merge_request";

/// How much one review may send to the model.
#[derive(Debug, Clone)]
pub struct ReviewBudget {
    /// Most files reviewed (the rest are named as skipped).
    pub max_files: usize,
    /// Largest piece of one file's diff in one prompt (characters).
    pub max_piece_chars: usize,
    /// Most characters of diff one review sends in all.
    pub max_total_chars: usize,
    /// A changed file is shown whole, for context, up to this many bytes.
    pub max_context_bytes: usize,
    /// Related code from the index per prompt: most chunks, most characters.
    pub related_chunks: usize,
    pub related_chars: usize,
    /// Most characters of related code one review sends in all.
    pub max_related_total_chars: usize,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        Self {
            max_files: 50,
            max_piece_chars: 24_000,
            max_total_chars: 240_000,
            max_context_bytes: 16 * 1024,
            related_chunks: 3,
            related_chars: 6_000,
            max_related_total_chars: 60_000,
        }
    }
}

/// What the review jobs need: the agent's services (database, policy,
/// gateway, repositories, models) and the budget.
#[derive(Clone)]
pub struct ReviewServices {
    pub agent: crate::agent::AgentResponder,
    pub budget: ReviewBudget,
    /// Chat's per-user budget, which mentions count in too.
    pub rate_limit: u32,
    pub rate_window: std::time::Duration,
    /// For the runs the failed-pipeline trigger starts.
    pub config: std::sync::Arc<crate::config::Config>,
}

impl ReviewServices {
    pub fn new(agent: crate::agent::AgentResponder, config: &crate::config::Config) -> Self {
        Self {
            agent,
            budget: ReviewBudget::default(),
            rate_limit: config.ai_action_rate_limit,
            rate_window: config.ai_action_rate_window,
            config: std::sync::Arc::new(config.clone()),
        }
    }
}

impl std::fmt::Debug for ReviewServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReviewServices")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("policy: {0}")]
    Policy(#[from] crate::policy::PolicyError),
    #[error("repository: {0}")]
    Repository(#[from] crate::repositories::RepositoryError),
    #[error("model settings: {0}")]
    Models(#[from] crate::ai_models::ModelsError),
    #[error(transparent)]
    WorkItem(#[from] crate::work_items::WorkItemError),
}

/// What a refusal note says (in our words).
fn refusal_text(username: &str, why: NoCodeReview) -> Option<String> {
    match why {
        NoCodeReview::CannotRead => None,
        NoCodeReview::DuoOff => Some(format!(
            "@{username} GitLab Duo features are turned off for this project, so I cannot review this merge request."
        )),
        NoCodeReview::NoAccess => Some(format!(
            "@{username} I cannot review this merge request for you: your account does not have access to GitLab Duo Code Review. Ask an administrator for a GitLab Duo Enterprise seat."
        )),
    }
}

/// How a review that does not get to the model ends: a note saying why
/// (none when saying anything would leak), and its record.
struct Ending {
    by: BotAuthor,
    merge_request_id: i64,
    record: i64,
}

impl Ending {
    async fn stop(
        &self,
        db: &impl Queries,
        text: Option<String>,
        status: &'static str,
        detail: &str,
    ) -> Result<(), ReviewError> {
        if let Some(text) = text {
            posting::note(
                db,
                self.by,
                Kind::MergeRequest,
                self.merge_request_id,
                text,
                false,
            )
            .await?;
        }
        let outcome = Outcome {
            status,
            detail: detail.to_owned(),
            ..Outcome::default()
        };
        store::finish(db, self.record, &outcome).await?;
        Ok(())
    }
}

/// A file of the diff with what the review needs of it.
struct ReviewedFile {
    path: String,
    old_path: String,
    lines: Vec<DiffLine>,
}

/// Runs the review `job` asks for. Errors are for retrying (a database or
/// repository failure); everything the user should know is a note.
pub async fn run(services: &ReviewServices, job: &ReviewRequested) -> Result<(), ReviewError> {
    let agent = services.agent.services();
    let db = agent.pool.get().await?;
    let Some(mr) =
        crate::work_items::merge_requests::by_iid(&*db, job.project_id, job.merge_request_iid)
            .await?
    else {
        return Ok(());
    };
    if mr.state != "opened" {
        return Ok(());
    }
    let Some(asker) = posting::asker(&*db, job.requester_id).await? else {
        return Ok(());
    };
    let (actor, by, username) = (asker.actor, asker.by, asker.username.as_str());
    let bot = by.bot_id;
    let record = store::start(&*db, job.project_id, mr.id, actor.id, job.trigger.as_str()).await?;

    let end = Ending {
        by,
        merge_request_id: mr.id,
        record,
    };
    if let Some(why) = agent.policy.why_no_code_review(&*db, actor, mr.id).await? {
        return end
            .stop(
                &*db,
                refusal_text(username, why),
                "refused",
                &format!("{why:?}"),
            )
            .await;
    }
    let model = agent
        .models
        .choice(&*db, crate::ai_models::Feature::DuoChat)
        .await?;
    if model == crate::ai_models::Choice::Disabled {
        let text = format!(
            "@{username} GitLab Duo is turned off on this instance by an administrator, so I cannot review this merge request."
        );
        return end
            .stop(&*db, Some(text), "refused", "model disabled")
            .await;
    }
    let Some(code) = agent
        .policy
        .code_for_ai(&*db, AiReader::User(actor), job.project_id)
        .await?
    else {
        // The requester cannot read the code itself (a guest): say so.
        let text = format!(
            "@{username} I cannot review this merge request for you: you cannot read this project's code."
        );
        return end
            .stop(&*db, Some(text), "refused", "cannot read code")
            .await;
    };
    set_state(&*db, mr.id, bot, "review_started").await?;

    let comparison = crate::repositories::branch_comparison(
        &agent.repositories,
        job.project_id,
        &mr.source_branch,
        &mr.target_branch,
        services.budget.max_files * 4,
    )
    .await?;
    let Some(comparison) = comparison else {
        let text = format!(
            "@{username} I cannot review this merge request: its branches `{}` and `{}` are not both in the repository.",
            mr.source_branch, mr.target_branch
        );
        return end
            .stop(&*db, Some(text), "failed", "branches missing")
            .await;
    };

    // Instructions: defaults first, then the project's from the target branch.
    let mut notices = Vec::new();
    let mut groups: Vec<InstructionGroup> = Vec::new();
    let instance_text = crate::instance::settings(&*db)
        .await?
        .duo_code_review_instructions;
    let mut documents = vec![(instance_text, Source::Instance)];
    documents.extend(
        crate::namespaces::groups::review_instructions_above_project(&*db, job.project_id)
            .await?
            .into_iter()
            .map(|g| (g.text, Source::Group(g.full_path))),
    );
    let repository = agent.repositories.path(job.project_id);
    let start_sha = comparison.start_sha.clone();
    let file_repository = repository.clone();
    let project_file = tokio::task::spawn_blocking(move || {
        crate::repositories::reader::file(
            &file_repository,
            &start_sha,
            instructions::INSTRUCTIONS_PATH,
            instructions::MAX_DOCUMENT_BYTES as u64,
        )
    })
    .await
    .ok()
    .and_then(Result::ok);
    if let Some(file) = project_file {
        documents.push((
            String::from_utf8_lossy(&file.content).into_owned(),
            Source::Project,
        ));
    }
    for (text, source) in documents {
        match instructions::parse(&text, source.clone()) {
            Ok(mut parsed) => groups.append(&mut parsed),
            Err(e) => notices.push(format!(
                "The {} review instructions were not applied: {e}.",
                match source {
                    Source::Instance => "instance's".to_owned(),
                    Source::Group(path) => format!("group {path}'s"),
                    Source::Project => format!("project's (`{}`)", instructions::INSTRUCTIONS_PATH),
                }
            )),
        }
    }

    // The bot's open threads: fixed ones are resolved, the rest shown.
    let mut resolved = 0;
    let mut still_open: Vec<OpenThread> = Vec::new();
    let previous_head = store::last_reviewed_head(&*db, mr.id).await?;
    for mut thread in store::open_threads(&*db, mr.id, bot).await? {
        let now = if thread.head_sha() == comparison.head_sha {
            LineNow::Unchanged
        } else {
            line_now(&repository, &thread, &comparison.head_sha).await
        };
        if now == LineNow::Gone {
            posting::reply(
                &*db,
                by,
                Kind::MergeRequest,
                mr.id,
                &thread.discussion_id,
                &format!(
                    "This looks addressed in {}: resolving.",
                    &comparison.head_sha[..comparison.head_sha.len().min(8)]
                ),
            )
            .await?;
            posting::resolve(&*db, mr.id, &thread.discussion_id, bot).await?;
            resolved += 1;
        } else {
            // Lines added above it moved it: the prompt and the check for
            // repeats use where it is now.
            if let LineNow::At(n) = now {
                thread.position.new_line = i32::try_from(n).ok();
            }
            still_open.push(thread);
        }
    }
    if previous_head.as_deref() == Some(comparison.head_sha.as_str()) {
        let mut text = format!(
            "@{username} Nothing new to review: the merge request has no commits since my last review."
        );
        if !still_open.is_empty() {
            let _ = write!(
                text,
                " {} of my earlier threads are still open.",
                still_open.len()
            );
        }
        posting::note(&*db, by, Kind::MergeRequest, mr.id, text, false).await?;
        store::finish(
            &*db,
            record,
            &Outcome {
                status: "done",
                head_sha: Some(comparison.head_sha.clone()),
                resolved,
                detail: "no new commits".into(),
                ..Outcome::default()
            },
        )
        .await?;
        set_state(&*db, mr.id, bot, "reviewed").await?;
        return Ok(());
    }

    // The files to review, and those skipped with the reason.
    let mut skipped: Vec<(String, &'static str)> = Vec::new();
    let mut files: Vec<ReviewedFile> = Vec::new();
    for change in &comparison.changes {
        let path = change.new_path.clone();
        if change.deleted_file {
            skipped.push((change.old_path.clone(), "deleted"));
        } else if !code.allows(&path) || !code.allows(&change.old_path) {
            skipped.push((path, "excluded by the project's Duo context rules"));
        } else if change.diff.trim().is_empty() {
            skipped.push((path, "no text changes (binary or mode only)"));
        } else if files.len() == services.budget.max_files {
            skipped.push((path, "over the review's file limit"));
        } else {
            files.push(ReviewedFile {
                path,
                old_path: change.old_path.clone(),
                lines: diff_lines::lines(&change.diff),
            });
        }
    }

    let auth = gateway_auth(services, &*db, actor.id).await?;
    // The index searched for related code (none: the review goes without),
    // and what developers said about the bot's earlier comments here.
    let related = if files.is_empty() {
        None
    } else {
        RelatedCode::open(&agent.code_index, actor.id, job.project_id, code.exclusions())
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(project_id = job.project_id, error = %e, "the code index is unusable: the review goes without related code");
                None
            })
    };
    let mut related_failed = false;
    let mut related_total = 0usize;
    let dismissals = feedback::for_project(&*db, job.project_id).await?;
    let mut dismissed = 0;
    let mut total_chars = 0usize;
    let mut commented: BTreeSet<(String, Option<u32>, Option<u32>)> = still_open
        .iter()
        .map(|t| (t.path().to_owned(), t.old_line(), t.new_line()))
        .collect();
    let mut comments = 0;
    let mut must_fix = 0;
    let mut reviewed = 0;
    let mut failed_files = Vec::new();
    let mut applied: BTreeSet<String> = BTreeSet::new();
    for file in &files {
        let size: usize = diff_lines::annotate(&file.lines).len();
        if total_chars + size.min(services.budget.max_piece_chars) > services.budget.max_total_chars
        {
            skipped.push((file.path.clone(), "over the review's size budget"));
            continue;
        }
        let matching = instructions::for_file(&groups, &file.path);
        for group in &matching {
            applied.insert(group.name.clone());
        }
        let instruction_text = matching
            .iter()
            .map(|g| format!("{}:\n{}", g.name, g.text))
            .collect::<Vec<_>>()
            .join("\n\n");
        let earlier = still_open
            .iter()
            .filter(|t| t.path() == file.path)
            .map(|t| {
                format!(
                    "line {}: {}",
                    t.new_line().or(t.old_line()).unwrap_or(0),
                    t.body.chars().take(400).collect::<String>()
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        let feedback_text = feedback::prompt_text(&feedback::relevant(&dismissals, &file.path));
        let context = file_context(
            &repository,
            &comparison.head_sha,
            &file.path,
            services.budget.max_context_bytes,
        )
        .await;
        let mut file_ok = true;
        for piece in diff_lines::pieces(&file.lines, services.budget.max_piece_chars) {
            let piece_lines = &file.lines[piece];
            let annotated = diff_lines::annotate(piece_lines);
            if total_chars + annotated.len() > services.budget.max_total_chars {
                skipped.push((
                    file.path.clone(),
                    "partly reviewed: over the review's size budget",
                ));
                break;
            }
            total_chars += annotated.len();
            let related_text = match &related {
                Some(index)
                    if !related_failed
                        && related_total < services.budget.max_related_total_chars =>
                {
                    let limits = RelatedLimits {
                        chunks: services.budget.related_chunks,
                        chars: services
                            .budget
                            .related_chars
                            .min(services.budget.max_related_total_chars - related_total),
                    };
                    let reviewed = [file.path.as_str(), file.old_path.as_str()];
                    match index.around(&reviewed, piece_lines, limits).await {
                        Ok(hits) => {
                            let text = super::related::prompt_text(&hits);
                            related_total += text.len();
                            text
                        }
                        Err(e) => {
                            // One failure (the embedder down) stands for the
                            // rest of this review.
                            tracing::warn!(merge_request_id = mr.id, error = %e, "related code search failed: the review goes without it");
                            related_failed = true;
                            String::new()
                        }
                    }
                }
                _ => String::new(),
            };
            let mut inputs = Map::new();
            inputs.insert("mr_title".into(), json!(mr.title));
            inputs.insert(
                "mr_description".into(),
                json!(mr.description.chars().take(4000).collect::<String>()),
            );
            inputs.insert("instructions".into(), json!(instruction_text));
            inputs.insert("earlier_threads".into(), json!(earlier));
            inputs.insert("file_path".into(), json!(file.path));
            inputs.insert("diff_lines".into(), json!(annotated));
            inputs.insert("file_content".into(), json!(context));
            inputs.insert("related_code".into(), json!(related_text));
            inputs.insert("feedback".into(), json!(feedback_text));
            let answer = match agent
                .gateway
                .prompt(&auth, PROMPT_ID, inputs, model.metadata())
                .await
            {
                Ok(answer) => answer,
                Err(e) => {
                    tracing::warn!(merge_request_id = mr.id, file = %file.path, error = %e, "review call failed");
                    file_ok = false;
                    break;
                }
            };
            for comment in response::parse(&answer) {
                // A comment about another file is not about these lines.
                if comment.file != file.path && comment.file != file.old_path {
                    continue;
                }
                let Some(line) = diff_lines::place(piece_lines, comment.old_line, comment.new_line)
                else {
                    continue;
                };
                let key = (file.path.clone(), line.old_line, line.new_line);
                // A comment on another line of the same position of an open
                // thread would repeat it; so would the same comment twice.
                if commented.contains(&key) {
                    continue;
                }
                // Developers dismissed this very comment on this file before.
                if feedback::dismissed_before(&dismissals, &file.path, &comment.body) {
                    dismissed += 1;
                    continue;
                }
                let position = Position {
                    base_sha: comparison.base_sha.clone(),
                    start_sha: comparison.start_sha.clone(),
                    head_sha: comparison.head_sha.clone(),
                    old_path: file.old_path.clone(),
                    new_path: file.path.clone(),
                    position_type: "text".to_owned(),
                    old_line: line.old_line.and_then(|n| i32::try_from(n).ok()),
                    new_line: line.new_line.and_then(|n| i32::try_from(n).ok()),
                };
                posting::diff_note(&*db, by, mr.id, &comment.body, position).await?;
                commented.insert(key);
                comments += 1;
                if comment.priority == 3 {
                    must_fix += 1;
                }
            }
        }
        if file_ok {
            reviewed += 1;
        } else {
            failed_files.push(file.path.clone());
        }
    }

    let summary = summary_text(&SummaryFacts {
        username,
        reviewed,
        comments,
        must_fix,
        resolved,
        still_open: still_open.len(),
        dismissed,
        skipped: &skipped,
        failed: &failed_files,
        applied: &applied,
        notices: &notices,
    });
    posting::note(&*db, by, Kind::MergeRequest, mr.id, summary, false).await?;
    let status = if reviewed == 0 && !failed_files.is_empty() {
        "failed"
    } else {
        "done"
    };
    store::finish(
        &*db,
        record,
        &Outcome {
            status,
            head_sha: Some(comparison.head_sha.clone()),
            files_reviewed: reviewed,
            files_skipped: skipped
                .iter()
                .map(|(p, _)| p.clone())
                .chain(failed_files.iter().cloned())
                .collect(),
            comments,
            resolved,
            detail: String::new(),
        },
    )
    .await?;
    set_state(&*db, mr.id, bot, "reviewed").await?;
    Ok(())
}

/// The bot's reviewer state, when it is a reviewer (a mention reviews
/// without making it one).
async fn set_state(
    db: &impl Queries,
    merge_request_id: i64,
    bot: i64,
    state: &str,
) -> Result<(), ReviewError> {
    crate::work_items::reviewers::set_state(db, merge_request_id, bot, state).await?;
    Ok(())
}

async fn gateway_auth(
    services: &ReviewServices,
    db: &impl Queries,
    user_id: i64,
) -> Result<GatewayAuth, ReviewError> {
    let agent = services.agent.services();
    let scopes = agent.policy.seat_unit_primitives(db, user_id).await?;
    let (realm, gateway_url) = crate::gateway_client::instance_route(db).await?;
    Ok(GatewayAuth {
        user_id,
        scopes: scopes.iter().map(|s| s.as_str().to_owned()).collect(),
        realm,
        request_id: Uuid::new_v4(),
        gateway_url,
    })
}

/// The file after the change, when it is small enough to show whole.
async fn file_context(
    repository: &std::path::Path,
    head: &str,
    path: &str,
    max_bytes: usize,
) -> String {
    let (repository, head, path) = (repository.to_owned(), head.to_owned(), path.to_owned());
    tokio::task::spawn_blocking(move || {
        crate::repositories::reader::file(&repository, &head, &path, max_bytes as u64)
    })
    .await
    .ok()
    .and_then(Result::ok)
    .and_then(|blob| String::from_utf8(blob.content).ok())
    .unwrap_or_default()
}

/// The text of line `n` (1-based) of `path` at `commit`.
async fn line_at(repository: &std::path::Path, commit: &str, path: &str, n: u32) -> Option<String> {
    let text = file_context(repository, commit, path, 4 * 1024 * 1024).await;
    if text.is_empty() {
        return None;
    }
    text.lines()
        .nth(n.checked_sub(1)? as usize)
        .map(str::to_owned)
}

/// Where a thread's line is in a newer head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineNow {
    /// Unknown or not moved (same head, no line, unreadable files).
    Unchanged,
    /// Its text is gone from the file (or the file is): what a fix looks like.
    Gone,
    /// The line of the new head holding its text, nearest to where it was.
    At(u32),
}

/// Reads the thread's line at its commit and the file at `head` once.
async fn line_now(repository: &std::path::Path, thread: &OpenThread, head: &str) -> LineNow {
    let Some(n) = thread.new_line() else {
        return LineNow::Unchanged;
    };
    let Some(before) = line_at(repository, thread.head_sha(), thread.path(), n).await else {
        return LineNow::Unchanged;
    };
    let before = before.trim();
    let now = file_context(repository, head, thread.path(), 4 * 1024 * 1024).await;
    if now.is_empty() {
        return LineNow::Gone;
    }
    if before.is_empty() {
        return LineNow::Unchanged;
    }
    now.lines()
        .enumerate()
        .filter(|(_, line)| line.trim() == before)
        .filter_map(|(i, _)| u32::try_from(i + 1).ok())
        .min_by_key(|m| m.abs_diff(n))
        .map_or(LineNow::Gone, LineNow::At)
}

struct SummaryFacts<'a> {
    username: &'a str,
    reviewed: i32,
    comments: i32,
    must_fix: i32,
    resolved: i32,
    still_open: usize,
    dismissed: i32,
    skipped: &'a [(String, &'static str)],
    failed: &'a [String],
    applied: &'a BTreeSet<String>,
    notices: &'a [String],
}

/// The summary note, in Markdown.
fn summary_text(f: &SummaryFacts<'_>) -> String {
    let mut text = format!("@{} I reviewed this merge request.\n\n", f.username);
    let _ = writeln!(
        text,
        "- Files reviewed: {}\n- New comments: {}{}",
        f.reviewed,
        f.comments,
        if f.must_fix > 0 {
            format!(" ({} to fix before merging)", f.must_fix)
        } else {
            String::new()
        }
    );
    if f.resolved > 0 {
        let _ = writeln!(
            text,
            "- Earlier threads resolved by the new commits: {}",
            f.resolved
        );
    }
    if f.still_open > 0 {
        let _ = writeln!(text, "- Earlier threads still open: {}", f.still_open);
    }
    if f.dismissed > 0 {
        let _ = writeln!(
            text,
            "- Comments left out because developers dismissed the same comment on the same file before: {}",
            f.dismissed
        );
    }
    if f.comments == 0 && f.failed.is_empty() && f.reviewed > 0 {
        text.push_str("\nI found nothing that needs a comment.\n");
    }
    if !f.applied.is_empty() {
        let names: Vec<&str> = f.applied.iter().map(String::as_str).collect();
        let _ = writeln!(text, "\nReview instructions applied: {}.", names.join(", "));
    }
    if !f.skipped.is_empty() {
        text.push_str("\nNot reviewed:\n");
        for (path, why) in f.skipped.iter().take(50) {
            let _ = writeln!(text, "- `{path}`: {why}");
        }
        if f.skipped.len() > 50 {
            let _ = writeln!(text, "- and {} more", f.skipped.len() - 50);
        }
    }
    if !f.failed.is_empty() {
        text.push_str("\nThe AI service failed while reviewing:\n");
        for path in f.failed {
            let _ = writeln!(text, "- `{path}`");
        }
    }
    for notice in f.notices {
        let _ = writeln!(text, "\n{notice}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_says_what_was_done_and_skipped() {
        let applied: BTreeSet<String> = ["Ruby style".to_owned()].into();
        let text = summary_text(&SummaryFacts {
            username: "alice",
            reviewed: 2,
            comments: 3,
            must_fix: 1,
            resolved: 1,
            still_open: 0,
            dismissed: 1,
            skipped: &[(
                "secrets/key.pem".into(),
                "excluded by the project's Duo context rules",
            )],
            failed: &[],
            applied: &applied,
            notices: &["The project's review instructions were not applied: bad YAML.".into()],
        });
        assert!(text.starts_with("@alice I reviewed"));
        assert!(text.contains("- New comments: 3 (1 to fix before merging)"));
        assert!(text.contains("- Earlier threads resolved by the new commits: 1"));
        assert!(text.contains("`secrets/key.pem`: excluded"));
        assert!(text.contains("Review instructions applied: Ruby style."));
        assert!(text.contains("bad YAML"));
        assert!(text.contains("dismissed the same comment on the same file before: 1"));
        assert!(refusal_text("bob", NoCodeReview::CannotRead).is_none());
        assert!(
            refusal_text("bob", NoCodeReview::NoAccess)
                .unwrap()
                .contains("does not have access")
        );
    }
}
