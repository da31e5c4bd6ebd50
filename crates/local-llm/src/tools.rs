//! OpenAI tool calling and structured output, enforced by grammar.
//!
//! A request's `tools`, `tool_choice` and `response_format` become an
//! [`OutputPlan`]: what the model is told (a tools section appended to the
//! system message) and the grammar its sampling must follow. A tool call is
//! always written in one fixed shape,
//!
//! ```text
//! <tool_call>
//! {"name": "issue_reader", "arguments": {...}}
//! </tool_call>
//! ```
//!
//! and [`OutputParser`] turns the generated text back into OpenAI's
//! `content` / `tool_calls`, incrementally for streams.

use serde_json::{Value, json};

use crate::grammar::{Grammar, GrammarBuilder, SchemaError, literal};

/// Marks the start of a call in the generated text.
pub const CALL_OPEN: &str = "<tool_call>";
/// Everything the grammar writes before the tool's name.
pub const CALL_HEAD: &str = "<tool_call>\n{\"name\": \"";
/// Between the name and the arguments.
pub const CALL_MIDDLE: &str = "\", \"arguments\": ";
/// After the arguments.
pub const CALL_TAIL: &str = "}\n</tool_call>";

pub const MAX_TOOLS: usize = 128;
pub const MAX_TOOL_NAME: usize = 64;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolsError {
    #[error("{0}")]
    Invalid(String),
    #[error("{context}: {source}")]
    Schema {
        context: String,
        source: SchemaError,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { schema: Value },
}

/// The grammar to sample under, and when it may be dropped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    pub grammar: Grammar,
    /// In `auto` mode the grammar matters only for a tool call: once the
    /// output cannot begin with this marker, the answer is free text and
    /// sampling continues unconstrained (cheaper, and the same result).
    pub lift_unless_prefix: Option<String>,
}

/// What a request asks of the output.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputPlan {
    /// Tools the model may call (empty with `tool_choice: none`).
    pub tools: Vec<ToolSpec>,
    pub choice: ToolChoice,
    pub format: ResponseFormat,
    pub constraint: Option<Constraint>,
}

impl OutputPlan {
    /// Plain text, no tools.
    pub fn text() -> Self {
        Self {
            tools: Vec::new(),
            choice: ToolChoice::None,
            format: ResponseFormat::Text,
            constraint: None,
        }
    }

    pub fn may_call_tools(&self) -> bool {
        !self.tools.is_empty()
    }

    /// Reads the request fields and builds the grammar.
    pub fn from_request(
        tools: Option<&[Value]>,
        tool_choice: Option<&Value>,
        response_format: Option<&Value>,
    ) -> Result<Self, ToolsError> {
        let declared = parse_tools(tools.unwrap_or_default())?;
        let choice = parse_choice(tool_choice, &declared)?;
        let format = parse_format(response_format)?;
        let offered: Vec<ToolSpec> = match &choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Named(name) => declared.into_iter().filter(|t| &t.name == name).collect(),
            ToolChoice::Auto | ToolChoice::Required => declared,
        };
        let constraint = build_constraint(&offered, &choice, &format)?;
        Ok(Self {
            tools: offered,
            choice,
            format,
            constraint,
        })
    }

    /// The section appended to the system message so the model knows the
    /// tools and the call format; `None` when no tool may be called.
    pub fn system_addendum(&self) -> Option<String> {
        if self.tools.is_empty() {
            return None;
        }
        let mut text = String::from(
            "# Tools\n\nYou can call the functions listed below. Each line describes one:\n<tools>\n",
        );
        for tool in &self.tools {
            let line = json!({
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            });
            text.push_str(&line.to_string());
            text.push('\n');
        }
        text.push_str("</tools>\n\nTo call a function, reply with nothing but:\n");
        text.push_str(CALL_OPEN);
        text.push_str("\n{\"name\": \"<function name>\", \"arguments\": <the arguments as a JSON object>}\n</tool_call>\n");
        text.push_str(match &self.choice {
            ToolChoice::Auto => {
                "If no function is needed, answer the user directly instead. A function's result comes back in <tool_response> tags."
            }
            _ => "Call a function now. Its result comes back in <tool_response> tags.",
        });
        Some(text)
    }
}

fn invalid(message: impl Into<String>) -> ToolsError {
    ToolsError::Invalid(message.into())
}

