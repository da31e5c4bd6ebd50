//! The conversation history sent with a question: GitLab's rules for which
//! earlier messages of the thread the model sees.

use contracts::{AgentMessage, MessageRole};
use uuid::Uuid;

use crate::chat::{ChatError, HistoryRow};
use crate::queries::Queries;

/// At most this many history messages reach the model.
pub const HISTORY_LIMIT: usize = 50;

/// Loads the thread's messages after its last `/reset`, except those of the
/// request being answered, and applies [`build_history`].
pub async fn load(
    db: &impl Queries,
    thread_id: i64,
    current_request: Uuid,
) -> Result<Vec<AgentMessage>, ChatError> {
    let rows = crate::chat::messages_since_reset(db, thread_id, current_request).await?;
    Ok(build_history(rows))
}

/// GitLab's history rules: drop failed and blank messages; group by request
/// and keep only groups with a question and an answer; within a group keep
/// the last message of each role; order by the group's first message; keep
/// the newest [`HISTORY_LIMIT`] messages.
pub fn build_history(rows: Vec<HistoryRow>) -> Vec<AgentMessage> {
    let mut groups: Vec<(Uuid, Vec<HistoryRow>)> = Vec::new();
    for row in rows {
        if row.has_errors || row.content.trim().is_empty() {
            continue;
        }
        let Some(request) = row.request_xid else {
            continue;
        };
        match groups.iter_mut().find(|(r, _)| *r == request) {
            Some((_, members)) => members.push(row),
            None => groups.push((request, vec![row])),
        }
    }
    groups.sort_by_key(|(_, members)| members.first().map(|m| m.id).unwrap_or(i64::MAX));
    let mut messages = Vec::new();
    for (_, members) in groups {
        let last_user = members.iter().rev().find(|m| m.is_user);
        let last_assistant = members.iter().rev().find(|m| !m.is_user);
        let (Some(user), Some(assistant)) = (last_user, last_assistant) else {
            continue;
        };
        let mut pair = [user, assistant];
        pair.sort_by_key(|m| m.id);
        for m in pair {
            let role = if m.is_user {
                MessageRole::User
            } else {
                MessageRole::Assistant
            };
            messages.push(AgentMessage::new(role, m.content.clone()));
        }
    }
    let skip = messages.len().saturating_sub(HISTORY_LIMIT);
    messages.split_off(skip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, is_user: bool, content: &str, request: u128, has_errors: bool) -> HistoryRow {
        HistoryRow {
            id,
            is_user,
            content: content.into(),
            request_xid: Some(Uuid::from_u128(request)),
            has_errors,
        }
    }

    #[test]
    fn keeps_answered_questions_in_order_and_drops_the_rest() {
        let rows = vec![
            row(1, true, "q1", 1, false),
            row(2, false, "a1", 1, false),
            row(3, true, "q2", 2, false),
            row(4, false, "", 2, true),
            row(5, true, "q3", 3, false),
            row(6, false, "a3 first", 3, false),
            row(7, false, "a3 second", 3, false),
            row(8, true, "   ", 4, false),
        ];
        let history = build_history(rows);
        let texts: Vec<(MessageRole, &str)> = history
            .iter()
            .map(|m| (m.role, m.content.as_str()))
            .collect();
        assert_eq!(
            texts,
            vec![
                (MessageRole::User, "q1"),
                (MessageRole::Assistant, "a1"),
                (MessageRole::User, "q3"),
                (MessageRole::Assistant, "a3 second"),
            ]
        );
    }

    #[test]
    fn only_the_newest_fifty_are_kept() {
        let mut rows = Vec::new();
        for i in 0..40 {
            rows.push(row(i * 2, true, &format!("q{i}"), i as u128, false));
            rows.push(row(i * 2 + 1, false, &format!("a{i}"), i as u128, false));
        }
        let history = build_history(rows);
        assert_eq!(history.len(), HISTORY_LIMIT);
        assert_eq!(history[0].content, "q15");
        assert_eq!(history[49].content, "a39");
    }
}
