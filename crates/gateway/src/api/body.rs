//! [`RawBody`]: a request body read whole, for handlers that parse it
//! themselves (to answer 422 in FastAPI's shape rather than actix's).
//!
//! actix's own `Bytes` extractor answers an oversized body with a plain-text
//! 413 and `web::PayloadConfig` has no error hook, so this extractor wraps it
//! and maps its failures to [`ApiError`]: 413 `{"detail": "Request body too
//! large"}` past `AIGW_MAX_REQUEST_BODY_BYTES` (the limit the app sets on
//! `PayloadConfig`), 400 for a body that could not be read.

use crate::error::ApiError;
use actix_web::error::PayloadError;
use actix_web::{FromRequest, HttpRequest, dev};
use bytes::Bytes;
use futures::future::LocalBoxFuture;

/// What every oversized body gets, here and in the proxies.
pub const TOO_LARGE: &str = "Request body too large";

/// The whole request body.
#[derive(Debug, Clone)]
pub struct RawBody(pub Bytes);

impl FromRequest for RawBody {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut dev::Payload) -> Self::Future {
        let body = Bytes::from_request(req, payload);
        Box::pin(async move { body.await.map(RawBody).map_err(|e| body_error(&e)) })
    }
}

fn body_error(err: &actix_web::Error) -> ApiError {
    match err.as_error::<PayloadError>() {
        Some(PayloadError::Overflow) => ApiError::PayloadTooLarge(TOO_LARGE.into()),
        _ => ApiError::BadRequest(format!("Could not read body: {err}")),
    }
}
