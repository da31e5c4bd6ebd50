//! The ReAct loop: ask the gateway for the next step, run the tool it names,
//! feed the observation back, until the model gives a final answer.
//!
//! - At most [`MAX_STEPS`] steps, then A1006.
//! - A step ending in a retryable `error` event before any answer text was
//!   forwarded is retried at most [`MAX_STEP_RETRIES`] times.
//! - `final_answer_delta` texts go to the chunk sender as they arrive.
//! - A tool the monolith does not implement ends the request with A9999 (the
//!   gateway offered a tool this monolith is too old for); the gateway's own
//!   "tool not available" error event ends it with G3001.
//! - A tool used a second time in one request is not run again: the model is
//!   told it already has that answer.

use std::collections::HashSet;
use tracing::Instrument;

use contracts::{
    AgentMessage, AgentOptions, AgentRequest, AgentScratchpad, AgentStep, MessageRole,
};
use futures::StreamExt;

use super::named_code::AttachedContext;
use super::tools::{ToolBox, ToolEnv, ToolInput, ToolOutcome};
use super::{RequestContext, Services};
use crate::chat::completion::{ChatAnswer, ChunkSender};
use crate::gateway_client::{GatewayError, error_event_failure, transport_backoff};
use contracts::{AgentEvent, DuoErrorCode};

pub const MAX_STEPS: usize = 10;
pub const MAX_STEP_RETRIES: usize = 2;

/// Resources the monolith cannot serve to the agent.
const UNAVAILABLE_RESOURCES: [&str; 2] = ["Pipelines", "Vulnerabilities"];

/// How one step of the model ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// Answer text (already forwarded to the chunk sender).
    Final(String),
    Action {
        tool: String,
        tool_input: String,
        thought: String,
    },
    /// The model followed neither format; its text is the answer.
    Unknown(String),
}

/// The observation for a tool the model already used in this request.
pub fn already_used_observation(tool: &str) -> String {
    format!("You already have the answer from the {tool} tool, read it carefully.")
}

pub struct ReactExecutor<'a> {
    services: &'a Services,
    ctx: &'a RequestContext,
    tools: &'a ToolBox,
}

impl<'a> ReactExecutor<'a> {
    pub fn new(services: &'a Services, ctx: &'a RequestContext, tools: &'a ToolBox) -> Self {
        Self {
            services,
            ctx,
            tools,
        }
    }

    pub async fn run(&self, chunks: &ChunkSender) -> ChatAnswer {
        let context = match super::page_context(self.services, self.ctx).await {
            Ok(context) => context,
            Err(e) => {
                tracing::debug!(error = %e, "page resource could not be serialised");
                None
            }
        };
        // Without a page, the resource the question names (if readable).
        let mut additional_context = self.ctx.additional_context.clone();
        let context = match context {
            Some(context) => Some(context),
            None => match super::named_resources::named_context(self.services, self.ctx).await {
                Some(AttachedContext::Resource(context)) => Some(context),
                Some(AttachedContext::Item(item)) => {
                    additional_context.push(item);
                    None
                }
                None => None,
            },
        };
        let mut question = AgentMessage::new(MessageRole::User, self.ctx.question.clone());
        question.context = context;
        question.current_file = self.ctx.current_file.clone();
        if !additional_context.is_empty() {
            question.additional_context = Some(additional_context);
        }

        let mut steps: Vec<AgentStep> = Vec::new();
        let mut used: HashSet<String> = HashSet::new();
        for step_number in 1..=MAX_STEPS {
            let step_span = traced(|| {
                tracing::info_span!(
                    "agent.step",
                    duo.agent.step = step_number,
                    duo.agent.next = tracing::field::Empty,
                    duo.error_code = tracing::field::Empty,
                    otel.status_code = tracing::field::Empty,
                )
            });
            let outcome = match self
                .step_with_retries(&question, &steps, chunks)
                .instrument(step_span.clone())
                .await
            {
                Ok(outcome) => outcome,
                Err(err) => {
                    step_span.record("duo.error_code", err.code().to_string());
                    step_span.record("otel.status_code", "ERROR");
                    return ChatAnswer::failed(err.code(), err.to_string());
                }
            };
            step_span.record(
                "duo.agent.next",
                match &outcome {
                    StepOutcome::Action { tool, .. } => tool.as_str(),
                    StepOutcome::Final(_) | StepOutcome::Unknown(_) => "final_answer",
                },
            );
            match outcome {
                StepOutcome::Final(text) => return ChatAnswer::text(text),
                StepOutcome::Unknown(text) => {
                    let _ = chunks.send(text.clone());
                    return ChatAnswer::text(text);
                }
                StepOutcome::Action {
                    tool,
                    tool_input,
                    thought,
                } => {
                    let Some(implementation) = self.tools.find(&tool) else {
                        // Version skew: the gateway offered a tool this monolith lacks.
                        return ChatAnswer::failed(
                            DuoErrorCode::A9999,
                            format!(
                                "the gateway chose the tool {tool:?}, which this monolith does not implement"
                            ),
                        );
                    };
                    let observation = if used.contains(&tool) {
                        already_used_observation(&tool)
                    } else {
                        used.insert(tool.clone());
                        let env = ToolEnv {
                            services: self.services,
                            ctx: self.ctx,
                            chunks,
                        };
                        let input = ToolInput {
                            input: tool_input.clone(),
                            suggestions: thought.clone(),
                        };
                        // The tool and the kind of resource it reads, never
                        // its input or what it found.
                        let tool_span = traced(|| {
                            tracing::info_span!(
                                parent: &step_span,
                                "agent.tool",
                                otel.name = %format!("execute_tool {tool}"),
                                gen_ai.operation.name = "execute_tool",
                                gen_ai.tool.name = %tool,
                                duo.resource_type = resource_type(&tool),
                                duo.error_code = tracing::field::Empty,
                                otel.status_code = tracing::field::Empty,
                            )
                        });
                        // The client shows which tool runs (a TOOL message).
                        chunks.tool(&tool);
                        let outcome = self
                            .tools
                            .run(implementation, &env, &input)
                            .instrument(tool_span.clone())
                            .await;
                        match outcome {
                            ToolOutcome::Observation(text) => text,
                            ToolOutcome::Final(answer) => return answer,
                            ToolOutcome::Failed { code, detail } => {
                                tool_span.record("duo.error_code", code.to_string());
                                tool_span.record("otel.status_code", "ERROR");
                                return ChatAnswer::failed(code, detail);
                            }
                        }
                    };
                    steps.push(AgentStep {
                        thought,
                        tool,
                        tool_input,
                        observation,
                    });
                }
            }
        }
        ChatAnswer::failed(
            DuoErrorCode::A1006,
            format!("no final answer after {MAX_STEPS} steps"),
        )
    }

