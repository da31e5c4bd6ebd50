//! The ReAct agent step behind `POST /v2/chat/agent`: checks the caller and
//! the body in GitLab's order, renders the `chat/react` prompt with the tools
//! the caller may use, calls the model and turns its output into events.
//!
//! Message layout: the `system` template gives the system prompt; each history
//! user turn, and the current question, is rendered with the `user` template
//! (input `message`); history assistant turns are passed through unchanged;
//! the `assistant` template (the scratchpad ending in `Thought:`) is the prefill.
//!
//! A prompt family with `params.tool_calling: native` skips the ReAct text:
//! the step goes to [`super::native`], which asks the model with its own tool
//! calling and emits the same events.

use super::FEATURE_CATEGORY;
use super::budget::{self, Budget, BudgetError, Trimmed};
use super::native::{self, NativeStep};
use super::react_parser::{ReactOutcome, ReactParser};
use super::tools_registry::{
    DuoChatToolsRegistry, TOOL_NOT_AVAILABLE, ToolDefinition, parse_feature_flags,
};
use crate::auth::GatewayUser;
use crate::config::Config;
use crate::error::{ApiError, ValidationIssue};
use crate::prompts::{
    PromptDefinition, PromptError, PromptRegistry, RenderedMessage, TemplateRole, ToolCalling,
    choose_families,
};
use crate::providers::conversation::Message;
use crate::providers::tool_calling::ToolCallingModel;
use crate::providers::{ChatMessage, ChatModel, ChatRole, ModelCall, ProviderError, ProviderKind};
use crate::providers::{ModelRoute, route_for_target};
use contracts::{AgentEvent, AgentMessage, AgentRequest, MessageRole, UnitPrimitive};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};
use std::sync::Arc;

pub const PROMPT_ID: &str = "chat/react";

/// Why an agent request is refused before streaming starts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// 403 `{"detail": "Unauthorized to access ..."}`.
    #[error("Unauthorized to access {0}")]
    Unauthorized(String),
    /// 422 in FastAPI's list shape: `{"detail": [{loc, msg, type}]}`, as
    /// GitLab's gateway answers for a body its request model rejects.
    #[error("{message}")]
    Invalid {
        /// The body field at fault, e.g. `messages`.
        field: &'static str,
        message: String,
    },
    #[error(transparent)]
    Prompt(#[from] PromptError),
    /// The prompt asks for native tool calling on a model that has none.
    #[error("{0}")]
    ModelChoice(String),
    /// The prompt does not fit the model's context even trimmed.
    #[error(transparent)]
    TooLong(#[from] BudgetError),
}

impl From<AgentError> for ApiError {
    fn from(err: AgentError) -> Self {
        match err {
            AgentError::Unauthorized(_) => Self::Forbidden(err.to_string()),
            AgentError::Invalid { field, message } => Self::Validation(vec![ValidationIssue {
                loc: vec!["body".into(), field.into()],
                msg: message,
                kind: "value_error".into(),
            }]),
            AgentError::Prompt(e) => e.into(),
            AgentError::ModelChoice(message) => Self::Unprocessable(message),
            // The text starts with "prompt is too long", which the monolith
            // turns into A1005 (and shows the rest to the user).
            AgentError::TooLong(e) => Self::PayloadTooLarge(e.to_string()),
        }
    }
}

/// Request headers the agent reads besides the body.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientInfo<'a> {
    /// `X-Gitlab-Version`.
    pub gitlab_version: Option<&'a str>,
    /// `x-gitlab-enabled-feature-flags`.
    pub feature_flags: Option<&'a str>,
}

/// Scope checks, in GitLab's order: `duo_chat`, then each additional
/// context item of every message.
pub fn authorize(user: &GatewayUser, request: &AgentRequest) -> Result<(), AgentError> {
    if !user.can(UnitPrimitive::DuoChat) {
        return Err(AgentError::Unauthorized("duo chat".into()));
    }
    for message in &request.messages {
        for item in message.additional_context.iter().flatten() {
            let needed = item.category.unit_primitive();
            if !user.can_str(&needed) {
                return Err(AgentError::Unauthorized(needed));
            }
        }
    }
    Ok(())
}

impl AgentError {
    fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            message: message.into(),
        }
    }
}

