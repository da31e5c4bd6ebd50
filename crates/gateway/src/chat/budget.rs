//! Fitting the chat agent's prompt into the model's context window.
//!
//! The gateway has no tokenizer for every model, so it counts conservatively:
//! [`CHARS_PER_TOKEN`] characters a token (English prose runs near four,
//! code and JSON nearer three). The answer needs room too: the budget keeps
//! [`Budget::reserve_tokens`] back for it.
//!
//! When the prompt is too large, the least relevant text goes first:
//! 1. the oldest history turns (a user turn with the answer after it);
//! 2. then the longest of the tool observations, the context items, the
//!    attached resource and the current file, clipped to what fits, with a
//!    sentence saying it was shortened, again and again until the prompt
//!    fits or nothing long is left to clip.
//!
//! What still does not fit is a [`BudgetError`] that names the model, its
//! context and the prompt's size.

use contracts::{AgentRequest, MessageRole};

/// Characters counted as one token when estimating a prompt's size.
pub const CHARS_PER_TOKEN: usize = 3;

/// Text shorter than this is not clipped further: what is left of it would
/// say nothing.
pub const MIN_CLIPPED_CHARS: usize = 200;

/// About the length of [`shortened_marker`]'s sentence.
const MARKER_CHARS: usize = 100;

/// The context window of the model a prompt goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The model's id, for the error message.
    pub model: String,
    /// Tokens the model's context holds, prompt and answer together.
    pub context_tokens: u32,
    /// Tokens kept back for the answer.
    pub reserve_tokens: u32,
}

impl Budget {
    /// The answer gets its `max_tokens`, but never more than a quarter of
    /// the context: a small model's prompt needs the room more.
    pub fn new(model: impl Into<String>, context_tokens: u32, max_tokens: u32) -> Self {
        Self {
            model: model.into(),
            context_tokens,
            reserve_tokens: max_tokens.min(context_tokens / 4),
        }
    }

    /// Tokens the prompt may take.
    pub fn prompt_tokens(&self) -> usize {
        self.context_tokens.saturating_sub(self.reserve_tokens) as usize
    }
}

/// Tokens a text of `chars` characters is estimated to take.
pub fn estimate_tokens(chars: usize) -> usize {
    chars.div_ceil(CHARS_PER_TOKEN)
}

/// The prompt does not fit even after trimming everything trimmable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "prompt is too long for the model {model}: its context holds {context_tokens} tokens \
     ({reserve_tokens} kept for the answer), and the prompt needs about {prompt_tokens} tokens \
     even after dropping the conversation history and shortening the context items and tool \
     results. Ask a shorter question or attach less context; or give the model a larger context \
     (the bundled model server: DUO_LOCAL_LLM_CONTEXT) or choose a model with a larger one"
)]
pub struct BudgetError {
    pub model: String,
    pub context_tokens: u32,
    pub reserve_tokens: u32,
    pub prompt_tokens: usize,
}

/// What trimming did, for the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// History messages dropped, oldest first.
    pub dropped_messages: usize,
    /// Which texts were clipped (`observation 2`, `context item 1`, ...).
    pub clipped: Vec<String>,
    /// The estimate before and after, in tokens.
    pub tokens_before: usize,
    pub tokens_after: usize,
}

impl Trimmed {
    pub fn is_empty(&self) -> bool {
        self.dropped_messages == 0 && self.clipped.is_empty()
    }
}

/// The sentence that ends a clipped text.
pub fn shortened_marker(kept: usize, total: usize) -> String {
    format!(
        "\n[Shortened to fit the model's context window: the first {kept} of {total} characters.]"
    )
}

/// Trims `request` until `measure` (the rendered prompt's size in
/// characters) fits `budget`. `measure` errors pass through unchanged.
pub fn fit<E>(
    request: &AgentRequest,
    budget: &Budget,
    mut measure: impl FnMut(&AgentRequest) -> Result<usize, E>,
) -> Result<Result<(AgentRequest, Trimmed), BudgetError>, E> {
    let allowed = budget.prompt_tokens();
    let mut request = request.clone();
    let mut trimmed = Trimmed::default();
    let mut tokens = estimate_tokens(measure(&request)?);
    trimmed.tokens_before = tokens;
    while tokens > allowed {
        let excess_chars = (tokens - allowed) * CHARS_PER_TOKEN;
        if !drop_oldest_turn(&mut request, &mut trimmed)
            && !clip_longest(&mut request, excess_chars, &mut trimmed)
        {
            return Ok(Err(BudgetError {
                model: budget.model.clone(),
                context_tokens: budget.context_tokens,
                reserve_tokens: budget.reserve_tokens,
                prompt_tokens: tokens,
            }));
        }
        tokens = estimate_tokens(measure(&request)?);
    }
    trimmed.tokens_after = tokens;
    Ok(Ok((request, trimmed)))
}

