//! Tool calling and structured output against the real model: whatever the
//! sampler draws, the grammar keeps the answer well formed.

use crate::common;
use local_llm::config::Config;

use reqwest::StatusCode;
use serde_json::{Value, json};

const CHAT_MODEL: &str = "smollm2-135m-instruct";
const SEEDS: u32 = 8;

async fn post(base: &str, body: &Value) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("request");
    let status = resp.status();
    (status, resp.json().await.expect("json body"))
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "issue_reader",
            "description": "Reads one issue of a project.",
            "parameters": {
                "type": "object",
                "properties": {
                    "project": {"type": "string", "maxLength": 40},
                    "issue_iid": {"type": "integer", "minimum": 1}
                },
                "required": ["project", "issue_iid"],
                "additionalProperties": false
            }
        }},
        {"type": "function", "function": {
            "name": "gitlab_documentation",
            "description": "Searches the GitLab documentation.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 60}},
                "required": ["query"],
                "additionalProperties": false
            }
        }}
    ])
}

fn request(question: &str) -> Value {
    json!({
        "model": CHAT_MODEL,
        "messages": [
            {"role": "system", "content": "You help with GitLab projects."},
            {"role": "user", "content": question}
        ],
        "max_tokens": 200,
    })
}

/// Checks one call against the declared tools' schemas; returns its name.
fn assert_valid_call(call: &Value) -> String {
    assert_eq!(call["type"], "function", "{call}");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    let name = call["function"]["name"].as_str().expect("name").to_owned();
    let arguments: Value = serde_json::from_str(
        call["function"]["arguments"]
            .as_str()
            .expect("arguments are a JSON string"),
    )
    .unwrap_or_else(|e| panic!("arguments do not parse ({e}): {call}"));
    let object = arguments.as_object().expect("arguments are an object");
    match name.as_str() {
        "issue_reader" => {
            assert!(object.len() == 2, "{arguments}");
            assert!(
                object["project"]
                    .as_str()
                    .is_some_and(|p| p.chars().count() <= 40),
                "{arguments}"
            );
            assert!(
                object["issue_iid"].as_u64().is_some_and(|n| n >= 1),
                "{arguments}"
            );
        }
        "gitlab_documentation" => {
            assert!(object.len() == 1, "{arguments}");
            let query = object["query"].as_str().expect("query");
            assert!((1..=60).contains(&query.chars().count()), "{arguments}");
        }
        other => panic!("called a tool that was not offered: {other}"),
    }
    name
}

