//! What the bot writes: notes, diff notes that open a resolvable thread,
//! replies in a thread, and resolving its own threads. Authored by the bot
//! on behalf of the person who asked (composite authorship), so every
//! comment shows who started the work.

use serde_json::Value;

use crate::queries::Queries;
use crate::work_items::notes::{self, NewNote};
use crate::work_items::{Author, Kind};

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
    position: &Value,
) -> Result<String, tokio_postgres::Error> {
    Ok(db
        .query_one(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, on_behalf_of_user_id, body, note_type, position, resolvable)
             VALUES ('MergeRequest', $1, $2, $3, $4, 'DiffNote', $5, true)
             RETURNING discussion_id",
            &[&merge_request_id, &by.bot_id, &by.requester_id, &body, position],
        )
        .await?
        .get(0))
}

/// A reply in the thread `discussion_id` of the item; the thread's kind of
/// note (diff note, position, resolvability) carries over.
pub async fn reply(
    db: &impl Queries,
    by: BotAuthor,
    kind: Kind,
    item: i64,
    discussion_id: &str,
    body: &str,
    internal: bool,
) -> Result<i64, tokio_postgres::Error> {
    Ok(db
        .query_one(
            "INSERT INTO notes (noteable_type, noteable_id, author_id, on_behalf_of_user_id, body, internal,
                                discussion_id, note_type, position, resolvable)
             SELECT $1, $2, $3, $4, $5, $6, $7,
                    CASE WHEN first.note_type IS NULL THEN 'DiscussionNote' ELSE first.note_type END,
                    first.position, first.resolvable
             FROM (SELECT note_type, position, resolvable FROM notes
                   WHERE noteable_type = $1 AND noteable_id = $2 AND discussion_id = $7
                   ORDER BY id LIMIT 1) first
             RETURNING id",
            &[
                &kind.noteable_type(),
                &item,
                &by.bot_id,
                &by.requester_id,
                &body,
                &internal,
                &discussion_id,
            ],
        )
        .await?
        .get(0))
}

/// Marks every note of the thread resolved by the bot.
pub async fn resolve(
    db: &impl Queries,
    merge_request_id: i64,
    discussion_id: &str,
    bot_id: i64,
) -> Result<(), tokio_postgres::Error> {
    db.execute(
        "UPDATE notes SET resolved_at = now(), resolved_by_id = $3
         WHERE noteable_type = 'MergeRequest' AND noteable_id = $1 AND discussion_id = $2 AND resolvable",
        &[&merge_request_id, &discussion_id, &bot_id],
    )
    .await?;
    Ok(())
}
