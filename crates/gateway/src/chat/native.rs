//! The chat agent's step with the provider's own tool calling (a prompt
//! family with `params.tool_calling: native`): the tools go to the model as
//! function definitions, earlier steps as calls and their results, and the
//! structured answer becomes the same NDJSON events the ReAct parser emits,
//! so the monolith cannot tell which way the model was asked.
//!
//! The calls themselves go through the providers' tool-calling client,
//! [`ToolCallingModel`] (Anthropic tool use, OpenAI `tools`, which the
//! bundled model server enforces with a grammar).

use super::FEATURE_CATEGORY;
use super::tools_registry::{TOOL_NOT_AVAILABLE, ToolDefinition};
use crate::observability::ModelWaitClock;
use crate::providers::conversation::{Message, ToolCall};
use crate::providers::tool_calling::{
    ModelTurn, ToolCallingModel, ToolSchema, TurnAssembler, TurnDelta, TurnOptions,
};
use crate::providers::{ModelParams, ModelRoute, ProviderError};
use crate::recent_values::RecentValues;
use contracts::{AgentEvent, AgentStep};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};
use std::cell::RefCell;
use std::sync::Arc;

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
    pub tools: Arc<[ToolSchema]>,
    pub params: ModelParams,
    /// The user's question: the tool input when the model gives none.
    pub question: String,
    /// Set for models that answer better in plain text than inside a
    /// function call's JSON (the bundled model).
    pub free_text: Option<FreeTextAnswer>,
}

/// How a small model answers in plain text: the agent's system prompt
/// without the tool instructions, and the conversation with the results of
/// earlier steps written out for it. Asked instead of the function call when
/// the question already carries its context (a small model answers from it
/// rather than choosing tools), after a tool ran, and as soon as the model
/// chooses `answer_directly` (its JSON answer is not waited for).
#[derive(Debug, Clone)]
pub struct FreeTextAnswer {
    pub system: String,
    pub messages: Vec<Message>,
    /// Whether the step goes straight to the plain-text answer.
    pub skip_choice: bool,
    /// The facts of the question's context the answer starts with, written
    /// by the gateway: a model this small cannot be relied on to quote them.
    pub lead: Option<String>,
}

