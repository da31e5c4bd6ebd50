//! ChatML prompt rendering (the template SmolLM2-Instruct was trained with).

use serde::{Deserialize, Serialize};

/// End-of-turn marker; the model's EOS in ChatML.
pub const END_OF_TURN: &str = "<|im_end|>";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Renders the conversation and opens the assistant's turn.
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

    #[test]
    fn renders_system_user_and_opens_assistant_turn() {
        let messages = vec![
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
        ];
        insta::assert_snapshot!(render_chatml(&messages));
    }
}
