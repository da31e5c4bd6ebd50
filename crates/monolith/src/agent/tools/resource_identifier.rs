//! The shared machinery of the issue, epic and merge request readers: find
//! which item a question means, authorize the user for it, and serialise it
//! for the model.
//!
//! Identification tries the plain forms first (a URL of this instance, a full
//! reference such as `group/project#12`, a short reference such as `#12`, or
//! the page the user is on). Only when the question needs interpretation
//! (none or several candidates) does it ask the gateway's identifier prompt
//! (`chat/<kind>_reader`), whose JSON answer is read tolerantly. The prompt
//! only ever sees the user's question and the model's thought.
//!
//! A missing item and one the user may not read end the same way: M3003.

use crate::queries::Queries;
use async_trait::async_trait;
use contracts::{DuoErrorCode, ResourceContext, ResourceType, UnitPrimitive};
use serde_json::{Map, Value, json};

use super::{Tool, ToolEnv, ToolInput, ToolOutcome};
use crate::policy::{ChatAuthError, Subject};

/// Longest description or diff passed to the model, in characters.
pub const MAX_TEXT_CHARS: usize = 20_000;
/// Identifier prompt attempts before giving up with M3003.
const PROMPT_ATTEMPTS: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderKind {
    Issue,
    Epic,
    MergeRequest,
}

impl ReaderKind {
    pub fn tool_name(self) -> &'static str {
        match self {
            Self::Issue => "issue_reader",
            Self::Epic => "epic_reader",
            Self::MergeRequest => "merge_request_reader",
        }
    }

    pub fn noun(self) -> &'static str {
        match self {
            Self::Issue => "issue",
            Self::Epic => "epic",
            Self::MergeRequest => "merge request",
        }
    }

    fn symbol(self) -> char {
        match self {
            Self::Issue => '#',
            Self::Epic => '&',
            Self::MergeRequest => '!',
        }
    }

    fn url_segment(self) -> &'static str {
        match self {
            Self::Issue => "issues",
            Self::Epic => "epics",
            Self::MergeRequest => "merge_requests",
        }
    }

    pub fn unit_primitive(self) -> UnitPrimitive {
        match self {
            Self::Issue => UnitPrimitive::AskIssue,
            Self::Epic => UnitPrimitive::AskEpic,
            Self::MergeRequest => UnitPrimitive::AskMergeRequest,
        }
    }

    fn subject(self, id: i64) -> Subject {
        match self {
            Self::Issue => Subject::Issue(id),
            Self::Epic => Subject::Epic(id),
            Self::MergeRequest => Subject::MergeRequest(id),
        }
    }

    fn id_of(self, subject: Subject) -> Option<i64> {
        match (self, subject) {
            (Self::Issue, Subject::Issue(id))
            | (Self::Epic, Subject::Epic(id))
            | (Self::MergeRequest, Subject::MergeRequest(id)) => Some(id),
            _ => None,
        }
    }

    /// Epics live in groups; issues and merge requests in projects.
    fn in_group(self) -> bool {
        self == Self::Epic
    }
}

/// How a question points at an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identifier {
    /// The item on the user's page.
    Current,
    /// A number within the current project (group for epics).
    Iid(i32),
    /// A link to this instance.
    Url(String),
    /// A full reference: `group/project#12`, `group&3`, `group/project!7`.
    Reference { path: String, iid: i32 },
}

/// The plain forms found in `text`; several means the question is ambiguous.
pub fn direct_candidates(kind: ReaderKind, text: &str, base: &url::Url) -> Vec<Identifier> {
    let mut found: Vec<Identifier> = Vec::new();
    for raw in text.split_whitespace() {
        // Leading '#', '&' and '!' belong to references; trailing punctuation
        // does not (a reference ends in digits, so trimming loses nothing).
        let token = raw
            .trim_start_matches(['(', '"', '\'', '`'])
            .trim_end_matches(|c: char| {
                matches!(
                    c,
                    ',' | '.' | '?' | '!' | ')' | '"' | '\'' | ':' | ';' | '`'
                )
            });
        if token.is_empty() {
            continue;
        }
        let candidate = if token.starts_with("http://") || token.starts_with("https://") {
            parse_url(kind, token, base).map(|_| Identifier::Url(token.to_owned()))
        } else {
            parse_reference(kind, token)
        };
        if let Some(c) = candidate
            && !found.contains(&c)
        {
            found.push(c);
        }
    }
    found
}

