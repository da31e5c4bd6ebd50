//! Reviewers and threads of merge requests: who may set a merge request's
//! reviewers, who may be asked to review it, who may resolve a thread, and
//! for whom the review bot reviews (the requester's own rights, never the
//! bot's).

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
    /// GitLab's `admin_merge_request`, which setting reviewers takes: who
    /// reads the project's merge requests and is a developer or above there
    /// (admins always).
    pub async fn may_set_reviewers(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        project: i64,
    ) -> Result<bool, PolicyError> {
        match Actor::composite(user) {
            Some((human, bot)) => Ok(self.may_set_reviewers_one(db, Some(human), project).await?
                && self.may_set_reviewers_one(db, Some(bot), project).await?),
            None => self.may_set_reviewers_one(db, user, project).await,
        }
    }

    async fn may_set_reviewers_one(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        project: i64,
    ) -> Result<bool, PolicyError> {
        let Some(actor) = user else { return Ok(false) };
        let Some(facts) = self.project_facts(db, user, project).await? else {
            return Ok(false);
        };
        Ok(Self::project_code_readable(&facts, user)
            && (actor.admin || facts.access >= access::DEVELOPER))
    }

    /// Whether user `user_id` may be asked to review the project's merge
    /// requests: the review bot always (when it runs, it acts for whoever
    /// asked, with their access); anyone else when their account is active
    /// and they read the project's merge requests themselves.
    pub async fn may_review(
        &self,
        db: &impl Queries,
        user_id: i64,
        project: i64,
    ) -> Result<bool, PolicyError> {
        let Some(row) = db
            .query_opt(
                "SELECT admin, state, user_type FROM users WHERE id = $1",
                &[&user_id],
            )
            .await?
        else {
            return Ok(false);
        };
        let admin: bool = row.get(0);
        let state: &str = row.get(1);
        let user_type: &str = row.get(2);
        if user_type == REVIEW_BOT_TYPE {
            return Ok(true);
        }
        if state != "active" {
            return Ok(false);
        }
        let user = Some(Actor::user(user_id, admin));
        self.project_allows(db, user, project, Self::project_code_readable)
            .await
    }

    /// GitLab's `resolve_note` on a merge request's thread: who reads the
    /// merge request and started the thread, wrote the merge request, or is
    /// a developer or above of its project (admins always).
    pub async fn may_resolve_thread(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        merge_request: i64,
        thread_author: i64,
    ) -> Result<bool, PolicyError> {
        match Actor::composite(user) {
            Some((human, bot)) => Ok(self
                .may_resolve_one(db, Some(human), merge_request, thread_author)
                .await?
                && self
                    .may_resolve_one(db, Some(bot), merge_request, thread_author)
                    .await?),
            None => {
                self.may_resolve_one(db, user, merge_request, thread_author)
                    .await
            }
        }
    }

    async fn may_resolve_one(
        &self,
        db: &impl Queries,
        user: Option<Actor>,
        merge_request: i64,
        thread_author: i64,
    ) -> Result<bool, PolicyError> {
        let Some(actor) = user else { return Ok(false) };
        if !self
            .can(
                db,
                user,
                Ability::ReadMergeRequest,
                Subject::MergeRequest(merge_request),
            )
            .await?
        {
            return Ok(false);
        }
        let Some(row) = db
            .query_opt(
                "SELECT project_id, author_id FROM merge_requests WHERE id = $1",
                &[&merge_request],
            )
            .await?
        else {
            return Ok(false);
        };
        let author: i64 = row.get(1);
        if actor.admin || actor.id == thread_author || actor.id == author {
            return Ok(true);
        }
        Ok(self
            .access_level(db, user, Subject::Project(row.get(0)))
            .await?
            >= access::DEVELOPER)
    }
}

/// `users.user_type` of GitLab's internal review bot.
const REVIEW_BOT_TYPE: &str = "duo_code_review_bot";

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