/// The opening line of a small model's answer from labelled context: the
/// resource's title with its reference, state, labels and assignees, and the
/// files of a code search. `None` when the context has none of these.
pub fn context_lead(plain: &str) -> Option<String> {
    let field = |label: &str| {
        plain
            .lines()
            .find_map(|line| line.strip_prefix(label))
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let mut lead = String::new();
    if let Some(title) = field("Title: ") {
        let mut facts: Vec<String> = Vec::new();
        if let Some(reference) = field("Reference: ") {
            facts.push(reference.to_owned());
        }
        if let Some(state) = field("State: ") {
            facts.push(if state == "opened" {
                "open".to_owned()
            } else {
                state.to_owned()
            });
        }
        if let Some(labels) = field("Labels: ") {
            facts.push(format!("labels: {labels}"));
        }
        if let Some(assignees) = field("Assignees: ") {
            facts.push(format!("assignees: {assignees}"));
        }
        lead.push_str(&format!("**{title}**"));
        if !facts.is_empty() {
            lead.push_str(&format!(" ({})", facts.join(", ")));
        }
        // A merge request: its branches and the files its diff changes.
        if let (Some(source), Some(target)) = (field("Source branch: "), field("Target branch: ")) {
            lead.push_str(&format!("\nFrom `{source}` into `{target}`"));
            let mut changed: Vec<String> = Vec::new();
            for path in plain
                .lines()
                .filter_map(|l| l.strip_prefix("+++ b/"))
                .map(str::trim)
            {
                let path = format!("`{path}`");
                if !changed.contains(&path) && changed.len() < 5 {
                    changed.push(path);
                }
            }
            if !changed.is_empty() {
                lead.push_str(&format!("; changes {}", changed.join(", ")));
            }
        }
    }
    // A commit is attached as JSON (`Commit: {...}`): its title, short id
    // and changed files.
    if lead.is_empty()
        && let Some(commit) =
            field("Commit: ").and_then(|json| serde_json::from_str::<serde_json::Value>(json).ok())
    {
        let title = commit["title"].as_str().unwrap_or_default();
        let id: String = commit["id"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(8)
            .collect();
        let changed: Vec<String> = commit["diffs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["new_path"].as_str())
            .take(5)
            .map(|p| format!("`{p}`"))
            .collect();
        if !title.is_empty() {
            lead.push_str(&format!("**{title}** (commit {id})"));
            if !changed.is_empty() {
                lead.push_str(&format!("\nChanged: {}", changed.join(", ")));
            }
        }
    }
    let mut files: Vec<&str> = Vec::new();
    // A file attached by its link: its path is in the link.
    for link in plain.lines().filter_map(|l| l.strip_prefix("Id: ")) {
        if let Some((_, rest)) = link.trim().split_once("/-/blob/")
            && let Some((_, path)) = rest.split_once('/')
        {
            let path = path.split('#').next().unwrap_or(path);
            if !path.is_empty() && !files.contains(&path) {
                files.push(path);
            }
        }
    }
    for path in plain.lines().filter_map(|l| l.strip_prefix("File path: ")) {
        let path = path.trim();
        if !path.is_empty() && !files.contains(&path) && files.len() < 5 {
            files.push(path);
        }
    }
    if !files.is_empty() {
        if !lead.is_empty() {
            lead.push('\n');
        }
        let listed: Vec<String> = files.iter().map(|f| format!("`{f}`")).collect();
        lead.push_str(&format!("Files: {}", listed.join(", ")));
    }
    (!lead.is_empty()).then(|| format!("{lead}\n\n"))
}

/// How long a plain-text answer from the bundled model may be, in tokens:
/// about ten seconds of decoding on two cores, more than the questions a
/// 135M model can answer well need.
pub const BUNDLED_ANSWER_TOKENS: u32 = 400;

/// The bundled model server's penalty on repeating its own words in a
/// plain answer (llama.cpp's DRY sampler; 0.8 is its documented starting
/// point): greedy decoding of a 135M model otherwise repeats one line until
/// its token budget runs out.
pub const BUNDLED_DRY_MULTIPLIER: f32 = 0.8;

/// The context of a question written for a small model: GitLab's tagged
/// documents (`<title>X</title>`, `<search_result>` blocks) become labelled
/// lines (`Title: X`, `File path: src/a.rs`), which a 135M model quotes,
/// where it echoes tags or invents around them. Lines that are only a tag
/// are dropped, unless text follows (a `<description>` block: `Description:`).
pub fn plain_markup(text: &str) -> String {
    // No tag, entity or carriage return: the lines come out as they went in
    // (most questions), without the regular expressions' passes.
    if !text.contains(['<', '&', '\r']) {
        return text.trim_end().to_owned();
    }
    tags_to_lines(text)
}

fn tags_to_lines(text: &str) -> String {
    static SINGLE: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"^<([a-z_]+)>(.*)</([a-z_]+)>$").ok());
    static OPEN: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"^<([a-z_]+)>(.*)$").ok());
    static CLOSE: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"^(.*)</([a-z_]+)>$").ok());
    let (Some(single), Some(open), Some(close)) = (SINGLE.as_ref(), OPEN.as_ref(), CLOSE.as_ref())
    else {
        return text.to_owned();
    };
    let label = |tag: &str| {
        let words = tag.replace('_', " ");
        let mut chars = words.chars();
        chars
            .next()
            .map(|first| first.to_uppercase().chain(chars).collect::<String>())
            .unwrap_or_default()
    };
    // Tags written on one line (`<issue><title>X</title></issue>`) first
    // go one per line.
    static ADJACENT: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"(</?[a-z_]+>)(</?[a-z_]+>)").ok());
    let mut split = text.to_owned();
    if let Some(adjacent) = ADJACENT.as_ref() {
        for _ in 0..2 {
            split = adjacent.replace_all(&split, "$1\n$2").into_owned();
        }
    }
    let lines: Vec<&str> = split.lines().collect();
    let mut out = String::with_capacity(text.len());
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if let Some(found) = single.captures(trimmed)
            && found[1] == found[3]
        {
            let value = found[2].trim();
            if !value.is_empty() {
                out.push_str(&format!("{}: {value}\n", label(&found[1])));
            }
            continue;
        }
        if let Some(found) = open.captures(trimmed) {
            let rest = found[2].trim();
            let next_is_text = lines
                .get(i + 1)
                .is_some_and(|next| !next.trim_start().starts_with('<'));
            if !rest.is_empty() {
                out.push_str(&format!("{}: {rest}\n", label(&found[1])));
            } else if next_is_text {
                out.push_str(&format!("{}:\n", label(&found[1])));
            }
            continue;
        }
        if let Some(found) = close.captures(trimmed) {
            let before = found[1].trim_end();
            if !before.is_empty() {
                out.push_str(before);
                out.push('\n');
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    unescape_entities(out.trim_end())
}

/// The five XML entities the monolith's documents escape (`acme&amp;1` is
/// the epic `acme&1`), back to their characters; `&amp;` last so that an
/// escaped entity stays one.
fn unescape_entities(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

impl FreeTextAnswer {
    /// The plain-text form of a step: `base` is the conversation up to and
    /// including the question; each earlier step's result follows as a user
    /// turn that asks for the answer from it.
    pub fn new(system: String, base: Vec<Message>, steps: &[AgentStep], has_context: bool) -> Self {
        let mut messages: Vec<Message> = base
            .into_iter()
            .map(|message| match message {
                Message::HumanMessage { content } => Message::human(plain_markup(&content)),
                other => other,
            })
            .collect();
        if !steps.is_empty() {
            let mut results = String::from(
                "Here is what was read to answer my question. Answer it from this, quoting names, titles, states and paths exactly.\n",
            );
            for step in steps {
                results.push_str(&format!(
                    "\nFrom {tool}:\n{observation}\n",
                    tool = step.tool.replace("\\_", "_"),
                    observation = plain_markup(&step.observation)
                ));
            }
            messages.push(Message::human(results));
        }
        let lead = if has_context {
            messages.iter().rev().find_map(|m| match m {
                Message::HumanMessage { content } => context_lead(content),
                _ => None,
            })
        } else {
            None
        };
        Self {
            system,
            messages,
            skip_choice: has_context || !steps.is_empty(),
            lead,
        }
    }
}

/// The tools that read one named resource: they need a question naming it.
const READERS: [&str; 5] = [
    "issue_reader",
    "merge_request_reader",
    "epic_reader",
    "build_reader",
    "commit_reader",
];

/// Whether `question` names a resource a reader could look up: a reference
/// (`#12`, `!34`, `&5`, a commit id), a link, or "this issue" and the like.
/// A small model offered the readers for "What is a merge request?" calls
/// one; without such a name there is nothing for it to read.
pub fn names_a_resource(question: &str) -> bool {
    static NAMED: std::sync::LazyLock<Option<regex::Regex>> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r"(?ix)
            [\#!&]\d+                                   # #12, !34, &5
            | https?://\S+                               # a link
            | \b[0-9a-f]{7,40}\b                         # a commit id
            | \b(this|that|the\s+current)\s+(issue|merge\s+request|mr|epic|job|build|pipeline|commit)\b
            | \b(issue|merge\s+request|mr|epic|job|build|commit)\s+(number\s+)?\d+\b",
        )
        .ok()
    });
    NAMED.as_ref().is_none_or(|named| named.is_match(question))
}

