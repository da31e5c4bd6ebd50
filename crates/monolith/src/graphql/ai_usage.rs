//! AI analytics in GitLab's shapes: `group(fullPath)` and `project(fullPath)`
//! with `aiUsageData { all(startDate, endDate) { nodes { event timestamp
//! user { username } } } }`, `aiMetrics(startDate, endDate)` and
//! `aiUserMetrics(startDate, endDate)`.
//!
//! A group or project the caller cannot read is `null`, as one that does
//! not exist. Its analytics need the policy's `may_read_ai_analytics`
//! (admins, reporters and above) and a token that may read (`api` or
//! `read_api`); otherwise the field is `null` with a `FORBIDDEN` error.
//! Ranges are at most a year; pages at most 100 nodes.

use chrono::NaiveDate;
use juniper::{FieldResult, GraphQLEnum, GraphQLObject, GraphQLScalar, graphql_object};

use super::{GqlContext, GroupId, PageInfo, ProjectId, Time, UserId, coded, internal};
use crate::ai_usage::reports::{self, DateRange, MAX_PAGE, UsageScope};
use crate::ai_usage::{DUO_CHAT_EVENT, UsageError};
use crate::gid;
use crate::policy::{Ability, Subject};

/// GitLab's `Date`: an ISO 8601 calendar day (`2025-01-31`).
#[derive(Debug, Clone, PartialEq, GraphQLScalar)]
#[graphql(name = "Date", transparent)]
pub struct Date(pub String);

impl Date {
    fn day(&self) -> FieldResult<NaiveDate> {
        NaiveDate::parse_from_str(&self.0, "%Y-%m-%d").map_err(|_| {
            coded(
                format!("{} is not a date (YYYY-MM-DD)", self.0),
                "ARGUMENT_ERROR",
            )
        })
    }
}

fn range(start: Option<Date>, end: Option<Date>) -> FieldResult<DateRange> {
    let start = start.as_ref().map(Date::day).transpose()?;
    let end = end.as_ref().map(Date::day).transpose()?;
    DateRange::new(start, end).map_err(usage_error)
}

fn usage_error(e: UsageError) -> juniper::FieldError {
    match e {
        UsageError::Invalid(message) => coded(message, "ARGUMENT_ERROR"),
        other => internal(other),
    }
}

fn page_size(first: Option<i32>) -> i64 {
    first.map_or(MAX_PAGE, |n| i64::from(n).clamp(0, MAX_PAGE))
}

/// `group(fullPath:)`: the group when the caller may read it.
pub async fn group(ctx: &GqlContext, full_path: &str) -> FieldResult<Option<Group>> {
    let db = ctx.pool.get().await.map_err(internal)?;
    let Some(id) = crate::namespaces::group_id_by_full_path(&*db, full_path)
        .await
        .map_err(internal)?
    else {
        return Ok(None);
    };
    let readable = ctx
        .policy
        .can(&*db, ctx.user, Ability::ReadGroup, Subject::Group(id))
        .await
        .map_err(internal)?;
    Ok(readable.then(|| Group {
        id,
        full_path: full_path.to_owned(),
    }))
}

/// `project(fullPath:)`: the project when the caller may read it.
pub async fn project(ctx: &GqlContext, full_path: &str) -> FieldResult<Option<Project>> {
    let db = ctx.pool.get().await.map_err(internal)?;
    let Some(id) = crate::namespaces::project_id_by_full_path(&*db, full_path)
        .await
        .map_err(internal)?
    else {
        return Ok(None);
    };
    let readable = ctx
        .policy
        .can(&*db, ctx.user, Ability::ReadProject, Subject::Project(id))
        .await
        .map_err(internal)?;
    Ok(readable.then(|| Project {
        id,
        full_path: full_path.to_owned(),
    }))
}

/// The scope's analytics, once the caller is allowed to read them.
async fn analytics(ctx: &GqlContext, container: Subject) -> FieldResult<UsageScope> {
    let db = ctx.pool.get().await.map_err(internal)?;
    let allowed = ctx
        .policy
        .may_read_ai_analytics(&*db, ctx.user, container)
        .await
        .map_err(internal)?;
    if !allowed {
        return Err(coded(
            "You don't have permission to read AI analytics here",
            "FORBIDDEN",
        ));
    }
    ctx.access.require_read()?;
    Ok(match container {
        Subject::Group(id) => UsageScope::Group(id),
        Subject::Project(id) => UsageScope::Project(id),
        _ => UsageScope::Instance,
    })
}