#[actix_web::test]
async fn required_tool_calls_always_parse_and_match_their_schema_over_many_seeds() {
    let base = common::start_server(common::test_config()).await;
    let mut names = Vec::new();
    for seed in 0..SEEDS {
        let mut body = request("What does issue 3 of acme/website say about the login page?");
        body["tools"] = tools();
        body["tool_choice"] = json!("required");
        body["temperature"] = json!(1.0);
        body["seed"] = json!(seed);
        let (status, reply) = post(&base, &body).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        let choice = &reply["choices"][0];
        assert_eq!(
            choice["finish_reason"], "tool_calls",
            "seed {seed}: {reply}"
        );
        assert!(choice["message"]["content"].is_null(), "{reply}");
        let calls = choice["message"]["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 1, "{reply}");
        names.push(assert_valid_call(&calls[0]));
    }
    assert_eq!(names.len(), SEEDS as usize);
}

#[actix_web::test]
async fn json_schema_answers_always_parse_and_match_over_many_seeds() {
    let base = common::start_server(common::test_config()).await;
    let schema = json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 30},
            "priority": {"enum": ["low", "medium", "high"]},
            "estimate_days": {"type": "integer", "minimum": 0},
            "labels": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
            "blocked": {"type": "boolean"}
        },
        "required": ["title", "priority", "estimate_days", "labels", "blocked"],
        "additionalProperties": false
    });
    for seed in 0..SEEDS {
        let mut body = request("Describe a bug about a broken login page as a ticket.");
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {"name": "ticket", "strict": true, "schema": schema},
        });
        body["temperature"] = json!(1.0);
        body["seed"] = json!(seed);
        body["max_tokens"] = json!(300);
        let (status, reply) = post(&base, &body).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        let choice = &reply["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "seed {seed}: {reply}");
        let text = choice["message"]["content"].as_str().expect("content");
        let ticket: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
        let keys: Vec<&str> = ticket
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys.len(), 5, "seed {seed}: {ticket}");
        assert!(
            ticket["title"]
                .as_str()
                .is_some_and(|t| t.chars().count() <= 30)
        );
        assert!(["low", "medium", "high"].contains(&ticket["priority"].as_str().unwrap_or("")));
        assert!(ticket["estimate_days"].as_u64().is_some(), "{ticket}");
        assert!(ticket["labels"].as_array().is_some_and(|l| l.len() <= 3));
        assert!(ticket["blocked"].is_boolean());
    }

    // `json_object`: any object, still always JSON.
    for seed in 0..4 {
        let mut body = request("Give the colour of the sky as JSON.");
        body["response_format"] = json!({"type": "json_object"});
        body["temperature"] = json!(0.8);
        body["seed"] = json!(seed);
        let (status, reply) = post(&base, &body).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        if reply["choices"][0]["finish_reason"] == "stop" {
            let text = reply["choices"][0]["message"]["content"]
                .as_str()
                .expect("content");
            let value: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
            assert!(value.is_object(), "{value}");
        } else {
            // Cut at max_tokens: still the start of an object.
            let text = reply["choices"][0]["message"]["content"]
                .as_str()
                .expect("content");
            assert!(text.trim_start().starts_with('{'), "{text:?}");
        }
    }
}

#[actix_web::test]
async fn tool_choice_none_named_and_auto() {
    let base = common::start_server(common::test_config()).await;
    let question = "Summarize issue 1 of acme/website.";

    // none: plain text even though tools are declared.
    let mut body = request(question);
    body["tools"] = tools();
    body["tool_choice"] = json!("none");
    body["temperature"] = json!(0);
    body["max_tokens"] = json!(40);
    let (status, reply) = post(&base, &body).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let message = &reply["choices"][0]["message"];
    assert!(message.get("tool_calls").is_none(), "{reply}");
    assert!(message["content"].as_str().is_some_and(|c| !c.is_empty()));
    assert_ne!(reply["choices"][0]["finish_reason"], "tool_calls");

    // A named function: that one, whatever the question.
    for (name, seed) in [("gitlab_documentation", 1), ("issue_reader", 2)] {
        let mut body = request(question);
        body["tools"] = tools();
        body["tool_choice"] = json!({"type": "function", "function": {"name": name}});
        body["temperature"] = json!(0.9);
        body["seed"] = json!(seed);
        let (status, reply) = post(&base, &body).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        let call = &reply["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(assert_valid_call(call), name);
        assert_eq!(reply["choices"][0]["finish_reason"], "tool_calls");
    }

    // auto: either an answer or a valid call, never a broken call in the text.
    for seed in 0..6 {
        let mut body = request(question);
        body["tools"] = tools();
        body["tool_choice"] = json!("auto");
        body["temperature"] = json!(1.0);
        body["seed"] = json!(seed);
        let (status, reply) = post(&base, &body).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        let choice = &reply["choices"][0];
        match choice["message"]["tool_calls"].as_array() {
            Some(calls) => {
                assert_eq!(choice["finish_reason"], "tool_calls");
                assert_valid_call(&calls[0]);
            }
            None => {
                let text = choice["message"]["content"].as_str().expect("content");
                assert!(!text.contains("<tool_call>"), "{text:?}");
            }
        }
    }

    // Choices that cannot be honoured are refused before any generation.
    for (tools, choice) in [
        (
            tools(),
            json!({"type": "function", "function": {"name": "epic_reader"}}),
        ),
        (Value::Null, json!("required")),
        (tools(), json!("sometimes")),
    ] {
        let mut body = request(question);
        if !tools.is_null() {
            body["tools"] = tools;
        }
        body["tool_choice"] = choice;
        let (status, reply) = post(&base, &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
        assert!(reply["error"]["message"].is_string(), "{reply}");
    }
    let mut body = request(question);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "^a+$"}}});
    let (status, reply) = post(&base, &body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("pattern")),
        "{reply}"
    );
}

