//! The events that start Duo's work where people are: the review bot added
//! as a merge request's reviewer, and a comment that mentions it. Each
//! enqueues a job (the worker runs it); nothing here calls a model, so the
//! request that caused the event stays fast.

use job_queue::{EnqueueOptions, Job};
use serde::{Deserialize, Serialize};

use crate::queries::Queries;

/// The review bot's username (GitLab's internal user).
pub const BOT_USERNAME: &str = "GitLabDuo";

/// The queue review and mention jobs run on.
pub const QUEUE: &str = "duo_review";

#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    #[error(transparent)]
    Db(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Queue(#[from] job_queue::QueueError),
}

/// What started a review.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewTrigger {
    ReviewerAssigned,
    Mention,
}

impl ReviewTrigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReviewerAssigned => "reviewer_assigned",
            Self::Mention => "mention",
        }
    }
}

/// Review merge request `merge_request_iid` of `project_id` for
/// `requester_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewRequested {
    pub project_id: i64,
    pub merge_request_iid: i32,
    pub requester_id: i64,
    pub trigger: ReviewTrigger,
}

impl Job for ReviewRequested {
    const KIND: &'static str = "duo_code_review";
}

/// Answer the comment `note_id` that mentioned the bot, in its thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MentionAsked {
    pub project_id: i64,
    /// `Issue` or `MergeRequest`.
    pub noteable_type: String,
    pub noteable_iid: i32,
    pub note_id: i64,
    pub requester_id: i64,
}

impl Job for MentionAsked {
    const KIND: &'static str = "duo_mention_reply";
}

/// A job of the project failed: a flow reads its log and proposes a fix as
/// a merge request (when the project turned this trigger on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineFailed {
    pub project_id: i64,
    pub pipeline_id: i64,
    pub job_id: i64,
    /// Who reported the failure (the run is theirs).
    pub user_id: i64,
}

impl Job for PipelineFailed {
    const KIND: &'static str = "duo_pipeline_failed";
}

/// After a job finished as failed: a fix flow, when the project turned the
/// trigger on (one per pipeline).
pub async fn job_failed(
    db: &impl Queries,
    project_id: i64,
    pipeline_id: i64,
    job_id: i64,
    user_id: i64,
) -> Result<bool, TriggerError> {
    if !enabled(db, project_id, TriggerEvent::PipelineFailed).await? {
        return Ok(false);
    }
    crate::db::enqueue(
        db,
        &PipelineFailed {
            project_id,
            pipeline_id,
            job_id,
            user_id,
        },
        EnqueueOptions {
            max_attempts: 3,
            ..EnqueueOptions::default()
                .queue(QUEUE)
                .dedupe(format!("duo_pipeline_failed:{pipeline_id}"))
        },
    )
    .await?;
    Ok(true)
}

/// The events a project can switch (absent: the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerEvent {
    ReviewerAssigned,
    Mention,
    PipelineFailed,
}

impl TriggerEvent {
    pub const ALL: [Self; 3] = [Self::ReviewerAssigned, Self::Mention, Self::PipelineFailed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReviewerAssigned => "reviewer_assigned",
            Self::Mention => "mention",
            Self::PipelineFailed => "pipeline_failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == text)
    }

    /// On unless a maintainer turned it off; a failed pipeline opens merge
    /// requests, so that one waits to be turned on.
    pub fn default_enabled(self) -> bool {
        !matches!(self, Self::PipelineFailed)
    }
}

/// Whether `event` starts Duo's flow in the project.
pub async fn enabled(
    db: &impl Queries,
    project_id: i64,
    event: TriggerEvent,
) -> Result<bool, tokio_postgres::Error> {
    let row = db
        .query_opt(
            "SELECT enabled FROM project_duo_triggers WHERE project_id = $1 AND event = $2",
            &[&project_id, &event.as_str()],
        )
        .await?;
    Ok(row.map_or(event.default_enabled(), |r| r.get(0)))
}