/// `#12`, `group/project#12` (and `&`/`!` for epics and merge requests).
fn parse_reference(kind: ReaderKind, token: &str) -> Option<Identifier> {
    let (path, number) = token.rsplit_once(kind.symbol())?;
    let iid: i32 = number.parse().ok().filter(|n| *n > 0)?;
    if path.is_empty() {
        return Some(Identifier::Iid(iid));
    }
    let valid_path = path.split('/').all(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    });
    valid_path.then(|| Identifier::Reference {
        path: path.to_owned(),
        iid,
    })
}

/// A link of this instance: `<base>/<project path>/-/issues/12`,
/// `<base>/groups/<group path>/-/epics/3`. Returns (container path, iid).
fn parse_url(kind: ReaderKind, text: &str, base: &url::Url) -> Option<(String, i32)> {
    let url = url::Url::parse(text).ok()?;
    if url.host_str() != base.host_str()
        || url.port_or_known_default() != base.port_or_known_default()
    {
        return None;
    }
    let base_path = base.path().trim_end_matches('/');
    let path = url.path().strip_prefix(base_path)?.trim_start_matches('/');
    let (container, rest) = path.split_once("/-/")?;
    let mut parts = rest.trim_end_matches('/').split('/');
    if parts.next()? != kind.url_segment() {
        return None;
    }
    let iid: i32 = parts.next()?.parse().ok().filter(|n| *n > 0)?;
    let container = if kind.in_group() {
        container.strip_prefix("groups/")?
    } else {
        container
    };
    Some((container.to_owned(), iid))
}

/// Reads the identifier prompt's answer: the first JSON object in the text,
/// keys in any case, values as strings or numbers.
pub fn parse_identifier_json(kind: ReaderKind, text: &str, base: &url::Url) -> Option<Identifier> {
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    let value: Value = serde_json::from_str(text.get(start..=end)?).ok()?;
    let object = value.as_object()?;
    let get = |key: &str| {
        object
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| match v {
                Value::String(s) => s.trim().to_owned(),
                other => other.to_string(),
            })
    };
    let kind_name = get("ResourceIdentifierType")?.to_ascii_lowercase();
    let identifier = get("ResourceIdentifier").unwrap_or_default();
    match kind_name.as_str() {
        "current" => Some(Identifier::Current),
        "iid" => identifier
            .trim_start_matches(kind.symbol())
            .parse()
            .ok()
            .filter(|n: &i32| *n > 0)
            .map(Identifier::Iid),
        "url" => parse_url(kind, &identifier, base).map(|_| Identifier::Url(identifier)),
        "reference" => parse_reference(kind, &identifier),
        _ => None,
    }
}

async fn container_by_path(
    db: &impl Queries,
    kind: ReaderKind,
    path: &str,
) -> Result<Option<i64>, tokio_postgres::Error> {
    if kind.in_group() {
        crate::namespaces::group_id_by_full_path(db, path).await
    } else {
        crate::namespaces::project_id_by_full_path(db, path).await
    }
}

async fn item_by_iid(
    db: &impl Queries,
    kind: ReaderKind,
    container: i64,
    iid: i32,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let sql = match kind {
        ReaderKind::Issue => "SELECT id FROM issues WHERE project_id = $1 AND iid = $2",
        ReaderKind::Epic => "SELECT id FROM epics WHERE group_id = $1 AND iid = $2",
        ReaderKind::MergeRequest => {
            "SELECT id FROM merge_requests WHERE project_id = $1 AND iid = $2"
        }
    };
    Ok(db
        .query_opt(sql, &[&container, &iid])
        .await?
        .map(|r| r.get(0)))
}

