//! A model client with the providers' own tool calling: Anthropic `tools` /
//! `tool_use` and OpenAI function calling, one turn at a time (streamed on
//! the OpenAI wire). It takes a [`ModelRoute`] from the one route decision
//! ([`route_for_target`](super::route_for_target)) and a conversation
//! ([`Message`]); callers name their `feature_category` in [`TurnOptions`].

use super::conversation::{Message, ToolCall};
use super::escaped_text::JsonText;
pub use super::openai::TurnDelta;
use super::openai::stream_deltas as stream_openai_deltas;
use super::{ModelParams, ModelRoute, ProviderClients, ProviderError};
use crate::config::ProvidersConfig;
use crate::observability::{InferenceLabels, InferenceRecorder, ModelWaitClock};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::Serialize;
use serde_json::{Value, json};
use tracing::Instrument;

/// How one model turn is asked for.
#[derive(Debug, Clone)]
pub struct TurnOptions {
    /// The model must call one of the tools (OpenAI `tool_choice: required`,
    /// Anthropic `tool_choice: any`).
    pub require_call: bool,
    /// The `feature_category` label of the call's metrics.
    pub feature_category: &'static str,
    /// The request's clock of time spent waiting on models, when it keeps one.
    pub wait_clock: Option<ModelWaitClock>,
}

impl TurnOptions {
    /// Counts the turn in the same inference metrics as the router's calls.
    fn recorder(&self, route: &ModelRoute, streaming: bool) -> InferenceRecorder {
        InferenceRecorder::start(
            InferenceLabels {
                engine: route.kind().engine(),
                model: route.model().to_owned(),
                feature_category: self.feature_category,
                streaming,
            },
            None,
        )
    }
}

