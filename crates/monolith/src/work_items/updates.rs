//! Changing an issue, merge request or epic in GitLab's terms: title,
//! description, labels (`labels` replaces, `add_labels` and `remove_labels`
//! adjust), assignees, confidentiality, due date, target branch, and
//! `state_event` (`close`/`reopen`, recording who closed the item and when).
//! Who may edit is the policy's `may_edit`, asked before this runs.

use super::{Kind, WorkItemError};
use crate::queries::Queries;

/// Every field an update may change; those a kind does not have are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ItemChanges {
    pub title: Option<String>,
    pub description: Option<String>,
    pub labels: Option<Vec<String>>,
    pub add_labels: Option<Vec<String>>,
    pub remove_labels: Option<Vec<String>>,
    pub assignee_ids: Option<Vec<i64>>,
    /// GitLab's single-assignee form; `0` unassigns.
    pub assignee_id: Option<i64>,
    pub confidential: Option<bool>,
    /// `YYYY-MM-DD`, or blank to clear.
    pub due_date: Option<String>,
    /// `close` or `reopen`.
    pub state_event: Option<String>,
    pub target_branch: Option<String>,
}

impl ItemChanges {
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

/// Applies `changes` to the item in one transaction, as `closer` where it
/// closes it; the first refused field refuses them all.
pub async fn apply(
    client: &mut deadpool_postgres::Client,
    kind: Kind,
    id: i64,
    closer: i64,
    changes: ItemChanges,
) -> Result<(), WorkItemError> {
    if changes.is_empty() {
        return Err(WorkItemError::BadRequest(
            "title, description, labels, add_labels, remove_labels, assignee_ids, confidential, due_date, state_event are missing, at least one parameter must be provided".into(),
        ));
    }
    let table = kind.table();
    let tx = client.transaction().await?;
    let row = tx
        .query_one(
            &format!("SELECT state, labels FROM {table} WHERE id = $1 FOR UPDATE"),
            &[&id],
        )
        .await?;
    let state_now: String = row.get(0);
    let mut labels: Vec<String> = row.get(1);

    if let Some(title) = &changes.title {
        if title.trim().is_empty() {
            return Err(WorkItemError::invalid("title", "can't be blank"));
        }
        set(&tx, table, id, "title", title).await?;
    }
    if let Some(description) = &changes.description {
        set(&tx, table, id, "description", description).await?;
    }
    let labels_changed =
        changes.labels.is_some() || changes.add_labels.is_some() || changes.remove_labels.is_some();
    if let Some(new) = changes.labels {
        labels = new;
    }
    for label in changes.add_labels.unwrap_or_default() {
        if !labels.contains(&label) {
            labels.push(label);
        }
    }
    let remove = changes.remove_labels.unwrap_or_default();
    labels.retain(|l| !remove.contains(l));
    if labels_changed {
        tx.execute(
            &format!("UPDATE {table} SET labels = $2 WHERE id = $1"),
            &[&id, &labels],
        )
        .await?;
    }
    if let Some(confidential) = changes.confidential {
        if kind == Kind::MergeRequest {
            return Err(WorkItemError::BadRequest(
                "confidential is not a merge request parameter".into(),
            ));
        }
        tx.execute(
            &format!("UPDATE {table} SET confidential = $2 WHERE id = $1"),
            &[&id, &confidential],
        )
        .await?;
    }
    if let Some(due) = &changes.due_date {
        if kind != Kind::Issue {
            return Err(WorkItemError::BadRequest(
                "due_date is not a parameter here".into(),
            ));
        }
        let date = if due.trim().is_empty() {
            None
        } else {
            Some(
                chrono::NaiveDate::parse_from_str(due.trim(), "%Y-%m-%d")
                    .map_err(|_| WorkItemError::BadRequest("due_date is invalid".into()))?,
            )
        };
        tx.execute(
            "UPDATE issues SET due_date = $2 WHERE id = $1",
            &[&id, &date],
        )
        .await?;
    }
    if let Some(branch) = &changes.target_branch {
        if kind != Kind::MergeRequest {
            return Err(WorkItemError::BadRequest(
                "target_branch is not a parameter here".into(),
            ));
        }
        if branch.trim().is_empty() {
            return Err(WorkItemError::invalid("target_branch", "can't be blank"));
        }
        set(&tx, table, id, "target_branch", branch).await?;
    }
    let assignees = match (changes.assignee_ids, changes.assignee_id) {
        (Some(ids), _) => Some(ids.into_iter().filter(|i| *i != 0).collect::<Vec<_>>()),
        (None, Some(0)) => Some(Vec::new()),
        (None, Some(one)) => Some(vec![one]),
        (None, None) => None,
    };
    if let Some(assignees) = assignees {
        if kind != Kind::Issue {
            return Err(WorkItemError::BadRequest(
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
            .map_err(WorkItemError::on_constraint(WorkItemError::BadRequest(
                "assignee_ids is invalid".into(),
            )))?;
        }
    }
    match changes.state_event.as_deref() {
        None => {}
        Some("close") if state_now == "opened" => {
            tx.execute(
                &format!(
                    "UPDATE {table} SET state = 'closed', closed_at = now(), closed_by_id = $2 WHERE id = $1"
                ),
                &[&id, &closer],
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
            return Err(WorkItemError::invalid(
                "state_event",
                format!("cannot change the state of a {state_now} merge request"),
            ));
        }
        Some(_) => {
            return Err(WorkItemError::BadRequest(
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
) -> Result<(), WorkItemError> {
    tx.execute(
        &format!("UPDATE {table} SET {column} = $2 WHERE id = $1"),
        &[&id, &value],
    )
    .await?;
    Ok(())
}
