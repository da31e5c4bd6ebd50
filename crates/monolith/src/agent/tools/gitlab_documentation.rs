//! `gitlab_documentation`: answers from the GitLab documentation. It asks the
//! gateway's documentation search, then answers with the best passages and
//! their links (`extras.sources`), streamed as the final answer. No passage
//! found → M2000.
//!
//! The gateway has no documentation-answer prompt yet, so the answer is the
//! passages themselves rather than a model's summary of them.

use async_trait::async_trait;
use contracts::{DuoErrorCode, UnitPrimitive};
use serde_json::{Value, json};

use super::{Tool, ToolEnv, ToolInput, ToolOutcome};
use crate::chat::completion::ChatAnswer;

pub struct GitlabDocumentation;

/// Longest passage quoted from one page.
const MAX_PASSAGE_CHARS: usize = 1_500;

#[async_trait]
impl Tool for GitlabDocumentation {
    fn name(&self) -> &'static str {
        "gitlab_documentation"
    }

    fn unit_primitive(&self) -> UnitPrimitive {
        UnitPrimitive::DocumentationSearch
    }

    async fn execute(&self, env: &ToolEnv<'_>, input: &ToolInput) -> ToolOutcome {
        let query = if input.input.trim().is_empty() {
            env.ctx.question.as_str()
        } else {
            input.input.as_str()
        };
        let found = match env.services.gateway.search_docs(&env.ctx.auth, query).await {
            Ok(found) => found,
            Err(err) => return ToolOutcome::failed(err.code(), err.to_string()),
        };
        let results: Vec<_> = found
            .response
            .results
            .into_iter()
            .filter(|r| !r.content.trim().is_empty())
            .collect();
        if results.is_empty() {
            return ToolOutcome::failed(DuoErrorCode::M2000, "no documentation found");
        }
        let mut sources = Vec::new();
        let first = "Here is what the GitLab documentation says:\n\n".to_owned();
        let _ = env.chunks.send(first.clone());
        let mut answer = first;
        for result in &results {
            let title =
                meta(&result.metadata, &["title", "source"]).unwrap_or_else(|| result.id.clone());
            let url = meta(&result.metadata, &["source_url", "url"]);
            let heading = match &url {
                Some(url) => format!("### [{title}]({url})\n\n"),
                None => format!("### {title}\n\n"),
            };
            let piece = format!(
                "{heading}{}\n\n",
                super::resource_identifier::bounded(result.content.trim(), MAX_PASSAGE_CHARS)
            );
            let _ = env.chunks.send(piece.clone());
            answer.push_str(&piece);
            let mut source = serde_json::Map::new();
            source.insert("title".into(), json!(title));
            if let Some(url) = url {
                source.insert("source_url".into(), json!(url));
            }
            for (k, v) in &result.metadata {
                source.entry(k.clone()).or_insert_with(|| v.clone());
            }
            sources.push(Value::Object(source));
        }
        ToolOutcome::Final(ChatAnswer {
            content: answer.trim_end().to_owned(),
            extras: json!({ "sources": sources }),
            error: None,
        })
    }
}

fn meta(metadata: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| metadata.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}
