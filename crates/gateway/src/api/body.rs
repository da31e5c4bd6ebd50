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

/// Request bodies up to this size are parsed and rendered on the async
/// worker itself; larger ones on the blocking pool.
pub const INLINE_PREPARE_MAX_BYTES: usize = 16 * 1024;

/// Runs `prepare` (parsing a request of `body_len` bytes and rendering its
/// prompt) where it costs least. A large request is CPU work: on the
/// blocking pool, so the async workers keep answering health checks and
/// other requests. A small one takes tens of microseconds, less than the
/// hand-off to another thread and back (a wake-up each way) costs in
/// latency, so it runs in place. `what` names the work in the error of a
/// blocking task that did not finish.
pub async fn prepare_in_place_or_blocking<T, F>(
    body_len: usize,
    what: &'static str,
    prepare: F,
) -> Result<T, ApiError>
where
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    T: Send + 'static,
{
    if body_len <= INLINE_PREPARE_MAX_BYTES {
        return prepare();
    }
    actix_web::web::block(prepare)
        .await
        .map_err(|e| ApiError::Internal(format!("{what}: {e}")))?
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::{ThreadId, current};

    async fn thread_of_preparing(body_len: usize) -> ThreadId {
        prepare_in_place_or_blocking(body_len, "test", || Ok(current().id()))
            .await
            .unwrap()
    }

    #[actix_web::test]
    async fn small_requests_are_prepared_in_place_large_ones_on_the_blocking_pool() {
        let here = current().id();
        assert_eq!(thread_of_preparing(0).await, here);
        assert_eq!(thread_of_preparing(INLINE_PREPARE_MAX_BYTES).await, here);
        assert_ne!(
            thread_of_preparing(INLINE_PREPARE_MAX_BYTES + 1).await,
            here
        );
    }

    #[actix_web::test]
    async fn a_failed_preparation_is_its_own_error_wherever_it_ran() {
        for body_len in [10, INLINE_PREPARE_MAX_BYTES + 1] {
            let err = prepare_in_place_or_blocking(body_len, "test", || -> Result<(), _> {
                Err(ApiError::BadRequest("nope".into()))
            })
            .await
            .unwrap_err();
            assert!(
                matches!(err, ApiError::BadRequest(ref m) if m == "nope"),
                "{err:?}"
            );
        }
    }
}