/// Drops the oldest history turn: a user message and the assistant answer
/// that follows it (or a lone assistant message). The question stays.
fn drop_oldest_turn(request: &mut AgentRequest, trimmed: &mut Trimmed) -> bool {
    if request.messages.len() < 2 {
        return false;
    }
    let first = request.messages.remove(0);
    trimmed.dropped_messages += 1;
    if first.role != MessageRole::Assistant
        && request.messages.len() >= 2
        && request.messages[0].role == MessageRole::Assistant
    {
        request.messages.remove(0);
        trimmed.dropped_messages += 1;
    }
    true
}

/// Clips the longest clippable text by the excess (at least by half of
/// what is above [`MIN_CLIPPED_CHARS`], so the loop ends quickly).
fn clip_longest(request: &mut AgentRequest, excess_chars: usize, trimmed: &mut Trimmed) -> bool {
    // Clipping adds the marker: a text only a little above the minimum
    // would grow, so it is left as it is.
    let mut texts: Vec<_> = clippable(request)
        .into_iter()
        .filter(|(_, text)| visible_chars(text) > MIN_CLIPPED_CHARS + MARKER_CHARS)
        .collect();
    texts.sort_by_key(|(_, text)| std::cmp::Reverse(visible_chars(text)));
    let Some((label, text)) = texts.into_iter().next() else {
        return false;
    };
    let total = original_length(text).unwrap_or_else(|| text.chars().count());
    let current = visible_chars(text);
    let cut = excess_chars + MARKER_CHARS;
    let keep = current.saturating_sub(cut).max(MIN_CLIPPED_CHARS);
    let kept: String = text.chars().take(keep).collect();
    *text = format!("{kept}{}", shortened_marker(keep, total));
    if !trimmed.clipped.contains(&label) {
        trimmed.clipped.push(label);
    }
    true
}

/// The marker's total, if the text was clipped before.
fn original_length(text: &str) -> Option<usize> {
    let start = text.rfind("\n[Shortened to fit the model's context window: ")?;
    let tail = &text[start..];
    let of = tail.find(" of ")?;
    let rest = &tail[of + 4..];
    let end = rest.find(' ')?;
    rest[..end].parse().ok()
}

/// Characters before the marker.
fn visible_chars(text: &str) -> usize {
    match text.rfind("\n[Shortened to fit the model's context window: ") {
        Some(start) => text[..start].chars().count(),
        None => text.chars().count(),
    }
}

