//! Workflows on a model too small to choose tools (the bundled model).
//!
//! A 135M model asked to pick tools, plan and edit loops on one sentence and
//! changes nothing. So for such a model the service takes the steps itself,
//! as the agents would, through the same tool calls, approvals and
//! checkpoints: it reads the one file the goal names, plans, asks the model
//! only for the text to add ([`WRITE_TEXT_PROMPT`]) and proposes the edit,
//! which the user approves as any other. Goals it cannot do this way (no
//! file named, several files, a change that is not an addition) are declined
//! with what to do instead; a run that changed nothing says so.

use crate::providers::conversation::{Message, ToolCall};
use serde_json::{Value, json};

/// The prompt that asks a small model for the text of an edit.
pub const WRITE_TEXT_PROMPT: &str = "workflow/small_model/write_text";

/// The most of a file shown to the model when it writes the text, in
/// characters: the bundled model's context is 2,048 tokens.
pub const MAX_SHOWN_CHARS: usize = 3_000;

/// Longest text added by one guided edit, in characters.
const MAX_ADDED_CHARS: usize = 1_000;
/// Longest one-line addition, in characters.
const MAX_LINE_CHARS: usize = 240;

/// What the service makes of a goal for a small model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Goal {
    /// Add text to one named file.
    Edit(EditGoal),
    /// Asks for no change and names no file: the model answers it.
    Question,
    /// A change the service cannot carry out with a small model; why.
    Beyond(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditGoal {
    /// The file, relative to the workspace root.
    pub path: String,
    /// The goal asks for one line (or one sentence).
    pub one_line: bool,
    /// What to write, in the goal's words ("a one-line description").
    pub what: String,
}

/// Verbs of goals that add text.
const ADDING: &[&str] = &[
    "add", "append", "write", "insert", "include", "put", "document", "create",
];
/// Verbs that add text when the goal names the file as where it goes
/// ("Describe this repository in NOTES.md"), and otherwise ask a question
/// ("Describe src/main.rs").
const ADDING_TO: &[&str] = &[
    "describe",
    "summarize",
    "summarise",
    "explain",
    "list",
    "note",
];
/// Words that name a file as the place text goes.
const INTO: &[&str] = &["in", "into", "to", "inside"];
/// Verbs of changes other than additions.
const CHANGING: &[&str] = &[
    "fix",
    "rename",
    "remove",
    "delete",
    "refactor",
    "replace",
    "change",
    "update",
    "rewrite",
    "move",
    "implement",
    "edit",
    "modify",
    "convert",
    "translate",
    "drop",
];

fn words(goal: &str) -> impl Iterator<Item = String> + '_ {
    goal.split(|c: char| !c.is_alphanumeric() && c != '-')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// The file paths a goal names: words with a file extension or a
/// directory separator, without surrounding punctuation.
pub fn named_paths(goal: &str) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for raw in goal.split_whitespace() {
        let quoting = |c: char| {
            matches!(
                c,
                '`' | '\'' | '"' | ',' | ';' | ':' | '!' | '?' | '(' | ')' | '[' | ']' | '<' | '>'
            )
        };
        // "`a.md`." and "a.md." alike: a sentence's full stop is not part of it.
        let word = raw
            .trim_matches(quoting)
            .trim_end_matches('.')
            .trim_matches(quoting);
        if word.contains("://") || word.is_empty() {
            continue;
        }
        let name = word.rsplit('/').next().unwrap_or(word);
        let has_extension = name.rsplit_once('.').is_some_and(|(stem, ext)| {
            !stem.is_empty()
                && (1..=10).contains(&ext.len())
                && ext.starts_with(|c: char| c.is_ascii_alphabetic())
                && ext.chars().all(|c| c.is_ascii_alphanumeric())
        });
        let is_path = word.contains('/') && word.chars().any(char::is_alphabetic);
        if (has_extension || is_path) && !paths.iter().any(|p| p == word) {
            paths.push(word.to_owned());
        }
    }
    paths
}

/// Whether a goal asks for a change (an addition or another edit): such a
/// run that changed nothing must say so.
pub fn asks_for_change(goal: &str) -> bool {
    adds(goal) || words(goal).any(|w| CHANGING.contains(&w.as_str()))
}

/// Whether a goal asks for text to be added: an adding verb, or a
/// describing one with a file named as where the text goes.
fn adds(goal: &str) -> bool {
    let lowered: Vec<String> = words(goal).collect();
    if lowered.iter().any(|w| ADDING.contains(&w.as_str())) {
        return true;
    }
    lowered.iter().any(|w| ADDING_TO.contains(&w.as_str())) && names_destination(goal)
}

