//! The events the API records that start Duo's work (see
//! [`crate::review::triggers`]): reviewers added to a merge request, and a
//! note written on an issue or merge request (a mention of the review bot).
//! Enqueuing is best effort: the change the request made stays, and a
//! failure to enqueue is logged, not answered.

use crate::queries::Queries;

/// After reviewers were saved: a review when the bot is among `added`.
pub(super) async fn reviewers_added(
    db: &impl Queries,
    project: i64,
    merge_request_iid: i32,
    requester: i64,
    added: &[i64],
) {
    if added.is_empty() {
        return;
    }
    if let Err(e) =
        crate::review::triggers::reviewers_added(db, project, merge_request_iid, requester, added)
            .await
    {
        tracing::warn!(error = %e, project, merge_request_iid, "could not enqueue the Duo review");
    }
}

/// After a note was written on an issue or merge request (`noteable_type`
/// `Issue` or `MergeRequest`): a reply or a review when it mentions the bot.
pub(super) async fn note_created(
    db: &impl Queries,
    project: i64,
    noteable_type: &str,
    noteable_iid: i32,
    note_id: i64,
    author: i64,
    body: &str,
) {
    if let Err(e) = crate::review::triggers::note_created(
        db,
        project,
        noteable_type,
        noteable_iid,
        note_id,
        author,
        body,
    )
    .await
    {
        tracing::warn!(error = %e, project, note_id, "could not enqueue Duo's answer to a mention");
    }
}