fn parse_tools(tools: &[Value]) -> Result<Vec<ToolSpec>, ToolsError> {
    if tools.len() > MAX_TOOLS {
        return Err(invalid(format!("at most {MAX_TOOLS} tools are allowed")));
    }
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(invalid(format!("tools[{i}].type must be \"function\"")));
        }
        let function = tool
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid(format!("tools[{i}].function must be an object")))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("tools[{i}].function.name must be a string")))?;
        if name.is_empty()
            || name.len() > MAX_TOOL_NAME
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(invalid(format!(
                "tools[{i}].function.name must be 1 to {MAX_TOOL_NAME} letters, digits, underscores or dashes"
            )));
        }
        if specs.iter().any(|s| s.name == name) {
            return Err(invalid(format!("two tools are named {name:?}")));
        }
        let description = match function.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(d)) => d.clone(),
            Some(_) => {
                return Err(invalid(format!(
                    "tools[{i}].function.description must be a string"
                )));
            }
        };
        // No parameters means a function that takes none.
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            }
            Some(schema @ Value::Object(_)) => schema.clone(),
            Some(_) => {
                return Err(invalid(format!(
                    "tools[{i}].function.parameters must be a JSON Schema object"
                )));
            }
        };
        if parameters.get("type").is_some_and(|t| t != "object") {
            return Err(invalid(format!(
                "tools[{i}].function.parameters must describe an object"
            )));
        }
        specs.push(ToolSpec {
            name: name.to_owned(),
            description,
            parameters,
        });
    }
    Ok(specs)
}

fn parse_choice(choice: Option<&Value>, tools: &[ToolSpec]) -> Result<ToolChoice, ToolsError> {
    let choice = match choice {
        None | Some(Value::Null) => {
            return Ok(if tools.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            });
        }
        Some(Value::String(mode)) => match mode.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(invalid(format!(
                    "tool_choice {other:?} is not one of auto, none, required"
                )));
            }
        },
        Some(Value::Object(object)) => {
            let name = object
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| object.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    invalid(
                        "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(invalid(format!(
                    "tool_choice names {name:?}, which is not among the tools"
                )));
            }
            ToolChoice::Named(name.to_owned())
        }
        Some(_) => return Err(invalid("tool_choice must be a string or an object")),
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(invalid("tool_choice requires tools"));
    }
    Ok(choice)
}

fn parse_format(format: Option<&Value>) -> Result<ResponseFormat, ToolsError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(ResponseFormat::Text);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let schema = format
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| {
                    invalid("response_format.json_schema.schema must be a JSON Schema object")
                })?;
            Ok(ResponseFormat::JsonSchema {
                schema: schema.clone(),
            })
        }
        _ => Err(invalid(
            "response_format.type must be text, json_object or json_schema",
        )),
    }
}

fn build_constraint(
    tools: &[ToolSpec],
    choice: &ToolChoice,
    format: &ResponseFormat,
) -> Result<Option<Constraint>, ToolsError> {
    let mut builder = GrammarBuilder::new();
    let answer = match format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => {
            Some(builder.any_object().map_err(|source| ToolsError::Schema {
                context: "response_format".into(),
                source,
            })?)
        }
        ResponseFormat::JsonSchema { schema } => Some(builder.schema(schema, schema).map_err(
            |source| ToolsError::Schema {
                context: "response_format.json_schema.schema".into(),
                source,
            },
        )?),
    };
    if tools.is_empty() {
        return Ok(answer.map(|root| Constraint {
            grammar: builder.finish(&root),
            lift_unless_prefix: None,
        }));
    }
    let mut calls = Vec::with_capacity(tools.len());
    for tool in tools {
        let arguments = builder
            .schema(&tool.parameters, &tool.parameters)
            .map_err(|source| ToolsError::Schema {
                context: format!("the parameters of tool {:?}", tool.name),
                source,
            })?;
        calls.push(format!(
            "{} {} {}",
            literal(&format!("{}{}", tool.name, CALL_MIDDLE)),
            arguments,
            literal(CALL_TAIL)
        ));
    }
    let call = format!("{} ( {} )", literal(CALL_HEAD), calls.join(" | "));
    let (root, lift) = match (choice, answer) {
        (ToolChoice::Auto, Some(answer)) => (format!("{call} | {answer}"), None),
        (ToolChoice::Auto, None) => {
            // Free text that cannot be mistaken for a call: it starts with
            // neither `<` nor whitespace.
            let text = builder
                .rule("text", r#"[^<\x00 \t\r\n] [^\x00]*"#.to_owned())
                .map_err(|source| ToolsError::Schema {
                    context: "the answer".into(),
                    source,
                })?;
            (format!("{call} | {text}"), Some(CALL_OPEN.to_owned()))
        }
        _ => (call, None),
    };
    Ok(Some(Constraint {
        grammar: builder.finish(&root),
        lift_unless_prefix: lift,
    }))
}