/// The project (group for epics) a short reference is relative to: the
/// container of the page resource.
async fn context_container(
    env: &ToolEnv<'_>,
    db: &impl Queries,
    kind: ReaderKind,
) -> Result<Option<i64>, String> {
    let Some(resource) = env.ctx.resource else {
        return Ok(None);
    };
    let container = env
        .services
        .policy
        .container_of(db, resource)
        .await
        .map_err(|e| e.to_string())?;
    Ok(match (kind.in_group(), container) {
        (true, Some(Subject::Group(id))) | (false, Some(Subject::Project(id))) => Some(id),
        (true, Some(Subject::Project(project))) => db
            .query_opt("SELECT group_id FROM projects WHERE id = $1", &[&project])
            .await
            .map_err(|e| e.to_string())?
            .map(|r| r.get(0)),
        _ => None,
    })
}

/// The item an identifier names, if it exists. Says nothing about access.
async fn resolve(
    env: &ToolEnv<'_>,
    db: &impl Queries,
    kind: ReaderKind,
    identifier: &Identifier,
) -> Result<Option<i64>, String> {
    let by_path = async |path: &str, iid: i32| -> Result<Option<i64>, tokio_postgres::Error> {
        match container_by_path(db, kind, path).await? {
            Some(container) => item_by_iid(db, kind, container, iid).await,
            None => Ok(None),
        }
    };
    match identifier {
        Identifier::Current => Ok(env.ctx.resource.and_then(|s| kind.id_of(s))),
        Identifier::Iid(iid) => match context_container(env, db, kind).await? {
            Some(container) => item_by_iid(db, kind, container, *iid)
                .await
                .map_err(|e| e.to_string()),
            None => Ok(None),
        },
        Identifier::Reference { path, iid } => by_path(path, *iid).await.map_err(|e| e.to_string()),
        Identifier::Url(text) => match parse_url(kind, text, &env.services.external_url) {
            Some((path, iid)) => by_path(&path, iid).await.map_err(|e| e.to_string()),
            None => Ok(None),
        },
    }
}

/// A reader tool for one kind of item.
pub struct ResourceReader {
    pub kind: ReaderKind,
}

impl ResourceReader {
    /// Asks the identifier prompt, up to [`PROMPT_ATTEMPTS`] times.
    async fn ask_prompt(
        &self,
        env: &ToolEnv<'_>,
        input: &ToolInput,
    ) -> Result<Option<Identifier>, ToolOutcome> {
        let mut inputs = Map::new();
        inputs.insert("input".into(), json!(input.input));
        inputs.insert("suggestions".into(), json!(input.suggestions));
        let prompt_id = format!("chat/{}", self.kind.tool_name());
        for attempt in 1..=PROMPT_ATTEMPTS {
            match env
                .services
                .gateway
                .prompt(
                    &env.ctx.auth,
                    &prompt_id,
                    inputs.clone(),
                    env.ctx.model.metadata(),
                )
                .await
            {
                Ok(text) => {
                    if let Some(id) =
                        parse_identifier_json(self.kind, &text, &env.services.external_url)
                    {
                        return Ok(Some(id));
                    }
                    tracing::debug!(attempt, "the identifier prompt answered no usable JSON");
                }
                Err(err) => return Err(ToolOutcome::failed(err.code(), err.to_string())),
            }
        }
        Ok(None)
    }

    async fn identify(
        &self,
        env: &ToolEnv<'_>,
        input: &ToolInput,
    ) -> Result<Option<Identifier>, ToolOutcome> {
        let candidates = direct_candidates(self.kind, &input.input, &env.services.external_url);
        match candidates.as_slice() {
            [one] => return Ok(Some(one.clone())),
            [] if env.ctx.resource.and_then(|s| self.kind.id_of(s)).is_some()
                && !mentions_other_item(&input.input) =>
            {
                return Ok(Some(Identifier::Current));
            }
            _ => {}
        }
        self.ask_prompt(env, input).await
    }
}

