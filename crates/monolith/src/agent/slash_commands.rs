//! Slash commands: answered by one gateway prompt (or, for `/help`, by no
//! model at all), without the agent loop. Each checks the user's permission
//! on what it reads and the unit primitive of its seat before calling the
//! gateway, and streams the answer. A command on a file the project's Duo
//! context exclusion rules exclude answers so without calling the gateway
//! (the file was never read: see `repository_file`).

use contracts::{DuoErrorCode, UnitPrimitive};
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::react_executor::StepChunks;
use super::tools::resource_identifier::tail;
use super::{RequestContext, Services};
use crate::chat::completion::{ChatAnswer, ChunkSender};
use crate::gateway_client::{GatewayError, transport_backoff};
use crate::policy::{Ability, ChatAuthError, Subject};
use crate::work_items::Kind;
use crate::work_items::builds::{self, JobLog};
use crate::work_items::notes::{self, Comment};

/// The most of a job log `/troubleshoot` sends: its last characters.
pub const MAX_LOG_CHARS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandName {
    Explain,
    Tests,
    Refactor,
    Fix,
    Troubleshoot,
    SummarizeComments,
    Help,
}

impl CommandName {
    /// The command as typed, without the slash.
    pub fn word(self) -> &'static str {
        match self {
            CommandName::Explain => "explain",
            CommandName::Tests => "tests",
            CommandName::Refactor => "refactor",
            CommandName::Fix => "fix",
            CommandName::Troubleshoot => "troubleshoot",
            CommandName::SummarizeComments => "summarize_comments",
            CommandName::Help => "help",
        }
    }

    /// The feature whose model answers this command (`/help` needs none).
    pub fn feature(self) -> Option<crate::ai_models::Feature> {
        use crate::ai_models::Feature;
        Some(match self {
            CommandName::Explain => Feature::ExplainCode,
            CommandName::Tests => Feature::WriteTests,
            CommandName::Refactor => Feature::RefactorCode,
            CommandName::Fix => Feature::FixCode,
            CommandName::Troubleshoot => Feature::TroubleshootJob,
            CommandName::SummarizeComments => Feature::SummarizeComments,
            CommandName::Help => return None,
        })
    }
}

/// A question of the form `/name rest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlashCommand {
    pub name: CommandName,
    /// What the user wrote after the command.
    pub input: String,
}

impl SlashCommand {
    /// Commands this monolith knows; anything else goes to the agent.
    pub fn parse(content: &str) -> Option<Self> {
        let content = content.trim_start();
        let rest = content.strip_prefix('/')?;
        if !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
            return None;
        }
        let (word, input) = match rest.split_once(char::is_whitespace) {
            Some((word, input)) => (word, input.trim()),
            None => (rest, ""),
        };
        let name = match word {
            "explain" => CommandName::Explain,
            "tests" => CommandName::Tests,
            "refactor" => CommandName::Refactor,
            "fix" => CommandName::Fix,
            "troubleshoot" => CommandName::Troubleshoot,
            "summarize_comments" => CommandName::SummarizeComments,
            "help" => CommandName::Help,
            _ => return None,
        };
        Some(Self {
            name,
            input: input.to_owned(),
        })
    }
}

pub const HELP_TEXT: &str = "I'm GitLab Duo Chat. Ask me about GitLab, about the issue, epic, merge request or CI job you are looking at, or about code.\n\n\
Commands:\n\n\
- `/explain`: explain the selected code\n\
- `/tests`: write tests for the selected code\n\
- `/refactor`: refactor the selected code\n\
- `/fix`: fix problems in the selected code\n\
- `/troubleshoot`: find why the CI job you are looking at failed\n\
- `/summarize_comments`: summarize the comments of the issue, epic or merge request you are looking at\n\
- `/reset`: start the conversation afresh in this thread\n\
- `/clear`: clear the conversation\n\
- `/new`: start a new conversation (the current one stays in your list)\n\
- `/help`: show this text";

pub async fn run(
    services: &Services,
    ctx: &RequestContext,
    command: SlashCommand,
    chunks: &ChunkSender,
) -> ChatAnswer {
    match prepare(services, ctx, &command).await {
        Ok(Prepared::Static(text)) => {
            let _ = chunks.send(text.clone());
            ChatAnswer::text(text)
        }
        Ok(Prepared::Prompt { id, inputs }) => {
            stream_prompt(services, ctx, &id, inputs, chunks).await
        }
        Err((code, detail)) => ChatAnswer::failed(code, detail),
    }
}

enum Prepared {
    Static(String),
    Prompt {
        id: String,
        inputs: Map<String, Value>,
    },
}

type Refused = (DuoErrorCode, String);

