//! Who may have the review bot review a merge request, or answer a
//! mention: the requester's own rights, never the bot's.

use crate::queries::Queries;

use super::*;

/// Why the bot will not review for this requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCodeReview {
    /// The requester cannot read the merge request: nothing is said there
    /// (saying anything would tell them it exists).
    CannotRead,
    /// Duo features are off for the project (or a group above it, or the
    /// instance).
    DuoOff,
    /// The requester holds no seat that includes code review.
    NoAccess,
}

impl Policy {
    /// Whether the bot may review merge request `merge_request_id` for
    /// `requester`: they read it, Duo is on for its project and their seat
    /// grants `review_merge_request`.
    pub async fn why_no_code_review(
        &self,
        db: &impl Queries,
        requester: Actor,
        merge_request_id: i64,
    ) -> Result<Option<NoCodeReview>, PolicyError> {
        let subject = Subject::MergeRequest(merge_request_id);
        if !self
            .can(db, Some(requester), Ability::ReadMergeRequest, subject)
            .await?
        {
            return Ok(Some(NoCodeReview::CannotRead));
        }
        if !self.duo_features_on_for(db, requester, subject).await? {
            return Ok(Some(NoCodeReview::DuoOff));
        }
        let seated = self
            .seat_unit_primitives(db, requester.id)
            .await?
            .contains(&UnitPrimitive::ReviewMergeRequest);
        if !seated || self.why_no_duo_chat(db, Some(requester)).await? == Some(NoDuoChat::TurnedOff)
        {
            return Ok(Some(NoCodeReview::NoAccess));
        }
        Ok(None)
    }
}
