//! `gitlab_documentation`: answers from the GitLab documentation. It asks the
//! gateway's documentation search, then has the model write the answer from
//! the passages found (the gateway's `chat/documentation_search` prompt, with
//! each passage's title and link), streamed as the final answer with the
//! pages in `extras.sources`. No passage found → M2000.
//!
//! The answer is never lost to a model failure: when the prompt fails, the
//! passages themselves are the answer, after a line saying the summary is
//! unavailable.

use async_trait::async_trait;
use contracts::{DuoErrorCode, UnitPrimitive};
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::{Tool, ToolEnv, ToolInput, ToolOutcome};
use crate::chat::completion::ChatAnswer;
use crate::gateway_client::{GatewayError, with_transport_retries};

pub struct GitlabDocumentation;

/// The gateway prompt that writes the answer.
pub const ANSWER_PROMPT: &str = "chat/documentation_search";

/// Longest passage quoted from one page.
const MAX_PASSAGE_CHARS: usize = 1_500;

/// The line that opens the fallback answer.
pub const SUMMARY_UNAVAILABLE: &str =
    "A summary of the documentation is unavailable right now; here is what it says:";

/// One passage found by the search.
#[derive(Debug, Clone)]
struct Passage {
    title: String,
    url: Option<String>,
    content: String,
}

impl Passage {
    fn as_markdown(&self) -> String {
        let heading = match &self.url {
            Some(url) => format!("### [{}]({url})", self.title),
            None => format!("### {}", self.title),
        };
        format!("{heading}\n\n{}\n\n", self.content)
    }
}

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
        let mut passages = Vec::new();
        for result in &results {
            let title =
                meta(&result.metadata, &["title", "source"]).unwrap_or_else(|| result.id.clone());
            let url = meta(&result.metadata, &["source_url", "url"]);
            passages.push(Passage {
                title: title.clone(),
                url: url.clone(),
                content: super::resource_identifier::bounded(
                    result.content.trim(),
                    MAX_PASSAGE_CHARS,
                ),
            });
            let mut source = Map::new();
            source.insert("title".into(), json!(title));
            if let Some(url) = url {
                source.insert("source_url".into(), json!(url));
            }
            for (k, v) in &result.metadata {
                source.entry(k.clone()).or_insert_with(|| v.clone());
            }
            sources.push(Value::Object(source));
        }
        // The user's own words: the tool input is a search query.
        let answer = written_answer(env, &env.ctx.question, &passages).await;
        ToolOutcome::Final(ChatAnswer {
            content: answer.trim_end().to_owned(),
            extras: json!({ "sources": sources }),
            error: None,
            record: None,
        })
    }
}

/// The model's answer, streamed as it comes; after a failed prompt (or an
/// empty answer), the passages follow what was streamed.
async fn written_answer(env: &ToolEnv<'_>, question: &str, passages: &[Passage]) -> String {
    let mut answer = String::new();
    let failure = match stream_answer(env, question, passages, &mut answer).await {
        Ok(()) if !answer.trim().is_empty() => return answer,
        Ok(()) => "the model answered nothing".to_owned(),
        Err(err) => err.to_string(),
    };
    tracing::warn!(error = %failure, "the documentation answer prompt failed; answering with the passages");
    let mut fallback = String::new();
    if !answer.is_empty() {
        fallback.push_str("\n\n");
    }
    fallback.push_str(SUMMARY_UNAVAILABLE);
    fallback.push_str("\n\n");
    for passage in passages {
        fallback.push_str(&passage.as_markdown());
    }
    let _ = env.chunks.send(fallback.clone());
    answer.push_str(&fallback);
    answer
}

async fn stream_answer(
    env: &ToolEnv<'_>,
    question: &str,
    passages: &[Passage],
    answer: &mut String,
) -> Result<(), GatewayError> {
    let mut inputs = Map::new();
    inputs.insert("question".into(), json!(question));
    inputs.insert(
        "passages".into(),
        Value::Array(
            passages
                .iter()
                .map(|p| json!({"title": p.title, "url": p.url, "content": p.content}))
                .collect(),
        ),
    );
    let gateway = &env.services.gateway;
    let mut stream = with_transport_retries("documentation answer", || {
        gateway.prompt_stream(
            &env.ctx.auth,
            ANSWER_PROMPT,
            inputs.clone(),
            env.ctx.model.metadata(),
        )
    })
    .await?;
    while let Some(piece) = stream.next().await {
        let text = piece?;
        let _ = env.chunks.send(text.clone());
        answer.push_str(&text);
    }
    Ok(())
}

fn meta(metadata: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| metadata.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}