/// The review bot's user id.
pub async fn bot_id(db: &impl Queries) -> Result<Option<i64>, tokio_postgres::Error> {
    Ok(crate::identity::users::review_bot(db).await?.map(|u| u.id))
}

/// After reviewers were added to a merge request: a review when the bot is
/// among `added` (dedupe: one pending review per merge request).
pub async fn reviewers_added(
    db: &impl Queries,
    project_id: i64,
    merge_request_iid: i32,
    requester_id: i64,
    added: &[i64],
) -> Result<bool, TriggerError> {
    let Some(bot) = bot_id(db).await? else {
        return Ok(false);
    };
    if !added.contains(&bot) || requester_id == bot {
        return Ok(false);
    }
    if !enabled(db, project_id, TriggerEvent::ReviewerAssigned).await? {
        return Ok(false);
    }
    enqueue_review(
        db,
        ReviewRequested {
            project_id,
            merge_request_iid,
            requester_id,
            trigger: ReviewTrigger::ReviewerAssigned,
        },
    )
    .await?;
    Ok(true)
}

async fn enqueue_review(db: &impl Queries, job: ReviewRequested) -> Result<(), TriggerError> {
    let key = format!(
        "duo_code_review:{}:{}",
        job.project_id, job.merge_request_iid
    );
    crate::db::enqueue(
        db,
        &job,
        EnqueueOptions {
            max_attempts: 3,
            ..EnqueueOptions::default().queue(QUEUE).dedupe(key)
        },
    )
    .await?;
    Ok(())
}

/// What a comment asks of the bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mention {
    /// `@GitLabDuo review` (on a merge request).
    Review,
    /// `@GitLabDuo <question>`.
    Question(String),
}

/// The mention of the bot in `body`, if any: a whole-word `@GitLabDuo`
/// (any case) outside code spans, code blocks and quotes. The question is
/// the rest of that line and the lines after it.
pub fn mention_in(body: &str) -> Option<Mention> {
    let question = question_in(body)?;
    let words: Vec<&str> = question.split_whitespace().collect();
    let asks_review = words.first().is_some_and(|w| {
        w.trim_end_matches(['.', '!', ','])
            .eq_ignore_ascii_case("review")
    });
    Some(if asks_review && words.len() <= 3 {
        Mention::Review
    } else {
        Mention::Question(question)
    })
}

/// The text after the mention of the bot in `body` (see [`mention_in`]),
/// whatever it asks: on an issue, `review` is a question like any other.
pub fn question_in(body: &str) -> Option<String> {
    let needle = format!("@{}", BOT_USERNAME.to_ascii_lowercase());
    let lines: Vec<&str> = body.lines().collect();
    let mut in_fence = false;
    for (index, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence || trimmed.starts_with('>') {
            continue;
        }
        let visible = strip_code_spans(line).to_ascii_lowercase();
        let mut from = 0;
        while let Some(found) = visible[from..].find(&needle) {
            let start = from + found;
            let end = start + needle.len();
            from = end;
            let word_before = visible[..start]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '@');
            let word_after = visible[end..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if word_before || word_after {
                continue;
            }
            let mut question = line
                .get(end..)
                .unwrap_or_default()
                .trim()
                .trim_start_matches([',', ':'])
                .trim()
                .to_owned();
            for more in &lines[index + 1..] {
                question.push('\n');
                question.push_str(more);
            }
            return Some(question.trim().chars().take(2000).collect());
        }
    }
    None
}

/// `line` with inline code spans blanked byte for byte, so offsets hold.
fn strip_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.extend(std::iter::repeat_n(' ', c.len_utf8()));
        } else {
            out.push(c);
        }
    }
    out
}

/// The thread `note_id` replies to, when the bot started it: its first
/// note's body and position.
#[derive(Debug, Clone, PartialEq)]
pub struct BotThread {
    pub body: String,
    pub position: Option<serde_json::Value>,
}

