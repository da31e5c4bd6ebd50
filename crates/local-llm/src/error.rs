//! The server's one wire error type, in OpenAI's `{"error":{...}}` shape.

use actix_web::{HttpResponse, ResponseError, http::StatusCode};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    ModelNotFound(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    Unprocessable(String),
    /// Names the full queue: `chat` or `embeddings`.
    #[error("the server is busy: the {0} queue is full, retry later")]
    QueueFull(&'static str),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    fn type_and_code(&self) -> (&'static str, &'static str) {
        match self {
            Self::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            Self::ModelNotFound(_) => ("invalid_request_error", "model_not_found"),
            Self::NotFound(_) => ("invalid_request_error", "not_found"),
            Self::PayloadTooLarge(_) => ("invalid_request_error", "input_too_large"),
            Self::Unprocessable(_) => ("invalid_request_error", "invalid_value"),
            Self::QueueFull(_) => ("server_error", "queue_full"),
            Self::Internal(_) => ("server_error", "internal_error"),
        }
    }

    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.type_and_code();
        // Internal details stay in the log; the client gets a generic line.
        let message = match self {
            Self::Internal(_) => "the model server failed to process the request".to_owned(),
            other => other.to_string(),
        };
        json!({ "error": { "message": message, "type": kind, "code": code } })
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::ModelNotFound(_) | Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::QueueFull(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Internal(detail) = self {
            tracing::error!(%detail, "request failed");
        }
        let mut response = HttpResponse::build(self.status_code());
        if let Self::QueueFull(_) = self {
            // Generations are seconds long; a second is a sensible first back-off.
            response.insert_header(("Retry-After", "1"));
        }
        response.json(self.body())
    }
}
