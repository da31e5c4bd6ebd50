//! Chat prompts from the model's own template: the Jinja template a GGUF
//! carries in `tokenizer.chat_template` (what llama.cpp and vLLM read),
//! rendered with minijinja and Python string methods (`.strip()`,
//! `.startswith()`, ...) as Hugging Face templates use them. Inputs are the
//! ones those servers pass: `messages` (`role`, `content`),
//! `add_generation_prompt`, `bos_token`, `eos_token`, and the functions
//! `raise_exception` and `strftime_now`. A model without a template is
//! spoken to in ChatML.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Environment, ErrorKind, UndefinedBehavior, Value, context};
use serde::{Deserialize, Serialize};

use crate::engine::ModelInfo;

/// End-of-turn marker in ChatML.
pub const END_OF_TURN: &str = "<|im_end|>";

/// ChatML, for models whose file has no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

const TEMPLATE_NAME: &str = "chat";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the chat template does not compile: {0}")]
    Compile(String),
    /// The template refused the conversation (`raise_exception`), e.g. roles
    /// that do not alternate; the client's request is at fault.
    #[error("the model's chat template refused the conversation: {0}")]
    Refused(String),
    #[error("the chat template failed to render: {0}")]
    Render(String),
}

/// Where the template came from, for logs and `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateSource {
    /// `tokenizer.chat_template` in the GGUF file.
    Model,
    /// `DUO_LOCAL_LLM_CHAT_TEMPLATE`.
    Override,
    /// The file has none: ChatML.
    ChatmlFallback,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    source: TemplateSource,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The model's template, or `override_source` when an admin set one.
    pub fn for_model(
        info: &ModelInfo,
        override_source: Option<String>,
    ) -> Result<Self, TemplateError> {
        let (source, kind) = match (override_source, &info.chat_template) {
            (Some(text), _) => (text, TemplateSource::Override),
            (None, Some(text)) => (text.clone(), TemplateSource::Model),
            (None, None) => (CHATML_TEMPLATE.to_owned(), TemplateSource::ChatmlFallback),
        };
        Self::compile(source, kind, &info.bos_token, &info.eos_token)
    }

    /// ChatML with no special BOS/EOS text.
    pub fn chatml() -> Result<Self, TemplateError> {
        Self::compile(
            CHATML_TEMPLATE.to_owned(),
            TemplateSource::ChatmlFallback,
            "",
            END_OF_TURN,
        )
    }

    fn compile(
        source: String,
        kind: TemplateSource,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // Templates are written for Python's Jinja: missing attributes read
        // as undefined rather than failing, as they do there.
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Hugging Face's transformers renders with both set, and the
        // templates' whitespace is written for that.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Compile(e.to_string()))?;
        env.set_syntax(syntax);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| TemplateError::Compile(e.to_string()))?;
        Ok(Self {
            env,
            source: kind,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    pub fn source(&self) -> TemplateSource {
        self.source
    }

    /// Renders the conversation and opens the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, TemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        template
            .render(context! {
                messages => Value::from(minijinja::value::Serde(messages)),
                add_generation_prompt => true,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidOperation
                    if e.detail().is_some_and(|d| d.starts_with(REFUSAL)) =>
                {
                    TemplateError::Refused(
                        e.detail()
                            .unwrap_or_default()
                            .trim_start_matches(REFUSAL)
                            .to_owned(),
                    )
                }
                _ => TemplateError::Render(e.to_string()),
            })
    }
}

const REFUSAL: &str = "template refused: ";

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{REFUSAL}{message}"),
    ))
}

/// `strftime_now(format)`: the current UTC date, for the few directives
/// templates use (`%d`, `%m`, `%Y`, `%b`, `%B`, `%H`, `%M`, `%S`, `%%`).
fn strftime_now(format: String) -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_utc(seconds, &format)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

fn format_utc(seconds: u64, format: &str) -> String {
    let days = seconds / 86_400;
    let secs = seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month_name = MONTHS[(month - 1).clamp(0, 11) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// ChatML rendering without a template engine (tests and benchmarks).
pub fn render_chatml(messages: &[ChatMessage]) -> String {
    let mut prompt = String::new();
    for message in messages {
        prompt.push_str("<|im_start|>");
        prompt.push_str(&message.role);
        prompt.push('\n');
        prompt.push_str(&message.content);
        prompt.push_str(END_OF_TURN);
        prompt.push('\n');
    }
    prompt.push_str("<|im_start|>assistant\n");
    prompt
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: "What is Rust?".into(),
            },
            ChatMessage {
                role: "assistant".into(),
                content: "A language.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: "Thanks".into(),
            },
        ]
    }

    #[test]
    fn renders_system_user_and_opens_assistant_turn() {
        insta::assert_snapshot!(render_chatml(&conversation()));
    }

    #[test]
    fn the_chatml_template_renders_like_the_hand_written_chatml() {
        let template = ChatTemplate::chatml().unwrap();
        assert_eq!(
            template.render(&conversation()).unwrap(),
            render_chatml(&conversation())
        );
    }

    #[test]
    fn python_string_methods_and_raise_exception_work() {
        let info = ModelInfo {
            chat_template: Some(
                "{{ bos_token }}{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('roles must be user or assistant') }}{% endif %}[{{ m.role.upper() }}] {{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}".into(),
            ),
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
            end_of_turn_texts: vec![],
            context_tokens: 2048,
        };
        let template = ChatTemplate::for_model(&info, None).unwrap();
        assert_eq!(template.source(), TemplateSource::Model);
        let rendered = template
            .render(&[ChatMessage {
                role: "user".into(),
                content: "  hi  ".into(),
            }])
            .unwrap();
        assert_eq!(rendered, "<s>[USER] hi\n[ASSISTANT]");
        match template.render(&conversation()) {
            Err(TemplateError::Refused(message)) => {
                assert_eq!(message, "roles must be user or assistant");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dates_format_as_strftime_does() {
        // 2024-02-29 13:05:09 UTC
        assert_eq!(
            format_utc(1_709_211_909, "%d %b %Y %H:%M:%S %B %%"),
            "29 Feb 2024 13:05:09 February %"
        );
    }
}