    fn request(&self, question: &AgentMessage, steps: &[AgentStep]) -> AgentRequest {
        let mut messages = self.ctx.history.clone();
        messages.push(question.clone());
        AgentRequest {
            messages,
            options: (!steps.is_empty()).then(|| AgentOptions {
                agent_scratchpad: Some(AgentScratchpad::react(steps.to_vec())),
            }),
            model_metadata: self.ctx.model.metadata().cloned(),
            unavailable_resources: Some(
                UNAVAILABLE_RESOURCES
                    .iter()
                    .map(|s| contracts::agent::ShortText::from(*s))
                    .collect(),
            ),
        }
    }

    async fn step_with_retries(
        &self,
        question: &AgentMessage,
        steps: &[AgentStep],
        chunks: &ChunkSender,
    ) -> Result<StepOutcome, GatewayError> {
        let request = self.request(question, steps);
        let started = tokio::time::Instant::now();
        let mut sink = StepChunks::new(chunks);
        let mut error_events = 0;
        let mut transport_retries = 0;
        loop {
            sink.restart();
            match self.step(&request, &mut sink).await {
                Err(StepError::Retryable(message)) if error_events < MAX_STEP_RETRIES => {
                    error_events += 1;
                    tracing::debug!(attempt = error_events, %message, "retrying an agent step");
                }
                Err(StepError::Retryable(message)) => return Err(error_event_failure(&message)),
                // The hop to the gateway failed (it died, restarted, or cut
                // the stream): ask again on a new connection, within the
                // step's budget. Tools already run are in `steps`, so none
                // runs twice; the text already shown is not sent twice.
                Err(StepError::Failed(err)) if err.is_transient() => {
                    let Some(pause) = transport_backoff(transport_retries, started.elapsed())
                    else {
                        tracing::warn!(
                            code = %err.code(),
                            attempts = transport_retries + 1,
                            "the AI gateway stayed unreachable; giving up on the step"
                        );
                        return Err(err);
                    };
                    transport_retries += 1;
                    tracing::info!(
                        attempt = transport_retries,
                        pause_ms = pause.as_millis() as u64,
                        error = %err,
                        "the AI gateway hop failed; retrying the step"
                    );
                    tokio::time::sleep(pause).await;
                }
                Err(StepError::Failed(err)) => return Err(err),
                Ok(outcome) => return Ok(outcome),
            }
        }
    }

