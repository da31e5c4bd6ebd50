//! The chat agent's step with the provider's own tool calling (a prompt
//! family with `params.tool_calling: native`): the tools go to the model as
//! function definitions, earlier steps as calls and their results, and the
//! structured answer becomes the same NDJSON events the ReAct parser emits,
//! so the monolith cannot tell which way the model was asked.
//!
//! The calls themselves go through the workflow service's
//! [`ToolCallingModel`] (Anthropic tool use, OpenAI `tools`, which the
//! bundled model server enforces with a grammar).

use super::tools_registry::ToolDefinition;
use crate::providers::{ModelParams, ProviderError};
use crate::workflow_service::model::{ModelRoute, ModelTurn, ToolCallingModel, ToolSchema};
use crate::workflow_service::state::{Message, ToolCall};
use contracts::{AgentEvent, AgentStep};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

/// The argument a model may give a chat tool: what the ReAct format calls
/// the Action Input. The tools ask for none (every reader wants the user's
/// question unchanged, and it makes a good documentation query), so a small
/// model only has to choose; a model that sends one anyway is heard.
pub const INPUT_ARGUMENT: &str = "input";

/// The function that stands for answering without a tool: the model must
/// call a function, so its choice is always well formed, and answering
/// directly is one of the choices.
pub const DIRECT_ANSWER: &str = "answer_directly";

/// Everything one native step needs, prepared before streaming starts.
#[derive(Debug, Clone)]
pub struct NativeStep {
    pub route: ModelRoute,
    pub system: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSchema>,
    pub params: ModelParams,
    /// The user's question: the tool input when the model gives none.
    pub question: String,
}

/// How long a direct answer from the bundled model may be, in characters:
/// its grammar then closes the answer in time, so a rambling small model
/// still produces a call that parses within its token budget (the `native`
/// family's 1024 tokens: a token adds at least one character).
pub const BUNDLED_ANSWER_CHARS: u64 = 600;

/// The direct answer, then the catalogue's tools, as function definitions;
/// `answer_chars` bounds the direct answer's length.
pub fn tool_schemas(tools: &[&ToolDefinition], answer_chars: Option<u64>) -> Vec<ToolSchema> {
    let mut answer = json!({"type": "string", "description": "The answer, in Markdown"});
    if let Some(limit) = answer_chars {
        answer["maxLength"] = json!(limit);
    }
    let direct = ToolSchema {
        name: DIRECT_ANSWER.to_owned(),
        description: "Answers the user directly, without reading anything: for greetings, \
            general programming questions, and questions the other functions cannot read."
            .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {"answer": answer},
            "required": ["answer"],
            "additionalProperties": false,
        }),
    };
    // The direct answer first: small models lean towards the first function
    // listed, and the bench (./dev bench agent-tools) measured fewer tool
    // calls for plain questions this way.
    let readers = tools.iter().map(|tool| ToolSchema {
        name: tool.name.to_owned(),
        // The last sentence tells a ReAct model what to write as input.
        description: tool
            .description
            .split(" Give ")
            .next()
            .unwrap_or(tool.description)
            .to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {},
            "additionalProperties": false,
        }),
    });
    std::iter::once(direct).chain(readers).collect()
}

/// Earlier steps of this question as the model's own calls and their results.
pub fn step_messages(steps: &[AgentStep]) -> Vec<Message> {
    let mut messages = Vec::with_capacity(steps.len() * 2);
    for (i, step) in steps.iter().enumerate() {
        let call = ToolCall {
            id: format!("call_step_{i}"),
            name: step.tool.replace("\\_", "_"),
            args: json!({ INPUT_ARGUMENT: step.tool_input }),
        };
        messages.push(Message::AiMessage {
            content: step.thought.replace("\\_", "_"),
            tool_calls: vec![call.clone()],
        });
        messages.push(Message::tool(&call, step.observation.clone(), false));
    }
    messages
}