/// Body checks that serde cannot express. They belong to body validation,
/// so they run before any scope check (GitLab's request model rejects these
/// bodies before the handler looks at the caller).
pub fn validate(request: &AgentRequest) -> Result<(), AgentError> {
    match request.messages.last() {
        None => {
            return Err(AgentError::invalid(
                "messages",
                "messages must not be empty",
            ));
        }
        Some(last) if last.role != MessageRole::User => {
            return Err(AgentError::invalid(
                "messages",
                "the last message must be from the user",
            ));
        }
        Some(_) => {}
    }
    if request
        .messages
        .iter()
        .any(|m| m.role == MessageRole::System)
    {
        return Err(AgentError::invalid(
            "messages",
            "messages may only have the roles user and assistant",
        ));
    }
    if let Some(field) = request
        .model_metadata
        .as_ref()
        .and_then(|m| m.oversized_field())
    {
        return Err(AgentError::invalid(
            "model_metadata",
            format!(
                "model_metadata.{field} is longer than {} characters",
                contracts::ModelMetadata::MAX_FIELD_LEN
            ),
        ));
    }
    Ok(())
}

/// A model call ready to run, and the tools the caller may be sent to.
#[derive(Debug, Clone)]
pub struct PreparedAgent {
    pub call: ModelCall,
    pub tools: Vec<&'static ToolDefinition>,
    /// Set when the prompt family asks for the provider's own tool calling.
    pub native: Option<NativeStep>,
}

/// Runs every check, in GitLab's order (body, then scopes), and renders
/// the prompt.
pub fn prepare(
    registry: &PromptRegistry,
    config: &Config,
    user: &GatewayUser,
    client: ClientInfo<'_>,
    request: &AgentRequest,
) -> Result<PreparedAgent, AgentError> {
    validate(request)?;
    authorize(user, request)?;
    let flags = parse_feature_flags(client.feature_flags);
    let tools = DuoChatToolsRegistry.tools_for(user, client.gitlab_version, &flags);

    let metadata = request.model_metadata.as_ref();
    let definition = choose_families(PROMPT_ID, metadata, config)
        .iter()
        .find_map(|family| {
            registry
                .resolve_with_flags(PROMPT_ID, family, None, &flags)
                .ok()
        })
        .ok_or_else(|| PromptError::NotFound(PROMPT_ID.to_owned()))?;
    let target = definition.model_target(
        &config.providers,
        metadata,
        &user.endpoint_guard(&config.providers.egress),
    )?;

    let (history, question) = match request.messages.split_last() {
        Some((question, history)) => (history, question),
        None => {
            return Err(AgentError::invalid(
                "messages",
                "messages must not be empty",
            ));
        }
    };
    if request.text_bytes() > config.max_prompt_bytes {
        return Err(AgentError::invalid(
            "messages",
            format!(
                "the request carries more than {} bytes of text (AIGW_MAX_PROMPT_BYTES)",
                config.max_prompt_bytes
            ),
        ));
    }
    let native_route = match definition.params.tool_calling {
        ToolCalling::React => None,
        ToolCalling::Native => Some(
            route_for_target(&config.providers, &target)
                .map_err(|e| AgentError::ModelChoice(e.to_string()))?,
        ),
    };
    let bundled = matches!(&native_route, Some(ModelRoute::OpenAi { base_url, .. })
        if *base_url == config.providers.local_llm_url);
    // The bundled small model chooses readers poorly and loses its context
    // window to their results: when the question's resource is attached
    // already, it answers from it (its only function is the direct answer).
    // Models that use tools well keep them.
    let from_context = bundled && has_attached_context(question);
    let tools = if from_context { Vec::new() } else { tools };
    let unavailable = request.unavailable_resources();
    let rendered = render_step(
        registry,
        &definition,
        &tools,
        &unavailable,
        request,
        question,
    )?;

    // Each history user turn alone, with only its own input.
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    for turn in history {
        match turn.role {
            MessageRole::Assistant => messages.push(ChatMessage {
                role: ChatRole::Assistant,
                content: turn.content.clone(),
            }),
            _ => {
                let turn_inputs = object([("message", message_input(turn))]);
                let content = definition
                    .render_roles(registry, &turn_inputs, |role| role == TemplateRole::User)?
                    .into_iter()
                    .next()
                    .map(|m| m.content)
                    .unwrap_or_default();
                messages.push(ChatMessage {
                    role: ChatRole::User,
                    content,
                });
            }
        }
    }
    let mut call = definition.model_call(rendered, target);
    messages.append(&mut call.messages);
    call.messages = messages;
    call.feature_category = FEATURE_CATEGORY;
    let conversation: Vec<Message> = call
        .messages
        .iter()
        .map(|m| match m.role {
            ChatRole::Assistant => Message::AiMessage {
                content: m.content.clone(),
                tool_calls: Vec::new(),
            },
            _ => Message::human(m.content.clone()),
        })
        .collect();
    let native = match native_route {
        None => None,
        Some(route) => {
            let offered = if bundled {
                native::offered_to_small_model(&tools, &question.content)
            } else {
                tools.clone()
            };
            let free_text = if bundled {
                // The same system prompt with no tools: no instructions
                // about functions for an answer that calls none.
                let system =
                    render_system(registry, &definition, &[], &unavailable, question, || {
                        prompt_inputs(&[], request, question)
                    })?
                    .iter()
                    .map(|m| m.content.as_str())
                    .collect::<Vec<_>>()
                    .join("\n\n");
                let has_context = from_context || question.current_file.is_some();
                Some(native::FreeTextAnswer::new(
                    system,
                    conversation.clone(),
                    request.steps(),
                    // Nothing to choose from is a plain answer too.
                    has_context || offered.is_empty(),
                ))
            } else {
                None
            };
            Some(NativeStep {
                route,
                system: call.system.clone().unwrap_or_default(),
                messages: conversation
                    .into_iter()
                    .chain(native::step_messages(request.steps()))
                    .collect(),
                tools: native::tool_schemas(
                    &offered,
                    bundled.then_some(native::BUNDLED_ANSWER_CHARS),
                    from_context,
                ),
                params: call.params.clone(),
                question: question.content.clone(),
                free_text,
            })
        }
    };
    Ok(PreparedAgent {
        call,
        tools,
        native,
    })
}

