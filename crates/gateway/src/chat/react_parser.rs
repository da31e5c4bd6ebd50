//! Incremental parser for the ReAct model output.
//!
//! It follows GitLab's rules on the accumulated text, wrapped as
//! `Thought: {text}` (the prefill ends in `Thought:`):
//! 1. `Final Answer:` wins over everything: the text after it is the answer,
//!    streamed live as it grows;
//! 2. else `Action:` plus `Action Input:` make a tool action (with the thought
//!    before them);
//! 3. else the whole stripped output is `unknown`.

use regex::Regex;
use std::sync::LazyLock;

const FINAL_ANSWER: &str = "Final Answer:";

/// What the model decided, once its output is complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReactOutcome {
    /// The model answered; the text was streamed as deltas.
    FinalAnswer(String),
    Action {
        tool: String,
        tool_input: String,
        thought: String,
    },
    /// Nothing parsed: the whole stripped output.
    Unknown(String),
}

/// Feed chunks with [`ReactParser::push`], which returns the new final-answer
/// text (if any); call [`ReactParser::finish`] when the stream ends.
#[derive(Debug, Default)]
pub struct ReactParser {
    text: String,
    /// Byte offset in `text` where the answer starts (after the marker and
    /// the whitespace following it), once the marker has been seen.
    answer_start: Option<usize>,
    /// How many bytes of the answer (from `answer_start`) were emitted.
    emitted: usize,
}

impl ReactParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a chunk and returns the answer text that is now certain and was
    /// not returned before (`None` when there is none).
    pub fn push(&mut self, chunk: &str) -> Option<String> {
        let searched_up_to = self.text.len();
        self.text.push_str(chunk);
        if self.answer_start.is_none() {
            // The marker may straddle the previous chunk boundary.
            let mut from = searched_up_to.saturating_sub(FINAL_ANSWER.len());
            while !self.text.is_char_boundary(from) {
                from -= 1;
            }
            if let Some(pos) = self.text[from..].find(FINAL_ANSWER) {
                self.answer_start = Some(from + pos + FINAL_ANSWER.len());
            }
        }
        let start = self.answer_start?;
        let answer = self.text[start..].trim_start();
        // Whitespace at the end may be the answer's trailing whitespace,
        // which is stripped, so hold it back until more text follows.
        let certain = answer.trim_end();
        if certain.len() <= self.emitted {
            return None;
        }
        let delta = certain[self.emitted..].to_owned();
        self.emitted = certain.len();
        Some(delta)
    }

    /// The accumulated output so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Parses the complete output.
    pub fn finish(&self) -> ReactOutcome {
        parse(&self.text)
    }
}

static ACTION: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?s)Action:\s*(.*?)\s*Action").ok());
static ACTION_INPUT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?s)Action Input:\s*(.*?)\s*$").ok());
static THOUGHT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?s)^Thought:\s*(.*?)\s*(?:Action|Final Answer):").ok());

fn capture(re: &LazyLock<Option<Regex>>, text: &str) -> Option<String> {
    let re = re.as_ref()?;
    re.captures(text)
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_owned())
}

/// Parses a complete model output in one go.
pub fn parse(output: &str) -> ReactOutcome {
    let stripped = output.trim();
    let wrapped = format!("Thought: {stripped}");
    if let Some(pos) = wrapped.find(FINAL_ANSWER) {
        return ReactOutcome::FinalAnswer(wrapped[pos + FINAL_ANSWER.len()..].trim().to_owned());
    }
    match (capture(&ACTION, &wrapped), capture(&ACTION_INPUT, &wrapped)) {
        (Some(tool), Some(tool_input)) => ReactOutcome::Action {
            tool: normalise_tool_name(&tool),
            tool_input,
            thought: capture(&THOUGHT, &wrapped).unwrap_or_default(),
        },
        _ => ReactOutcome::Unknown(stripped.to_owned()),
    }
}