/// A piece of the answer as OpenAI shapes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputEvent {
    Content(String),
    /// A call begins: its id and the function's name.
    CallStart {
        id: String,
        name: String,
    },
    /// More of the call's arguments (JSON text).
    CallArguments(String),
}

#[derive(Debug)]
enum ParseState {
    /// Tools are offered and nothing tells a call from text yet.
    Undecided,
    Text,
    /// Reading the call's head up to the end of its name.
    CallHead,
    /// Streaming the arguments; the fixed tail is held back.
    CallArguments,
}

/// Splits generated text into content and a tool call, as it arrives.
#[derive(Debug)]
pub struct OutputParser {
    state: ParseState,
    buffer: String,
    called: bool,
}

impl OutputParser {
    pub fn new(plan: &OutputPlan) -> Self {
        Self {
            state: if plan.may_call_tools() {
                ParseState::Undecided
            } else {
                ParseState::Text
            },
            buffer: String::new(),
            called: false,
        }
    }

    /// A call was made (the answer's `finish_reason` is `tool_calls`).
    pub fn called(&self) -> bool {
        self.called
    }

    pub fn push(&mut self, text: &str) -> Vec<OutputEvent> {
        let mut events = Vec::new();
        self.buffer.push_str(text);
        loop {
            match self.state {
                ParseState::Text => {
                    if !self.buffer.is_empty() {
                        events.push(OutputEvent::Content(std::mem::take(&mut self.buffer)));
                    }
                    return events;
                }
                ParseState::Undecided => {
                    if self.buffer.starts_with(CALL_OPEN) {
                        self.state = ParseState::CallHead;
                    } else if CALL_OPEN.starts_with(self.buffer.as_str()) {
                        return events;
                    } else {
                        self.state = ParseState::Text;
                    }
                }
                ParseState::CallHead => {
                    let Some(rest) = self.buffer.strip_prefix(CALL_HEAD) else {
                        if CALL_HEAD.starts_with(self.buffer.as_str()) {
                            return events;
                        }
                        // Not the shape the grammar writes: pass it on as text.
                        self.state = ParseState::Text;
                        continue;
                    };
                    let Some(end) = rest.find(CALL_MIDDLE) else {
                        return events;
                    };
                    let name = rest[..end].to_owned();
                    let after = rest[end + CALL_MIDDLE.len()..].to_owned();
                    self.buffer = after;
                    self.called = true;
                    events.push(OutputEvent::CallStart {
                        id: format!("call_{}", uuid::Uuid::new_v4().simple()),
                        name,
                    });
                    self.state = ParseState::CallArguments;
                }
                ParseState::CallArguments => {
                    // Hold back what may be the start of the fixed tail.
                    let keep = (1..=CALL_TAIL.len().min(self.buffer.len()))
                        .rev()
                        .find(|&n| {
                            self.buffer.is_char_boundary(self.buffer.len() - n)
                                && CALL_TAIL.starts_with(&self.buffer[self.buffer.len() - n..])
                        })
                        .unwrap_or(0);
                    let release = self.buffer.len() - keep;
                    if release > 0 {
                        let part: String = self.buffer.drain(..release).collect();
                        events.push(OutputEvent::CallArguments(part));
                    }
                    return events;
                }
            }
        }
    }

    /// The rest, once generation has ended (a complete call's tail is dropped).
    pub fn finish(&mut self) -> Vec<OutputEvent> {
        let rest = std::mem::take(&mut self.buffer);
        match self.state {
            ParseState::CallArguments => {
                if rest == CALL_TAIL || rest.is_empty() {
                    Vec::new()
                } else {
                    vec![OutputEvent::CallArguments(
                        rest.strip_suffix(CALL_TAIL).unwrap_or(&rest).to_owned(),
                    )]
                }
            }
            _ if rest.is_empty() => Vec::new(),
            _ => vec![OutputEvent::Content(rest)],
        }
    }
}