pub struct Group {
    id: i64,
    full_path: String,
}

#[graphql_object]
#[graphql(name = "Group", context = GqlContext)]
impl Group {
    fn id(&self) -> GroupId {
        GroupId(gid::format("Group", self.id))
    }
    fn full_path(&self) -> &str {
        &self.full_path
    }
    /// AI usage events of the group and everything below it.
    async fn ai_usage_data(&self, ctx: &GqlContext) -> FieldResult<Option<AiUsageData>> {
        let scope = analytics(ctx, Subject::Group(self.id)).await?;
        Ok(Some(AiUsageData { scope }))
    }
    async fn ai_metrics(
        &self,
        ctx: &GqlContext,
        start_date: Option<Date>,
        end_date: Option<Date>,
    ) -> FieldResult<Option<AiMetrics>> {
        let scope = analytics(ctx, Subject::Group(self.id)).await?;
        ai_metrics(ctx, scope, range(start_date, end_date)?)
            .await
            .map(Some)
    }
    async fn ai_user_metrics(
        &self,
        ctx: &GqlContext,
        start_date: Option<Date>,
        end_date: Option<Date>,
        first: Option<i32>,
    ) -> FieldResult<Option<AiUserMetricsConnection>> {
        let scope = analytics(ctx, Subject::Group(self.id)).await?;
        ai_user_metrics(ctx, scope, range(start_date, end_date)?, first)
            .await
            .map(Some)
    }
}

pub struct Project {
    id: i64,
    full_path: String,
}

#[graphql_object]
#[graphql(name = "Project", context = GqlContext)]
impl Project {
    fn id(&self) -> ProjectId {
        ProjectId(gid::format("Project", self.id))
    }
    fn full_path(&self) -> &str {
        &self.full_path
    }
    /// AI usage events of the project.
    async fn ai_usage_data(&self, ctx: &GqlContext) -> FieldResult<Option<AiUsageData>> {
        let scope = analytics(ctx, Subject::Project(self.id)).await?;
        Ok(Some(AiUsageData { scope }))
    }
    async fn ai_metrics(
        &self,
        ctx: &GqlContext,
        start_date: Option<Date>,
        end_date: Option<Date>,
    ) -> FieldResult<Option<AiMetrics>> {
        let scope = analytics(ctx, Subject::Project(self.id)).await?;
        ai_metrics(ctx, scope, range(start_date, end_date)?)
            .await
            .map(Some)
    }
    async fn ai_user_metrics(
        &self,
        ctx: &GqlContext,
        start_date: Option<Date>,
        end_date: Option<Date>,
        first: Option<i32>,
    ) -> FieldResult<Option<AiUserMetricsConnection>> {
        let scope = analytics(ctx, Subject::Project(self.id)).await?;
        ai_user_metrics(ctx, scope, range(start_date, end_date)?, first)
            .await
            .map(Some)
    }
}

pub struct AiUsageData {
    scope: UsageScope,
}