/// Whether the monolith attached a resource, a file or another context item
/// to the question.
fn has_attached_context(question: &AgentMessage) -> bool {
    question.context.is_some()
        || question
            .additional_context
            .as_ref()
            .is_some_and(|items| !items.is_empty())
}

/// The size of the prompt a prepared step sends, in characters: the system
/// prompt and the messages, and for native tool calling the tools' schemas
/// and the earlier calls and their results as well.
pub fn prompt_chars(prepared: &PreparedAgent) -> usize {
    match &prepared.native {
        Some(step) => {
            // JSON forms (escapes counted): an overestimate, on the safe side.
            let json_chars = |v: &Value| v.to_string().chars().count();
            let tools: usize = step
                .tools
                .iter()
                .map(|t| t.name.len() + t.description.chars().count() + json_chars(&t.parameters))
                .sum();
            step.system.chars().count()
                + serde_json::to_value(&step.messages).map_or(0, |v| json_chars(&v))
                + tools
        }
        None => prepared.call.prompt_chars(),
    }
}

/// Prepares the step so its prompt fits `budget`: when the whole request
/// does not, history is dropped and long texts clipped ([`budget::fit`]).
pub fn prepare_to_fit(
    registry: &PromptRegistry,
    config: &Config,
    user: &GatewayUser,
    client: ClientInfo<'_>,
    request: &AgentRequest,
    budget: &Budget,
) -> Result<(PreparedAgent, Trimmed), AgentError> {
    let (fitted, trimmed) = budget::fit(request, budget, |r| {
        prepare(registry, config, user, client, r).map(|p| prompt_chars(&p))
    })??;
    Ok((prepare(registry, config, user, client, &fitted)?, trimmed))
}

/// The step's rendered templates: the system prompt (the same for every
/// request offered the same tools, so rendered once per tool set), then the
/// question's user turn and the scratchpad prefill, rendered for this request.
fn render_step(
    registry: &PromptRegistry,
    definition: &PromptDefinition,
    tools: &[&ToolDefinition],
    unavailable: &[String],
    request: &AgentRequest,
    question: &AgentMessage,
) -> Result<Vec<RenderedMessage>, PromptError> {
    let all_inputs = || prompt_inputs(tools, request, question);
    let system = render_system(
        registry,
        definition,
        tools,
        unavailable,
        question,
        all_inputs,
    )?;
    let turn_inputs = object([
        ("message", message_input(question)),
        ("scratchpad", Value::Array(scratchpad_input(request))),
    ]);
    let not_system = |role| role != TemplateRole::System;
    let turn = match definition.render_roles(registry, &turn_inputs, not_system) {
        // A user or assistant template that reads the tools as well.
        Err(PromptError::MissingInput(_)) => {
            definition.render_roles(registry, &all_inputs(), not_system)?
        }
        rendered => rendered?,
    };
    let mut messages = system.to_vec();
    messages.extend(turn);
    Ok(messages)
}