/// Whether `question` asks about code: where something is, a function, a
/// file, the repository.
pub fn asks_about_code(question: &str) -> bool {
    static CODE: std::sync::LazyLock<Option<regex::Regex>> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r"(?i)\b(code|codebase|function|method|class|struct|module|file|files|repository|repo|source|implemented|implementation|defined|handled|configured)\b|\bwhere\s+(is|are|do|does)\b",
        )
        .ok()
    });
    CODE.as_ref().is_none_or(|code| code.is_match(question))
}

/// The tools offered to the bundled model for `question`: a reader when it
/// names something to read, codebase search when it asks about code, and
/// nothing else: a model of its size answers a general question (or one
/// about GitLab) better by itself than by choosing and reading a tool, and
/// with nothing offered it is not asked to choose at all.
pub fn offered_to_small_model<'a>(
    tools: &[&'a ToolDefinition],
    question: &str,
) -> Vec<&'a ToolDefinition> {
    let named = names_a_resource(question);
    let code = asks_about_code(question);
    tools
        .iter()
        .filter(|tool| {
            (named && READERS.contains(&tool.name)) || (code && tool.name == "codebase_search")
        })
        .copied()
        .collect()
}

/// How long a direct answer from the bundled model may be, in characters:
/// its grammar then closes the answer in time, so a rambling small model
/// still produces a call that parses within its token budget (the `native`
/// family's 1024 tokens: a token adds at least one character).
pub const BUNDLED_ANSWER_CHARS: u64 = 600;