/// What a turn sends, as text, for its span (built only with traces on).
fn prompt_text(system: &str, messages: &[Message]) -> String {
    let mut text = system.to_owned();
    text.push_str(&serde_json::to_string(messages).unwrap_or_default());
    text
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSchema {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// What the model answered in one turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelTurn {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    /// Calls the model made that could not be read (bad JSON arguments):
    /// (id, name, reason). They are answered with an error, not run.
    pub invalid_calls: Vec<(String, String, String)>,
}

/// Collects a streamed turn's pieces into the turn they make.
#[derive(Debug, Default)]
pub struct TurnAssembler {
    text: String,
    /// By index: id, name, arguments so far.
    calls: std::collections::BTreeMap<u64, (String, String, String)>,
}

impl TurnAssembler {
    pub fn push(&mut self, delta: &TurnDelta) {
        match delta {
            TurnDelta::Text(text) => self.text.push_str(text),
            TurnDelta::Call {
                index,
                id,
                name,
                arguments,
            } => {
                let call = self.calls.entry(*index).or_default();
                if let Some(id) = id {
                    call.0.clone_from(id);
                }
                if let Some(name) = name {
                    call.1.push_str(name);
                }
                call.2.push_str(arguments);
            }
        }
    }

    /// The first call's name so far.
    pub fn first_call_name(&self) -> Option<&str> {
        self.calls.values().next().map(|c| c.1.as_str())
    }

    /// The turn, read as a whole answer in OpenAI's shape is.
    pub fn finish(self) -> ModelTurn {
        let calls: Vec<Value> = self
            .calls
            .into_values()
            .map(|(id, name, arguments)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        read_openai(&json!({
            "choices": [{"message": {"content": self.text, "tool_calls": calls}}],
        }))
    }
}

/// Calls models; one per process (shares the connection pools).
#[derive(Clone)]
pub struct ToolCallingModel {
    clients: ProviderClients,
}

impl ToolCallingModel {
    pub fn new(config: &ProvidersConfig) -> Result<Self, ProviderError> {
        Ok(Self::with_clients(ProviderClients::new(config)?))
    }

    /// A client sharing its connection pools with other model clients.
    pub fn with_clients(clients: ProviderClients) -> Self {
        Self { clients }
    }

    /// One model turn, counted in the inference metrics like the router's.
    pub async fn complete(
        &self,
        route: &ModelRoute,
        system: &str,
        messages: &[Message],
        tools: &[ToolSchema],
        params: &ModelParams,
        turn: TurnOptions,
    ) -> Result<ModelTurn, ProviderError> {
        let require_call = turn.require_call && !tools.is_empty();
        let mut recorder = turn.recorder(route, false);
        recorder.prompt(|| prompt_text(system, messages));
        let clock = turn.wait_clock.unwrap_or_default();
        let outcome = clock
            .time(
                self.turn(route, system, messages, tools, params, require_call)
                    .instrument(recorder.span()),
            )
            .await;
        match &outcome {
            Ok(answer) => {
                recorder.output(&answer.text);
                recorder.debug_output(|| format!("{:?}", answer.tool_calls));
            }
            Err(err) => recorder.fail_with(err),
        }
        outcome
    }

    /// One model turn streamed as it is generated, on the OpenAI wire (the
    /// bundled model server and self-hosted models); `None` for routes that
    /// answer in one piece here (Anthropic, mock), which callers ask with
    /// [`Self::complete`].
    pub async fn stream_turn(
        &self,
        route: &ModelRoute,
        system: &str,
        messages: &[Message],
        tools: &[ToolSchema],
        params: &ModelParams,
        turn: TurnOptions,
    ) -> Result<Option<BoxStream<'static, Result<TurnDelta, ProviderError>>>, ProviderError> {
        let ModelRoute::OpenAi {
            base_url,
            api_key,
            model,
            egress,
        } = route
        else {
            return Ok(None);
        };
        let mut body = openai_body(model, system, messages, tools, params);
        body.stream = true;
        if turn.require_call && !tools.is_empty() {
            body.tool_choice = Some("required");
        }
        let mut recorder = turn.recorder(route, true);
        recorder.prompt(|| prompt_text(system, messages));
        let clock = turn.wait_clock.unwrap_or_default();
        let mut chunks = match clock
            .time(
                stream_openai_deltas(
                    self.clients.get(*egress),
                    base_url,
                    api_key.as_deref(),
                    &body,
                    params,
                )
                .instrument(recorder.span()),
            )
            .await
        {
            Ok(chunks) => chunks,
            Err(err) => {
                recorder.fail_with(&err);
                return Err(err);
            }
        };
        Ok(Some(
            async_stream::stream! {
                // Waiting for the next chunk is model time; the rest is ours.
                while let Some(chunk) = clock.time(chunks.next()).await {
                    match chunk {
                        Ok(pieces) => {
                            for piece in pieces {
                                match &piece {
                                    TurnDelta::Text(text) => recorder.output(text),
                                    TurnDelta::Call { arguments, .. } => recorder.output(arguments),
                                }
                                yield Ok(piece);
                            }
                        }
                        Err(err) => {
                            recorder.fail_with(&err);
                            yield Err(err);
                            break;
                        }
                    }
                }
                drop(recorder);
            }
            .boxed(),
        ))
    }

    async fn turn(
        &self,
        route: &ModelRoute,
        system: &str,
        messages: &[Message],
        tools: &[ToolSchema],
        params: &ModelParams,
        require_call: bool,
    ) -> Result<ModelTurn, ProviderError> {
        let (request, wire) = match route {
            ModelRoute::Mock => {
                return Ok(ModelTurn {
                    text: "mock".to_owned(),
                    ..ModelTurn::default()
                });
            }
            ModelRoute::Vertex { .. } => {
                return Err(ProviderError::NotConfigured(
                    "Vertex AI models cannot call tools".to_owned(),
                ));
            }
            ModelRoute::Anthropic {
                base_url,
                api_key,
                model,
                egress,
            } => {
                let key = api_key.as_deref().ok_or_else(|| {
                    ProviderError::NotConfigured(
                        "no Anthropic API key (ANTHROPIC_API_KEY)".to_owned(),
                    )
                })?;
                let root = base_url.trim_end_matches('/').trim_end_matches("/v1");
                let client = self.clients.get(*egress);
                let request = client
                    .post(format!("{root}/v1/messages"))
                    .headers(duo_telemetry::outgoing_headers())
                    .header("x-api-key", key)
                    .header("anthropic-version", "2023-06-01")
                    .json(&{
                        let mut body = anthropic_body(model, system, messages, tools, params);
                        if require_call {
                            body.tool_choice = Some(json!({"type": "any"}));
                        }
                        body
                    });
                (request, Wire::Anthropic)
            }
            ModelRoute::OpenAi {
                base_url,
                api_key,
                model,
                egress,
            } => {
                let client = self.clients.get(*egress);
                let url = format!("{}/chat/completions", base_url.trim_end_matches('/'));
                let mut request = client
                    .post(url)
                    .headers(duo_telemetry::outgoing_headers())
                    .json(&{
                        let mut body = openai_body(model, system, messages, tools, params);
                        if require_call {
                            body.tool_choice = Some("required");
                        }
                        body
                    });
                if let Some(key) = api_key {
                    request = request.bearer_auth(key);
                }
                (request, Wire::OpenAi)
            }
        };
        let mut retries = params.max_retries;
        loop {
            // The whole call (head and body) within the call's timeout.
            let deadline = tokio::time::Instant::now() + params.timeout;
            let response = match tokio::time::timeout_at(deadline, request.clone().send()).await {
                Err(_) if retries > 0 => {
                    retries -= 1;
                    continue;
                }
                Err(_) => return Err(ProviderError::Timeout("model call")),
                Ok(response) => response,
            };
            let response = match response {
                Ok(response) => response,
                Err(err) if retries > 0 && (err.is_connect() || err.is_timeout()) => {
                    retries -= 1;
                    continue;
                }
                Err(err) if err.is_timeout() => return Err(ProviderError::Timeout("model call")),
                Err(err) => return Err(ProviderError::Connection(err.to_string())),
            };
            let status = response.status.as_u16();
            let body = match tokio::time::timeout_at(deadline, response.body.text()).await {
                Err(_) => return Err(ProviderError::Timeout("model call")),
                Ok(body) => body.map_err(|e| ProviderError::Connection(e.to_string()))?,
            };
            if matches!(status, 429 | 503 | 529) && retries > 0 {
                retries -= 1;
                continue;
            }
            if !(200..300).contains(&status) {
                let message = serde_json::from_str::<Value>(&body)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                    .unwrap_or(body);
                return Err(if matches!(status, 429 | 503 | 529) {
                    ProviderError::Overloaded { message }
                } else {
                    ProviderError::Status { status, message }
                });
            }
            let json: Value = serde_json::from_str(&body)
                .map_err(|e| ProviderError::Malformed(format!("model answer: {e}")))?;
            return Ok(match wire {
                Wire::Anthropic => read_anthropic(&json),
                Wire::OpenAi => read_openai(&json),
            });
        }
    }
}

enum Wire {
    Anthropic,
    OpenAi,
}

/// Anthropic's Messages API request, borrowed from the conversation and
/// serialized straight onto the wire: a long run's history is not built into
/// a JSON tree before every model call.
#[derive(Serialize)]
struct AnthropicRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    /// The system prompt, from the thread's kept escapes when long (it is
    /// the same for every step offered the same tools).
    system: JsonText<'a>,
    messages: Vec<AnthropicTurn<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<AnthropicTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
}