    async fn step(
        &self,
        request: &AgentRequest,
        chunks: &mut StepChunks<'_>,
    ) -> Result<StepOutcome, StepError> {
        let mut events = self
            .services
            .gateway
            .agent_step(&self.ctx.auth, request)
            .await
            .map_err(StepError::Failed)?;
        collect_step(&mut events, chunks).await
    }
}

/// The answer text of one step as the user sees it, across the step's
/// attempts: a retry's text is forwarded only past what an earlier attempt
/// already showed, so a user sees one answer, not its first words twice.
/// When a retry says something else than what was shown, nothing more is
/// streamed and the stored final answer (sent whole when the request ends)
/// replaces the partial one.
pub struct StepChunks<'a> {
    sender: &'a ChunkSender,
    /// What reached the user in this step so far.
    shown: String,
    /// This attempt's text.
    attempt: String,
    diverged: bool,
}

impl<'a> StepChunks<'a> {
    pub fn new(sender: &'a ChunkSender) -> Self {
        Self {
            sender,
            shown: String::new(),
            attempt: String::new(),
            diverged: false,
        }
    }

    /// A new attempt of the step begins.
    pub fn restart(&mut self) {
        self.attempt.clear();
    }

    /// Text of the current attempt: shown unless an earlier attempt showed it.
    pub fn push(&mut self, text: &str) {
        self.attempt.push_str(text);
        if self.diverged {
            return;
        }
        if self.attempt.len() <= self.shown.len() {
            self.diverged = !self.shown.starts_with(self.attempt.as_str());
        } else if self.attempt.starts_with(self.shown.as_str()) {
            let new = self.attempt[self.shown.len()..].to_owned();
            self.shown.push_str(&new);
            let _ = self.sender.send(new);
        } else {
            self.diverged = true;
        }
    }
}

/// A span when traces are exported, none otherwise (nothing to pay for).
fn traced(make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if duo_telemetry::traces_enabled() {
        make()
    } else {
        tracing::Span::none()
    }
}

/// The kind of GitLab resource a chat tool reads, for its span.
fn resource_type(tool: &str) -> &'static str {
    match tool {
        "issue_reader" => "issue",
        "epic_reader" => "epic",
        "merge_request_reader" => "merge_request",
        "build_reader" => "ci_build",
        "commit_reader" => "commit",
        "codebase_search" => "repository",
        "gitlab_documentation" => "documentation",
        _ => "other",
    }
}

#[derive(Debug)]
pub enum StepError {
    /// A retryable `error` event arrived before any answer text was forwarded.
    Retryable(String),
    Failed(GatewayError),
}