/// The events for one model turn: an `action` for a call to a permitted
/// tool, the answer as one `final_answer_delta` otherwise.
pub fn turn_events(turn: ModelTurn, tools: &[&ToolDefinition], question: &str) -> Vec<AgentEvent> {
    if let Some(call) = turn.tool_calls.into_iter().next() {
        if call.name == DIRECT_ANSWER {
            let answer = match call.args.get("answer") {
                Some(Value::String(text)) => text.clone(),
                _ => String::new(),
            };
            if answer.trim().is_empty() {
                return vec![AgentEvent::Unknown { text: answer }];
            }
            return vec![AgentEvent::delta(answer)];
        }
        let Some(permitted) = tools.iter().find(|t| t.name == call.name) else {
            return vec![AgentEvent::Error {
                message: super::agent::TOOL_NOT_AVAILABLE.into(),
                retryable: false,
            }];
        };
        tracing::debug!(event = %format!("request_{}", permitted.unit_primitive), tool = %call.name, "agent chose a tool");
        let tool_input = match call.args.get(INPUT_ARGUMENT) {
            Some(Value::String(text)) if !text.trim().is_empty() => text.clone(),
            _ => question.to_owned(),
        };
        let thought = if turn.text.trim().is_empty() {
            format!("I should use {} to answer this.", call.name)
        } else {
            turn.text.trim().to_owned()
        };
        return vec![AgentEvent::Action {
            tool: call.name,
            tool_input,
            thought,
        }];
    }
    if let Some((_, name, reason)) = turn.invalid_calls.into_iter().next() {
        return vec![AgentEvent::Unknown {
            text: format!("the model called {name} with unreadable arguments: {reason}"),
        }];
    }
    if turn.text.trim().is_empty() {
        return vec![AgentEvent::Unknown { text: turn.text }];
    }
    vec![AgentEvent::delta(turn.text)]
}

fn error_event(err: &ProviderError) -> AgentEvent {
    tracing::warn!(error = %err, retryable = err.retryable(), "model call failed during a native agent step");
    AgentEvent::Error {
        message: err.to_string(),
        retryable: err.retryable(),
    }
}

/// Calls the model once and streams the step's events.
pub fn run(
    model: ToolCallingModel,
    step: NativeStep,
    tools: Vec<&'static ToolDefinition>,
) -> BoxStream<'static, AgentEvent> {
    async_stream::stream! {
        if step.route == ModelRoute::Mock {
            yield AgentEvent::Unknown { text: "mock".into() };
            return;
        }
        match model
            .complete_with(&step.route, &step.system, &step.messages, &step.tools, &step.params, true)
            .await
        {
            Ok(turn) => {
                for event in turn_events(turn, &tools, &step.question) {
                    yield event;
                }
            }
            Err(err) => yield error_event(&err),
        }
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tools_registry::TOOLS;

    fn catalogue() -> Vec<&'static ToolDefinition> {
        TOOLS.iter().collect()
    }

    #[test]
    fn a_call_becomes_an_action_with_its_input() {
        let turn = ModelTurn {
            text: String::new(),
            tool_calls: vec![ToolCall {
                id: "c".into(),
                name: "issue_reader".into(),
                args: json!({"input": "Summarize issue #1"}),
            }],
            invalid_calls: vec![],
        };
        assert_eq!(
            turn_events(turn, &catalogue(), "q"),
            vec![AgentEvent::Action {
                tool: "issue_reader".into(),
                tool_input: "Summarize issue #1".into(),
                thought: "I should use issue_reader to answer this.".into(),
            }]
        );
    }

    #[test]
    fn a_call_without_input_reads_with_the_question() {
        let turn = ModelTurn {
            tool_calls: vec![ToolCall {
                id: "c".into(),
                name: "epic_reader".into(),
                args: json!({}),
            }],
            ..ModelTurn::default()
        };
        match &turn_events(turn, &catalogue(), "What is epic &1?")[..] {
            [AgentEvent::Action { tool_input, .. }] => assert_eq!(tool_input, "What is epic &1?"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_tools_text_and_empty_turns() {
        let call = |name: &str| ModelTurn {
            tool_calls: vec![ToolCall {
                id: "c".into(),
                name: name.into(),
                args: json!({"input": "x"}),
            }],
            ..ModelTurn::default()
        };
        assert!(matches!(
            turn_events(call("rm_rf"), &catalogue(), "q")[..],
            [AgentEvent::Error { .. }]
        ));
        let text = ModelTurn {
            text: "Rebase rewrites history.".into(),
            ..ModelTurn::default()
        };
        assert_eq!(
            turn_events(text, &catalogue(), "q"),
            vec![AgentEvent::delta("Rebase rewrites history.")]
        );
        assert!(matches!(
            turn_events(ModelTurn::default(), &catalogue(), "q")[..],
            [AgentEvent::Unknown { .. }]
        ));
    }

    #[test]
    fn schemas_speak_of_the_input_argument() {
        let schemas = tool_schemas(&catalogue(), None);
        let (direct, tools) = schemas.split_first().unwrap();
        for schema in tools {
            assert!(
                !schema.description.contains("Action Input"),
                "{}",
                schema.name
            );
            assert_eq!(schema.parameters["properties"], json!({}));
        }
        assert_eq!(direct.name, DIRECT_ANSWER);
        let answer = ModelTurn {
            tool_calls: vec![ToolCall {
                id: "c".into(),
                name: DIRECT_ANSWER.into(),
                args: json!({"answer": "Hi."}),
            }],
            ..ModelTurn::default()
        };
        assert_eq!(
            turn_events(answer, &catalogue(), "q"),
            vec![AgentEvent::delta("Hi.")]
        );
    }
}