/// A finished answer: content and at most one call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub content: String,
    pub call: Option<(String, String, String)>,
}

impl Answer {
    pub fn apply(&mut self, event: OutputEvent) {
        match event {
            OutputEvent::Content(text) => self.content.push_str(&text),
            OutputEvent::CallStart { id, name } => self.call = Some((id, name, String::new())),
            OutputEvent::CallArguments(part) => {
                if let Some((_, _, arguments)) = &mut self.call {
                    arguments.push_str(&part);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "description": "d",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}})
    }

    fn parse_all(plan: &OutputPlan, pieces: &[&str]) -> Vec<OutputEvent> {
        let mut parser = OutputParser::new(plan);
        let mut events: Vec<OutputEvent> = pieces.iter().flat_map(|p| parser.push(p)).collect();
        events.extend(parser.finish());
        events
    }

    #[test]
    fn choices_are_read_and_checked() {
        let tools = [tool("a"), tool("b")];
        let plan = OutputPlan::from_request(Some(&tools), None, None).unwrap();
        assert_eq!(plan.choice, ToolChoice::Auto);
        let plan = OutputPlan::from_request(
            Some(&tools),
            Some(&json!({"type": "function", "function": {"name": "b"}})),
            None,
        )
        .unwrap();
        assert_eq!(plan.tools.len(), 1);
        let grammar = plan.constraint.unwrap().grammar.text;
        assert!(grammar.contains(&literal(&format!("b{CALL_MIDDLE}"))));
        assert!(!grammar.contains(&literal(&format!("a{CALL_MIDDLE}"))));
        let plan = OutputPlan::from_request(Some(&tools), Some(&json!("none")), None).unwrap();
        assert!(plan.constraint.is_none() && plan.tools.is_empty());
        for bad in [
            json!("sometimes"),
            json!({"type": "function", "function": {"name": "c"}}),
        ] {
            assert!(OutputPlan::from_request(Some(&tools), Some(&bad), None).is_err());
        }
        assert!(OutputPlan::from_request(None, Some(&json!("required")), None).is_err());
    }

    #[test]
    fn auto_grammar_lifts_after_text_and_required_does_not() {
        let tools = [tool("a")];
        let auto = OutputPlan::from_request(Some(&tools), None, None).unwrap();
        assert_eq!(
            auto.constraint.unwrap().lift_unless_prefix.as_deref(),
            Some(CALL_OPEN)
        );
        let required =
            OutputPlan::from_request(Some(&tools), Some(&json!("required")), None).unwrap();
        assert_eq!(required.constraint.unwrap().lift_unless_prefix, None);
    }

    #[test]
    fn a_call_split_anywhere_parses_the_same() {
        let plan = OutputPlan::from_request(Some(&[tool("issue_reader")]), None, None).unwrap();
        let text = "<tool_call>\n{\"name\": \"issue_reader\", \"arguments\": {\"q\": \"}\\n</tool_call>\"}}\n</tool_call>";
        for split in 0..=text.len() {
            if !text.is_char_boundary(split) {
                continue;
            }
            let mut answer = Answer::default();
            for event in parse_all(&plan, &[&text[..split], &text[split..]]) {
                answer.apply(event);
            }
            let (_, name, arguments) = answer.call.expect("a call");
            assert_eq!(name, "issue_reader");
            assert_eq!(
                arguments, "{\"q\": \"}\\n</tool_call>\"}",
                "split at {split}"
            );
            assert_eq!(answer.content, "");
        }
    }

    #[test]
    fn text_that_is_not_a_call_is_content() {
        let plan = OutputPlan::from_request(Some(&[tool("a")]), None, None).unwrap();
        assert_eq!(
            parse_all(&plan, &["<to", "day is sunny"]),
            vec![OutputEvent::Content("<today is sunny".into())]
        );
        assert_eq!(
            parse_all(&OutputPlan::text(), &["<tool_call>"]),
            vec![OutputEvent::Content("<tool_call>".into())]
        );
    }
}