/// Whether the text seems to name some item in words ("issue 12"), which the
/// identifier prompt should interpret rather than assuming the current page.
fn mentions_other_item(text: &str) -> bool {
    text.split_whitespace().any(|w| {
        w.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .parse::<u64>()
            .is_ok()
    })
}

#[async_trait]
impl Tool for ResourceReader {
    fn name(&self) -> &'static str {
        self.kind.tool_name()
    }

    fn unit_primitive(&self) -> UnitPrimitive {
        self.kind.unit_primitive()
    }

    async fn execute(&self, env: &ToolEnv<'_>, input: &ToolInput) -> ToolOutcome {
        let not_found = || ToolOutcome::failed(DuoErrorCode::M3003, "not found or not readable");
        let identifier = match self.identify(env, input).await {
            Ok(Some(identifier)) => identifier,
            Ok(None) => return not_found(),
            Err(outcome) => return outcome,
        };
        let db = match env.services.pool.get().await {
            Ok(db) => db,
            Err(e) => return ToolOutcome::failed(DuoErrorCode::M4001, e.to_string()),
        };
        let id = match resolve(env, &*db, self.kind, &identifier).await {
            Ok(Some(id)) => id,
            Ok(None) => return not_found(),
            Err(e) => return ToolOutcome::failed(DuoErrorCode::M4001, e.to_string()),
        };
        let subject = self.kind.subject(id);
        // Authorize before any content is read.
        match env
            .services
            .policy
            .authorize_chat_resource(&*db, Some(env.ctx.actor), subject)
            .await
        {
            Ok(()) => {}
            Err(ChatAuthError::Denied(code)) => {
                return ToolOutcome::failed(code, "not found or not readable");
            }
            Err(ChatAuthError::Policy(e)) => {
                return ToolOutcome::failed(DuoErrorCode::M4001, e.to_string());
            }
        }
        match serialize_subject(&*db, subject, &env.services.external_url).await {
            Ok(Some(context)) => ToolOutcome::Observation(format!(
                "Please use this information about the identified {}: {}",
                self.kind.noun(),
                context.content
            )),
            Ok(None) => not_found(),
            Err(e) => ToolOutcome::failed(DuoErrorCode::M5000, e.to_string()),
        }
    }
}

/// Cuts text to `max` characters, saying so.
pub fn bounded(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}\n[truncated]")
}