#[derive(Serialize)]
struct AnthropicTurn<'a> {
    role: &'static str,
    content: Vec<AnthropicBlock<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicBlock<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
}

#[derive(Serialize)]
struct AnthropicTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

fn anthropic_body<'a>(
    model: &'a str,
    system: &'a str,
    messages: &'a [Message],
    tools: &'a [ToolSchema],
    params: &ModelParams,
) -> AnthropicRequest<'a> {
    // Anthropic wants strictly alternating roles: tool results and a
    // following user message share one user turn.
    let mut wire: Vec<AnthropicTurn<'a>> = Vec::new();
    let mut push = |role: &'static str, block: AnthropicBlock<'a>| match wire.last_mut() {
        Some(last) if last.role == role => last.content.push(block),
        _ => wire.push(AnthropicTurn {
            role,
            content: vec![block],
        }),
    };
    for message in messages {
        match message {
            Message::HumanMessage { content } => {
                push(
                    "user",
                    AnthropicBlock::Text {
                        text: non_empty(content),
                    },
                );
            }
            Message::AiMessage {
                content,
                tool_calls,
            } => {
                if !content.is_empty() || tool_calls.is_empty() {
                    push(
                        "assistant",
                        AnthropicBlock::Text {
                            text: non_empty(content),
                        },
                    );
                }
                for call in tool_calls {
                    push(
                        "assistant",
                        AnthropicBlock::ToolUse {
                            id: &call.id,
                            name: &call.name,
                            input: &call.args,
                        },
                    );
                }
            }
            Message::ToolMessage {
                content,
                tool_call_id,
                is_error,
                ..
            } => push(
                "user",
                AnthropicBlock::ToolResult {
                    tool_use_id: tool_call_id,
                    content,
                    is_error: *is_error,
                },
            ),
        }
    }
    AnthropicRequest {
        model,
        max_tokens: params.max_tokens,
        system: JsonText(system),
        messages: wire,
        tools: tools
            .iter()
            .map(|t| AnthropicTool {
                name: &t.name,
                description: &t.description,
                input_schema: &t.parameters,
            })
            .collect(),
        temperature: params.temperature,
        tool_choice: None,
    }
}

