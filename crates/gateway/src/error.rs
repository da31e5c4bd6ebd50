//! The gateway's one error type at the HTTP boundary. Each variant knows its
//! status code and the body GitLab's gateway sends for it.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Authentication failed: 401 `{"error": msg}`.
    #[error("{0}")]
    Unauthorized(String),
    /// A scope (unit primitive) check failed: 403 `{"detail": msg}`.
    #[error("{0}")]
    Forbidden(String),
    /// 400 `{"detail": msg}`.
    #[error("{0}")]
    BadRequest(String),
    /// 404 `{"detail": msg}`.
    #[error("{0}")]
    NotFound(String),
    /// 413 `{"detail": msg}`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 422 `{"detail": msg}` for a single message.
    #[error("{0}")]
    Unprocessable(String),
    /// 422 `{"detail": [{loc, msg, type}]}`: body validation, as FastAPI reports it.
    #[error("invalid request body")]
    Validation(Vec<ValidationIssue>),
    /// 421 `{"detail": "<code>: <reason>"}`: the model provider refused.
    #[error("{0}")]
    Upstream(String),
    /// 502 `{"detail": "Bad Gateway"}`: a proxied provider could not be reached.
    #[error("Bad Gateway")]
    BadGateway,
    /// 503 `{"detail": msg}`.
    #[error("{0}")]
    Unavailable(String),
    /// 429 `{"detail": msg}`: the model provider rate-limits us.
    #[error("{0}")]
    TooManyRequests(String),
    /// 504 `{"detail": msg}`: the model provider did not answer in time.
    #[error("{0}")]
    GatewayTimeout(String),
    /// 500; the message is logged, never sent.
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ValidationIssue {
    pub loc: Vec<String>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
}

impl ApiError {
    /// A 422 for a body that failed to deserialise.
    pub fn invalid_body(err: impl std::fmt::Display) -> Self {
        Self::Validation(vec![ValidationIssue {
            loc: vec!["body".into()],
            msg: err.to_string(),
            kind: "value_error".into(),
        }])
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unprocessable(_) | Self::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Upstream(_) => StatusCode::MISDIRECTED_REQUEST,
            Self::BadGateway => StatusCode::BAD_GATEWAY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::GatewayTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let body = match self {
            Self::Unauthorized(msg) => json!({ "error": msg }),
            Self::Validation(issues) => json!({ "detail": issues }),
            Self::Internal(msg) => {
                tracing::error!(error = %msg, "internal error");
                json!({ "detail": "Internal Server Error" })
            }
            other => json!({ "detail": other.to_string() }),
        };
        HttpResponse::build(self.status_code()).json(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::to_bytes;

    async fn body_of(err: ApiError) -> (u16, serde_json::Value) {
        let resp = err.error_response();
        let status = resp.status().as_u16();
        let bytes = to_bytes(resp.into_body()).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[actix_web::test]
    async fn bodies_match_the_reference() {
        assert_eq!(
            body_of(ApiError::Unauthorized(
                "No authorization header presented".into()
            ))
            .await,
            (401, json!({"error": "No authorization header presented"}))
        );
        assert_eq!(
            body_of(ApiError::Forbidden(
                "Unauthorized to access duo chat".into()
            ))
            .await,
            (403, json!({"detail": "Unauthorized to access duo chat"}))
        );
        assert_eq!(
            body_of(ApiError::Upstream("401: Unauthorized".into())).await,
            (421, json!({"detail": "401: Unauthorized"}))
        );
        assert_eq!(
            body_of(ApiError::BadGateway).await,
            (502, json!({"detail": "Bad Gateway"}))
        );
        let (status, body) = body_of(ApiError::Internal("secret stack".into())).await;
        assert_eq!(status, 500);
        assert!(!body.to_string().contains("secret"));
    }
}