/// `MergeRequestReader` → `merge_request_reader`, `issue\_reader` →
/// `issue_reader`, surrounding whitespace removed.
pub fn normalise_tool_name(raw: &str) -> String {
    let name = raw.trim().replace("\\_", "_");
    if name.contains('_') || !name.chars().any(|c| c.is_ascii_uppercase()) {
        return name;
    }
    let mut snake = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                snake.push('_');
            }
            snake.push(c.to_ascii_lowercase());
        } else {
            snake.push(c);
        }
    }
    snake
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn action(tool: &str, tool_input: &str, thought: &str) -> ReactOutcome {
        ReactOutcome::Action {
            tool: tool.into(),
            tool_input: tool_input.into(),
            thought: thought.into(),
        }
    }

    fn table() -> Vec<(&'static str, ReactOutcome)> {
        vec![
            (
                " I know this.\nFinal Answer: Use `git rebase`.\n",
                ReactOutcome::FinalAnswer("Use `git rebase`.".into()),
            ),
            (
                "I should read it.\nAction: issue_reader\nAction Input: What is #1 about?",
                action("issue_reader", "What is #1 about?", "I should read it."),
            ),
            (
                "Look it up.\nAction: MergeRequestReader\nAction Input: !5",
                action("merge_request_reader", "!5", "Look it up."),
            ),
            (
                "Docs.\nAction:  gitlab\\_documentation \nAction Input: protected branches\n",
                action("gitlab_documentation", "protected branches", "Docs."),
            ),
            (
                // The final answer wins even when an action came first.
                "Hmm.\nAction: issue_reader\nAction Input: #2\nFinal Answer: It is closed.",
                ReactOutcome::FinalAnswer("It is closed.".into()),
            ),
            (
                "I can answer directly.\nAction: DirectAnswer\nFinal Answer: Hello there!",
                ReactOutcome::FinalAnswer("Hello there!".into()),
            ),
            (
                "Final Answer:\n\nLine one.\n\nLine two with Final Answer: inside.  ",
                ReactOutcome::FinalAnswer(
                    "Line one.\n\nLine two with Final Answer: inside.".into(),
                ),
            ),
            (
                "  I am not following the format at all.  ",
                ReactOutcome::Unknown("I am not following the format at all.".into()),
            ),
            (
                "Action: issue_reader but no input",
                ReactOutcome::Unknown("Action: issue_reader but no input".into()),
            ),
            ("", ReactOutcome::Unknown(String::new())),
            (
                "Ünïcode thought ✓\nFinal Answer: Grüße, 世界!",
                ReactOutcome::FinalAnswer("Grüße, 世界!".into()),
            ),
        ]
    }

    #[test]
    fn one_shot_parse_table() {
        for (output, expected) in table() {
            assert_eq!(parse(output), expected, "output {output:?}");
        }
    }

    fn feed(chunks: &[&str]) -> (String, Vec<String>, ReactOutcome) {
        let mut parser = ReactParser::new();
        let mut deltas = Vec::new();
        for chunk in chunks {
            if let Some(delta) = parser.push(chunk) {
                assert!(!delta.is_empty(), "empty delta");
                deltas.push(delta);
            }
        }
        (deltas.concat(), deltas, parser.finish())
    }

    #[test]
    fn split_at_every_boundary_gives_the_one_shot_result() {
        for (output, expected) in table() {
            let boundaries: Vec<usize> = (0..=output.len())
                .filter(|i| output.is_char_boundary(*i))
                .collect();
            for &cut in &boundaries {
                let (streamed, _, outcome) = feed(&[&output[..cut], &output[cut..]]);
                assert_eq!(outcome, expected, "cut at {cut} of {output:?}");
                let expected_stream = match &expected {
                    ReactOutcome::FinalAnswer(answer) => answer.clone(),
                    _ => String::new(),
                };
                assert_eq!(streamed, expected_stream, "cut at {cut} of {output:?}");
            }
            // One character at a time, like GitLab's fake model.
            let chars: Vec<String> = output.chars().map(String::from).collect();
            let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
            let (streamed, _, outcome) = feed(&refs);
            assert_eq!(outcome, expected);
            if let ReactOutcome::FinalAnswer(answer) = &expected {
                assert_eq!(&streamed, answer);
            }
        }
    }

    #[test]
    fn deltas_are_live_and_never_contain_the_marker() {
        let (_, deltas, _) = feed(&["Thinking.\nFinal Ans", "wer: Hel", "lo", " ", "world", "\n"]);
        assert_eq!(deltas, vec!["Hel", "lo", " world"]);
    }

    #[test]
    fn nothing_is_emitted_before_the_marker_is_complete() {
        let mut parser = ReactParser::new();
        assert_eq!(parser.push("Final Answer"), None);
        assert_eq!(parser.push(" is coming"), None);
        assert_eq!(parser.push("\nFinal Answer:"), None);
        assert_eq!(parser.push("   "), None);
        assert_eq!(parser.push("Yes"), Some("Yes".into()));
    }

    #[test]
    fn tool_names_are_normalised() {
        for (raw, expected) in [
            ("MergeRequestReader", "merge_request_reader"),
            ("IssueReader", "issue_reader"),
            (" issue\\_reader ", "issue_reader"),
            ("issue_reader", "issue_reader"),
            ("DirectAnswer", "direct_answer"),
            ("gitlab_documentation", "gitlab_documentation"),
        ] {
            assert_eq!(normalise_tool_name(raw), expected, "{raw}");
        }
    }
}
