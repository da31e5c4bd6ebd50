//! What the bot writes: notes, diff notes that open a resolvable thread,
//! replies in a thread, and resolving its own threads, through the work
//! items' discussions. Authored by the bot on behalf of the person who
//! asked (composite authorship), so every comment shows who started the
//! work.

use crate::queries::Queries;
use crate::work_items::discussions::{self, NewThreadNote, Noteable};
use crate::work_items::notes::{self, NewNote};
use crate::work_items::position::Position;
use crate::work_items::{Author, Kind, WorkItemError};

/// Who writes: the bot, for `requester`.
#[derive(Debug, Clone, Copy)]
pub struct BotAuthor {
    pub bot_id: i64,
    pub requester_id: i64,
}

impl BotAuthor {
    fn author(self) -> Author {
        Author {
            id: self.bot_id,
            on_behalf_of: Some(self.requester_id),
        }
    }
}

/// The person a job works for, as the bot writes for them.
#[derive(Debug, Clone)]
pub struct Asker {
    pub actor: crate::policy::Actor,
    pub username: String,
    pub by: BotAuthor,
}

/// The active user `requester_id` and the bot that writes for them; `None`
/// when either is missing (a blocked user, no bot), and the job ends.
pub async fn asker(
    db: &impl Queries,
    requester_id: i64,
) -> Result<Option<Asker>, tokio_postgres::Error> {
    let Some(bot) = crate::identity::users::review_bot(db).await? else {
        tracing::warn!("the review bot user is missing");
        return Ok(None);
    };
    let Some(user) = crate::identity::users::by_id(db, requester_id).await? else {
        return Ok(None);
    };
    let Some(active) = crate::identity::users::active(db, requester_id).await? else {
        return Ok(None);
    };
    Ok(Some(Asker {
        actor: crate::policy::Actor::user(active.id, active.admin),
        username: user.username,
        by: BotAuthor {
            bot_id: bot.id,
            requester_id,
        },
    }))
}

/// A plain note on the item.
pub async fn note(
    db: &impl Queries,
    by: BotAuthor,
    kind: Kind,
    item: i64,
    body: String,
    internal: bool,
) -> Result<i64, tokio_postgres::Error> {
    Ok(notes::create(
        db,
        NewNote {
            kind,
            item,
            body,
            internal,
            author: by.author(),
        },
    )
    .await?
    .id)
}

/// A diff note at `position` opening a resolvable thread; its discussion id.
pub async fn diff_note(
    db: &impl Queries,
    by: BotAuthor,
    merge_request_id: i64,
    body: &str,
    position: Position,
) -> Result<String, tokio_postgres::Error> {
    Ok(discussions::start(
        db,
        NewThreadNote {
            noteable: Noteable {
                kind: Kind::MergeRequest,
                id: merge_request_id,
            },
            author: by.author(),
            body: body.to_owned(),
            internal: false,
            position: Some(position),
            resolvable: true,
        },
    )
    .await?
    .discussion_id)
}

/// A reply in the thread `discussion_id` of the item (it takes the
/// thread's kind of note and internal flag).
pub async fn reply(
    db: &impl Queries,
    by: BotAuthor,
    kind: Kind,
    item: i64,
    discussion_id: &str,
    body: &str,
) -> Result<(), WorkItemError> {
    discussions::reply(
        db,
        Noteable { kind, id: item },
        discussion_id,
        by.author(),
        body,
    )
    .await?;
    Ok(())
}

/// Marks the thread resolved by the bot.
pub async fn resolve(
    db: &impl Queries,
    merge_request_id: i64,
    discussion_id: &str,
    bot_id: i64,
) -> Result<(), WorkItemError> {
    discussions::resolve(
        db,
        Noteable {
            kind: Kind::MergeRequest,
            id: merge_request_id,
        },
        discussion_id,
        true,
        bot_id,
    )
    .await?;
    Ok(())
}