/// Reads one step's events: forwards answer text live and decides how the
/// step ended.
pub async fn collect_step<S>(
    events: &mut S,
    chunks: &mut StepChunks<'_>,
) -> Result<StepOutcome, StepError>
where
    S: futures::Stream<Item = Result<AgentEvent, GatewayError>> + Unpin,
{
    let mut answer = String::new();
    let mut action = None;
    let mut unknown: Option<String> = None;
    let mut any_event = false;
    while let Some(event) = events.next().await {
        any_event = true;
        let event = match event {
            Ok(event) => event,
            // The stream broke: the caller may ask again (transport errors),
            // whatever part of the answer was already shown.
            Err(err) => return Err(StepError::Failed(err)),
        };
        match event {
            AgentEvent::FinalAnswerDelta { text, .. } => {
                if !text.is_empty() {
                    chunks.push(&text);
                    answer.push_str(&text);
                }
            }
            AgentEvent::Action {
                tool,
                tool_input,
                thought,
            } => {
                if action.is_none() {
                    action = Some(StepOutcome::Action {
                        tool,
                        tool_input,
                        thought,
                    });
                }
            }
            AgentEvent::Unknown { text } => {
                unknown.get_or_insert_with(String::new).push_str(&text);
            }
            AgentEvent::Error { message, retryable } => {
                if answer.is_empty() {
                    return Err(if retryable {
                        StepError::Retryable(message)
                    } else {
                        StepError::Failed(error_event_failure(&message))
                    });
                }
                // Part of the answer already reached the user.
                return Err(StepError::Failed(GatewayError::Interrupted(message)));
            }
        }
    }
    if !any_event {
        return Err(StepError::Failed(GatewayError::NoEvents));
    }
    if !answer.is_empty() {
        return Ok(StepOutcome::Final(answer));
    }
    if let Some(action) = action {
        return Ok(action);
    }
    match unknown {
        Some(text) if !text.trim().is_empty() => Ok(StepOutcome::Unknown(text)),
        _ => Err(StepError::Failed(GatewayError::NoEvents)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(events: Vec<AgentEvent>) -> (Result<StepOutcome, StepError>, Vec<String>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let tx: ChunkSender = tx.into();
        let mut stream = futures::stream::iter(events.into_iter().map(Ok));
        let outcome = collect_step(&mut stream, &mut StepChunks::new(&tx)).await;
        let mut chunks = Vec::new();
        while let Ok(c) = rx.try_recv() {
            chunks.push(c);
        }
        (outcome, chunks)
    }

    fn error(retryable: bool) -> AgentEvent {
        AgentEvent::Error {
            message: "overloaded_error".into(),
            retryable,
        }
    }

    #[tokio::test]
    async fn step_outcomes() {
        let (outcome, chunks) = collect(vec![AgentEvent::delta("a"), AgentEvent::delta("b")]).await;
        assert_eq!(outcome.unwrap(), StepOutcome::Final("ab".into()));
        assert_eq!(chunks, vec!["a", "b"]);

        let action = AgentEvent::Action {
            tool: "issue_reader".into(),
            tool_input: "#1".into(),
            thought: "t".into(),
        };
        let (outcome, _) = collect(vec![action, AgentEvent::Unknown { text: "x".into() }]).await;
        assert!(matches!(outcome.unwrap(), StepOutcome::Action { .. }));

        let (outcome, _) = collect(vec![AgentEvent::Unknown {
            text: "plain".into(),
        }])
        .await;
        assert_eq!(outcome.unwrap(), StepOutcome::Unknown("plain".into()));

        let (outcome, _) = collect(vec![]).await;
        assert!(matches!(
            outcome,
            Err(StepError::Failed(GatewayError::NoEvents))
        ));

        let (outcome, _) = collect(vec![error(true)]).await;
        assert!(matches!(outcome, Err(StepError::Retryable(_))));

        let (outcome, _) = collect(vec![error(false)]).await;
        match outcome {
            Err(StepError::Failed(e)) => assert_eq!(e.code(), DuoErrorCode::A1004),
            other => panic!("{other:?}"),
        }

        // Once text reached the user, a failure is never retried: A1003.
        let (outcome, chunks) = collect(vec![AgentEvent::delta("partial"), error(true)]).await;
        match outcome {
            Err(StepError::Failed(e)) => assert_eq!(e.code(), DuoErrorCode::A1003),
            other => panic!("{other:?}"),
        }
        assert_eq!(chunks, vec!["partial"]);
    }

    fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(c) = rx.try_recv() {
            out.push(c);
        }
        out
    }

    #[test]
    fn a_retried_step_shows_only_what_was_not_shown_yet() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let tx: ChunkSender = tx.into();
        let mut sink = StepChunks::new(&tx);
        sink.push("The answer");
        sink.push(" is");
        // The stream broke; the retry says the same and then more.
        sink.restart();
        sink.push("The ans");
        sink.push("wer is forty");
        sink.push("-two.");
        assert_eq!(drain(&mut rx), ["The answer", " is", " forty", "-two."]);
    }

    #[test]
    fn a_retry_that_says_something_else_streams_no_more() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let tx: ChunkSender = tx.into();
        let mut sink = StepChunks::new(&tx);
        sink.push("Yes, because");
        sink.restart();
        sink.push("No, since it");
        sink.push(" cannot.");
        assert_eq!(drain(&mut rx), ["Yes, because"]);
    }

    #[test]
    fn transport_retries_back_off_and_stop_at_the_budget() {
        use crate::gateway_client::{MAX_TRANSPORT_RETRIES, RETRY_BUDGET};
        let zero = std::time::Duration::ZERO;
        let first = transport_backoff(0, zero).unwrap();
        assert!(first >= std::time::Duration::from_millis(250));
        assert!(first <= std::time::Duration::from_millis(375));
        let later = transport_backoff(5, zero).unwrap();
        assert!(later >= std::time::Duration::from_secs(2));
        assert!(transport_backoff(MAX_TRANSPORT_RETRIES, zero).is_none());
        assert!(transport_backoff(0, RETRY_BUDGET).is_none());
    }

    #[test]
    fn no_transport_failure_is_unexpected() {
        for err in [
            GatewayError::Connect("refused".into()),
            GatewayError::StreamCut("reset".into()),
            GatewayError::Timeout,
            GatewayError::NoEvents,
            GatewayError::Status { status: 502 },
            GatewayError::Status { status: 503 },
            GatewayError::Status { status: 504 },
        ] {
            assert_ne!(err.code(), DuoErrorCode::A9999, "{err}");
        }
    }
}
