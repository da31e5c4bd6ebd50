//! `@GitLabDuo <question>` in a comment: the chat agent answers as the
//! person who asked (their rights bound what it reads), with the issue or
//! merge request as the resource the question is about, and the bot posts
//! the answer in the same thread. A reply in an internal thread is
//! internal; a confidential issue's answer stays on that issue.
//!
//! A reply in one of the bot's diff threads that dismisses its comment
//! ("false positive", "this is intended") also teaches the bot: it becomes
//! the project's review feedback ([`super::feedback`]), when the person who
//! replied reads the merge request and its code and Duo is on there.

use uuid::Uuid;

use super::feedback::{self, NewFeedback};
use super::posting;
use super::reviewer::{ReviewError, ReviewServices};
use super::triggers::{BotThread, Mention, MentionAsked, bot_thread, mention_in, question_in};
use crate::policy::{Actor, AiReader, ChatAuthError, Subject};
use crate::work_items::Kind;

/// The comment that asked, as the reply needs it.
struct Asked {
    body: String,
    discussion_id: String,
}

async fn asked(
    db: &impl crate::queries::Queries,
    note_id: i64,
    kind: Kind,
    item: i64,
) -> Result<Option<Asked>, tokio_postgres::Error> {
    Ok(db
        .query_opt(
            "SELECT body, discussion_id FROM notes
             WHERE id = $1 AND noteable_type = $2 AND noteable_id = $3",
            &[&note_id, &kind.noteable_type(), &item],
        )
        .await?
        .map(|r| Asked {
            body: r.get(0),
            discussion_id: r.get(1),
        }))
}

/// Answers the mention `job` names. Errors are for retrying; refusals the
/// asker should know about are replies.
pub async fn run(services: &ReviewServices, job: &MentionAsked) -> Result<(), ReviewError> {
    let agent = services.agent.services();
    let db = agent.pool.get().await?;
    let kind = match job.noteable_type.as_str() {
        "Issue" => Kind::Issue,
        "MergeRequest" => Kind::MergeRequest,
        _ => return Ok(()),
    };
    let Some(item) =
        crate::work_items::id_by_iid(&*db, kind, job.project_id, job.noteable_iid).await?
    else {
        return Ok(());
    };
    let Some(asked) = asked(&*db, job.note_id, kind, item).await? else {
        return Ok(());
    };
    // `review` is a review on a merge request (its own job), a question
    // anywhere else.
    let Some(asker) = super::posting::asker(&*db, job.requester_id).await? else {
        return Ok(());
    };
    let question = match mention_in(&asked.body) {
        Some(Mention::Question(question)) => question,
        Some(Mention::Review) if kind != Kind::MergeRequest => {
            question_in(&asked.body).unwrap_or_default()
        }
        Some(Mention::Review) => return Ok(()),
        // A reply in one of the bot's threads: the thread is the context.
        None => match bot_thread(&*db, job.note_id).await? {
            Some(thread) => thread_question(&thread, &asked.body),
            None => return Ok(()),
        },
    };
    let (actor, by, username) = (asker.actor, asker.by, asker.username.as_str());
    // A retried job must not answer twice.
    if already_answered(
        &*db,
        kind,
        item,
        &asked.discussion_id,
        by.bot_id,
        job.note_id,
    )
    .await?
    {
        return Ok(());
    }
    let learned = if kind == Kind::MergeRequest {
        learn(
            services,
            &*db,
            actor,
            Reply {
                project_id: job.project_id,
                merge_request_id: item,
                note_id: job.note_id,
                body: &asked.body,
            },
        )
        .await?
    } else {
        false
    };
    let subject = kind.subject(item);
    let refusal = match agent
        .policy
        .authorize_chat_resource(&*db, Some(actor), subject)
        .await
    {
        Ok(()) => None,
        Err(ChatAuthError::Denied(contracts::DuoErrorCode::M3003)) => return Ok(()),
        Err(ChatAuthError::Denied(code)) => Some(format!(
            "@{username} I cannot answer here: {}",
            code.user_message()
        )),
        Err(ChatAuthError::Policy(e)) => return Err(e.into()),
    };
    let mut text = match refusal {
        Some(text) => text,
        None if question.trim().is_empty() => format!(
            "@{username} Ask me a question after the mention, for example `@GitLabDuo what does this change break?`{}",
            if kind == Kind::MergeRequest {
                ", or `@GitLabDuo review` for a code review."
            } else {
                "."
            }
        ),
        None => {
            let allowed = crate::rate_limit::take(
                &db,
                actor.id,
                crate::chat::RATE_LIMIT_ACTION,
                services.rate_limit,
                services.rate_window,
            )
            .await?;
            if allowed {
                answer(services, actor.id, subject, &question, username).await
            } else {
                format!(
                    "@{username} You have asked GitLab Duo too many questions in a short time. Try again in a minute."
                )
            }
        }
    };
    if learned {
        text.push_str(
            "\n\nNoted: later reviews of this project will take your reply into account.",
        );
    }
    posting::reply(
        &*db,
        by,
        kind,
        item,
        &asked.discussion_id,
        &format!("{text}\n\n<!-- duo-mention-reply:{} -->", job.note_id),
    )
    .await?;
    Ok(())
}