/// The direct answer, then the catalogue's tools, as function definitions;
/// `answer_chars` bounds the direct answer's length. `from_context`: the
/// question's resource is attached and the direct answer is the only
/// function, so it asks for that resource's facts.
pub fn tool_schemas(
    tools: &[&ToolDefinition],
    answer_chars: Option<u64>,
    from_context: bool,
) -> Arc<[ToolSchema]> {
    let key = SchemaKey {
        tools: tools
            .iter()
            .map(|tool| (tool.name, tool.description))
            .collect(),
        answer_chars,
        from_context,
    };
    KEPT_SCHEMAS.with_borrow_mut(|kept| {
        kept.get_or_insert_with(&key, || {
            let schemas = build_tool_schemas(tools, answer_chars, from_context);
            (key.clone(), schemas.into())
        })
    })
}

/// What a set of function definitions is built from: the tools' names and
/// descriptions are static, so equal keys build equal schemas.
#[derive(Clone, PartialEq, Eq)]
struct SchemaKey {
    tools: Vec<(&'static str, &'static str)>,
    answer_chars: Option<u64>,
    from_context: bool,
}

/// Schema sets each worker thread keeps (a few tool sets are offered in
/// turn; building one is JSON values for every tool, each request).
const KEPT_SCHEMA_SETS: usize = 16;

thread_local! {
    static KEPT_SCHEMAS: RefCell<RecentValues<SchemaKey, Arc<[ToolSchema]>>> =
        const { RefCell::new(RecentValues::new(KEPT_SCHEMA_SETS)) };
}

