//! The shared machinery of the issue, epic and merge request readers: find
//! which item a question means, then hand it to the work items domain, which
//! authorizes the user for it and serialises it for the model.
//!
//! Identification tries the plain forms first (a URL of this instance, a full
//! reference such as `group/project#12`, a short reference such as `#12`, or
//! the page the user is on). Only when the question needs interpretation
//! (none or several candidates) does it ask the gateway's identifier prompt
//! (`chat/<kind>_reader`), whose JSON answer is read tolerantly. The prompt
//! only ever sees the user's question and the model's thought.
//!
//! Reading the item is the work items domain's [`read_for_ai`]: a missing
//! item and one the user may not read end the same way, M3003.

use crate::queries::Queries;
use async_trait::async_trait;
use contracts::{DuoErrorCode, UnitPrimitive};
use serde_json::{Map, Value, json};

use super::{Tool, ToolEnv, ToolInput, ToolOutcome};
use crate::agent::{RequestContext, Services};
use crate::policy::Subject;
use crate::work_items::{self, AiReadError, read_for_ai};

// The text limits other tools share with the work item serialization.
pub use crate::work_items::ai_serialization::{MAX_TEXT_CHARS, bounded, tail};
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

    /// The work item kind this reader reads.
    pub fn item_kind(self) -> work_items::Kind {
        match self {
            Self::Issue => work_items::Kind::Issue,
            Self::Epic => work_items::Kind::Epic,
            Self::MergeRequest => work_items::Kind::MergeRequest,
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
        self.item_kind().in_group()
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
    let path = crate::agent::instance_links::path_below(text, base)?;
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

/// The project (group for epics) a short reference is relative to: the
/// container of the page resource.
async fn context_container(
    services: &Services,
    ctx: &RequestContext,
    db: &impl Queries,
    kind: ReaderKind,
) -> Result<Option<i64>, String> {
    let Some(resource) = ctx.resource else {
        return Ok(None);
    };
    let container = services
        .policy
        .container_of(db, resource)
        .await
        .map_err(|e| e.to_string())?;
    Ok(match (kind.in_group(), container) {
        (true, Some(Subject::Group(id))) | (false, Some(Subject::Project(id))) => Some(id),
        (true, Some(Subject::Project(project))) => crate::namespaces::group_of_project(db, project)
            .await
            .map_err(|e| e.to_string())?,
        _ => None,
    })
}

/// The item an identifier names, if it exists. Says nothing about access.
pub(crate) async fn resolve(
    services: &Services,
    ctx: &RequestContext,
    db: &impl Queries,
    kind: ReaderKind,
    identifier: &Identifier,
) -> Result<Option<i64>, String> {
    let by_path = async |path: &str, iid: i32| -> Result<Option<i64>, tokio_postgres::Error> {
        match container_by_path(db, kind, path).await? {
            Some(container) => work_items::id_by_iid(db, kind.item_kind(), container, iid).await,
            None => Ok(None),
        }
    };
    match identifier {
        Identifier::Current => Ok(ctx.resource.and_then(|s| kind.id_of(s))),
        Identifier::Iid(iid) => match context_container(services, ctx, db, kind).await? {
            Some(container) => work_items::id_by_iid(db, kind.item_kind(), container, *iid)
                .await
                .map_err(|e| e.to_string()),
            None => Ok(None),
        },
        Identifier::Reference { path, iid } => by_path(path, *iid).await.map_err(|e| e.to_string()),
        Identifier::Url(text) => match parse_url(kind, text, &services.external_url) {
            Some((path, iid)) => by_path(&path, iid).await.map_err(|e| e.to_string()),
            None => Ok(None),
        },
    }
}

/// A work item the tool could not read, as its coded failure. The code is
/// the domain's ([`AiReadError::code`]), so every reader answers the same
/// refusal or failure alike.
impl From<AiReadError> for ToolOutcome {
    fn from(e: AiReadError) -> Self {
        ToolOutcome::failed(e.code(), e.to_string())
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
        let not_found = || AiReadError::Refused(DuoErrorCode::M3003).into();
        let identifier = match self.identify(env, input).await {
            Ok(Some(identifier)) => identifier,
            Ok(None) => return not_found(),
            Err(outcome) => return outcome,
        };
        let db = match env.services.pool.get().await {
            Ok(db) => db,
            Err(e) => return AiReadError::failed(e).into(),
        };
        let id = match resolve(env.services, env.ctx, &*db, self.kind, &identifier).await {
            Ok(Some(id)) => id,
            Ok(None) => return not_found(),
            Err(e) => return AiReadError::failed(e).into(),
        };
        let subject = self.kind.item_kind().subject(id);
        match read_for_ai(
            &env.services.policy,
            &*db,
            env.ctx.actor,
            subject,
            &env.services.external_url,
        )
        .await
        {
            Ok(context) => ToolOutcome::Observation(format!(
                "Please use this information about the identified {}: {}",
                self.kind.noun(),
                context.content
            )),
            Err(e) => e.into(),
        }
    }
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
}