/// [`BotThread`] of the note, if it is someone else's reply in a thread the
/// bot started. One query, with the bot found inside it: every comment
/// posted without a mention asks this.
pub async fn bot_thread(
    db: &impl Queries,
    note_id: i64,
) -> Result<Option<BotThread>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT first.body, first.position FROM notes n
             JOIN LATERAL (
                 SELECT f.id, f.author_id, f.body, f.position FROM notes f
                 WHERE f.noteable_type = n.noteable_type AND f.noteable_id = n.noteable_id
                   AND f.discussion_id = n.discussion_id
                 ORDER BY f.created_at, f.id LIMIT 1
             ) first ON true
             JOIN users bot ON bot.id = first.author_id AND bot.user_type = 'duo_code_review_bot'
             WHERE n.id = $1 AND first.id <> n.id AND n.author_id <> bot.id",
            &[&note_id],
        )
        .await?
        .map(|r| BotThread {
            body: r.get(0),
            position: r.get(1),
        }))
}

/// After a comment was posted on an issue or merge request: a review or a
/// reply when it mentions the bot or answers one of its threads (never for
/// the bot's own comments).
pub async fn note_created(
    db: &impl Queries,
    project_id: i64,
    noteable_type: &str,
    noteable_iid: i32,
    note_id: i64,
    author_id: i64,
    body: &str,
) -> Result<Option<Mention>, TriggerError> {
    // A reply in one of the bot's threads asks it, mention or not.
    let mention = match mention_in(body) {
        Some(mention) => {
            // The bot's own comments never ask it anything.
            if bot_id(db).await? != Some(author_id) {
                mention
            } else {
                return Ok(None);
            }
        }
        None => match bot_thread(db, note_id).await? {
            Some(_) => Mention::Question(body.trim().chars().take(2000).collect()),
            None => return Ok(None),
        },
    };
    if !enabled(db, project_id, TriggerEvent::Mention).await? {
        return Ok(None);
    }
    match &mention {
        Mention::Review if noteable_type == "MergeRequest" => {
            enqueue_review(
                db,
                ReviewRequested {
                    project_id,
                    merge_request_iid: noteable_iid,
                    requester_id: author_id,
                    trigger: ReviewTrigger::Mention,
                },
            )
            .await?;
        }
        _ => {
            crate::db::enqueue(
                db,
                &MentionAsked {
                    project_id,
                    noteable_type: noteable_type.to_owned(),
                    noteable_iid,
                    note_id,
                    requester_id: author_id,
                },
                EnqueueOptions {
                    max_attempts: 3,
                    ..EnqueueOptions::default()
                        .queue(QUEUE)
                        .dedupe(format!("duo_mention_reply:{note_id}"))
                },
            )
            .await?;
        }
    }
    Ok(Some(mention))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_are_whole_words_outside_code_and_quotes() {
        assert_eq!(mention_in("@GitLabDuo review"), Some(Mention::Review));
        assert_eq!(
            mention_in("please @gitlabduo Review!"),
            Some(Mention::Review)
        );
        assert_eq!(
            mention_in("@GitLabDuo why does the build fail?\nIt started today."),
            Some(Mention::Question(
                "why does the build fail?\nIt started today.".into()
            ))
        );
        assert_eq!(
            mention_in("@GitLabDuo review the error handling in depth please now"),
            Some(Mention::Question(
                "review the error handling in depth please now".into()
            ))
        );
        assert_eq!(mention_in("ask `@GitLabDuo review` for one"), None);
        assert_eq!(mention_in("```\n@GitLabDuo review\n```"), None);
        assert_eq!(mention_in("> @GitLabDuo review"), None);
        assert_eq!(mention_in("mail me@GitLabDuo review"), None);
        assert_eq!(mention_in("@GitLabDuo2 review"), None);
        assert_eq!(mention_in("@GitLabDuo.bak review"), None);
        assert_eq!(mention_in("nothing here"), None);
    }
}
