//! Vertex AI predict: `.../publishers/google/models/{model}:predict` and
//! `:serverStreamingPredict`.
//!
//! Models whose name contains `embedding` or `gecko` answer text embeddings
//! (`instances[].content` → `predictions[].embeddings.values`); others answer
//! text (`predictions[].content`). The streaming form answers in the shape it
//! was asked in: a body with `instances` gets one
//! `{"predictions": [{"content": piece}]}` per piece, a body with Vertex's
//! tensor `inputs` gets `{"outputs": [{"structVal": {"content": {"stringVal":
//! [piece]}}}]}`; one per SSE event with `?alt=sse`, or a JSON array of those
//! objects without it. An error in the middle of an SSE stream is an
//! `{"error": {...}}` event.

use crate::script::{self, Failure, Plan};
use crate::{State, sse_event};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::Bytes;
use serde_json::{Value, json};

const EMBEDDING_DIMS: usize = 16;

fn error_response(status: u16, message: &str) -> HttpResponse {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(code).json(json!({
        "error": {"code": status, "message": message, "status": code.canonical_reason().unwrap_or("UNKNOWN")}
    }))
}

fn sse_response(
    body: impl futures::Stream<Item = Result<Bytes, actix_web::Error>> + 'static,
) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(body)
}

pub(crate) async fn model_action(
    state: web::Data<State>,
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
    body: web::Bytes,
) -> HttpResponse {
    let json = state.record(&req, &body);
    let (_project, _location, model_action) = path.into_inner();
    let Some((model, action)) = model_action.rsplit_once(':') else {
        return error_response(404, "unknown model action");
    };
    let tensors = action == "serverStreamingPredict" && json["inputs"].is_array();
    let instances = match json["instances"].as_array() {
        Some(instances) => instances.as_slice(),
        None if tensors => &[],
        None => return error_response(400, "instances must be a list"),
    };
    match action {
        "predict" if model.contains("embedding") || model.contains("gecko") => {
            let predictions: Vec<Value> = instances
                .iter()
                .map(|instance| {
                    let text = instance["content"].as_str().unwrap_or_default();
                    json!({"embeddings": {
                        "values": script::embedding(text, EMBEDDING_DIMS),
                        "statistics": {"token_count": script::token_count(text), "truncated": false},
                    }})
                })
                .collect();
            HttpResponse::Ok().json(json!({"predictions": predictions}))
        }
        "predict" | "serverStreamingPredict" => {
            let streaming = action == "serverStreamingPredict";
            let sse = req.query_string().contains("alt=sse");
            let item = |piece: &str| {
                if tensors {
                    json!({"outputs": [{"structVal": {"content": {"stringVal": [piece]}}}]})
                } else {
                    json!({"predictions": [{"content": piece}]})
                }
            };
            let (pieces, held) = match state.plan(model, &json) {
                Plan::Answer {
                    pieces,
                    first_byte_delay,
                    held,
                } => {
                    if let Some(delay) = first_byte_delay {
                        tokio::time::sleep(delay).await;
                    }
                    (pieces, held)
                }
                Plan::Tools { text, .. } => (vec![text], None),
                Plan::Fail(Failure::Hang) => {
                    state.wait_until_shutdown().await;
                    return error_response(503, "The fake provider is stopping");
                }
                Plan::Fail(Failure::Overloaded) => {
                    return error_response(429, "Resource exhausted");
                }
                Plan::Fail(Failure::Status {
                    status, message, ..
                }) => return error_response(status, &message),
                Plan::Fail(Failure::ErrorMidStream { text }) if streaming && sse => {
                    let events = vec![
                        sse_event(None, &item(&text)),
                        sse_event(
                            None,
                            &json!({"error": {"code": 500, "message": "Internal error", "status": "INTERNAL"}}),
                        ),
                    ];
                    return sse_response(state.sse_body(events));
                }
                Plan::Fail(_) => return error_response(500, "Internal error"),
            };
            if !streaming {
                let text = pieces.concat() + &held.unwrap_or_default().concat();
                return HttpResponse::Ok().json(json!({"predictions": [{"content": text}]}));
            }
            let events = |pieces: &[String]| -> Vec<Bytes> {
                pieces.iter().map(|p| sse_event(None, &item(p))).collect()
            };
            if sse {
                let after = held.as_deref().map(events);
                sse_response(state.held_sse_body(events(&pieces), after))
            } else {
                let items: Vec<Value> = pieces
                    .iter()
                    .chain(held.iter().flatten())
                    .map(|p| item(p))
                    .collect();
                HttpResponse::Ok().json(items)
            }
        }
        _ => error_response(404, "unknown model action"),
    }
}
