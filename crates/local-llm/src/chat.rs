//! `/v1/chat/completions`: from the request to a generation (messages
//! through the model's chat template, tools and response format to a
//! grammar), and from the generated text back to OpenAI's answer shapes,
//! whole or as `chat.completion.chunk`s.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{ChatCompletionRequest, Usage, WireMessage};
use crate::chat_template::{ChatMessage, ChatTemplate, TemplateError};
use crate::config::Config;
use crate::engine::{EngineError, Repetition, SamplingParams};
use crate::error::ApiError;
use crate::generation::{FinishReason, GenerationEvent, GenerationRequest};
use crate::tools::{Answer, OutputEvent, OutputParser, OutputPlan, ToolsError};

/// Most calls one assistant message may carry in the history.
pub const MAX_HISTORY_CALLS: usize = 16;

/// A validated request, ready for the queue.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub generation: GenerationRequest,
    pub plan: OutputPlan,
    pub stream: bool,
    pub include_usage: bool,
}

impl From<ToolsError> for ApiError {
    fn from(err: ToolsError) -> Self {
        ApiError::Unprocessable(err.to_string())
    }
}

impl From<TemplateError> for ApiError {
    fn from(err: TemplateError) -> Self {
        match err {
            TemplateError::Refused(_) => ApiError::BadRequest(err.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

pub fn prepare(
    config: &Config,
    template: &ChatTemplate,
    request: ChatCompletionRequest,
) -> Result<Prepared, ApiError> {
    if request.model != config.chat_model_id {
        return Err(ApiError::ModelNotFound(format!(
            "model {:?} does not exist; this server serves {:?}",
            request.model, config.chat_model_id
        )));
    }
    if request.messages.is_empty() {
        return Err(ApiError::BadRequest(
            "messages must not be empty".to_owned(),
        ));
    }
    let plan = OutputPlan::from_request(
        request.tools.as_deref(),
        request.tool_choice.as_ref(),
        request.response_format.as_ref(),
    )?;
    let mut messages = conversation(&request.messages)?;
    if let Some(addendum) = plan.system_addendum() {
        match messages.first_mut() {
            Some(first) if first.role == "system" => {
                first.content.push_str("\n\n");
                first.content.push_str(&addendum);
            }
            _ => messages.insert(
                0,
                ChatMessage {
                    role: "system".to_owned(),
                    content: addendum,
                },
            ),
        }
    }
    let temperature = request.temperature.unwrap_or(0.7);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::Unprocessable(
            "temperature must be between 0 and 2".to_owned(),
        ));
    }
    let top_p = request.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::Unprocessable(
            "top_p must be in (0, 1]".to_owned(),
        ));
    }
    let max_tokens = request
        .max_completion_tokens
        .or(request.max_tokens)
        .unwrap_or(512);
    if max_tokens == 0 {
        return Err(ApiError::Unprocessable(
            "max_tokens must be at least 1".to_owned(),
        ));
    }
    let penalty = |name: &str, value: Option<f32>| match value.unwrap_or(0.0) {
        v if (-2.0..=2.0).contains(&v) => Ok(v),
        _ => Err(ApiError::Unprocessable(format!(
            "{name} must be between -2 and 2"
        ))),
    };
    let frequency_penalty = penalty("frequency_penalty", request.frequency_penalty)?;
    let presence_penalty = penalty("presence_penalty", request.presence_penalty)?;
    let dry_multiplier = request.dry_multiplier.unwrap_or(0.0);
    if !(0.0..=5.0).contains(&dry_multiplier) {
        return Err(ApiError::Unprocessable(
            "dry_multiplier must be between 0 and 5".to_owned(),
        ));
    }
    let stop = request.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::Unprocessable(
            "at most 4 stop sequences are allowed".to_owned(),
        ));
    }
    let prompt = template.render(&messages)?;
    Ok(Prepared {
        generation: GenerationRequest {
            prompt,
            params: SamplingParams {
                temperature,
                top_p,
                max_tokens,
                seed: pick_seed(request.seed),
                constraint: plan.constraint.clone(),
                repetition: Repetition {
                    frequency_penalty,
                    presence_penalty,
                    dry_multiplier,
                },
            },
            stop,
        },
        plan,
        stream: request.stream,
        include_usage: request
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
    })
}

