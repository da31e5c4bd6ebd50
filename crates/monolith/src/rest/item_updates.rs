//! `PUT` on issues, merge requests and epics, in GitLab's shapes (the
//! changes themselves are the work items domain's [`updates`]). Who may edit
//! is the policy's `may_edit`.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::params::{LabelList, Params};
use super::{ApiError, WRITE_SCOPES, require_user};
use crate::app_state::AppState;
use crate::policy::{Actor, EditableItem};
use crate::work_items::epics::EpicKey;
use crate::work_items::updates::{self, ItemChanges};
use crate::work_items::{Identified, Kind};

/// Every field a `PUT` may change; those a kind does not have are refused.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ItemUpdate {
    title: Option<String>,
    description: Option<String>,
    labels: Option<LabelList>,
    add_labels: Option<LabelList>,
    remove_labels: Option<LabelList>,
    assignee_ids: Option<Vec<i64>>,
    assignee_id: Option<i64>,
    confidential: Option<bool>,
    due_date: Option<String>,
    state_event: Option<String>,
    target_branch: Option<String>,
    /// Merge requests: replaces the reviewers (see `merge_requests::checked_reviewers`).
    reviewer_ids: Option<Vec<i64>>,
}

impl ItemUpdate {
    /// The changes of an item without reviewers (issues, epics).
    fn without_reviewers(self) -> Result<ItemChanges, ApiError> {
        if self.reviewer_ids.is_some() {
            return Err(ApiError::BadRequest(
                "reviewer_ids is not a parameter here".into(),
            ));
        }
        Ok(self.into())
    }
}

impl From<ItemUpdate> for ItemChanges {
    fn from(u: ItemUpdate) -> Self {
        ItemChanges {
            title: u.title,
            description: u.description,
            labels: u.labels.map(|l| l.0),
            add_labels: u.add_labels.map(|l| l.0),
            remove_labels: u.remove_labels.map(|l| l.0),
            assignee_ids: u.assignee_ids,
            assignee_id: u.assignee_id,
            confidential: u.confidential,
            due_date: u.due_date,
            state_event: u.state_event,
            target_branch: u.target_branch,
        }
    }
}

fn editable(kind: Kind, id: i64) -> EditableItem {
    match kind {
        Kind::Issue => EditableItem::Issue(id),
        Kind::MergeRequest => EditableItem::MergeRequest(id),
        Kind::Epic => EditableItem::Epic(id),
    }
}

/// The signed-in caller, after checking they may edit the item they can read
/// (the lookup before this answered 404 for an item they cannot read).
pub(super) async fn editor(
    state: &AppState,
    req: &HttpRequest,
    kind: Kind,
    id: i64,
) -> Result<Actor, ApiError> {
    let me = require_user(state, req, WRITE_SCOPES).await?;
    let actor = Actor::from(&me);
    let db = state.pool.get().await?;
    if !state
        .policy
        .may_edit(&*db, Some(actor), editable(kind, id))
        .await?
    {
        return Err(ApiError::Forbidden);
    }
    Ok(actor)
}

/// Applies the changes in one transaction.
pub(super) async fn apply(
    state: &AppState,
    kind: Kind,
    id: i64,
    me: Actor,
    changes: ItemChanges,
) -> Result<(), ApiError> {
    let mut db = state.pool.get().await?;
    Ok(updates::apply(&mut db, kind, id, me.id, changes).await?)
}

/// `PUT /projects/:id/issues/:iid`.
pub(super) async fn update_issue(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    body: Params<ItemUpdate>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let found = super::issues::find_issue(&state, &req, project, iid).await;
    let id = item_id(found)?;
    let me = editor(&state, &req, Kind::Issue, id).await?;
    let changes = body.into_inner().without_reviewers()?;
    apply(&state, Kind::Issue, id, me, changes).await?;
    super::issues::show_issue(state, req, web::Path::from((project, iid))).await
}

/// `PUT /projects/:id/merge_requests/:iid`; `reviewer_ids` alone is an
/// update too. Reviewers are checked before anything changes.
pub(super) async fn update_merge_request(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    body: Params<ItemUpdate>,
) -> Result<HttpResponse, ApiError> {
    let (project, iid) = path.into_inner();
    let found = super::merge_requests::find_merge_request(&state, &req, project, iid).await;
    let id = item_id(found)?;
    let me = editor(&state, &req, Kind::MergeRequest, id).await?;
    let mut update = body.into_inner();
    let reviewers = match update.reviewer_ids.take() {
        Some(ids) => {
            Some(super::merge_requests::checked_reviewers(&state, me, project, &ids).await?)
        }
        None => None,
    };
    let changes = ItemChanges::from(update);
    if reviewers.is_none() || changes != ItemChanges::default() {
        apply(&state, Kind::MergeRequest, id, me, changes).await?;
    }
    if let Some(ids) = reviewers {
        super::merge_requests::save_reviewers(&state, me.id, project, iid, id, &ids).await?;
    }
    super::merge_requests::show_merge_request(state, req, web::Path::from((project, iid))).await
}

/// `PUT /groups/:id/epics/:iid`.
pub(super) async fn update_epic(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(i64, i32)>,
    body: Params<ItemUpdate>,
) -> Result<HttpResponse, ApiError> {
    let (group, iid) = path.into_inner();
    let found = super::epics::find_epic(&state, &req, group, EpicKey::Iid(i64::from(iid))).await;
    let id = item_id(found)?;
    let me = editor(&state, &req, Kind::Epic, id).await?;
    let changes = body.into_inner().without_reviewers()?;
    apply(&state, Kind::Epic, id, me, changes).await?;
    super::epics::show_epic(state, req, web::Path::from((group, iid))).await
}

/// The item's id from a lookup; a 404 of the lookup stays a 404.
fn item_id<T: Identified>(
    found: Result<super::item_access::Found<T>, ApiError>,
) -> Result<i64, ApiError> {
    Ok(found?.item.id())
}