/// Whether a named file follows "in", "to", "into" or "inside".
fn names_destination(goal: &str) -> bool {
    let paths = named_paths(goal);
    let tokens: Vec<&str> = goal.split_whitespace().collect();
    tokens.windows(2).any(|pair| {
        INTO.contains(&pair[0].to_lowercase().as_str())
            && paths.iter().any(|p| pair[1].contains(p.as_str()))
    })
}

/// Reads a goal for a small model.
pub fn read_goal(goal: &str) -> Goal {
    let lowered: Vec<String> = words(goal).collect();
    let adds = adds(goal);
    let changes = lowered.iter().any(|w| CHANGING.contains(&w.as_str()));
    let paths = named_paths(goal);
    if !adds && !changes {
        return Goal::Question;
    }
    if !adds {
        return Goal::Beyond(
            "The goal asks for a change other than adding text (a fix, a rename, a removal), \
             which the bundled model cannot make reliably."
                .to_owned(),
        );
    }
    let path = match paths.as_slice() {
        [] => {
            return Goal::Beyond(
                "The goal names no file: say which file to add the text to.".to_owned(),
            );
        }
        [one] => one,
        _ => {
            return Goal::Beyond(format!(
                "The goal names {} files ({}); the bundled model changes one file at a time.",
                paths.len(),
                paths.join(", ")
            ));
        }
    };
    if path.starts_with('/') || path.split('/').any(|part| part == "..") {
        return Goal::Beyond(format!(
            "{path} is not a path inside the workspace: name the file relative to its root."
        ));
    }
    let text = goal.to_lowercase();
    let one_line = [
        "one-line",
        "one line",
        "single line",
        "a line",
        "one sentence",
        "a sentence",
    ]
    .iter()
    .any(|phrase| text.contains(phrase));
    Goal::Edit(EditGoal {
        path: path.clone(),
        one_line,
        what: what_to_write(goal, path),
    })
}

/// What the goal asks to be written, without its verb and its file: "Add
/// a one-line description to README.md" → "a one-line description";
/// "Describe this repository in NOTES.md" → "a description of this
/// repository". The goal itself when nothing is left.
pub fn what_to_write(goal: &str, path: &str) -> String {
    let tokens: Vec<&str> = goal.split_whitespace().collect();
    let bare = |t: &str| {
        t.trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase()
    };
    let Some(verb_at) = tokens.iter().position(|t| {
        let w = bare(t);
        ADDING.contains(&w.as_str()) || ADDING_TO.contains(&w.as_str())
    }) else {
        return goal.trim().to_owned();
    };
    let mut what: Vec<&str> = Vec::new();
    let mut rest = tokens[verb_at + 1..].iter().peekable();
    while let Some(token) = rest.next() {
        let names_file = |t: &str| t.contains(path);
        if INTO.contains(&bare(token).as_str()) && rest.peek().is_some_and(|t| names_file(t)) {
            rest.next();
            continue;
        }
        what.push(token);
    }
    let what = what.join(" ");
    let what = what.trim().trim_end_matches(['.', '!']).trim();
    if what.is_empty() {
        return goal.trim().to_owned();
    }
    // A description of nothing named is one of the project (a small model
    // otherwise describes the description).
    let what = if ["description", "summary", "overview"]
        .iter()
        .any(|noun| what.to_lowercase().ends_with(noun))
    {
        format!("{what} of the project")
    } else {
        what.to_owned()
    };
    let what = what.as_str();
    match bare(tokens[verb_at]).as_str() {
        "describe" => format!("a description of {what}"),
        "summarize" | "summarise" => format!("a summary of {what}"),
        "explain" => format!("an explanation of {what}"),
        "list" => format!("a list of {what}"),
        "note" => format!("a note on {what}"),
        _ => what.to_owned(),
    }
}

/// What a goal the service cannot carry out with a small model ends with.
pub fn decline_message(reason: &str) -> String {
    format!(
        "{reason} With the bundled model, a workflow adds a short text to one file named in the \
         goal, for example \"Add a one-line description to README.md\". For other changes, set \
         ANTHROPIC_API_KEY or choose a larger self-hosted model (docs/duo-workflow.md, \
         \"Models\")."
    )
}

