//! Vertex AI predict: `.../publishers/google/models/{model}:predict` and
//! `:serverStreamingPredict`.
//!
//! Models whose name contains `embedding` or `gecko` answer text embeddings
//! (`instances[].content` → `predictions[].embeddings.values`); others answer
//! text (`predictions[].content`). The streaming form sends one
//! `{"predictions": [{"content": piece}]}` per SSE event with `?alt=sse`, or a
//! JSON array of those objects without it.

use crate::script::{self, Failure, Plan};
use crate::{State, sse_event};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};

const EMBEDDING_DIMS: usize = 16;

fn error_response(status: u16, message: &str) -> HttpResponse {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(code).json(json!({
        "error": {"code": status, "message": message, "status": code.canonical_reason().unwrap_or("UNKNOWN")}
    }))
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
    let Some(instances) = json["instances"].as_array() else {
        return error_response(400, "instances must be a list");
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
            let pieces = match state.plan(model, &serde_json::Value::Null) {
                Plan::Answer {
                    pieces,
                    first_byte_delay,
                } => {
                    if let Some(delay) = first_byte_delay {
                        tokio::time::sleep(delay).await;
                    }
                    pieces
                }
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
                Plan::Fail(_) => return error_response(500, "Internal error"),
            };
            if !streaming {
                let text = pieces.concat();
                return HttpResponse::Ok().json(json!({"predictions": [{"content": text}]}));
            }
            let sse = req.query_string().contains("alt=sse");
            let items: Vec<Value> = pieces
                .iter()
                .map(|p| json!({"predictions": [{"content": p}]}))
                .collect();
            if sse {
                let events = items.iter().map(|item| sse_event(None, item)).collect();
                HttpResponse::Ok()
                    .content_type("text/event-stream")
                    .streaming(state.sse_body(events))
            } else {
                HttpResponse::Ok().json(items)
            }
        }
        _ => error_response(404, "unknown model action"),
    }
}