fn non_empty(text: &str) -> &str {
    if text.trim().is_empty() {
        "(empty)"
    } else {
        text
    }
}

/// An OpenAI chat completions request, borrowed from the conversation (see
/// [`AnthropicRequest`]).
#[derive(Serialize)]
struct OpenAiRequest<'a> {
    model: &'a str,
    messages: Vec<OpenAiMessage<'a>>,
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<OpenAiTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dry_multiplier: Option<f32>,
}

#[derive(Serialize)]
struct OpenAiMessage<'a> {
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    /// Long texts (the system prompt) from the thread's kept escapes.
    content: JsonText<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OpenAiToolCall<'a>>,
}

#[derive(Serialize)]
struct OpenAiToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OpenAiFunctionCall<'a>,
}

#[derive(Serialize)]
struct OpenAiFunctionCall<'a> {
    name: &'a str,
    /// The arguments as JSON text, as the API takes them.
    arguments: String,
}

#[derive(Serialize)]
struct OpenAiTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: OpenAiFunction<'a>,
}

#[derive(Serialize)]
struct OpenAiFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

fn openai_body<'a>(
    model: &'a str,
    system: &'a str,
    messages: &'a [Message],
    tools: &'a [ToolSchema],
    params: &ModelParams,
) -> OpenAiRequest<'a> {
    let plain = |role, content| OpenAiMessage {
        role,
        tool_call_id: None,
        content: JsonText(content),
        tool_calls: Vec::new(),
    };
    let mut wire = Vec::with_capacity(messages.len() + 1);
    // An empty system turn is left out: chat templates then use the
    // model's own default instead of an empty instruction.
    if !system.is_empty() {
        wire.push(plain("system", system));
    }
    for message in messages {
        wire.push(match message {
            Message::HumanMessage { content } => plain("user", content),
            Message::AiMessage {
                content,
                tool_calls,
            } => OpenAiMessage {
                tool_calls: tool_calls
                    .iter()
                    .map(|c| OpenAiToolCall {
                        id: &c.id,
                        kind: "function",
                        function: OpenAiFunctionCall {
                            name: &c.name,
                            arguments: c.args.to_string(),
                        },
                    })
                    .collect(),
                ..plain("assistant", content)
            },
            Message::ToolMessage {
                content,
                tool_call_id,
                ..
            } => OpenAiMessage {
                tool_call_id: Some(tool_call_id),
                ..plain("tool", content)
            },
        });
    }
    OpenAiRequest {
        model,
        messages: wire,
        max_tokens: params.max_tokens,
        stream: false,
        tools: tools
            .iter()
            .map(|t| OpenAiTool {
                kind: "function",
                function: OpenAiFunction {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
            .collect(),
        temperature: params.temperature,
        tool_choice: None,
        dry_multiplier: params.dry_multiplier,
    }
}

fn read_anthropic(json: &Value) -> ModelTurn {
    let mut turn = ModelTurn::default();
    for block in json["content"].as_array().into_iter().flatten() {
        match block["type"].as_str() {
            Some("text") => turn
                .text
                .push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => {
                let id = block["id"].as_str().unwrap_or_default().to_owned();
                let name = block["name"].as_str().unwrap_or_default().to_owned();
                match &block["input"] {
                    Value::Object(_) => turn.tool_calls.push(ToolCall {
                        id,
                        name,
                        args: block["input"].clone(),
                    }),
                    _ => turn.invalid_calls.push((
                        id,
                        name,
                        "the arguments are not a JSON object".into(),
                    )),
                }
            }
            _ => {}
        }
    }
    turn
}

fn read_openai(json: &Value) -> ModelTurn {
    let message = &json["choices"][0]["message"];
    let mut turn = ModelTurn {
        text: message["content"].as_str().unwrap_or_default().to_owned(),
        ..ModelTurn::default()
    };
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let id = call["id"].as_str().unwrap_or_default().to_owned();
        let name = call["function"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let raw = call["function"]["arguments"].as_str().unwrap_or("{}");
        match serde_json::from_str::<Value>(raw) {
            Ok(args @ Value::Object(_)) => turn.tool_calls.push(ToolCall { id, name, args }),
            Ok(_) => {
                turn.invalid_calls
                    .push((id, name, "the arguments are not a JSON object".into()))
            }
            Err(err) => turn.invalid_calls.push((
                id,
                name,
                format!("the arguments are not valid JSON: {err}"),
            )),
        }
    }
    turn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_wires_are_written_in_the_providers_shapes() {
        let messages = read_file_round("text", true);
        let tools = vec![ToolSchema {
            name: "read_file".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object"}),
        }];
        let params = ModelParams {
            max_tokens: 100,
            temperature: Some(0.5),
            ..ModelParams::default()
        };
        let mut openai = openai_body("m", "sys", &messages, &tools, &params);
        openai.tool_choice = Some("required");
        assert_eq!(
            serde_json::to_value(&openai).unwrap(),
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "goal"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "t1", "type": "function", "function": {"name": "read_file", "arguments": "{\"file_path\":\"a\"}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "t1", "content": "text"},
                ],
                "max_tokens": 100,
                "stream": false,
                "tools": [{"type": "function", "function": {"name": "read_file", "description": "Reads a file", "parameters": {"type": "object"}}}],
                "temperature": 0.5,
                "tool_choice": "required",
            })
        );
        let anthropic = anthropic_body("m", "sys", &messages, &tools, &ModelParams::default());
        assert_eq!(
            serde_json::to_value(&anthropic).unwrap(),
            json!({
                "model": "m",
                "max_tokens": ModelParams::default().max_tokens,
                "system": "sys",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "goal"}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read_file", "input": {"file_path": "a"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "text", "is_error": true}]},
                ],
                "tools": [{"name": "read_file", "description": "Reads a file", "input_schema": {"type": "object"}}],
            })
        );
    }

    #[test]
    fn anthropic_merges_tool_results_and_the_next_user_turn() {
        let mut messages = read_file_round("contents", false);
        messages.push(Message::human("rejected: use b"));
        let body = serde_json::to_value(anthropic_body(
            "m",
            "sys",
            &messages,
            &[],
            &ModelParams::default(),
        ))
        .unwrap();
        let wire = body["messages"].as_array().unwrap();
        assert_eq!(wire.len(), 3);
        assert_eq!(wire[1]["content"][0]["type"], "tool_use");
        assert_eq!(wire[2]["content"][0]["type"], "tool_result");
        assert_eq!(wire[2]["content"][1]["text"], "rejected: use b");
    }

    #[test]
    fn openai_arguments_that_are_not_json_are_invalid_calls() {
        let turn = read_openai(
            &json!({"choices": [{"message": {"content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{\"file_path\": \"x\"}"}},
                {"id": "b", "type": "function", "function": {"name": "edit_file", "arguments": "{oops"}}
            ]}}]}),
        );
        assert_eq!(turn.tool_calls.len(), 1);
        assert_eq!(turn.invalid_calls.len(), 1);
        assert_eq!(turn.invalid_calls[0].0, "b");
    }

    /// A goal, the model's `read_file` call `t1`, and the tool's result.
    fn read_file_round(result: &str, is_error: bool) -> Vec<Message> {
        let call = ToolCall {
            id: "t1".into(),
            name: "read_file".into(),
            args: json!({"file_path": "a"}),
        };
        vec![
            Message::human("goal"),
            Message::AiMessage {
                content: String::new(),
                tool_calls: vec![call.clone()],
            },
            Message::tool(&call, result, is_error),
        ]
    }
}