async fn prepare(
    services: &Services,
    ctx: &RequestContext,
    command: &SlashCommand,
) -> Result<Prepared, Refused> {
    let need = |primitive: UnitPrimitive| {
        if ctx.has_scope(primitive) {
            Ok(())
        } else {
            Err((
                DuoErrorCode::M3005,
                format!("the seat does not grant {primitive}"),
            ))
        }
    };
    match command.name {
        CommandName::Help => Ok(Prepared::Static(HELP_TEXT.to_owned())),
        CommandName::Explain | CommandName::Tests | CommandName::Refactor | CommandName::Fix => {
            let (prompt, primitive) = match command.name {
                CommandName::Explain => ("explain_code", UnitPrimitive::ExplainCode),
                CommandName::Tests => ("write_tests", UnitPrimitive::WriteTests),
                CommandName::Refactor => ("refactor_code", UnitPrimitive::RefactorCode),
                _ => ("fix_code", UnitPrimitive::FixCode),
            };
            need(primitive)?;
            authorize_context(services, ctx).await?;
            if let Some(name) = &ctx.excluded_file {
                // Nothing of the file was read or kept; nothing goes to a model.
                return Ok(Prepared::Static(excluded_answer(command.name, name)));
            }
            let file = ctx
                .current_file
                .as_ref()
                .filter(|f| !f.data.trim().is_empty())
                .ok_or((DuoErrorCode::M4000, "no code is selected".to_owned()))?;
            let mut inputs = Map::new();
            inputs.insert("selected_text".into(), json!(file.data));
            inputs.insert("file_content".into(), json!(ctx.file_content));
            inputs.insert("file_name".into(), json!(file.file_path));
            inputs.insert(
                "language_info".into(),
                json!(language_info(&file.file_path)),
            );
            inputs.insert("input".into(), json!(command.input));
            inputs.insert("libraries".into(), json!(""));
            inputs.insert("file_content_reuse".into(), json!(""));
            Ok(Prepared::Prompt {
                id: format!("chat/{prompt}"),
                inputs,
            })
        }
        CommandName::Troubleshoot => {
            need(UnitPrimitive::TroubleshootJob)?;
            let Some(Subject::Build(id)) = ctx.resource else {
                return Err((DuoErrorCode::M4005, "no CI job in context".into()));
            };
            authorize_resource(services, ctx, Subject::Build(id)).await?;
            let db = services
                .pool
                .get()
                .await
                .map_err(|e| (DuoErrorCode::M4002, e.to_string()))?;
            let JobLog { status, log } = builds::status_and_log(&*db, id)
                .await
                .map_err(|e| (DuoErrorCode::M4002, e.to_string()))?
                .ok_or((DuoErrorCode::M4005, "job not found".to_owned()))?;
            if status != "failed" || log.trim().is_empty() {
                return Err((
                    DuoErrorCode::M4005,
                    "the job did not fail or has no log".into(),
                ));
            }
            let mut inputs = Map::new();
            inputs.insert("selected_text".into(), json!(tail(&log, MAX_LOG_CHARS)));
            inputs.insert("language_info".into(), json!(""));
            Ok(Prepared::Prompt {
                id: "chat/troubleshoot_job".into(),
                inputs,
            })
        }
        CommandName::SummarizeComments => {
            need(UnitPrimitive::SummarizeComments)?;
            let (kind, item) = match ctx.resource {
                Some(Subject::Issue(id)) => (Kind::Issue, id),
                Some(Subject::Epic(id)) => (Kind::Epic, id),
                Some(Subject::MergeRequest(id)) => (Kind::MergeRequest, id),
                _ => {
                    return Err((
                        DuoErrorCode::M4004,
                        "no issue, epic or merge request in context".into(),
                    ));
                }
            };
            let resource = ctx.resource.ok_or((DuoErrorCode::M4004, String::new()))?;
            authorize_resource(services, ctx, resource).await?;
            let notes = readable_notes(services, ctx, kind, item).await?;
            if notes.is_empty() {
                return Err((DuoErrorCode::M4004, "no comments to summarize".into()));
            }
            let mut inputs = Map::new();
            inputs.insert("notes_content".into(), json!(notes.join("\n")));
            Ok(Prepared::Prompt {
                id: "chat/summarize_comments".into(),
                inputs,
            })
        }
    }
}

/// What a command on a file the project's Duo context exclusion rules
/// exclude answers, without asking a model.
pub fn excluded_answer(command: CommandName, file: &str) -> String {
    format!(
        "I can't `/{}` `{file}`: the project's GitLab Duo context exclusion rules exclude this file, so its content is not sent to AI.",
        command.word()
    )
}

/// GitLab's `ChatAuthorizer.context`: the page resource when there is one,
/// else the user (already checked before any command runs).
async fn authorize_context(services: &Services, ctx: &RequestContext) -> Result<(), Refused> {
    match ctx.resource {
        Some(resource) => authorize_resource(services, ctx, resource).await,
        None => Ok(()),
    }
}