/// The next step of an agent of the run, read from its conversation so far
/// (so a resumed run goes on where it was).
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Make this tool call, as the agent's turn.
    Call { text: String, call: ToolCall },
    /// Ask the model for the text to add; the file's contents as read
    /// (`None`: it does not exist yet).
    Write { contents: Option<String> },
    /// The agent's last word.
    Finish(String),
}

const EDIT_TOOLS: &[&str] = &["edit_file", "create_file_with_contents"];

/// A tool call of the conversation with its result, if it has one.
fn calls(conversation: &[Message]) -> Vec<(&ToolCall, Option<(&str, bool)>)> {
    let mut found = Vec::new();
    for message in conversation {
        if let Message::AiMessage { tool_calls, .. } = message {
            for call in tool_calls {
                let result = conversation.iter().find_map(|m| match m {
                    Message::ToolMessage {
                        content,
                        tool_call_id,
                        is_error,
                        ..
                    } if *tool_call_id == call.id => Some((content.as_str(), *is_error)),
                    _ => None,
                });
                found.push((call, result));
            }
        }
    }
    found
}

fn call(conversation: &[Message], name: &str, args: Value) -> ToolCall {
    ToolCall {
        // Unique within the conversation, and stable for a resumed run.
        id: format!("guided-{}-{}", name, conversation.len()),
        name: name.to_owned(),
        args,
    }
}

fn read_call(conversation: &[Message], goal: &EditGoal) -> Step {
    Step::Call {
        text: format!("Reading {}.", goal.path),
        call: call(conversation, "read_file", json!({ "file_path": goal.path })),
    }
}

/// The contents of the goal's file as the conversation read it: `Some(Ok)`
/// read, `Some(Err)` not there (or unreadable), `None` not read yet.
fn read_result(conversation: &[Message], goal: &EditGoal) -> Option<Result<String, String>> {
    calls(conversation)
        .into_iter()
        .rev()
        .find(|(c, result)| {
            c.name == "read_file" && c.args["file_path"] == goal.path.as_str() && result.is_some()
        })
        .and_then(|(_, result)| result)
        .map(|(content, is_error)| {
            if is_error {
                Err(content.to_owned())
            } else {
                Ok(content.to_owned())
            }
        })
}

/// The step after what `agent`'s conversation holds.
pub fn next_step(agent: &str, goal: &EditGoal, conversation: &[Message]) -> Step {
    match agent {
        "context_builder" => match read_result(conversation, goal) {
            None => read_call(conversation, goal),
            Some(Ok(contents)) => Step::Finish(format!(
                "{} has {} lines; the text will be added at its end.",
                goal.path,
                contents.lines().count()
            )),
            Some(Err(_)) => Step::Finish(format!(
                "{} does not exist yet; it will be created with the text.",
                goal.path
            )),
        },
        "planner" => Step::Call {
            text: String::new(),
            call: call(
                conversation,
                "create_plan",
                json!({ "steps": [
                    format!("Write the text the goal asks for: {}", goal_summary(goal)),
                    format!("Add it to {} (you approve the edit first)", goal.path),
                ]}),
            ),
        },
        _ => {
            if let Some((edit, result)) = calls(conversation)
                .into_iter()
                .rev()
                .find(|(c, _)| EDIT_TOOLS.contains(&c.name.as_str()))
            {
                return match result {
                    None => Step::Finish(format!("The edit of {} got no result.", goal.path)),
                    Some((_, false)) => {
                        let added = added_text(edit).unwrap_or_default();
                        // One line reads on one line (terminals show an
                        // entry's first line).
                        let gap = if added.contains('\n') { "\n\n" } else { " " };
                        Step::Finish(format!("Added to {}:{gap}{added}", goal.path))
                    }
                    Some((message, true)) if message.contains("rejected") => Step::Finish(format!(
                        "You rejected the edit: {} is unchanged.",
                        goal.path
                    )),
                    Some((message, true)) => {
                        Step::Finish(format!("The edit of {} failed: {message}", goal.path))
                    }
                };
            }
            match read_result(conversation, goal) {
                None => read_call(conversation, goal),
                Some(Ok(contents)) => Step::Write {
                    contents: Some(contents),
                },
                Some(Err(error)) if looks_missing(&error) => Step::Write { contents: None },
                Some(Err(error)) => Step::Finish(format!(
                    "{} could not be read, so nothing was changed: {error}",
                    goal.path
                )),
            }
        }
    }
}

fn goal_summary(goal: &EditGoal) -> &'static str {
    if goal.one_line {
        "one line"
    } else {
        "a few short lines"
    }
}