/// The `data:` payloads of an SSE body, `[DONE]` excluded (asserted last).
fn chunks(body: &str) -> Vec<Value> {
    let events: Vec<&str> = body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data frame"))
        .collect();
    assert_eq!(events.last().copied(), Some("[DONE]"), "{body}");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk json"))
        .collect()
}

#[actix_web::test]
async fn a_streamed_tool_call_comes_in_openai_chunk_shapes() {
    // Every token's piece on its own: the shape of each chunk is what is
    // checked, and a fast machine would otherwise join tokens into fewer.
    let config = Config {
        pieces_every: std::time::Duration::ZERO,
        ..common::test_config()
    };
    let base = common::start_server(config).await;
    let mut body = request("Summarize issue 1 of acme/website.");
    body["tools"] = tools();
    body["tool_choice"] = json!({"type": "function", "function": {"name": "issue_reader"}});
    body["temperature"] = json!(0);
    let (status, whole) = post(&base, &body).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let expected = &whole["choices"][0]["message"]["tool_calls"][0];

    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = common::post_text(&format!("{base}/v1/chat/completions"), &body).await;
    let chunks = chunks(&text);
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    // The first chunk opens the call: role, index, id, type and name, empty arguments.
    let first = &chunks[0]["choices"][0]["delta"];
    assert_eq!(first["role"], "assistant", "{text}");
    assert!(first["content"].is_null(), "{text}");
    let opening = &first["tool_calls"][0];
    assert_eq!(opening["index"], 0);
    assert_eq!(opening["type"], "function");
    assert_eq!(opening["function"]["name"], "issue_reader");
    assert_eq!(opening["function"]["arguments"], "");
    let id = opening["id"].as_str().expect("id");
    assert!(id.starts_with("call_"));
    // Then argument pieces only, without the id or name again.
    let (with_choices, usage): (Vec<&Value>, Vec<&Value>) = chunks[1..]
        .iter()
        .partition(|c| c["choices"].as_array().is_some_and(|c| !c.is_empty()));
    let (last, middle) = with_choices.split_last().expect("a final chunk");
    let mut arguments = String::new();
    for chunk in middle {
        let choice = &chunk["choices"][0];
        assert!(choice["finish_reason"].is_null(), "{chunk}");
        let call = &choice["delta"]["tool_calls"][0];
        assert_eq!(call["index"], 0, "{chunk}");
        assert!(
            call.get("id").is_none() && call["function"].get("name").is_none(),
            "{chunk}"
        );
        assert!(choice["delta"].get("content").is_none(), "{chunk}");
        arguments.push_str(call["function"]["arguments"].as_str().expect("piece"));
    }
    assert!(
        middle.len() > 1,
        "the arguments should come in pieces: {text}"
    );
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(
        arguments,
        expected["function"]["arguments"].as_str().expect("args")
    );
    let parsed: Value = serde_json::from_str(&arguments).expect("arguments parse");
    assert!(parsed["issue_iid"].as_u64().is_some(), "{parsed}");
    assert_eq!(usage.len(), 1, "{text}");
    assert!(usage[0]["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 3);
}

#[actix_web::test]
async fn a_streamed_plain_answer_with_tools_offered_carries_content_only() {
    let base = common::start_server(common::test_config()).await;
    let mut body = request("Say hello.");
    body["tools"] = tools();
    body["tool_choice"] = json!("none");
    body["temperature"] = json!(0);
    body["max_tokens"] = json!(12);
    body["stream"] = json!(true);
    let text = common::post_text(&format!("{base}/v1/chat/completions"), &body).await;
    let chunks = chunks(&text);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()),
        "{text}"
    );
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!content.is_empty());
}