/// Escapes text placed between our XML-like tags.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Serialises a readable resource for the model. Callers authorize first.
pub async fn serialize_subject(
    db: &impl Queries,
    subject: Subject,
    base: &url::Url,
) -> Result<Option<ResourceContext>, tokio_postgres::Error> {
    let base = base.as_str().trim_end_matches('/');
    let (resource_type, content) = match subject {
        Subject::Issue(id) => {
            let Some(r) = db
                .query_opt(
                    &format!(
                        "{} SELECT i.iid, i.title, i.description, i.state, i.labels, i.confidential,
                                u.username, paths.full_path || '/' || p.path, to_char(i.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
                         FROM issues i JOIN projects p ON p.id = i.project_id JOIN paths ON paths.id = p.group_id
                         JOIN users u ON u.id = i.author_id WHERE i.id = $1",
                        crate::namespaces::FULL_PATHS
                    ),
                    &[&id],
                )
                .await?
            else {
                return Ok(None);
            };
            let iid: i32 = r.get(0);
            let path: String = r.get(7);
            let labels: Vec<String> = r.get(4);
            (
                ResourceType::Issue,
                format!(
                    "<issue>\n<reference>{path}#{iid}</reference>\n<url>{base}/{path}/-/issues/{iid}</url>\n<title>{}</title>\n<state>{}</state>\n<confidential>{}</confidential>\n<labels>{}</labels>\n<author>@{}</author>\n<created_at>{}</created_at>\n<description>\n{}\n</description>\n</issue>",
                    escape(r.get(1)),
                    r.get::<_, String>(3),
                    r.get::<_, bool>(5),
                    escape(&labels.join(", ")),
                    r.get::<_, String>(6),
                    r.get::<_, String>(8),
                    escape(&bounded(r.get(2), MAX_TEXT_CHARS)),
                ),
            )
        }
        Subject::Epic(id) => {
            let Some(r) = db
                .query_opt(
                    &format!(
                        "{} SELECT e.iid, e.title, e.description, e.state, e.labels, e.confidential,
                                u.username, paths.full_path, to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
                         FROM epics e JOIN paths ON paths.id = e.group_id
                         JOIN users u ON u.id = e.author_id WHERE e.id = $1",
                        crate::namespaces::FULL_PATHS
                    ),
                    &[&id],
                )
                .await?
            else {
                return Ok(None);
            };
            let iid: i32 = r.get(0);
            let path: String = r.get(7);
            let labels: Vec<String> = r.get(4);
            (
                ResourceType::Epic,
                format!(
                    "<epic>\n<reference>{path}&amp;{iid}</reference>\n<url>{base}/groups/{path}/-/epics/{iid}</url>\n<title>{}</title>\n<state>{}</state>\n<confidential>{}</confidential>\n<labels>{}</labels>\n<author>@{}</author>\n<created_at>{}</created_at>\n<description>\n{}\n</description>\n</epic>",
                    escape(r.get(1)),
                    r.get::<_, String>(3),
                    r.get::<_, bool>(5),
                    escape(&labels.join(", ")),
                    r.get::<_, String>(6),
                    r.get::<_, String>(8),
                    escape(&bounded(r.get(2), MAX_TEXT_CHARS)),
                ),
            )
        }
        Subject::MergeRequest(id) => {
            let Some(r) = db
                .query_opt(
                    &format!(
                        "{} SELECT m.iid, m.title, m.description, m.state, m.labels, m.source_branch,
                                m.target_branch, u.username, paths.full_path || '/' || p.path, m.diff,
                                m.project_id
                         FROM merge_requests m JOIN projects p ON p.id = m.project_id JOIN paths ON paths.id = p.group_id
                         JOIN users u ON u.id = m.author_id WHERE m.id = $1",
                        crate::namespaces::FULL_PATHS
                    ),
                    &[&id],
                )
                .await?
            else {
                return Ok(None);
            };
            let iid: i32 = r.get(0);
            let path: String = r.get(8);
            let labels: Vec<String> = r.get(4);
            // Files the project's Duo context exclusion rules exclude leave
            // the diff (their headers stay, saying so).
            let diff = match crate::policy::Policy::context_exclusions(db, r.get(10)).await {
                Ok(exclusions) => exclusions.filter_unified_diff(r.get(9)),
                Err(crate::policy::PolicyError::Db(crate::db::DbError::Query(e))) => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "exclusion rules unavailable; diff left out");
                    String::new()
                }
            };
            (
                ResourceType::MergeRequest,
                format!(
                    "<merge_request>\n<reference>{path}!{iid}</reference>\n<url>{base}/{path}/-/merge_requests/{iid}</url>\n<title>{}</title>\n<state>{}</state>\n<source_branch>{}</source_branch>\n<target_branch>{}</target_branch>\n<labels>{}</labels>\n<author>@{}</author>\n<description>\n{}\n</description>\n<diff>\n{}\n</diff>\n</merge_request>",
                    escape(r.get(1)),
                    r.get::<_, String>(3),
                    escape(r.get(5)),
                    escape(r.get(6)),
                    escape(&labels.join(", ")),
                    r.get::<_, String>(7),
                    escape(&bounded(r.get(2), MAX_TEXT_CHARS)),
                    escape(&bounded(&diff, MAX_TEXT_CHARS)),
                ),
            )
        }
        Subject::Build(id) => {
            let Some(r) = db
                .query_opt(
                    &format!(
                        "{} SELECT b.name, b.stage, b.status, pl.ref, paths.full_path || '/' || p.path, b.log
                         FROM ci_builds b JOIN ci_pipelines pl ON pl.id = b.pipeline_id
                         JOIN projects p ON p.id = b.project_id JOIN paths ON paths.id = p.group_id WHERE b.id = $1",
                        crate::namespaces::FULL_PATHS
                    ),
                    &[&id],
                )
                .await?
            else {
                return Ok(None);
            };
            let path: String = r.get(4);
            let log: String = r.get(5);
            (
                ResourceType::Build,
                format!(
                    "<job>\n<url>{base}/{path}/-/jobs/{id}</url>\n<name>{}</name>\n<stage>{}</stage>\n<status>{}</status>\n<ref>{}</ref>\n<log_tail>\n{}\n</log_tail>\n</job>",
                    escape(r.get(0)),
                    escape(r.get(1)),
                    r.get::<_, String>(2),
                    escape(r.get(3)),
                    escape(&tail(&log, MAX_TEXT_CHARS)),
                ),
            )
        }
        _ => return Ok(None),
    };
    Ok(Some(ResourceContext {
        resource_type,
        content,
    }))
}