fn looks_missing(error: &str) -> bool {
    let error = error.to_lowercase();
    error.contains("no such file") || error.contains("not found") || error.contains("os error 2")
}

/// The text an edit call adds (what the user sees in the summary).
fn added_text(edit: &ToolCall) -> Option<String> {
    let new = edit.args["new_str"]
        .as_str()
        .or_else(|| edit.args["contents"].as_str())?;
    let old = edit.args["old_str"].as_str().unwrap_or_default();
    Some(new.strip_prefix(old).unwrap_or(new).trim().to_owned())
}

/// The model's reply made into the text to add: code fences, quotes and
/// lines the file already has (or that repeat the goal) left out; one line
/// when the goal asks for one; bounded. `None` when nothing is left.
pub fn clean_text(reply: &str, contents: &str, goal: &EditGoal, goal_text: &str) -> Option<String> {
    let one_line = goal.one_line;
    let file_name = goal
        .path
        .rsplit('/')
        .next()
        .unwrap_or(&goal.path)
        .to_lowercase();
    let what = goal.what.to_lowercase();
    let existing: Vec<String> = contents
        .lines()
        .map(|l| l.trim().to_lowercase())
        .filter(|l| !l.is_empty())
        .collect();
    let goal = goal_text.trim().to_lowercase();
    let mut kept: Vec<String> = Vec::new();
    for line in reply.lines() {
        let line = line.trim();
        if line.starts_with("```") {
            continue;
        }
        let line = line
            .trim_matches(|c| c == '"' || c == '\u{201c}' || c == '\u{201d}')
            .trim();
        let lowered = line.to_lowercase();
        if lowered.is_empty()
            || !line.chars().any(char::is_alphabetic)
            || existing.contains(&lowered)
            || lowered.trim_end_matches('.') == goal.trim_end_matches('.')
            || restates(&lowered, &file_name, &what)
            || kept.iter().any(|k| k.to_lowercase() == lowered)
        {
            continue;
        }
        kept.push(line.to_owned());
        if one_line {
            break;
        }
    }
    let limit = if one_line {
        MAX_LINE_CHARS
    } else {
        MAX_ADDED_CHARS
    };
    let text = kept.join("\n");
    let text = if text.chars().count() > limit {
        let cut: String = text.chars().take(limit).collect();
        // End at a word: a cut word reads as a mistake.
        match cut.rfind(char::is_whitespace) {
            Some(at) if at > limit / 2 => cut[..at].trim_end().to_owned(),
            _ => cut,
        }
    } else {
        text
    };
    (!text.is_empty()).then_some(text)
}

/// Whether a line of the reply talks about the task instead of doing it
/// ("Here is the text:", "A one-line description of README.md").
fn restates(line: &str, file_name: &str, what: &str) -> bool {
    const ABOUT_THE_TASK: &[&str] = &[
        "here is",
        "here's",
        "this file",
        "the task",
        "reply with",
        "the new text",
    ];
    ABOUT_THE_TASK
        .iter()
        .any(|p| line.starts_with(p) || line.contains(p))
        || line.contains(file_name)
        || restates_what(line, what)
}

/// The line is mostly the goal's own words for what to write.
fn restates_what(line: &str, what: &str) -> bool {
    let what = what.trim_start_matches("a ").trim_start_matches("an ");
    if what.len() < 8 || !line.contains(what) {
        return false;
    }
    let rest = line.replacen(what, " ", 1);
    rest.split_whitespace().count() <= 4
}

/// Whether text shown to the model was cut by the executor or the tool layer
/// (an edit built from it would lose the rest).
fn truncated(contents: &str) -> bool {
    contents.ends_with("[output truncated]")
}

