//! `PUT` on issues, merge requests and epics, in GitLab's shapes: title,
//! description, labels (`labels` replaces, `add_labels` and `remove_labels`
//! adjust), assignees, confidentiality, due date, and `state_event`
//! (`close`/`reopen`, recording who closed the item and when). Who may edit is
//! the policy's `may_edit`.

use crate::queries::Queries;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::common::on_constraint;
use super::params::{LabelList, Params};
use super::{ApiError, WRITE_SCOPES, require_user};
use crate::app_state::AppState;
use crate::policy::{Actor, EditableItem};

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
}

/// Which table an update goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Issue,
    MergeRequest,
    Epic,
}

impl Kind {
    fn table(self) -> &'static str {
        match self {
            Kind::Issue => "issues",
            Kind::MergeRequest => "merge_requests",
            Kind::Epic => "epics",
        }
    }

    fn editable(self, id: i64) -> EditableItem {
        match self {
            Kind::Issue => EditableItem::Issue(id),
            Kind::MergeRequest => EditableItem::MergeRequest(id),
            Kind::Epic => EditableItem::Epic(id),
        }
    }
}

impl ItemUpdate {
    fn is_empty(&self) -> bool {
        self.title.is_none()
            && self.description.is_none()
            && self.labels.is_none()
            && self.add_labels.is_none()
            && self.remove_labels.is_none()
            && self.assignee_ids.is_none()
            && self.assignee_id.is_none()
            && self.confidential.is_none()
            && self.due_date.is_none()
            && self.state_event.is_none()
            && self.target_branch.is_none()
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
        .may_edit(&*db, Some(actor), kind.editable(id))
        .await?
    {
        return Err(ApiError::Forbidden);
    }
    Ok(actor)
}

/// Applies the update in one transaction.
pub(super) async fn apply(
    state: &AppState,
    kind: Kind,
    id: i64,
    me: Actor,
    update: ItemUpdate,
) -> Result<(), ApiError> {
    if update.is_empty() {
        return Err(ApiError::BadRequest(
            "title, description, labels, add_labels, remove_labels, assignee_ids, confidential, due_date, state_event are missing, at least one parameter must be provided".into(),
        ));
    }
    let table = kind.table();
    let mut db = state.pool.get().await?;
    let tx = db.transaction().await?;
    let row = tx
        .query_one(
            &format!("SELECT state, labels FROM {table} WHERE id = $1 FOR UPDATE"),
            &[&id],
        )
        .await?;
    let state_now: String = row.get(0);
    let mut labels: Vec<String> = row.get(1);

    if let Some(title) = &update.title {
        if title.trim().is_empty() {
            return Err(ApiError::invalid("title", "can't be blank"));
        }
        set(&tx, table, id, "title", title).await?;
    }
    if let Some(description) = &update.description {
        set(&tx, table, id, "description", description).await?;
    }
    let labels_changed =
        update.labels.is_some() || update.add_labels.is_some() || update.remove_labels.is_some();
    if let Some(new) = update.labels {
        labels = new.0;
    }
    for label in update.add_labels.map(|l| l.0).unwrap_or_default() {
        if !labels.contains(&label) {
            labels.push(label);
        }
    }
    let remove = update.remove_labels.map(|l| l.0).unwrap_or_default();
    labels.retain(|l| !remove.contains(l));
    if labels_changed {
        tx.execute(
            &format!("UPDATE {table} SET labels = $2 WHERE id = $1"),
            &[&id, &labels],
        )
        .await?;
    }
    if let Some(confidential) = update.confidential {
        if kind == Kind::MergeRequest {
            return Err(ApiError::BadRequest(
                "confidential is not a merge request parameter".into(),
            ));
        }
        tx.execute(
            &format!("UPDATE {table} SET confidential = $2 WHERE id = $1"),
            &[&id, &confidential],
        )
        .await?;
    }
    if let Some(due) = &update.due_date {
        if kind != Kind::Issue {
            return Err(ApiError::BadRequest(
                "due_date is not a parameter here".into(),
            ));
        }
        let date = if due.trim().is_empty() {
            None
        } else {
            Some(
                chrono::NaiveDate::parse_from_str(due.trim(), "%Y-%m-%d")
                    .map_err(|_| ApiError::BadRequest("due_date is invalid".into()))?,
            )
        };
        tx.execute(
            "UPDATE issues SET due_date = $2 WHERE id = $1",
            &[&id, &date],
        )
        .await?;
    }
    if let Some(branch) = &update.target_branch {
        if kind != Kind::MergeRequest {
            return Err(ApiError::BadRequest(
                "target_branch is not a parameter here".into(),
            ));
        }
        if branch.trim().is_empty() {
            return Err(ApiError::invalid("target_branch", "can't be blank"));
        }
        set(&tx, table, id, "target_branch", branch).await?;
    }
    let assignees = match (update.assignee_ids, update.assignee_id) {
        (Some(ids), _) => Some(ids.into_iter().filter(|i| *i != 0).collect::<Vec<_>>()),
        (None, Some(0)) => Some(Vec::new()),
        (None, Some(one)) => Some(vec![one]),
        (None, None) => None,
    };
    if let Some(assignees) = assignees {
        if kind != Kind::Issue {
            return Err(ApiError::BadRequest(
                "assignee_ids is not a parameter here".into(),
            ));
        }
        tx.execute("DELETE FROM issue_assignees WHERE issue_id = $1", &[&id])
            .await?;
        for user in assignees {
            tx.execute(
                "INSERT INTO issue_assignees (issue_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&id, &user],
            )
            .await
            .map_err(on_constraint(ApiError::BadRequest("assignee_ids is invalid".into())))?;
        }
    }
    match update.state_event.as_deref() {
        None => {}
        Some("close") if state_now == "opened" => {
            tx.execute(
                &format!(
                    "UPDATE {table} SET state = 'closed', closed_at = now(), closed_by_id = $2 WHERE id = $1"
                ),
                &[&id, &me.id],
            )
            .await?;
        }
        Some("reopen") if state_now == "closed" => {
            tx.execute(
                &format!(
                    "UPDATE {table} SET state = 'opened', closed_at = NULL, closed_by_id = NULL WHERE id = $1"
                ),
                &[&id],
            )
            .await?;
        }
        // Closing a closed item or reopening an open one changes nothing (as GitLab).
        Some("close" | "reopen") if state_now != "merged" && state_now != "locked" => {}
        Some("close" | "reopen") => {
            return Err(ApiError::Invalid(serde_json::json!({
                "state_event": [format!("cannot change the state of a {state_now} merge request")]
            })));
        }
        Some(_) => {
            return Err(ApiError::BadRequest(
                "state_event does not have a valid value".into(),
            ));
        }
    }
    tx.execute(
        &format!("UPDATE {table} SET updated_at = now() WHERE id = $1"),
        &[&id],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn set(
    tx: &impl Queries,
    table: &str,
    id: i64,
    column: &str,
    value: &str,
) -> Result<(), ApiError> {
    tx.execute(
        &format!("UPDATE {table} SET {column} = $2 WHERE id = $1"),
        &[&id, &value],
    )
    .await?;
    Ok(())
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
    apply(&state, Kind::Issue, id, me, body.into_inner()).await?;
    super::issues::show_issue(state, req, web::Path::from((project, iid))).await
}

/// `PUT /projects/:id/merge_requests/:iid`.
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
    apply(&state, Kind::MergeRequest, id, me, body.into_inner()).await?;
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
    let found = super::epics::find_epic(&state, &req, group, "iid", i64::from(iid)).await;
    let id = item_id(found)?;
    let me = editor(&state, &req, Kind::Epic, id).await?;
    apply(&state, Kind::Epic, id, me, body.into_inner()).await?;
    super::epics::show_epic(state, req, web::Path::from((group, iid))).await
}

/// The item's id from a lookup; a 404 of the lookup stays a 404.
fn item_id(found: Result<super::items::Found, ApiError>) -> Result<i64, ApiError> {
    Ok(found?.row.get("id"))
}
