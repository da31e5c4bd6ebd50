//! Anthropic Messages API: `POST /v1/messages`.

use crate::script::{self, Failure, Plan};
use crate::{State, sse_event, stop_list};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::Bytes;
use serde_json::{Value, json};

pub(crate) fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn error_response(status: u16, kind: &str, message: &str) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .json(error_body(kind, message))
}

pub(crate) async fn messages(
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
    let stop = stop_list(json.get("stop_sequences"));
    let input_tokens = script::token_count(&json["messages"].to_string());

    match state.plan(&model, &json) {
        Plan::Fail(failure) => fail(&state, failure, streaming, &model).await,
        Plan::Tools { text, calls } => {
            tool_use(&state, &model, &text, &calls, streaming, input_tokens)
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
            let stop_sequence = script::Answer::stopped_by(&answer, &after);
            let stop_reason = if stop_sequence.is_some() {
                "stop_sequence"
            } else {
                "end_turn"
            };
            let text = answer.text() + &after.text();
            if !streaming {
                return HttpResponse::Ok().json(json!({
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": stop_reason,
                    "stop_sequence": stop_sequence,
                    "usage": {"input_tokens": input_tokens, "output_tokens": script::token_count(&text)},
                }));
            }
            let output_tokens = script::token_count(&text);
            let mut events = opening_events(&model, input_tokens);
            events.extend(answer.pieces.iter().map(|p| text_delta(p)));
            let mut closing: Vec<Bytes> = after.pieces.iter().map(|p| text_delta(p)).collect();
            closing.push(sse_event(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": 0}),
            ));
            closing.push(sse_event(
                Some("message_delta"),
                &json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": {"output_tokens": output_tokens},
                }),
            ));
            closing.push(sse_event(
                Some("message_stop"),
                &json!({"type": "message_stop"}),
            ));
            if held.is_some() {
                sse_response(state.held_sse_body(events, Some(closing)))
            } else {
                events.extend(closing);
                sse_response(state.sse_body(events))
            }
        }
    }
}

fn sse_response(
    body: impl futures::Stream<Item = Result<Bytes, actix_web::Error>> + 'static,
) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(body)
}

fn opening_events(model: &str, input_tokens: usize) -> Vec<Bytes> {
    vec![
        sse_event(
            Some("message_start"),
            &json!({
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": {"input_tokens": input_tokens, "output_tokens": 1},
                },
            }),
        ),
        sse_event(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        sse_event(Some("ping"), &json!({"type": "ping"})),
    ]
}

fn text_delta(text: &str) -> Bytes {
    sse_event(
        Some("content_block_delta"),
        &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
    )
}

async fn fail(state: &State, failure: Failure, streaming: bool, model: &str) -> HttpResponse {
    match failure {
        Failure::Overloaded => error_response(529, "overloaded_error", "Overloaded"),
        Failure::ServerError => error_response(500, "api_error", "Internal server error"),
        Failure::Status {
            status,
            kind,
            message,
        } => error_response(status, &kind, &message),
        Failure::ErrorMidStream { text } if streaming => {
            let mut events = opening_events(model, 1);
            events.push(text_delta(&text));
            events.push(sse_event(
                Some("error"),
                &error_body("api_error", "Internal server error"),
            ));
            sse_response(state.sse_body(events))
        }
        Failure::ErrorMidStream { .. } => error_response(500, "api_error", "Internal server error"),
        Failure::Malformed if streaming => {
            let mut events = opening_events(model, 1);
            events.push(Bytes::from_static(
                b"event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"delta\": {\n\n",
            ));
            sse_response(state.sse_body(events))
        }
        Failure::Malformed => HttpResponse::Ok()
            .content_type("application/json")
            .body("{\"type\": \"message\", \"content\": ["),
        Failure::Hang if streaming => sse_response(state.hanging_body()),
        Failure::Hang => {
            state.wait_until_shutdown().await;
            error_response(503, "api_error", "The fake provider is stopping")
        }
    }
}

/// A turn with `tool_use` blocks.
fn tool_use(
    state: &State,
    model: &str,
    text: &str,
    calls: &[script::ToolCall],
    streaming: bool,
    input_tokens: usize,
) -> HttpResponse {
    if !streaming {
        let mut content = Vec::new();
        if !text.is_empty() {
            content.push(json!({"type": "text", "text": text}));
        }
        content.extend(
            calls.iter().map(
                |c| json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input()}),
            ),
        );
        return HttpResponse::Ok().json(json!({
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": "tool_use",
            "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": script::token_count(text)},
        }));
    }
    // Text block 0 (opened by the opening events), then one block per call
    // whose input arrives as JSON deltas.
    let mut events = opening_events(model, input_tokens);
    if !text.is_empty() {
        events.push(text_delta(text));
    }
    events.push(sse_event(
        Some("content_block_stop"),
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    for (n, call) in calls.iter().enumerate() {
        let index = n + 1;
        events.push(sse_event(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}}),
        ));
        events.push(sse_event(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": call.arguments}}),
        ));
        events.push(sse_event(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(sse_event(
        Some("message_delta"),
        &json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"output_tokens": script::token_count(text)}}),
    ));
    events.push(sse_event(
        Some("message_stop"),
        &json!({"type": "message_stop"}),
    ));
    sse_response(state.sse_body(events))
}
