use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::db::DbError;
use crate::policy::PolicyError;
use crate::tokens::TokenError;

/// Every failure of a REST request, with the status and body GitLab answers.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("401 Unauthorized")]
    Unauthorized,
    #[error("403 Forbidden - Your account has been blocked.")]
    Blocked,
    #[error("insufficient scope, needs one of: {0}")]
    InsufficientScope(String),
    #[error("403 Forbidden")]
    Forbidden,
    #[error("404 {0} Not Found")]
    NotFound(&'static str),
    #[error("{0}")]
    BadRequest(String),
    #[error("409 {0}")]
    Conflict(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<deadpool_postgres::PoolError> for ApiError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<tokio_postgres::Error> for ApiError {
    fn from(e: tokio_postgres::Error) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<PolicyError> for ApiError {
    fn from(e: PolicyError) -> Self {
        ApiError::Internal(e.to_string())
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Invalid => ApiError::Unauthorized,
            TokenError::Blocked => ApiError::Blocked,
            TokenError::UnknownScope(s) => {
                ApiError::BadRequest(format!("scopes does not have a valid value: {s}"))
            }
            TokenError::NoScopes => ApiError::BadRequest("scopes is missing".into()),
            TokenError::Db(db) => db.into(),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Blocked | ApiError::InsufficientScope(_) | ApiError::Forbidden => {
                StatusCode::FORBIDDEN
            }
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let body = match self {
            ApiError::InsufficientScope(scope) => json!({
                "error": "insufficient_scope",
                "error_description": "The request requires higher privileges than provided by the access token.",
                "scope": scope,
            }),
            ApiError::BadRequest(msg) => json!({ "error": msg }),
            ApiError::Internal(detail) => {
                // The detail goes to the log only; clients get GitLab's generic body.
                tracing::error!(error = %detail, "request failed");
                json!({ "message": "500 Internal Server Error" })
            }
            other => json!({ "message": other.to_string() }),
        };
        HttpResponse::build(self.status_code()).json(body)
    }
}