/// Keys longer than this (a caller listing many unavailable resources) are
/// rendered without the cache, so its entries stay small.
const MAX_SYSTEM_KEY_BYTES: usize = 1024;

/// The system templates rendered with the tools and the unavailable
/// resources alone, from the registry's render cache. A question with no
/// attached context also lends its (empty) context fields: the native
/// prompts read them when no tool is offered, and with nothing attached the
/// render is the same for every such question. A system template that reads
/// more than those (an attached context, the question's text) is rendered
/// from `all_inputs` instead, uncached.
fn render_system(
    registry: &PromptRegistry,
    definition: &PromptDefinition,
    tools: &[&ToolDefinition],
    unavailable: &[String],
    question: &AgentMessage,
    all_inputs: impl Fn() -> Value,
) -> Result<Arc<[RenderedMessage]>, PromptError> {
    let system_only = |role| role == TemplateRole::System;
    let no_context = question.context.is_none()
        && question
            .additional_context
            .as_ref()
            .is_none_or(|items| items.is_empty());
    // Tool names identify their definitions (static in this process); the
    // resources list is JSON so that no two lists share a key.
    let mut key = String::with_capacity(128);
    for (i, tool) in tools.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(tool.name);
    }
    key.push('\u{0}');
    if unavailable.is_empty() {
        key.push_str("[]");
    } else {
        key.push_str(&serde_json::to_string(unavailable).unwrap_or_default());
    }
    key.push('\u{0}');
    if no_context {
        key.push_str("no-context");
    }
    if key.len() > MAX_SYSTEM_KEY_BYTES {
        return Ok(definition
            .render_roles(registry, &all_inputs(), system_only)?
            .into());
    }
    let cached = definition.render_roles_cached(registry, &[TemplateRole::System], &key, || {
        let mut inputs = system_inputs(tools, unavailable);
        if no_context {
            // The values `message_input` gives a question with nothing
            // attached; any other message field stays missing, so a template
            // reading one is rendered whole instead.
            inputs["message"] = json!({ "context": null, "additional_context": [] });
        }
        inputs
    });
    match cached? {
        Some(rendered) => Ok(rendered),
        None => Ok(definition
            .render_roles(registry, &all_inputs(), system_only)?
            .into()),
    }
}

/// The scratchpad's steps as the templates read them.
fn scratchpad_input(request: &AgentRequest) -> Vec<Value> {
    request
        .steps()
        .iter()
        .map(|step| {
            object([
                ("thought", step.thought.replace("\\_", "_").into()),
                ("tool", step.tool.replace("\\_", "_").into()),
                ("tool_input", step.tool_input.as_str().into()),
                ("observation", step.observation.as_str().into()),
            ])
        })
        .collect()
}

/// The inputs the system templates read: the tools and the resources.
fn system_inputs(tools: &[&ToolDefinition], unavailable: &[String]) -> Value {
    json!({
        "tools": tools,
        "tool_names": tools.iter().map(|t| t.name).collect::<Vec<_>>(),
        "resources": tools.iter().map(|t| t.resource).collect::<Vec<_>>(),
        "unavailable_resources": unavailable,
    })
}

/// The `chat/react` inputs (see `prompts/chat/react/base/1.0.0.yml`).
pub fn prompt_inputs(
    tools: &[&ToolDefinition],
    request: &AgentRequest,
    question: &AgentMessage,
) -> Value {
    let mut inputs = system_inputs(tools, &request.unavailable_resources());
    inputs["message"] = message_input(question);
    inputs["scratchpad"] = Value::Array(scratchpad_input(request));
    inputs
}

/// Every key is present (null or empty when absent): templates render with
/// strict undefined checks.
fn message_input(message: &AgentMessage) -> Value {
    let additional: Vec<Value> = message
        .additional_context
        .iter()
        .flatten()
        .map(|item| {
            object([
                ("id", item.id.clone().unwrap_or_default().into()),
                ("category", item.category.as_str().into()),
                ("content", item.content.clone().unwrap_or_default().into()),
            ])
        })
        .collect();
    let role = match message.role {
        MessageRole::Assistant => "assistant",
        _ => "user",
    };
    object([
        ("role", role.into()),
        ("content", message.content.as_str().into()),
        (
            "context",
            message.context.as_ref().map_or(Value::Null, |c| {
                object([
                    ("type", c.resource_type.as_str().into()),
                    ("content", c.content.as_str().into()),
                ])
            }),
        ),
        (
            "current_file",
            message.current_file.as_ref().map_or(Value::Null, |f| {
                object([
                    ("file_path", f.file_path.as_str().into()),
                    ("data", f.data.as_str().into()),
                    ("selected_code", f.selected_code.into()),
                ])
            }),
        ),
        ("additional_context", Value::Array(additional)),
    ])
}

