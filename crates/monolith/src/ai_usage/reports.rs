//! What usage looks like from above: events and counts for a group, a
//! project or the instance over a range of days.
//!
//! An event counts for a group or project when the question was asked about
//! a resource in it (for a group: in it or any group below), or when it was
//! asked about no resource by a member of it (a direct or inherited member;
//! for a group also members of groups and projects below it), as GitLab
//! counts Duo Chat users among a group's contributors. Days are UTC days;
//! a range is at most [`MAX_RANGE_DAYS`] long, so every query reads a bounded
//! slice of the day indexes.

use chrono::{DateTime, Duration, NaiveDate, Utc};

use super::UsageError;
use crate::queries::Queries;

/// The longest range a report covers, in days.
pub const MAX_RANGE_DAYS: i64 = 366;
/// The most events or users one page holds.
pub const MAX_PAGE: i64 = 100;

/// Whose usage a report shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageScope {
    Instance,
    Group(i64),
    Project(i64),
}

impl UsageScope {
    fn params(self) -> (&'static str, i64) {
        match self {
            UsageScope::Instance => ("instance", 0),
            UsageScope::Group(id) => ("group", id),
            UsageScope::Project(id) => ("project", id),
        }
    }
}

/// Days from `start` to `end`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateRange {
    pub start: NaiveDate,
    pub end: NaiveDate,
}

impl DateRange {
    /// The range asked for; a missing end is today, a missing start the
    /// end's month before (GitLab's default). Refused: start after end, or
    /// longer than [`MAX_RANGE_DAYS`].
    pub fn new(start: Option<NaiveDate>, end: Option<NaiveDate>) -> Result<Self, UsageError> {
        let end = end.unwrap_or_else(|| Utc::now().date_naive());
        let start = start.unwrap_or(end - Duration::days(30));
        if start > end {
            return Err(UsageError::Invalid(
                "startDate must not be after endDate".into(),
            ));
        }
        if (end - start).num_days() >= MAX_RANGE_DAYS {
            return Err(UsageError::Invalid(format!(
                "the date range may cover at most {MAX_RANGE_DAYS} days"
            )));
        }
        Ok(Self { start, end })
    }

    /// The last `days` days up to today.
    pub fn last_days(days: i64) -> Self {
        let end = Utc::now().date_naive();
        let days = days.clamp(1, MAX_RANGE_DAYS);
        Self {
            start: end - Duration::days(days - 1),
            end,
        }
    }
}

/// The events of a scope and range, as a CTE named `scoped`; its parameters
/// are $1 (scope kind), $2 (group or project id), $3 and $4 (first and last day).
const SCOPED: &str = "
WITH RECURSIVE sub(id) AS (
    SELECT id FROM groups WHERE $1::text = 'group' AND id = $2
    UNION ALL
    SELECT g.id FROM groups g JOIN sub ON g.parent_id = sub.id
), anc(id, parent_id) AS (
    SELECT id, parent_id FROM groups
    WHERE id = CASE $1::text WHEN 'group' THEN $2
                             WHEN 'project' THEN (SELECT group_id FROM projects WHERE id = $2) END
    UNION ALL
    SELECT g.id, g.parent_id FROM groups g JOIN anc ON g.id = anc.parent_id
), scope_projects(id) AS (
    SELECT id FROM projects
    WHERE ($1::text = 'group' AND group_id IN (SELECT id FROM sub))
       OR ($1::text = 'project' AND id = $2)
), scope_members(user_id) AS (
    SELECT user_id FROM group_members
    WHERE group_id IN (SELECT id FROM sub UNION SELECT id FROM anc)
    UNION
    SELECT user_id FROM project_members WHERE project_id IN (SELECT id FROM scope_projects)
), scoped AS (
    SELECT e.* FROM ai_usage_events e
    WHERE e.day BETWEEN $3 AND $4
      AND ($1::text = 'instance'
           OR e.project_id IN (SELECT id FROM scope_projects)
           OR ($1::text = 'group' AND e.namespace_id IN (SELECT id FROM sub))
           OR (e.project_id IS NULL AND e.namespace_id IS NULL
               AND e.user_id IN (SELECT user_id FROM scope_members)))
)";

