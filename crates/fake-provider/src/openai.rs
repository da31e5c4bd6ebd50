//! OpenAI chat completions, models and embeddings.

use crate::script::{self, Failure, Plan};
use crate::{State, sse_event, stop_list};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::Bytes;
use serde_json::{Value, json};

/// Models listed by `GET /v1/models`; any model name is accepted anyway.
const MODELS: [&str; 3] = [
    "fake-model",
    "smollm2-135m-instruct",
    "claude-3-5-sonnet-20241022",
];
const EMBEDDING_DIMS: usize = 16;
/// MiniLM's size, for bag-of-words embeddings.
const BOW_DIMS: usize = 384;

fn error_response(status: u16, kind: &str, message: &str) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .json(json!({"error": {"message": message, "type": kind, "code": status}}))
}

fn sse_response(
    body: impl futures::Stream<Item = Result<Bytes, actix_web::Error>> + 'static,
) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(body)
}

fn chunk(model: &str, delta: Value, finish_reason: Option<&str>) -> Bytes {
    sse_event(
        None,
        &json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }),
    )
}

pub(crate) async fn chat_completions(
    state: web::Data<State>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let json = state.record(&req, &body);
    if !json.is_object() {
        return error_response(400, "invalid_request_error", "body must be a JSON object");
    }
    let model = json["model"].as_str().unwrap_or_default().to_owned();
    let streaming = json["stream"].as_bool().unwrap_or(false);
    let stop = stop_list(json.get("stop"));
    let prompt_tokens = script::token_count(&json["messages"].to_string());

    match state.plan(&model, &json) {
        Plan::Fail(failure) => fail(&state, failure, streaming, &model).await,
        Plan::Tools { text, calls } => {
            tool_calls(&state, &model, &text, &calls, streaming, prompt_tokens)
        }
        Plan::Answer {
            pieces,
            first_byte_delay,
            held,
        } => {
            if let Some(delay) = first_byte_delay {
                tokio::time::sleep(delay).await;
            }
            let (answer, after) =
                script::Answer::held(pieces, held.clone().unwrap_or_default(), &stop);
            if !streaming {
                let text = answer.text() + &after.text();
                return HttpResponse::Ok().json(json!({
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": script::token_count(&text),
                        "total_tokens": prompt_tokens + script::token_count(&text),
                    },
                }));
            }
            let mut events = vec![chunk(
                &model,
                json!({"role": "assistant", "content": ""}),
                None,
            )];
            events.extend(
                answer
                    .pieces
                    .iter()
                    .map(|p| chunk(&model, json!({"content": p}), None)),
            );
            let mut closing: Vec<Bytes> = after
                .pieces
                .iter()
                .map(|p| chunk(&model, json!({"content": p}), None))
                .collect();
            closing.push(chunk(&model, json!({}), Some("stop")));
            closing.push(Bytes::from_static(b"data: [DONE]\n\n"));
            if held.is_some() {
                sse_response(state.held_sse_body(events, Some(closing)))
            } else {
                events.extend(closing);
                sse_response(state.sse_body(events))
            }
        }
    }
}

async fn fail(state: &State, failure: Failure, streaming: bool, model: &str) -> HttpResponse {
    match failure {
        Failure::Overloaded => error_response(503, "overloaded_error", "The server is overloaded"),
        Failure::ServerError => error_response(500, "server_error", "Internal server error"),
        Failure::Status {
            status,
            kind,
            message,
        } => error_response(status, &kind, &message),
        Failure::ErrorMidStream { text } if streaming => {
            let events = vec![
                chunk(model, json!({"role": "assistant", "content": text}), None),
                sse_event(
                    None,
                    &json!({"error": {"message": "Internal server error", "type": "server_error", "code": 500}}),
                ),
            ];
            sse_response(state.sse_body(events))
        }
        Failure::ErrorMidStream { .. } => {
            error_response(500, "server_error", "Internal server error")
        }
        Failure::Malformed if streaming => {
            let events = vec![
                chunk(model, json!({"role": "assistant", "content": ""}), None),
                Bytes::from_static(b"data: {\"choices\": [{\"delta\": \n\n"),
            ];
            sse_response(state.sse_body(events))
        }
        Failure::Malformed => HttpResponse::Ok()
            .content_type("application/json")
            .body("{\"choices\": ["),
        Failure::Hang if streaming => sse_response(state.hanging_body()),
        Failure::Hang => {
            state.wait_until_shutdown().await;
            error_response(503, "server_error", "The fake provider is stopping")
        }
    }
}

pub(crate) async fn models(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    state.record(&req, &[]);
    let data: Vec<Value> = MODELS
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "fake-provider"}))
        .collect();
    HttpResponse::Ok().json(json!({"object": "list", "data": data}))
}

pub(crate) async fn embeddings(
    state: web::Data<State>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let json = state.record(&req, &body);
    let _in_flight = state.embedding_started().await;
    let inputs: Vec<String> = match &json["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => {
            return error_response(
                400,
                "invalid_request_error",
                "input must be a string or a list of strings",
            );
        }
    };
    let model = json["model"].as_str().unwrap_or_default();
    if state.embeddings_failing() || model.starts_with("fake-500") {
        return error_response(500, "server_error", "the embedding model failed");
    }
    if model.starts_with("fake-overloaded") {
        return error_response(429, "rate_limit_exceeded", "slow down");
    }
    // `fake-max-batch-N`: more than N inputs in one call is "too long".
    if let Some(max) = model
        .strip_prefix("fake-max-batch-")
        .and_then(|n| n.split('-').next())
        .and_then(|n| n.parse::<usize>().ok())
        && inputs.len() > max
    {
        return error_response(
            400,
            "invalid_request_error",
            "This model's maximum context length was exceeded: too many tokens",
        );
    }
    let tokens: usize = inputs.iter().map(|t| script::token_count(t)).sum();
    // `fake-bow…` models embed the words of a text (similar texts, similar
    // vectors), so retrieval over them means something; others hash the text.
    let bag_of_words = model.contains("bow");
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let embedding = if bag_of_words {
                script::bag_of_words_embedding(text, BOW_DIMS)
            } else {
                script::embedding(text, EMBEDDING_DIMS)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    HttpResponse::Ok().json(json!({
        "object": "list",
        "data": data,
        "model": json["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

/// A turn with `tool_calls`.
fn tool_calls(
    state: &State,
    model: &str,
    text: &str,
    calls: &[script::ToolCall],
    streaming: bool,
    prompt_tokens: usize,
) -> HttpResponse {
    let wire: Vec<Value> = calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect();
    if !streaming {
        let content = if text.is_empty() {
            Value::Null
        } else {
            json!(text)
        };
        return HttpResponse::Ok().json(json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content, "tool_calls": wire},
                "finish_reason": "tool_calls",
            }],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1},
        }));
    }
    let mut events = vec![chunk(
        model,
        json!({"role": "assistant", "content": text}),
        None,
    )];
    for (index, call) in calls.iter().enumerate() {
        events.push(chunk(
            model,
            json!({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                   "function": {"name": call.name, "arguments": call.arguments}}]}),
            None,
        ));
    }
    events.push(chunk(model, json!({}), Some("tool_calls")));
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    sse_response(state.sse_body(events))
}