/// A JSON object from its fields, moved in. `json!` would serialize each
/// interpolated `Value` into a copy (it calls `to_value` on every
/// expression), on every request.
fn object<const N: usize>(fields: [(&str, Value); N]) -> Value {
    Value::Object(
        fields
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
    )
}

fn error_event(err: &ProviderError) -> AgentEvent {
    // Provider messages carry no prompt text or credentials, so WARN is safe.
    tracing::warn!(error = %err, retryable = err.retryable(), "model call failed during an agent step");
    AgentEvent::Error {
        message: super::model_error_message(err),
        retryable: err.retryable(),
    }
}

/// Calls the model and streams the events: live `final_answer_delta`s, then
/// one `action` or `unknown` at the end, or an `error` that ends the stream.
pub fn run(
    model: Arc<dyn ChatModel>,
    tool_model: ToolCallingModel,
    prepared: PreparedAgent,
) -> BoxStream<'static, AgentEvent> {
    if let Some(step) = prepared.native {
        return native::run(tool_model, step, prepared.tools, prepared.call.wait_clock);
    }
    async_stream::stream! {
        let PreparedAgent { call, tools, .. } = prepared;
        if call.target.kind == ProviderKind::Mock {
            yield AgentEvent::Unknown { text: "mock".into() };
            return;
        }
        let mut chunks = match model.stream(call).await {
            Ok(chunks) => chunks,
            Err(err) => {
                yield error_event(&err);
                return;
            }
        };
        let mut parser = ReactParser::new();
        while let Some(chunk) = chunks.next().await {
            match chunk {
                Ok(text) => {
                    if let Some(delta) = parser.push(&text) {
                        yield AgentEvent::delta(delta);
                    }
                }
                Err(err) => {
                    yield error_event(&err);
                    return;
                }
            }
        }
        match parser.finish() {
            ReactOutcome::FinalAnswer(_) => {}
            ReactOutcome::Action { tool, tool_input, thought } => {
                if let Some(permitted) = tools.iter().find(|t| t.name == tool) {
                    // GitLab tracks each permitted tool call as an event.
                    tracing::debug!(event = %format!("request_{}", permitted.unit_primitive), tool = %tool, "agent chose a tool");
                    yield AgentEvent::Action { tool, tool_input, thought };
                } else {
                    yield AgentEvent::Error { message: TOOL_NOT_AVAILABLE.into(), retryable: false };
                }
            }
            ReactOutcome::Unknown(text) => yield AgentEvent::Unknown { text },
        }
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> AgentRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn validation_cases() {
        let ok = request(
            r#"{"messages":[{"role":"assistant","content":"a"},{"role":"user","content":"q"}]}"#,
        );
        assert_eq!(validate(&ok), Ok(()));
        for bad in [
            r#"{"messages":[]}"#,
            r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#,
            r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"}]}"#,
        ] {
            assert!(
                matches!(validate(&request(bad)), Err(AgentError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn duo_chat_is_checked_before_context_scopes() {
        let req = request(
            r#"{"messages":[{"role":"user","content":"q","additional_context":[{"category":"file"}]}]}"#,
        );
        let err = authorize(&GatewayUser::with_scopes(["include_file_context"]), &req);
        assert_eq!(err, Err(AgentError::Unauthorized("duo chat".into())));
        let err = authorize(&GatewayUser::with_scopes(["duo_chat"]), &req);
        assert_eq!(
            err.map_err(|e| e.to_string()),
            Err("Unauthorized to access include_file_context".into())
        );
    }

    #[test]
    fn scratchpad_escapes_are_fixed() {
        let req = request(
            r#"{"messages":[{"role":"user","content":"q"}],"options":{"agent_scratchpad":{"agent_type":"react","steps":[{"thought":"read issue\\_reader","tool":"issue\\_reader","tool_input":"a\\_b","observation":"o"}]}}}"#,
        );
        let inputs = prompt_inputs(&[], &req, &req.messages[0]);
        assert_eq!(inputs["scratchpad"][0]["tool"], "issue_reader");
        assert_eq!(inputs["scratchpad"][0]["thought"], "read issue_reader");
        assert_eq!(inputs["scratchpad"][0]["tool_input"], "a\\_b");
    }
}