/// The messages as the template sees them: roles `system`, `user`,
/// `assistant`. Earlier calls are written back in the call format the model
/// is asked to use, and tool results become user turns in
/// `<tool_response>` tags (consecutive results share one turn), so any
/// template, with or without tool support, renders them.
fn conversation(wire: &[WireMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages: Vec<ChatMessage> = Vec::with_capacity(wire.len());
    let mut last_was_tool = false;
    for message in wire {
        let mut content = message.text()?;
        let role = match message.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => {
                for call in message
                    .tool_calls
                    .iter()
                    .flatten()
                    .take(MAX_HISTORY_CALLS + 1)
                {
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(&history_call(call)?);
                }
                if message
                    .tool_calls
                    .as_ref()
                    .is_some_and(|c| c.len() > MAX_HISTORY_CALLS)
                {
                    return Err(ApiError::Unprocessable(format!(
                        "an assistant message may carry at most {MAX_HISTORY_CALLS} tool calls"
                    )));
                }
                "assistant"
            }
            "tool" => {
                let response = format!("<tool_response>\n{content}\n</tool_response>");
                match messages.last_mut() {
                    Some(previous) if last_was_tool => {
                        previous.content.push('\n');
                        previous.content.push_str(&response);
                    }
                    _ => messages.push(ChatMessage {
                        role: "user".to_owned(),
                        content: response,
                    }),
                }
                last_was_tool = true;
                continue;
            }
            other => {
                return Err(ApiError::Unprocessable(format!(
                    "unknown message role {other:?}"
                )));
            }
        };
        last_was_tool = false;
        messages.push(ChatMessage {
            role: role.to_owned(),
            content,
        });
    }
    Ok(messages)
}

/// One earlier call, as the model would have written it.
fn history_call(call: &Value) -> Result<String, ApiError> {
    let function = call.get("function");
    let name = function
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ApiError::Unprocessable("tool_calls[].function.name must be a string".to_owned())
        })?;
    let arguments = match function.and_then(|f| f.get("arguments")) {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(object @ Value::Object(_)) => object.to_string(),
        Some(_) => {
            return Err(ApiError::Unprocessable(
                "tool_calls[].function.arguments must be a JSON string".to_owned(),
            ));
        }
    };
    Ok(format!(
        "<tool_call>\n{{\"name\": {}, \"arguments\": {arguments}}}\n</tool_call>",
        Value::String(name.to_owned())
    ))
}

/// The client's seed keeps sampling reproducible; without one each request
/// draws its own, so identical requests at temperature > 0 can differ, as
/// OpenAI's do. (Greedy decoding ignores the seed.)
pub fn pick_seed(requested: Option<u32>) -> u32 {
    requested.unwrap_or_else(|| {
        let bytes = uuid::Uuid::new_v4().into_bytes();
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    })
}

pub fn engine_error(err: EngineError) -> ApiError {
    match err {
        EngineError::PromptTooLong { .. } => ApiError::PayloadTooLarge(err.to_string()),
        EngineError::EmptyPrompt => ApiError::BadRequest(err.to_string()),
        other => ApiError::Internal(other.to_string()),
    }
}

/// Waits until the generator has taken the prompt, so prompt errors still get a status code.
pub async fn await_start(
    events: &mut UnboundedReceiver<GenerationEvent>,
) -> Result<usize, ApiError> {
    match events.recv().await {
        Some(GenerationEvent::Started { prompt_tokens }) => Ok(prompt_tokens),
        Some(GenerationEvent::Failed(err)) => Err(engine_error(err)),
        Some(_) | None => Err(ApiError::Internal(
            "generator ended without starting".to_owned(),
        )),
    }
}

#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub prompt_tokens: usize,
}

impl ResponseMeta {
    pub fn new(model: &str, prompt_tokens: usize) -> Self {
        Self {
            id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
            model: model.to_owned(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            prompt_tokens,
        }
    }
}

/// OpenAI's `finish_reason`: a finished call is `tool_calls`.
fn finish_reason(reason: FinishReason, called: bool) -> &'static str {
    match reason {
        FinishReason::Stop if called => "tool_calls",
        other => other.as_str(),
    }
}

/// A whole `chat.completion`.
pub async fn complete(
    mut events: UnboundedReceiver<GenerationEvent>,
    meta: ResponseMeta,
    prepared: &Prepared,
) -> Result<Value, ApiError> {
    let mut parser = OutputParser::new(&prepared.plan);
    let mut answer = Answer::default();
    loop {
        match events.recv().await {
            Some(GenerationEvent::Delta(text)) => {
                for event in parser.push(&text) {
                    answer.apply(event);
                }
            }
            Some(GenerationEvent::Finished {
                reason,
                completion_tokens,
                cached_tokens,
            }) => {
                for event in parser.finish() {
                    answer.apply(event);
                }
                let message = match &answer.call {
                    Some((id, name, arguments)) => json!({
                        "role": "assistant",
                        "content": if answer.content.is_empty() { Value::Null } else { Value::String(answer.content.clone()) },
                        "tool_calls": [{
                            "id": id,
                            "type": "function",
                            "function": { "name": name, "arguments": arguments },
                        }],
                    }),
                    None => json!({ "role": "assistant", "content": answer.content }),
                };
                return Ok(json!({
                    "id": meta.id,
                    "object": "chat.completion",
                    "created": meta.created,
                    "model": meta.model,
                    "choices": [{
                        "index": 0,
                        "message": message,
                        "finish_reason": finish_reason(reason, parser.called()),
                    }],
                    "usage": Usage::new(meta.prompt_tokens, completion_tokens, cached_tokens),
                }));
            }
            Some(GenerationEvent::Failed(err)) => return Err(engine_error(err)),
            Some(GenerationEvent::Started { .. }) => {}
            None => {
                return Err(ApiError::Internal(
                    "generator stopped mid-answer".to_owned(),
                ));
            }
        }
    }
}