/// The last `max` characters of `text`.
pub fn tail(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_owned();
    }
    text.chars().skip(count - max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> url::Url {
        url::Url::parse("http://gitlab.test:3000/").unwrap()
    }

    #[test]
    fn plain_forms_are_found() {
        let b = base();
        assert_eq!(
            direct_candidates(ReaderKind::Issue, "Summarise issue #12, please.", &b),
            vec![Identifier::Iid(12)]
        );
        assert_eq!(
            direct_candidates(ReaderKind::Issue, "what about gl/app#7?", &b),
            vec![Identifier::Reference {
                path: "gl/app".into(),
                iid: 7
            }]
        );
        assert_eq!(
            direct_candidates(ReaderKind::MergeRequest, "review !3!", &b),
            vec![Identifier::Iid(3)]
        );
        let url = "http://gitlab.test:3000/gl/app/-/issues/4";
        assert_eq!(
            direct_candidates(ReaderKind::Issue, &format!("see {url}"), &b),
            vec![Identifier::Url(url.into())]
        );
        assert!(
            direct_candidates(
                ReaderKind::Issue,
                "see http://other.test/gl/app/-/issues/4",
                &b
            )
            .is_empty()
        );
        assert_eq!(
            direct_candidates(ReaderKind::Issue, "#1 and #2", &b).len(),
            2
        );
        assert!(direct_candidates(ReaderKind::Epic, "#1", &b).is_empty());
        assert_eq!(
            parse_url(
                ReaderKind::Epic,
                "http://gitlab.test:3000/groups/gl/sub/-/epics/3",
                &b
            ),
            Some(("gl/sub".into(), 3))
        );
    }

    #[test]
    fn identifier_json_is_read_tolerantly() {
        let b = base();
        let k = ReaderKind::Issue;
        assert_eq!(
            parse_identifier_json(
                k,
                "Sure! {\"ResourceIdentifierType\": \"iid\", \"ResourceIdentifier\": \"#5\"} done",
                &b
            ),
            Some(Identifier::Iid(5))
        );
        assert_eq!(
            parse_identifier_json(
                k,
                "{\"resourceidentifiertype\":\"IID\",\"resourceidentifier\":5}",
                &b
            ),
            Some(Identifier::Iid(5))
        );
        assert_eq!(
            parse_identifier_json(
                k,
                "{\"ResourceIdentifierType\":\"current\",\"ResourceIdentifier\":\"current\"}",
                &b
            ),
            Some(Identifier::Current)
        );
        assert_eq!(parse_identifier_json(k, "no json here", &b), None);
        assert_eq!(
            parse_identifier_json(k, "{\"ResourceIdentifierType\":\"guess\"}", &b),
            None
        );
    }

    #[test]
    fn bounded_and_tail_cut_long_text() {
        assert_eq!(bounded("abc", 5), "abc");
        assert_eq!(bounded("abcdef", 3), "abc\n[truncated]");
        assert_eq!(tail("abcdef", 2), "ef");
    }
}
