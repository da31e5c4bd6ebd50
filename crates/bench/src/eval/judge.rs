//! The QA judge: a model that reads the question, the reference answer and
//! the system's answer (through `eval/judge-prompt.md`) and replies CORRECT
//! or INCORRECT with a reason. Its reply is read strictly: anything but the
//! two-line form is a judge error, never a verdict.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use fake_provider::FakeProvider;
use serde_json::{Value, json};

/// What the judge said about one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Correct {
        reason: String,
    },
    Incorrect {
        reason: String,
    },
    /// The reply had no readable verdict, or the judge could not be asked.
    Error {
        detail: String,
    },
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Correct { .. } => "CORRECT",
            Verdict::Incorrect { .. } => "INCORRECT",
            Verdict::Error { .. } => "JUDGE ERROR",
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            Verdict::Correct { reason } | Verdict::Incorrect { reason } => reason,
            Verdict::Error { detail } => detail,
        }
    }
}

/// Reads a judge's reply. The first non-blank line must be exactly
/// `CORRECT` or `INCORRECT`; the next non-blank line must start with
/// `Reason:` and say something. Anything else is a judge error.
pub fn parse_verdict(reply: &str) -> Verdict {
    let mut lines = reply.lines().map(str::trim).filter(|l| !l.is_empty());
    let error = |detail: String| Verdict::Error { detail };
    let shown = || reply.chars().take(200).collect::<String>();
    let Some(first) = lines.next() else {
        return error("the judge replied nothing".to_owned());
    };
    let correct = match first {
        "CORRECT" => true,
        "INCORRECT" => false,
        _ => return error(format!("no verdict on the first line: {:?}", shown())),
    };
    let reason = lines
        .next()
        .and_then(|l| l.strip_prefix("Reason:"))
        .map(str::trim)
        .unwrap_or_default();
    if reason.is_empty() {
        return error(format!("a verdict without a reason: {:?}", shown()));
    }
    if lines.next().is_some() {
        return error(format!("more than the two lines asked for: {:?}", shown()));
    }
    let reason = reason.to_owned();
    if correct {
        Verdict::Correct { reason }
    } else {
        Verdict::Incorrect { reason }
    }
}

/// The judge prompt with its three slots filled. Each slot must appear once
/// in the template.
pub fn render_prompt(
    template: &str,
    question: &str,
    reference: &str,
    answer: &str,
) -> anyhow::Result<String> {
    for slot in ["{{question}}", "{{reference}}", "{{answer}}"] {
        ensure!(
            template.matches(slot).count() == 1,
            "the judge prompt must hold {slot} exactly once"
        );
    }
    // The answer goes in last, so text inside it that looks like a slot
    // stays as it is.
    Ok(template
        .replace("{{question}}", question)
        .replace("{{reference}}", reference)
        .replace("{{answer}}", answer))
}

/// Which model judges, and how it is reached.
pub enum Judge {
    /// A fake provider of the harness's own, answering the scripted verdict.
    Fake(FakeProvider),
    /// Anthropic's Messages API.
    Anthropic {
        base_url: String,
        api_key: String,
        model: String,
    },
    /// An OpenAI-compatible `/chat/completions` (the bundled model server,
    /// vLLM, Ollama, ...).
    OpenAi {
        base_url: String,
        api_key: Option<String>,
        model: String,
    },
}

impl Judge {
    pub fn describe(&self) -> String {
        match self {
            Judge::Fake(_) => "fake (scripted verdicts)".to_owned(),
            Judge::Anthropic { model, .. } => format!("anthropic {model}"),
            Judge::OpenAi {
                base_url, model, ..
            } => format!("openai-compatible {model} at {base_url}"),
        }
    }

    /// Asks the judge `prompt`; `scripted` is the fake judge's reply.
    pub async fn ask(
        &self,
        http: &reqwest::Client,
        prompt: &str,
        scripted: Option<&str>,
    ) -> anyhow::Result<String> {
        match self {
            Judge::Fake(fake) => {
                fake.reset();
                fake.push_text(scripted.unwrap_or("(no scripted verdict)"));
                anthropic(http, &fake.url(), "fake-judge", "fake-judge", prompt).await
            }
            Judge::Anthropic {
                base_url,
                api_key,
                model,
            } => anthropic(http, base_url, api_key, model, prompt).await,
            Judge::OpenAi {
                base_url,
                api_key,
                model,
            } => openai(http, base_url, api_key.as_deref(), model, prompt).await,
        }
    }