/// Builds `chat.completion.chunk` frames.
struct Chunks {
    meta: ResponseMeta,
    /// The first delta (with `role`) has been sent.
    opened: bool,
}

impl Chunks {
    fn frame(payload: &Value) -> Bytes {
        Bytes::from(format!("data: {payload}\n\n"))
    }

    fn chunk(&self, choices: Value, usage: Option<Usage>) -> Bytes {
        let mut payload = json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            payload["usage"] = json!(usage);
        }
        Self::frame(&payload)
    }

    fn delta(&mut self, mut delta: Value, finish: Option<&str>) -> Bytes {
        if !self.opened {
            self.opened = true;
            delta["role"] = json!("assistant");
        }
        self.chunk(
            json!([{ "index": 0, "delta": delta, "finish_reason": finish }]),
            None,
        )
    }

    /// The frames for one parsed piece of output.
    fn event(&mut self, event: OutputEvent) -> Bytes {
        match event {
            OutputEvent::Content(text) => self.delta(json!({ "content": text }), None),
            OutputEvent::CallStart { id, name } => {
                let mut delta = json!({
                    "tool_calls": [{
                        "index": 0,
                        "id": id,
                        "type": "function",
                        "function": { "name": name, "arguments": "" },
                    }],
                });
                if !self.opened {
                    delta["content"] = Value::Null;
                }
                self.delta(delta, None)
            }
            OutputEvent::CallArguments(part) => self.delta(
                json!({ "tool_calls": [{ "index": 0, "function": { "arguments": part } }] }),
                None,
            ),
        }
    }
}

/// Dropping this stream (actix does when the client disconnects) drops the
/// event receiver, which halts generation at the next token. When tools are
/// offered, the first chunk waits until the output shows whether it is a
/// call, so it carries either `content` or `tool_calls`, as OpenAI's do.
pub fn sse_stream(
    mut events: UnboundedReceiver<GenerationEvent>,
    meta: ResponseMeta,
    prepared: Prepared,
) -> impl futures::Stream<Item = Result<Bytes, actix_web::Error>> {
    let prompt_tokens = meta.prompt_tokens;
    let include_usage = prepared.include_usage;
    let mut parser = OutputParser::new(&prepared.plan);
    let mut chunks = Chunks {
        meta,
        opened: false,
    };
    async_stream::stream! {
        if !prepared.plan.may_call_tools() {
            yield Ok(chunks.delta(json!({ "content": "" }), None));
        }
        while let Some(event) = events.recv().await {
            match event {
                GenerationEvent::Delta(text) => {
                    for event in parser.push(&text) {
                        yield Ok(chunks.event(event));
                    }
                }
                GenerationEvent::Finished { reason, completion_tokens, cached_tokens } => {
                    for event in parser.finish() {
                        yield Ok(chunks.event(event));
                    }
                    let finish = finish_reason(reason, parser.called());
                    yield Ok(chunks.delta(json!({}), Some(finish)));
                    if include_usage {
                        let usage = Usage::new(prompt_tokens, completion_tokens, cached_tokens);
                        yield Ok(chunks.chunk(json!([]), Some(usage)));
                    }
                    break;
                }
                GenerationEvent::Failed(err) => {
                    tracing::error!(error = %err, "generation failed mid-stream");
                    yield Ok(Chunks::frame(&ApiError::Internal(err.to_string()).body()));
                    break;
                }
                GenerationEvent::Started { .. } => {}
            }
        }
        yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_given_seed_is_kept_and_a_missing_one_is_drawn_per_request() {
        assert_eq!(pick_seed(Some(7)), 7);
        assert_eq!(pick_seed(Some(0x5eed)), 0x5eed);
        let drawn: HashSet<u32> = (0..8).map(|_| pick_seed(None)).collect();
        // Eight draws from 2^32 values all colliding would mean a fixed seed.
        assert!(drawn.len() > 1, "{drawn:?}");
    }

    fn wire(value: Value) -> Vec<WireMessage> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn calls_and_tool_results_in_the_history_become_text_turns() {
        let messages = conversation(&wire(json!([
            {"role": "developer", "content": "sys"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "one"},
            {"role": "tool", "tool_call_id": "call_2", "content": "two"},
        ])))
        .unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(
            messages[2].content,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1}}\n</tool_call>"
        );
        assert_eq!(
            messages[3].content,
            "<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response>"
        );
    }
}