#[graphql_object]
#[graphql(name = "AiUsageData", context = GqlContext)]
impl AiUsageData {
    /// Every recorded event in the range, newest first.
    async fn all(
        &self,
        ctx: &GqlContext,
        start_date: Option<Date>,
        end_date: Option<Date>,
        first: Option<i32>,
        after: Option<String>,
    ) -> FieldResult<AiUsageEventConnection> {
        let range = range(start_date, end_date)?;
        let after = after
            .map(|cursor| {
                cursor
                    .parse::<i64>()
                    .map_err(|_| coded("after is not a cursor of this list", "ARGUMENT_ERROR"))
            })
            .transpose()?;
        let db = ctx.pool.get().await.map_err(internal)?;
        let (rows, more) = reports::events(&*db, self.scope, range, page_size(first), after)
            .await
            .map_err(usage_error)?;
        let cursor = |row: Option<&reports::EventRow>| row.map(|r| r.id.to_string());
        Ok(AiUsageEventConnection {
            page_info: PageInfo {
                start_cursor: cursor(rows.first()),
                end_cursor: cursor(rows.last()),
                has_next_page: more,
                has_previous_page: after.is_some(),
            },
            nodes: rows
                .into_iter()
                .map(|r| AiUsageEvent {
                    id: juniper::ID::new(gid::format("Ai::UsageEvent", r.id)),
                    event: AiUsageEventType::from_name(&r.event),
                    timestamp: Time(
                        r.timestamp
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    ),
                    user: UserCore {
                        id: UserId(gid::format("User", r.user_id)),
                        username: r.username,
                    },
                })
                .collect(),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, GraphQLEnum)]
#[graphql(name = "AiUsageEventType")]
pub enum AiUsageEventType {
    /// A Duo Chat answer was requested.
    RequestDuoChatResponse,
    /// An event this version does not name.
    Unknown,
}

impl AiUsageEventType {
    fn from_name(name: &str) -> Self {
        if name == DUO_CHAT_EVENT {
            Self::RequestDuoChatResponse
        } else {
            Self::Unknown
        }
    }
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "UserCore")]
pub struct UserCore {
    pub id: UserId,
    pub username: String,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiUsageEvent")]
pub struct AiUsageEvent {
    pub id: juniper::ID,
    pub event: AiUsageEventType,
    pub timestamp: Time,
    pub user: UserCore,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiUsageEventConnection")]
pub struct AiUsageEventConnection {
    pub nodes: Vec<AiUsageEvent>,
    pub page_info: PageInfo,
}

/// GitLab's `AiMetrics`, with the counts this instance records.
#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiMetrics")]
pub struct AiMetrics {
    /// People who asked Duo Chat at least one question in the range.
    pub duo_chat_contributors_count: Option<i32>,
    /// People who used any recorded AI feature in the range.
    pub duo_used_count: Option<i32>,
    /// Always null: code suggestions go from the IDE to the AI gateway
    /// directly, so this instance does not see them.
    pub code_suggestions_contributors_count: Option<i32>,
}

async fn ai_metrics(
    ctx: &GqlContext,
    scope: UsageScope,
    range: DateRange,
) -> FieldResult<AiMetrics> {
    let db = ctx.pool.get().await.map_err(internal)?;
    let metrics = reports::metrics(&*db, scope, range)
        .await
        .map_err(usage_error)?;
    let count = |n: i64| Some(i32::try_from(n).unwrap_or(i32::MAX));
    Ok(AiMetrics {
        duo_chat_contributors_count: count(metrics.duo_chat_contributors),
        duo_used_count: count(metrics.duo_used),
        code_suggestions_contributors_count: None,
    })
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiUserMetrics")]
pub struct AiUserMetrics {
    pub user: UserCore,
    /// Duo Chat questions the person asked in the range.
    pub duo_chat_interactions_count: Option<i32>,
    /// Always null (see `AiMetrics.codeSuggestionsContributorsCount`).
    pub code_suggestions_accepted_count: Option<i32>,
}

#[derive(Debug, Clone, GraphQLObject)]
#[graphql(name = "AiUserMetricsConnection")]
pub struct AiUserMetricsConnection {
    pub nodes: Vec<AiUserMetrics>,
    pub page_info: PageInfo,
}

async fn ai_user_metrics(
    ctx: &GqlContext,
    scope: UsageScope,
    range: DateRange,
    first: Option<i32>,
) -> FieldResult<AiUserMetricsConnection> {
    let db = ctx.pool.get().await.map_err(internal)?;
    let rows = reports::user_metrics(&*db, scope, range, page_size(first))
        .await
        .map_err(usage_error)?;
    Ok(AiUserMetricsConnection {
        nodes: rows
            .into_iter()
            .map(|r| AiUserMetrics {
                user: UserCore {
                    id: UserId(gid::format("User", r.user_id)),
                    username: r.username,
                },
                duo_chat_interactions_count: Some(
                    i32::try_from(r.duo_chat_interactions).unwrap_or(i32::MAX),
                ),
                code_suggestions_accepted_count: None,
            })
            .collect(),
        page_info: PageInfo::single_page(),
    })
}
