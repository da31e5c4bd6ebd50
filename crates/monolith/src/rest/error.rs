use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::db::DbError;
use crate::identity::tokens::TokenError;
use crate::policy::PolicyError;
use crate::work_items::WorkItemError;

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
    /// GitLab's `forbidden!(reason)`.
    #[error("403 Forbidden - {0}")]
    ForbiddenBecause(&'static str),
    #[error("404 {0} Not Found")]
    NotFound(&'static str),
    /// A record looked up by a key that does not exist (GitLab's answer to
    /// `find_by!` failing, e.g. a member that is not one).
    #[error("404 Not found")]
    RecordNotFound,
    #[error("{0}")]
    BadRequest(String),
    /// A failed model validation: 400 with `{"message": {field: [errors]}}`.
    #[error("400 Bad request: {0}")]
    Invalid(serde_json::Value),
    /// 405 with the reason as the message (e.g. deleting the default branch).
    #[error("{0}")]
    MethodNotAllowed(&'static str),
    /// 409 with the reason as the message, as GitLab's `conflict!` answers.
    #[error("{0}")]
    Conflict(String),
    /// 422 with the reason as the message (a workflow that cannot be run).
    #[error("{0}")]
    Unprocessable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// A validation failure of one field, in GitLab's `{"message": {field: [..]}}` shape.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        let mut errors = serde_json::Map::new();
        errors.insert(field.to_owned(), json!([message.into()]));
        ApiError::Invalid(serde_json::Value::Object(errors))
    }
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
            ApiError::Blocked
            | ApiError::InsufficientScope(_)
            | ApiError::Forbidden
            | ApiError::ForbiddenBecause(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) | ApiError::RecordNotFound => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) | ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
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
            ApiError::Invalid(errors) => json!({ "message": errors }),
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

/// A constraint violation (unknown foreign key, duplicate) becomes `err`; other
/// database failures stay internal errors.
pub(super) fn on_constraint(err: ApiError) -> impl FnOnce(tokio_postgres::Error) -> ApiError {
    move |e| {
        if e.code().is_some() { err } else { e.into() }
    }
}

/// A refusal of the work items domain, in the API's words.
impl From<WorkItemError> for ApiError {
    fn from(e: WorkItemError) -> Self {
        match e {
            WorkItemError::BadRequest(msg) => ApiError::BadRequest(msg),
            WorkItemError::Invalid { field, message } => ApiError::invalid(field, message),
            WorkItemError::Conflict(msg) => ApiError::Conflict(msg),
            WorkItemError::Db(e) => e.into(),
        }
    }
}