/// A reply on a merge request, as learning reads it.
struct Reply<'a> {
    project_id: i64,
    merge_request_id: i64,
    note_id: i64,
    body: &'a str,
}

/// Keeps `reply` as the project's review feedback when it dismisses the
/// bot's diff comment it answers and its author may teach the bot (reads
/// the merge request and the code, Duo on, the file not excluded); whether
/// it counts. A retried job keeps it once.
async fn learn(
    services: &ReviewServices,
    db: &impl crate::queries::Queries,
    actor: Actor,
    reply: Reply<'_>,
) -> Result<bool, ReviewError> {
    if !feedback::dismisses(reply.body) {
        return Ok(false);
    }
    let Some(thread) = bot_thread(db, reply.note_id).await? else {
        return Ok(false);
    };
    let Some(path) = thread
        .position
        .as_ref()
        .and_then(|p| p["new_path"].as_str().or(p["old_path"].as_str()))
        .filter(|p| !p.is_empty())
    else {
        return Ok(false);
    };
    let policy = &services.agent.services().policy;
    if !policy
        .may_send_to_ai(db, actor, Subject::MergeRequest(reply.merge_request_id))
        .await?
    {
        return Ok(false);
    }
    let Some(code) = policy
        .code_for_ai(db, AiReader::User(actor), reply.project_id)
        .await?
    else {
        return Ok(false);
    };
    if !code.allows(path) {
        return Ok(false);
    }
    let kept = feedback::record(
        db,
        &NewFeedback {
            project_id: reply.project_id,
            merge_request_id: reply.merge_request_id,
            path,
            comment: &thread.body,
            reply: reply.body,
            user_id: actor.id,
            reply_note_id: reply.note_id,
        },
    )
    .await?;
    if kept {
        tracing::info!(
            project_id = reply.project_id,
            path,
            "a developer dismissed a review comment: kept as review feedback"
        );
    }
    // Kept now or by an earlier run of this job: either way it counts.
    Ok(true)
}

/// The question a reply in the bot's thread asks: the reply, with the
/// comment it answers and where that comment sits.
fn thread_question(thread: &BotThread, reply: &str) -> String {
    let place = thread.position.as_ref().map(|p| {
        format!(
            " on `{}` line {}",
            p["new_path"]
                .as_str()
                .or(p["old_path"].as_str())
                .unwrap_or_default(),
            p["new_line"]
                .as_i64()
                .or(p["old_line"].as_i64())
                .unwrap_or(0)
        )
    });
    format!(
        "Someone replied to your review comment{}.\nYour comment was:\n{}\n\nTheir reply:\n{}\n\nAnswer the reply briefly.",
        place.unwrap_or_default(),
        thread.body.chars().take(2000).collect::<String>(),
        reply.trim().chars().take(2000).collect::<String>()
    )
}

async fn already_answered(
    db: &impl crate::queries::Queries,
    kind: Kind,
    item: i64,
    discussion_id: &str,
    bot: i64,
    note_id: i64,
) -> Result<bool, tokio_postgres::Error> {
    let marker = format!("%<!-- duo-mention-reply:{note_id} -->%");
    Ok(db
        .query_opt(
            "SELECT 1 FROM notes WHERE noteable_type = $1 AND noteable_id = $2 AND discussion_id = $3
               AND author_id = $4 AND body LIKE $5 LIMIT 1",
            &[&kind.noteable_type(), &item, &discussion_id, &bot, &marker],
        )
        .await?
        .is_some())
}

/// The chat agent's answer for the asker, about the item.
async fn answer(
    services: &ReviewServices,
    user_id: i64,
    subject: Subject,
    question: &str,
    username: &str,
) -> String {
    let (model, id) = match subject {
        Subject::Issue(id) => ("Issue", id),
        Subject::MergeRequest(id) => ("MergeRequest", id),
        _ => ("Issue", 0),
    };
    let (chunks, _received) = crate::chat::completion::ChunkSender::channel();
    let result = services
        .agent
        .answer(
            &crate::chat::CompletionJob {
                request_id: Uuid::new_v4(),
                user_id,
                // No chat thread: a mention starts from the item alone.
                thread_id: 0,
                content: question.to_owned(),
                resource_id: Some(crate::gid::format(model, id)),
                ..Default::default()
            },
            chunks,
        )
        .await;
    match result {
        Ok(answer) => match answer.error {
            None if !answer.content.trim().is_empty() => {
                format!("@{username} {}", answer.content.trim())
            }
            None => format!("@{username} I have no answer to that."),
            Some(error) => format!(
                "@{username} I could not answer: {} (error code {})",
                error.code.user_message(),
                error.code.code()
            ),
        },
        Err(e) => {
            tracing::warn!(error = %e, "mention answer failed");
            format!(
                "@{username} I could not answer right now: the AI service failed. Try again later."
            )
        }
    }
}