    /// Judges one answer: the verdict, or a judge error when the call fails.
    pub async fn judge(
        &self,
        http: &reqwest::Client,
        template: &str,
        question: &str,
        reference: &str,
        answer: &str,
        scripted: Option<&str>,
    ) -> Verdict {
        let prompt = match render_prompt(template, question, reference, answer) {
            Ok(p) => p,
            Err(e) => {
                return Verdict::Error {
                    detail: e.to_string(),
                };
            }
        };
        match self.ask(http, &prompt, scripted).await {
            Ok(reply) => parse_verdict(&reply),
            Err(e) => Verdict::Error {
                detail: format!("asking the judge failed: {e:#}"),
            },
        }
    }
}

const JUDGE_MAX_TOKENS: u32 = 200;
const JUDGE_TIMEOUT: Duration = Duration::from_secs(600);

async fn anthropic(
    http: &reqwest::Client,
    base_url: &str,
    api_key: &str,
    model: &str,
    prompt: &str,
) -> anyhow::Result<String> {
    let response = http
        .post(format!("{}/v1/messages", base_url.trim_end_matches('/')))
        .header("x-api-key", api_key)
        .header("anthropic-version", "2023-06-01")
        .timeout(JUDGE_TIMEOUT)
        .json(&json!({
            "model": model,
            "max_tokens": JUDGE_MAX_TOKENS,
            "temperature": 0,
            "messages": [{"role": "user", "content": prompt}],
        }))
        .send()
        .await
        .context("the judge is unreachable")?;
    let status = response.status();
    let body: Value = response.json().await.context("the judge's answer")?;
    if !status.is_success() {
        bail!("the judge answered {status}: {body}");
    }
    let text: String = body["content"]
        .as_array()
        .context("no content in the judge's answer")?
        .iter()
        .filter_map(|block| block["text"].as_str())
        .collect();
    Ok(text)
}

async fn openai(
    http: &reqwest::Client,
    base_url: &str,
    api_key: Option<&str>,
    model: &str,
    prompt: &str,
) -> anyhow::Result<String> {
    let mut request = http
        .post(format!(
            "{}/chat/completions",
            base_url.trim_end_matches('/')
        ))
        .timeout(JUDGE_TIMEOUT)
        .json(&json!({
            "model": model,
            "max_tokens": JUDGE_MAX_TOKENS,
            "temperature": 0,
            "messages": [{"role": "user", "content": prompt}],
        }));
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.context("the judge is unreachable")?;
    let status = response.status();
    let body: Value = response.json().await.context("the judge's answer")?;
    if !status.is_success() {
        bail!("the judge answered {status}: {body}");
    }
    body["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_owned)
        .context("no message in the judge's answer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_strictly() {
        assert_eq!(
            parse_verdict("CORRECT\nReason: It names SAML and OIDC."),
            Verdict::Correct {
                reason: "It names SAML and OIDC.".into()
            }
        );
        assert_eq!(
            parse_verdict("\n  INCORRECT  \n\nReason:  Wrong level.\n"),
            Verdict::Incorrect {
                reason: "Wrong level.".into()
            }
        );
        for bad in [
            "",
            "correct\nReason: lower case",
            "CORRECT.\nReason: punctuation",
            "**CORRECT**\nReason: markdown",
            "CORRECT or INCORRECT\nReason: both",
            "CORRECT",
            "CORRECT\nReason:",
            "CORRECT\nBecause it is.",
            "INCORRECT\nReason: one\nand more text",
            "The answer is CORRECT.\nReason: not on its own line",
        ] {
            assert!(
                matches!(parse_verdict(bad), Verdict::Error { .. }),
                "{bad:?} was read as a verdict"
            );
        }
    }

    #[test]
    fn the_stored_prompt_has_its_slots() {
        let template =
            std::fs::read_to_string(crate::eval::sets::eval_dir().join("judge-prompt.md")).unwrap();
        let prompt = render_prompt(&template, "Q?", "R.", "A {{question}}").unwrap();
        assert!(prompt.contains("<question>\nQ?\n</question>"), "{prompt}");
        assert!(prompt.contains("R."));
        assert!(prompt.contains("A {{question}}"));
        assert!(render_prompt("no slots", "q", "r", "a").is_err());
    }

    #[tokio::test]
    async fn the_fake_judge_answers_its_script_over_the_anthropic_wire() {
        let judge = Judge::Fake(FakeProvider::start().await.unwrap());
        let http = reqwest::Client::new();
        let verdict = judge
            .judge(
                &http,
                "{{question}} {{reference}} {{answer}}",
                "q",
                "r",
                "a",
                Some("INCORRECT\nReason: It is wrong."),
            )
            .await;
        assert_eq!(
            verdict,
            Verdict::Incorrect {
                reason: "It is wrong.".into()
            }
        );
    }
}