fn build_tool_schemas(
    tools: &[&ToolDefinition],
    answer_chars: Option<u64>,
    from_context: bool,
) -> Vec<ToolSchema> {
    let (function, argument) = if from_context {
        (
            "Answers the question from the GitLab resource given with it: its title and state first, then the facts the question asks for.",
            // The bundled model copies this text into its answer: it
            // says no more than the plain one.
            "The answer, in Markdown",
        )
    } else {
        (
            "Answers the user directly, without reading anything: for greetings, \
            general programming questions, and questions the other functions cannot read.",
            "The answer, in Markdown",
        )
    };
    let mut answer = json!({"type": "string", "description": argument});
    if let Some(limit) = answer_chars {
        answer["maxLength"] = json!(limit);
    }
    let direct = ToolSchema {
        name: DIRECT_ANSWER.to_owned(),
        description: function.to_owned(),
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
                message: TOOL_NOT_AVAILABLE.into(),
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

/// The plain-text answer, streamed as `final_answer_delta`s.
fn free_text_answer(
    model: &ToolCallingModel,
    step: &NativeStep,
    free: &FreeTextAnswer,
    wait_clock: Option<ModelWaitClock>,
) -> BoxStream<'static, AgentEvent> {
    let model = model.clone();
    let route = step.route.clone();
    let system = free.system.clone();
    let messages = free.messages.clone();
    let lead = free.lead.clone();
    let mut params = step.params.clone();
    params.max_tokens = params.max_tokens.min(BUNDLED_ANSWER_TOKENS);
    params.dry_multiplier = Some(BUNDLED_DRY_MULTIPLIER);
    async_stream::stream! {
        let options = TurnOptions {
            require_call: false,
            feature_category: FEATURE_CATEGORY,
            wait_clock,
        };
        let pieces = match model.stream_turn(&route, &system, &messages, &[], &params, options.clone()).await {
            Ok(Some(pieces)) => pieces,
            Ok(None) => match model.complete(&route, &system, &messages, &[], &params, options).await {
                Ok(turn) => futures::stream::iter([Ok(TurnDelta::Text(turn.text))]).boxed(),
                Err(err) => {
                    yield error_event(&err);
                    return;
                }
            },
            Err(err) => {
                yield error_event(&err);
                return;
            }
        };
        let mut pieces = pieces;
        let mut said = false;
        if let Some(lead) = lead {
            said = true;
            yield AgentEvent::delta(lead);
        }
        while let Some(piece) = pieces.next().await {
            match piece {
                Ok(TurnDelta::Text(text)) if !text.is_empty() => {
                    // Leading blank lines would start the answer's Markdown badly.
                    let text = if said { text } else { text.trim_start().to_owned() };
                    if !text.is_empty() {
                        said = true;
                        yield AgentEvent::delta(text);
                    }
                }
                Ok(_) => {}
                Err(err) => {
                    yield error_event(&err);
                    return;
                }
            }
        }
        if !said {
            yield AgentEvent::Unknown { text: String::new() };
        }
    }
    .boxed()
}

fn error_event(err: &ProviderError) -> AgentEvent {
    tracing::warn!(error = %err, retryable = err.retryable(), "model call failed during a native agent step");
    AgentEvent::Error {
        message: super::model_error_message(err),
        retryable: err.retryable(),
    }
}

/// Reads the `answer` string out of `answer_directly`'s arguments while they
/// are still being generated, so a direct answer streams like a ReAct final
/// answer instead of arriving in one piece at the end.
#[derive(Debug, Default)]
pub struct AnswerStreamer {
    raw: String,
    /// Where unread text starts in `raw`; `None` until the string opened.
    cursor: Option<usize>,
    closed: bool,
}

impl AnswerStreamer {
    /// Adds more argument text; returns the answer's newly decoded characters.
    pub fn push(&mut self, arguments: &str) -> String {
        self.raw.push_str(arguments);
        if self.closed {
            return String::new();
        }
        let start = match self.cursor {
            Some(at) => at,
            None => match answer_opening(&self.raw) {
                Some(at) => at,
                None => return String::new(),
            },
        };
        let mut out = String::new();
        let bytes = self.raw.as_bytes();
        let mut at = start;
        while at < bytes.len() {
            match bytes[at] {
                b'"' => {
                    self.closed = true;
                    at += 1;
                    break;
                }
                b'\\' => match unescape(&self.raw[at..]) {
                    Some((text, used)) => {
                        out.push_str(&text);
                        at += used;
                    }
                    // An escape cut in half: wait for the rest.
                    None => break,
                },
                _ => {
                    let Some(ch) = self.raw[at..].chars().next() else {
                        break;
                    };
                    out.push(ch);
                    at += ch.len_utf8();
                }
            }
        }
        self.cursor = Some(at);
        out
    }
}

/// Where the `answer` value's text starts (just past its opening quote).
fn answer_opening(raw: &str) -> Option<usize> {
    let key = raw.find("\"answer\"")? + "\"answer\"".len();
    let rest = &raw[key..];
    let colon = rest.find(|c: char| !c.is_whitespace())?;
    if !rest[colon..].starts_with(':') {
        return None;
    }
    let after = &rest[colon + 1..];
    let quote = after.find(|c: char| !c.is_whitespace())?;
    after[quote..]
        .starts_with('"')
        .then(|| key + colon + 1 + quote + 1)
}

/// One JSON escape at the start of `text` (which begins with a backslash):
/// its characters and how many bytes it used; `None` when incomplete.
fn unescape(text: &str) -> Option<(String, usize)> {
    let kind = *text.as_bytes().get(1)?;
    let simple = match kind {
        b'n' => Some('\n'),
        b't' => Some('\t'),
        b'r' => Some('\r'),
        b'b' => Some('\u{8}'),
        b'f' => Some('\u{c}'),
        b'/' => Some('/'),
        b'\\' => Some('\\'),
        b'"' => Some('"'),
        _ => None,
    };
    if let Some(ch) = simple {
        return Some((ch.to_string(), 2));
    }
    if kind != b'u' {
        // Not JSON; pass it through as written.
        return Some((text[..2].to_owned(), 2));
    }
    let unit = |from: usize| -> Option<u16> {
        text.get(from..from + 4)
            .and_then(|hex| u16::from_str_radix(hex, 16).ok())
    };
    let first = unit(2)?;
    if (0xD800..0xDC00).contains(&first) {
        // A surrogate pair: `\uD83D\uDE00`.
        if text.len() < 12 {
            return None;
        }
        let second = if text.get(6..8) == Some("\\u") {
            unit(8)
        } else {
            None
        };
        let decoded: String = char::decode_utf16(second.map_or(vec![first], |s| vec![first, s]))
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect();
        return Some((decoded, if second.is_some() { 12 } else { 6 }));
    }
    let decoded: String = char::decode_utf16([first])
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect();
    Some((decoded, 6))
}

/// Calls the model and streams the step's events. On the OpenAI wire the
/// turn streams, and a direct answer's text comes out as it is generated.
/// Time spent waiting on the model is added to `wait_clock`.
pub fn run(
    model: ToolCallingModel,
    step: NativeStep,
    tools: Vec<&'static ToolDefinition>,
    wait_clock: Option<ModelWaitClock>,
) -> BoxStream<'static, AgentEvent> {
    async_stream::stream! {
        if step.route == ModelRoute::Mock {
            yield AgentEvent::Unknown { text: "mock".into() };
            return;
        }
        let options = TurnOptions {
            require_call: true,
            feature_category: FEATURE_CATEGORY,
            wait_clock,
        };
        if let Some(free) = step.free_text.as_ref().filter(|f| f.skip_choice) {
            let mut answer = free_text_answer(&model, &step, free, options.wait_clock.clone());
            while let Some(event) = answer.next().await {
                yield event;
            }
            return;
        }
        let streamed = model
            .stream_turn(&step.route, &step.system, &step.messages, &step.tools, &step.params, options.clone())
            .await;
        let turn = match streamed {
            Err(err) => {
                yield error_event(&err);
                return;
            }
            Ok(None) => {
                match model
                    .complete(&step.route, &step.system, &step.messages, &step.tools, &step.params, options)
                    .await
                {
                    Ok(turn) => turn,
                    Err(err) => {
                        yield error_event(&err);
                        return;
                    }
                }
            }
            Ok(Some(mut pieces)) => {
                let mut turn = TurnAssembler::default();
                let mut answer = AnswerStreamer::default();
                let mut sent = String::new();
                while let Some(piece) = pieces.next().await {
                    let piece = match piece {
                        Ok(piece) => piece,
                        Err(err) => {
                            yield error_event(&err);
                            return;
                        }
                    };
                    turn.push(&piece);
                    if let (Some(free), true) = (
                        step.free_text.as_ref(),
                        turn.first_call_name() == Some(DIRECT_ANSWER),
                    ) {
                        // The choice is made: the JSON answer is not waited
                        // for (dropping the stream ends its generation).
                        drop(pieces);
                        let mut answer = free_text_answer(&model, &step, free, options.wait_clock.clone());
                        while let Some(event) = answer.next().await {
                            yield event;
                        }
                        return;
                    }
                    if let TurnDelta::Call { index: 0, arguments, .. } = &piece
                        && turn.first_call_name() == Some(DIRECT_ANSWER)
                    {
                        let text = answer.push(arguments);
                        if !text.is_empty() {
                            sent.push_str(&text);
                            yield AgentEvent::delta(text);
                        }
                    }
                }
                let events = turn_events(turn.finish(), &tools, &step.question);
                for event in events {
                    // The answer's streamed part is not sent twice.
                    match event {
                        AgentEvent::FinalAnswerDelta { text, .. } if !sent.is_empty() => {
                            if let Some(rest) = text.strip_prefix(sent.as_str())
                                && !rest.is_empty()
                            {
                                yield AgentEvent::delta(rest.to_owned());
                            }
                        }
                        other => yield other,
                    }
                }
                return;
            }
        };
        for event in turn_events(turn, &tools, &step.question) {
            yield event;
        }
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_context_becomes_labelled_lines() {
        let tagged = "<context>\nThe user is currently looking at this issue:\n<type>issue</type>\n<content>\n<issue>\n<reference>acme/api#1</reference>\n<title>Login fails</title>\n<state>opened</state>\n<created_at></created_at>\n<description>\nUsers get a 500.\nSteps: reload\n</description>\n</issue>\n</content>\n</context>\n<search_result>\n<file_path>src/session.rs</file_path>\n<content>fn refresh() {\n}</content>\n</search_result>\nSummarize it";
        assert_eq!(
            plain_markup(tagged),
            "Context:\nThe user is currently looking at this issue:\nType: issue\nReference: acme/api#1\nTitle: Login fails\nState: opened\nDescription:\nUsers get a 500.\nSteps: reload\nFile path: src/session.rs\nContent: fn refresh() {\n}\nSummarize it"
        );
        assert_eq!(plain_markup("a < b and c > d"), "a < b and c > d");
        assert_eq!(
            plain_markup("<issue><title>Add dark mode</title></issue>"),
            "Title: Add dark mode"
        );
        assert_eq!(
            plain_markup(
                "<epic>\n<reference>acme&amp;1</reference>\n<title>a &lt;b&gt; &amp;lt;</title>\n</epic>"
            ),
            "Reference: acme&1\nTitle: a <b> &lt;"
        );
    }

    #[test]
    fn text_without_tags_takes_the_short_way_to_the_same_result() {
        for text in [
            "What does this do?",
            "two\nlines\n\n",
            "  indented\n\ttabbed  \n",
            "",
            "\n\n",
            "trailing spaces   ",
            "unicode: héllo — ✓\nnext",
        ] {
            assert_eq!(plain_markup(text), tags_to_lines(text), "{text:?}");
        }
        // Anything the long way changes still takes it.
        assert_eq!(plain_markup("a\r\nb"), "a\nb");
        assert_eq!(plain_markup("x &amp; y"), "x & y");
    }

    #[test]
    fn a_small_models_answer_leads_with_the_contexts_facts() {
        let issue = "Context:\nType: issue\nReference: acme/api#1\nTitle: Login fails\nState: opened\nLabels: bug, auth\nDescription:\nUsers get a 500.\nSummarize it";
        assert_eq!(
            context_lead(issue).as_deref(),
            Some("**Login fails** (acme/api#1, open, labels: bug, auth)\n\n")
        );
        let code = "File path: src/session.rs\nContent: fn a()\nFile path: src/main.rs\nFile path: src/session.rs\nWhere?";
        assert_eq!(
            context_lead(code).as_deref(),
            Some("Files: `src/session.rs`, `src/main.rs`\n\n")
        );
        assert_eq!(context_lead("What is a merge request?"), None);
        let mr = "Title: Refresh sessions\nState: opened\nSource branch: fix\nTarget branch: main\nDiff:\n--- a/src/session.rs\n+++ b/src/session.rs\n@@ -1 +1 @@";
        assert_eq!(
            context_lead(mr).as_deref(),
            Some(
                "**Refresh sessions** (open)\nFrom `fix` into `main`; changes `src/session.rs`\n\n"
            )
        );
        let commit = r#"Commit: {"id": "fbbf7742fc3996a9", "title": "Refresh sessions", "diffs": [{"new_path": "src/session.rs"}]}"#;
        assert_eq!(
            context_lead(commit).as_deref(),
            Some("**Refresh sessions** (commit fbbf7742)\nChanged: `src/session.rs`\n\n")
        );
        let file = "Id: http://gitlab.example/acme/api/-/blob/main/config/api.toml#L3\nCategory: file\nContent: listen = 1";
        assert_eq!(
            context_lead(file).as_deref(),
            Some("Files: `config/api.toml`\n\n")
        );
    }

    #[test]
    fn questions_about_code_are_told_apart_from_the_rest() {
        for code in [
            "Where is the session refresh handled?",
            "Which function parses the config?",
            "Explain the rate limit code in acme/website",
        ] {
            assert!(asks_about_code(code), "{code}");
        }
        for plain in [
            "What is a merge request?",
            "What can you do?",
            "Summarize issue #1",
        ] {
            assert!(!asks_about_code(plain), "{plain}");
        }
    }

    #[test]
    fn questions_naming_something_to_read_are_told_apart_from_the_rest() {
        for named in [
            "Summarize issue #12",
            "What does !34 change?",
            "Summarize acme/platform/api#1",
            "Is epic &5 done?",
            "Why did http://gitlab.example/acme/api/-/jobs/7 fail?",
            "Explain commit 1a2b3c4d",
            "Summarize this issue",
            "what is this merge request about",
            "Why did job 42 fail?",
        ] {
            assert!(names_a_resource(named), "{named}");
        }
        for plain in [
            "What is a merge request?",
            "What can you do?",
            "How do I write a haiku in Rust?",
            "Explain issues and epics in GitLab",
            "What is the difference between an issue and a merge request?",
        ] {
            assert!(!names_a_resource(plain), "{plain}");
        }
    }

    #[test]
    fn a_direct_answer_streams_out_of_its_arguments_over_any_split() {
        let arguments = r#"{ "answer" : "Line one\nA \"quote\", caf\u00e9 \ud83d\ude00 done" }"#;
        let expected = "Line one\nA \"quote\", café 😀 done";
        for size in 1..=arguments.len() {
            let mut streamer = AnswerStreamer::default();
            let mut out = String::new();
            let mut at = 0;
            while at < arguments.len() {
                let mut end = (at + size).min(arguments.len());
                while !arguments.is_char_boundary(end) {
                    end += 1;
                }
                out.push_str(&streamer.push(&arguments[at..end]));
                at = end;
            }
            assert_eq!(out, expected, "pieces of {size}");
        }
    }

    #[test]
    fn text_before_the_answer_key_and_after_its_end_is_not_streamed() {
        let mut streamer = AnswerStreamer::default();
        assert_eq!(streamer.push(r#"{"ans"#), "");
        assert_eq!(streamer.push(r#"wer": "hi"#), "hi");
        assert_eq!(streamer.push(r#"", "extra": "no"}"#), "");
    }
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
    fn kept_schemas_are_what_building_them_gives_for_their_own_inputs() {
        let tools = catalogue();
        let variants = [
            (None, false),
            (Some(BUNDLED_ANSWER_CHARS), false),
            (None, true),
        ];
        for (answer_chars, from_context) in variants {
            let kept = tool_schemas(&tools, answer_chars, from_context);
            let again = tool_schemas(&tools, answer_chars, from_context);
            assert!(
                Arc::ptr_eq(&kept, &again),
                "the second call reuses the first"
            );
            let built = build_tool_schemas(&tools, answer_chars, from_context);
            assert_eq!(kept.len(), built.len());
            for (kept, built) in kept.iter().zip(&built) {
                assert_eq!(
                    (&kept.name, &kept.description, &kept.parameters),
                    (&built.name, &built.description, &built.parameters)
                );
            }
        }
        // Fewer tools, another set.
        assert_eq!(tool_schemas(&tools[..1], None, false).len(), 2);
        assert_eq!(
            tool_schemas(&tools, Some(BUNDLED_ANSWER_CHARS), false)[0].parameters["properties"]["answer"]
                ["maxLength"],
            json!(BUNDLED_ANSWER_CHARS)
        );
        assert!(
            tool_schemas(&tools, None, false)[0].parameters["properties"]["answer"]
                .get("maxLength")
                .is_none()
        );
    }

    #[test]
    fn schemas_speak_of_the_input_argument() {
        let schemas = tool_schemas(&catalogue(), None, false);
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
