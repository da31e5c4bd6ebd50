//! What the chat tools and the page context send to the AI gateway about a
//! work item: a small XML-like document per kind (GitLab's
//! `serialize_for_ai`), with long text cut and our tags escaped. Callers
//! authorize first; [`super::ai::read_for_ai`] does both.

use contracts::{ResourceContext, ResourceType};

use crate::policy::Subject;
use crate::queries::Queries;

/// Longest description or diff passed to the model, in characters.
pub const MAX_TEXT_CHARS: usize = 20_000;

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
pub async fn serialize_for_ai(
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
            (
                ResourceType::Issue,
                planning_item(
                    "issue",
                    &format!("{path}#{iid}"),
                    &format!("{base}/{path}/-/issues/{iid}"),
                    &r,
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
            (
                ResourceType::Epic,
                planning_item(
                    "epic",
                    &format!("{path}&amp;{iid}"),
                    &format!("{base}/groups/{path}/-/epics/{iid}"),
                    &r,
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
            let document = AiDocument::new("merge_request")
                .field("reference", format!("{path}!{iid}"))
                .field("url", format!("{base}/{path}/-/merge_requests/{iid}"))
                .field("title", escape(r.get(1)))
                .field("state", r.get::<_, String>(3))
                .field("source_branch", escape(r.get(5)))
                .field("target_branch", escape(r.get(6)))
                .field("labels", escape(&labels.join(", ")))
                .field("author", format!("@{}", r.get::<_, String>(7)))
                .block("description", escape(&bounded(r.get(2), MAX_TEXT_CHARS)))
                .block("diff", escape(&bounded(&diff, MAX_TEXT_CHARS)));
            (ResourceType::MergeRequest, document.finish())
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
            let document = AiDocument::new("job")
                .field("url", format!("{base}/{path}/-/jobs/{id}"))
                .field("name", escape(r.get(0)))
                .field("stage", escape(r.get(1)))
                .field("status", r.get::<_, String>(2))
                .field("ref", escape(r.get(3)))
                .block("log_tail", escape(&tail(&log, MAX_TEXT_CHARS)));
            (ResourceType::Build, document.finish())
        }
        _ => return Ok(None),
    };
    Ok(Some(ResourceContext {
        resource_type,
        content,
    }))
}

/// An issue or an epic (the same facts, read by the same columns: iid,
/// title, description, state, labels, confidential, author, path, created).
fn planning_item(tag: &'static str, reference: &str, url: &str, r: &tokio_postgres::Row) -> String {
    let labels: Vec<String> = r.get(4);
    AiDocument::new(tag)
        .field("reference", reference)
        .field("url", url)
        .field("title", escape(r.get(1)))
        .field("state", r.get::<_, String>(3))
        .field("confidential", r.get::<_, bool>(5))
        .field("labels", escape(&labels.join(", ")))
        .field("author", format!("@{}", r.get::<_, String>(6)))
        .field("created_at", r.get::<_, String>(8))
        .block("description", escape(&bounded(r.get(2), MAX_TEXT_CHARS)))
        .finish()
}

/// A resource as the model reads it: `<tag>` holding one element per fact,
/// one per line; long texts (`block`) on lines of their own. Values are
/// written as given: callers escape what users wrote.
struct AiDocument {
    tag: &'static str,
    text: String,
}

impl AiDocument {
    fn new(tag: &'static str) -> Self {
        Self {
            tag,
            text: format!("<{tag}>\n"),
        }
    }

    fn field(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        use std::fmt::Write;
        let _ = writeln!(self.text, "<{name}>{value}</{name}>");
        self
    }

    fn block(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        use std::fmt::Write;
        let _ = writeln!(self.text, "<{name}>\n{value}\n</{name}>");
        self
    }

    fn finish(mut self) -> String {
        self.text.push_str("</");
        self.text.push_str(self.tag);
        self.text.push('>');
        self.text
    }
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

    #[test]
    fn bounded_and_tail_cut_long_text() {
        assert_eq!(bounded("abc", 5), "abc");
        assert_eq!(bounded("abcdef", 3), "abc\n[truncated]");
        assert_eq!(tail("abcdef", 2), "ef");
    }

    #[test]
    fn our_tags_are_escaped() {
        assert_eq!(escape("<a> & b"), "&lt;a&gt; &amp; b");
    }
}