/// One usage event, as `aiUsageData` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub id: i64,
    pub event: String,
    pub timestamp: DateTime<Utc>,
    pub user_id: i64,
    pub username: String,
}

/// A page of events, newest first, after the event `after` (an id) when given.
pub async fn events(
    db: &impl Queries,
    scope: UsageScope,
    range: DateRange,
    first: i64,
    after: Option<i64>,
) -> Result<(Vec<EventRow>, bool), UsageError> {
    let (kind, id) = scope.params();
    let limit = first.clamp(0, MAX_PAGE) + 1;
    let sql = format!(
        "{SCOPED}
         SELECT s.id, s.event, s.\"timestamp\", s.user_id, u.username
         FROM scoped s JOIN users u ON u.id = s.user_id
         WHERE $5::bigint IS NULL OR s.id < $5
         ORDER BY s.id DESC
         LIMIT $6"
    );
    let rows = db
        .query(
            &sql,
            &[&kind, &id, &range.start, &range.end, &after, &limit],
        )
        .await?;
    let mut events: Vec<EventRow> = rows
        .iter()
        .map(|r| EventRow {
            id: r.get(0),
            event: r.get(1),
            timestamp: r.get(2),
            user_id: r.get(3),
            username: r.get(4),
        })
        .collect();
    let more = events.len() as i64 == limit;
    events.truncate(usize::try_from(limit - 1).unwrap_or(0));
    Ok((events, more))
}

/// Counts for `aiMetrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Metrics {
    /// People who asked Duo Chat at least one question.
    pub duo_chat_contributors: i64,
    /// People who used any recorded AI feature.
    pub duo_used: i64,
    /// Questions asked.
    pub duo_chat_questions: i64,
}

pub async fn metrics(
    db: &impl Queries,
    scope: UsageScope,
    range: DateRange,
) -> Result<Metrics, UsageError> {
    let (kind, id) = scope.params();
    let sql = format!(
        "{SCOPED}
         SELECT count(DISTINCT user_id) FILTER (WHERE event = '{chat}'),
                count(DISTINCT user_id),
                count(*) FILTER (WHERE event = '{chat}')
         FROM scoped",
        chat = super::DUO_CHAT_EVENT
    );
    let row = db
        .query_one(&sql, &[&kind, &id, &range.start, &range.end])
        .await?;
    Ok(Metrics {
        duo_chat_contributors: row.get(0),
        duo_used: row.get(1),
        duo_chat_questions: row.get(2),
    })
}

/// One person's usage, for `aiUserMetrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct UserMetrics {
    pub user_id: i64,
    pub username: String,
    pub duo_chat_interactions: i64,
}

/// The people who used AI in the scope, most questions first.
pub async fn user_metrics(
    db: &impl Queries,
    scope: UsageScope,
    range: DateRange,
    first: i64,
) -> Result<Vec<UserMetrics>, UsageError> {
    let (kind, id) = scope.params();
    let sql = format!(
        "{SCOPED}
         SELECT s.user_id, u.username, count(*) FILTER (WHERE s.event = '{chat}') AS chats
         FROM scoped s JOIN users u ON u.id = s.user_id
         GROUP BY s.user_id, u.username
         ORDER BY chats DESC, s.user_id
         LIMIT $5",
        chat = super::DUO_CHAT_EVENT
    );
    let limit = first.clamp(0, MAX_PAGE);
    let rows = db
        .query(&sql, &[&kind, &id, &range.start, &range.end, &limit])
        .await?;
    Ok(rows
        .iter()
        .map(|r| UserMetrics {
            user_id: r.get(0),
            username: r.get(1),
            duo_chat_interactions: r.get(2),
        })
        .collect())
}