/// The texts trimming may clip, each with a label for the log.
fn clippable(request: &mut AgentRequest) -> Vec<(String, &mut String)> {
    let mut texts: Vec<(String, &mut String)> = Vec::new();
    if let Some(scratchpad) = request
        .options
        .as_mut()
        .and_then(|o| o.agent_scratchpad.as_mut())
    {
        for (i, step) in scratchpad.steps.iter_mut().enumerate() {
            texts.push((format!("observation {}", i + 1), &mut step.observation));
        }
    }
    if let Some(question) = request.messages.last_mut() {
        if let Some(context) = question.context.as_mut() {
            texts.push(("resource".to_owned(), &mut context.content));
        }
        if let Some(file) = question.current_file.as_mut() {
            texts.push(("current file".to_owned(), &mut file.data));
        }
        for (i, item) in question.additional_context.iter_mut().flatten().enumerate() {
            if let Some(content) = item.content.as_mut() {
                texts.push((format!("context item {}", i + 1), content));
            }
        }
    }
    texts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: serde_json::Value) -> AgentRequest {
        serde_json::from_value(json).unwrap()
    }

    /// Counts the characters of every text the prompt would carry.
    fn chars(request: &AgentRequest) -> Result<usize, std::convert::Infallible> {
        let steps: usize = request
            .steps()
            .iter()
            .map(|s| s.observation.chars().count() + s.thought.len())
            .sum();
        let messages: usize = request
            .messages
            .iter()
            .map(|m| {
                m.content.chars().count()
                    + m.context.as_ref().map_or(0, |c| c.content.chars().count())
                    + m.additional_context
                        .iter()
                        .flatten()
                        .map(|c| c.content.as_ref().map_or(0, |t| t.chars().count()))
                        .sum::<usize>()
            })
            .sum();
        Ok(steps + messages)
    }

    #[test]
    fn reserve_is_at_most_a_quarter_of_the_context() {
        let budget = Budget::new("smollm2", 2048, 1024);
        assert_eq!(budget.reserve_tokens, 512);
        assert_eq!(budget.prompt_tokens(), 1536);
        assert_eq!(Budget::new("big", 200_000, 8192).reserve_tokens, 8192);
    }

    #[test]
    fn a_prompt_that_fits_is_unchanged() {
        let req = request(serde_json::json!({"messages": [{"role": "user", "content": "hi"}]}));
        let (fitted, trimmed) = fit(&req, &Budget::new("m", 2048, 256), chars)
            .unwrap()
            .unwrap();
        assert_eq!(fitted, req);
        assert!(trimmed.is_empty());
    }

    #[test]
    fn oldest_history_goes_first_then_the_longest_observation() {
        let long = "x".repeat(3000);
        let req = request(serde_json::json!({
            "messages": [
                {"role": "user", "content": "old question ".repeat(40)},
                {"role": "assistant", "content": "old answer ".repeat(40)},
                {"role": "user", "content": "newer question"},
                {"role": "assistant", "content": "newer answer"},
                {"role": "user", "content": "What does the search find?",
                 "additional_context": [{"category": "file", "id": "a.rs", "content": "fn a() {}"}]},
            ],
            "options": {"agent_scratchpad": {"agent_type": "react", "steps": [
                {"thought": "t", "tool": "gitlab_documentation", "tool_input": "q", "observation": "short"},
                {"thought": "t", "tool": "repository_search", "tool_input": "q", "observation": long},
            ]}},
        }));
        // 1000 tokens for the prompt: 3000 characters.
        let budget = Budget::new("smollm2", 1200, 200);
        let (fitted, trimmed) = fit(&req, &budget, chars).unwrap().unwrap();
        assert_eq!(trimmed.dropped_messages, 4);
        assert_eq!(trimmed.clipped, vec!["observation 2".to_owned()]);
        assert!(trimmed.tokens_after <= budget.prompt_tokens());
        assert_eq!(fitted.messages.len(), 1);
        let steps = fitted.steps();
        assert_eq!(steps[0].observation, "short");
        assert!(
            steps[1].observation.ends_with("characters.]"),
            "{}",
            steps[1].observation
        );
        assert!(steps[1].observation.contains(" of 3000 characters"));
        insta::assert_snapshot!(
            steps[1].observation.trim_start_matches('x').trim_start(),
            @"[Shortened to fit the model's context window: the first 2858 of 3000 characters.]"
        );
        assert_eq!(
            fitted.messages[0].additional_context.as_ref().unwrap()[0]
                .content
                .as_deref(),
            Some("fn a() {}")
        );
    }

    #[test]
    fn clipping_twice_keeps_the_original_length_in_the_marker() {
        let req = request(serde_json::json!({
            "messages": [{"role": "user", "content": "q",
                "context": {"type": "issue", "content": "y".repeat(5000)},
                "additional_context": [{"category": "file", "id": "b.rs", "content": "z".repeat(4000)}]}],
        }));
        let budget = Budget::new("smollm2", 1000, 0);
        let (fitted, trimmed) = fit(&req, &budget, chars).unwrap().unwrap();
        assert!(trimmed.tokens_after <= 1000);
        let question = &fitted.messages[0];
        let resource = &question.context.as_ref().unwrap().content;
        let item = question.additional_context.as_ref().unwrap()[0]
            .content
            .as_ref()
            .unwrap();
        assert!(resource.contains(" of 5000 characters.]"), "{resource}");
        assert!(item.contains(" of 4000 characters.]"), "{item}");
        assert_eq!(
            trimmed.clipped,
            vec!["resource".to_owned(), "context item 1".to_owned()]
        );
    }

    #[test]
    fn a_question_too_long_to_fit_names_the_model_and_the_sizes() {
        let req = request(serde_json::json!({
            "messages": [{"role": "user", "content": "q".repeat(9000)}],
        }));
        let err = fit(
            &req,
            &Budget::new("smollm2-135m-instruct", 2048, 1024),
            chars,
        )
        .unwrap()
        .unwrap_err();
        assert_eq!(err.prompt_tokens, 3000);
        let text = err.to_string();
        assert!(text.starts_with("prompt is too long for the model smollm2-135m-instruct"));
        assert!(text.contains("holds 2048 tokens (512 kept for the answer)"));
        assert!(text.contains("about 3000 tokens"));
        assert!(text.contains("DUO_LOCAL_LLM_CONTEXT"));
    }
}