/// The tool call that adds `text` at the end of `path` (`contents: None`:
/// a new file). The last non-empty line is the anchor when it occurs once
/// (`edit_file` replaces the first occurrence); otherwise the whole file is
/// written. A file that was not read whole gets no edit.
pub fn edit_call(
    conversation: &[Message],
    goal: &EditGoal,
    contents: Option<&str>,
    text: &str,
) -> Result<ToolCall, String> {
    let Some(contents) = contents else {
        return Ok(call(
            conversation,
            "create_file_with_contents",
            json!({ "file_path": goal.path, "contents": format!("{text}\n") }),
        ));
    };
    if truncated(contents) {
        return Err(format!(
            "{} is too large for the bundled model's edit: it was not read whole.",
            goal.path
        ));
    }
    let separator = if prose_file(&goal.path) { "\n\n" } else { "\n" };
    if let Some(anchor) = contents.lines().rev().find(|l| !l.trim().is_empty())
        && contents.matches(anchor).count() == 1
    {
        return Ok(call(
            conversation,
            "edit_file",
            json!({
                "file_path": goal.path,
                "old_str": anchor,
                "new_str": format!("{anchor}{separator}{text}"),
            }),
        ));
    }
    let body = contents.trim_end();
    let new = if body.is_empty() {
        format!("{text}\n")
    } else {
        format!("{body}{separator}{text}\n")
    };
    Ok(call(
        conversation,
        "create_file_with_contents",
        json!({ "file_path": goal.path, "contents": new }),
    ))
}

/// Prose files get a paragraph, code and data files a line.
fn prose_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_lowercase();
    match name.rsplit_once('.') {
        None => true,
        Some((_, ext)) => matches!(ext, "md" | "markdown" | "txt" | "rst" | "adoc"),
    }
}