/// The admin page's figures for the whole instance.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Overview {
    /// Every day of the range, oldest first: (day, questions, failed answers).
    pub per_day: Vec<(NaiveDate, i64, i64)>,
    /// Failed answers by Duo error code, most first.
    pub errors: Vec<(String, i64)>,
    /// Questions that ran each tool, most first.
    pub tools: Vec<(String, i64)>,
    /// Questions per category ("Not categorised" for none yet), most first.
    pub categories: Vec<(String, i64)>,
    /// Time to first streamed text per day with answers: (day, p50 ms, p95 ms).
    pub first_token: Vec<(NaiveDate, f64, f64)>,
    /// Estimated tokens over the range: (in, out).
    pub tokens: (i64, i64),
}

/// The label of questions without a category.
pub const UNCATEGORISED: &str = "Not categorised";

pub async fn overview(db: &impl Queries, range: DateRange) -> Result<Overview, UsageError> {
    const JOINED: &str = "ai_usage_events e JOIN ai_chat_question_usage q ON q.event_id = e.id
                          WHERE e.day BETWEEN $1 AND $2";
    let per_day = db
        .query(
            "SELECT d::date, count(q.event_id), count(q.error_code)
             FROM generate_series($1::date, $2::date, interval '1 day') d
             LEFT JOIN ai_usage_events e ON e.day = d::date
             LEFT JOIN ai_chat_question_usage q ON q.event_id = e.id
             GROUP BY d ORDER BY d",
            &[&range.start, &range.end],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let counted = |rows: Vec<tokio_postgres::Row>| -> Vec<(String, i64)> {
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    let errors = counted(
        db.query(
            &format!(
                "SELECT q.error_code, count(*) FROM {JOINED} AND q.error_code IS NOT NULL
                 GROUP BY 1 ORDER BY 2 DESC, 1"
            ),
            &[&range.start, &range.end],
        )
        .await?,
    );
    let tools = counted(
        db.query(
            "SELECT t, count(*)
             FROM ai_usage_events e JOIN ai_chat_question_usage q ON q.event_id = e.id
             CROSS JOIN LATERAL unnest(q.tools) t
             WHERE e.day BETWEEN $1 AND $2
             GROUP BY 1 ORDER BY 2 DESC, 1",
            &[&range.start, &range.end],
        )
        .await?,
    );
    let categories = counted(
        db.query(
            &format!(
                "SELECT coalesce(q.category, '{UNCATEGORISED}'), count(*) FROM {JOINED}
                 GROUP BY 1 ORDER BY 2 DESC, 1"
            ),
            &[&range.start, &range.end],
        )
        .await?,
    );
    let first_token = db
        .query(
            &format!(
                "SELECT e.day,
                        percentile_cont(0.5) WITHIN GROUP (ORDER BY q.first_token_ms),
                        percentile_cont(0.95) WITHIN GROUP (ORDER BY q.first_token_ms)
                 FROM {JOINED} AND q.first_token_ms IS NOT NULL
                 GROUP BY 1 ORDER BY 1"
            ),
            &[&range.start, &range.end],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let tokens = db
        .query_one(
            &format!(
                "SELECT coalesce(sum(q.input_tokens), 0)::bigint,
                        coalesce(sum(q.output_tokens), 0)::bigint FROM {JOINED}"
            ),
            &[&range.start, &range.end],
        )
        .await?;
    Ok(Overview {
        per_day,
        errors,
        tools,
        categories,
        first_token,
        tokens: (tokens.get(0), tokens.get(1)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_bounded() {
        let day = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").ok();
        let range = DateRange::new(day("2025-01-01"), day("2025-01-31")).unwrap();
        assert_eq!((range.end - range.start).num_days(), 30);
        assert!(DateRange::new(day("2025-02-01"), day("2025-01-31")).is_err());
        assert!(DateRange::new(day("2024-01-01"), day("2025-01-31")).is_err());
        assert!(DateRange::new(day("2025-01-01"), day("2025-12-31")).is_ok());
        let last = DateRange::last_days(7);
        assert_eq!((last.end - last.start).num_days(), 6);
    }
}