async fn authorize_resource(
    services: &Services,
    ctx: &RequestContext,
    resource: Subject,
) -> Result<(), Refused> {
    let db = services
        .pool
        .get()
        .await
        .map_err(|e| (DuoErrorCode::M4000, e.to_string()))?;
    services
        .policy
        .authorize_chat_resource(&*db, Some(ctx.actor), resource)
        .await
        .map_err(|e| match e {
            ChatAuthError::Denied(code) => (code, "not readable".to_owned()),
            ChatAuthError::Policy(p) => (DuoErrorCode::M4000, p.to_string()),
        })
}

/// The user-written notes of an item that the user may read, oldest first,
/// each in a `<comment>` element.
async fn readable_notes(
    services: &Services,
    ctx: &RequestContext,
    kind: Kind,
    item: i64,
) -> Result<Vec<String>, Refused> {
    let db = services
        .pool
        .get()
        .await
        .map_err(|e| (DuoErrorCode::M4000, e.to_string()))?;
    let comments = notes::comments(&*db, kind, item, None)
        .await
        .map_err(|e| (DuoErrorCode::M4000, e.to_string()))?;
    let mut readable_notes = Vec::new();
    for Comment {
        id,
        author_username,
        body,
    } in comments
    {
        let readable = services
            .policy
            .can(&*db, Some(ctx.actor), Ability::ReadNote, Subject::Note(id))
            .await
            .map_err(|e| (DuoErrorCode::M4000, e.to_string()))?;
        if readable {
            readable_notes.push(format!(
                "<comment author=\"@{author_username}\">{}</comment>",
                body.replace('<', "&lt;").replace('>', "&gt;")
            ));
        }
    }
    Ok(readable_notes)
}

async fn stream_prompt(
    services: &Services,
    ctx: &RequestContext,
    prompt_id: &str,
    inputs: Map<String, Value>,
    chunks: &ChunkSender,
) -> ChatAnswer {
    // A hop to the gateway that fails (it died, restarted, or cut the
    // stream) is asked again within the budget; text already shown is not
    // shown twice.
    let started = tokio::time::Instant::now();
    let mut sink = StepChunks::new(chunks);
    let mut retry = 0;
    loop {
        sink.restart();
        let err =
            match stream_prompt_once(services, ctx, prompt_id, inputs.clone(), &mut sink).await {
                Ok(answer) => return answer,
                Err(err) => err,
            };
        if err.is_transient()
            && let Some(pause) = transport_backoff(retry, started.elapsed())
        {
            retry += 1;
            tracing::info!(attempt = retry, error = %err, "the AI gateway hop failed; retrying the prompt");
            tokio::time::sleep(pause).await;
            continue;
        }
        return ChatAnswer::failed(err.code(), err.to_string());
    }
}

async fn stream_prompt_once(
    services: &Services,
    ctx: &RequestContext,
    prompt_id: &str,
    inputs: Map<String, Value>,
    chunks: &mut StepChunks<'_>,
) -> Result<ChatAnswer, GatewayError> {
    let mut stream = services
        .gateway
        .prompt_stream(&ctx.auth, prompt_id, inputs, ctx.model.metadata())
        .await?;
    let mut answer = String::new();
    while let Some(piece) = stream.next().await {
        let text = piece?;
        chunks.push(&text);
        answer.push_str(&text);
    }
    if answer.trim().is_empty() {
        return Ok(ChatAnswer::failed(
            DuoErrorCode::A1002,
            "the prompt answered nothing",
        ));
    }
    Ok(ChatAnswer::text(answer))
}

/// A sentence naming the language of a file, from its extension.
pub fn language_info(file_name: &str) -> String {
    let extension = file_name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase());
    let language = match extension.as_deref() {
        Some("rs") => "Rust",
        Some("rb") => "Ruby",
        Some("py") => "Python",
        Some("js" | "mjs" | "cjs") => "JavaScript",
        Some("ts" | "tsx") => "TypeScript",
        Some("go") => "Go",
        Some("java") => "Java",
        Some("kt") => "Kotlin",
        Some("c" | "h") => "C",
        Some("cc" | "cpp" | "hpp") => "C++",
        Some("cs") => "C#",
        Some("php") => "PHP",
        Some("sh") => "shell",
        Some("yml" | "yaml") => "YAML",
        _ => return String::new(),
    };
    format!("The code is written in {language}.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse() {
        assert_eq!(
            SlashCommand::parse("/explain  what does it do"),
            Some(SlashCommand {
                name: CommandName::Explain,
                input: "what does it do".into()
            })
        );
        assert_eq!(
            SlashCommand::parse("/help").map(|c| c.name),
            Some(CommandName::Help)
        );
        assert_eq!(SlashCommand::parse("/unknown x"), None);
        assert_eq!(SlashCommand::parse("explain /explain"), None);
        assert_eq!(SlashCommand::parse("/ explain"), None);
    }

    #[test]
    fn language_from_extension() {
        assert_eq!(language_info("src/main.rs"), "The code is written in Rust.");
        assert_eq!(language_info("Makefile"), "");
    }
}