/// The file's contents as shown to the model: at most [`MAX_SHOWN_CHARS`].
pub fn shown_contents(contents: &str, max_chars: usize) -> String {
    if contents.chars().count() <= max_chars {
        return contents.to_owned();
    }
    let mut shown: String = contents.chars().take(max_chars).collect();
    shown.push_str("\n[the rest of the file is not shown]");
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(path: &str, one_line: bool, what: &str) -> Goal {
        Goal::Edit(EditGoal {
            path: path.to_owned(),
            one_line,
            what: what.to_owned(),
        })
    }

    fn goal(path: &str, one_line: bool) -> EditGoal {
        EditGoal {
            path: path.to_owned(),
            one_line,
            what: "a one-line description".to_owned(),
        }
    }

    #[test]
    fn goals_are_read_for_a_small_model() {
        assert_eq!(
            read_goal("Add a one-line description to README.md"),
            edit("README.md", true, "a one-line description of the project")
        );
        assert_eq!(
            read_goal("Append usage notes to `docs/usage.md`."),
            edit("docs/usage.md", false, "usage notes")
        );
        assert_eq!(
            read_goal("Write a CHANGELOG.md entry for version 1.2"),
            edit(
                "CHANGELOG.md",
                false,
                "a CHANGELOG.md entry for version 1.2"
            )
        );
        assert_eq!(
            read_goal("Describe this repository in NOTES.md"),
            edit("NOTES.md", false, "a description of this repository")
        );
        assert_eq!(read_goal("Describe src/main.rs"), Goal::Question);
        assert!(!asks_for_change("Describe src/main.rs"));
        assert!(asks_for_change("Describe the project in NOTES.md"));
        assert_eq!(read_goal("What can you do?"), Goal::Question);
        assert_eq!(read_goal("How does the session code work"), Goal::Question);
        assert!(
            matches!(read_goal("Fix the bug in src/main.rs"), Goal::Beyond(r) if r.contains("other than adding"))
        );
        assert!(matches!(read_goal("Add a test"), Goal::Beyond(r) if r.contains("names no file")));
        assert!(
            matches!(read_goal("Add a line to a.md and b.md"), Goal::Beyond(r) if r.contains("2 files"))
        );
        assert!(
            matches!(read_goal("Add a line to ../x.md"), Goal::Beyond(r) if r.contains("inside the workspace"))
        );
        assert!(matches!(
            read_goal("Add a note to /etc/passwd"),
            Goal::Beyond(_)
        ));
        // Links and version numbers are not files.
        assert_eq!(
            named_paths("see https://example.com/a.md and version 1.2"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_steps_follow_the_conversation() {
        let goal = goal("README.md", true);
        let mut conversation = vec![Message::human("Add a one-line description to README.md")];
        let Step::Call { call: read, .. } = next_step("chat", &goal, &conversation) else {
            panic!("a read comes first");
        };
        assert_eq!(read.name, "read_file");
        conversation.push(Message::AiMessage {
            content: String::new(),
            tool_calls: vec![read.clone()],
        });
        conversation.push(Message::tool(&read, "# Demo\n", false));
        assert_eq!(
            next_step("chat", &goal, &conversation),
            Step::Write {
                contents: Some("# Demo\n".into())
            }
        );
        let edit = edit_call(&conversation, &goal, Some("# Demo\n"), "A demo project.").unwrap();
        assert_eq!(edit.name, "edit_file");
        assert_eq!(edit.args["old_str"], "# Demo");
        assert_eq!(edit.args["new_str"], "# Demo\n\nA demo project.");
        conversation.push(Message::AiMessage {
            content: String::new(),
            tool_calls: vec![edit.clone()],
        });
        let mut rejected = conversation.clone();
        conversation.push(Message::tool(&edit, "edited", false));
        assert_eq!(
            next_step("chat", &goal, &conversation),
            Step::Finish("Added to README.md: A demo project.".into())
        );
        rejected.push(Message::tool(
            &edit,
            "The user rejected this tool call; it was not run.",
            true,
        ));
        assert!(
            matches!(next_step("chat", &goal, &rejected), Step::Finish(t) if t.contains("rejected") && t.contains("unchanged"))
        );
        // The context builder reads, then reports; the planner plans.
        assert!(matches!(
            next_step("context_builder", &goal, &conversation[..3]),
            Step::Finish(t) if t.contains("1 lines")
        ));
        assert!(matches!(
            next_step("planner", &goal, &[]),
            Step::Call { call, .. } if call.name == "create_plan"
        ));
    }

    #[test]
    fn a_missing_file_is_created_and_an_unreadable_one_is_not_touched() {
        let goal = goal("NOTES.md", false);
        let read = call(&[], "read_file", json!({"file_path": "NOTES.md"}));
        let conversation = vec![
            Message::AiMessage {
                content: String::new(),
                tool_calls: vec![read.clone()],
            },
            Message::tool(
                &read,
                "Action error: NOTES.md: No such file or directory (os error 2)",
                true,
            ),
        ];
        assert_eq!(
            next_step("executor", &goal, &conversation),
            Step::Write { contents: None }
        );
        let create = edit_call(&conversation, &goal, None, "Notes.").unwrap();
        assert_eq!(create.name, "create_file_with_contents");
        assert_eq!(create.args["contents"], "Notes.\n");
        let unreadable = vec![
            conversation[0].clone(),
            Message::tool(&read, "Action error: NOTES.md is not UTF-8 text", true),
        ];
        assert!(matches!(
            next_step("executor", &goal, &unreadable),
            Step::Finish(t) if t.contains("could not be read")
        ));
    }

    #[test]
    fn repeated_anchors_write_the_whole_file_unless_it_was_cut() {
        let goal = goal("src/lib.rs", true);
        let contents = "}\nfn a() {\n}\n";
        let whole = edit_call(&[], &goal, Some(contents), "// end").unwrap();
        assert_eq!(whole.name, "create_file_with_contents");
        assert_eq!(whole.args["contents"], "}\nfn a() {\n}\n// end\n");
        // The end of a file that was cut is unknown: no edit is built.
        let cut = "fn a() {}\n[output truncated]";
        assert!(edit_call(&[], &goal, Some(cut), "x").is_err());
    }

    #[test]
    fn replies_are_cleaned() {
        let text = "Add a one-line description to README.md";
        let readme = goal("README.md", true);
        assert_eq!(
            clean_text(
                "```\n# Demo\nA small demo project.\nMore.\n```",
                "# Demo\n",
                &readme,
                text
            ),
            Some("A small demo project.".into())
        );
        assert_eq!(
            clean_text("\"Quoted line.\"", "", &readme, text),
            Some("Quoted line.".into())
        );
        assert_eq!(clean_text("# Demo\n\n", "# Demo", &readme, text), None);
        assert_eq!(clean_text(text, "", &readme, text), None);
        // Talk about the task is not the text.
        for reply in [
            "Here is the text:",
            "A one-line description of a demo.",
            "The README.md file is a project.",
        ] {
            assert_eq!(clean_text(reply, "", &readme, text), None, "{reply}");
        }
        let notes = EditGoal {
            what: "usage notes".into(),
            ..goal("a.md", false)
        };
        assert_eq!(
            clean_text("one\none\ntwo", "", &notes, "Add usage notes to a.md"),
            Some("one\ntwo".into())
        );
        assert_eq!(
            clean_text(
                "Usage notes: run ./dev test to run every test.",
                "",
                &notes,
                "Add usage notes to a.md"
            ),
            Some("Usage notes: run ./dev test to run every test.".into())
        );
        let long = "word ".repeat(100);
        let cleaned = clean_text(&long, "", &readme, text).unwrap();
        assert!(cleaned.len() <= MAX_LINE_CHARS && cleaned.ends_with("word"));
    }
}
