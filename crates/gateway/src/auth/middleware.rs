//! Authentication as actix middleware, and `GatewayUser` as an extractor.
//!
//! Wiring:
//! ```ignore
//! App::new()
//!     .app_data(web::Data::new(authenticator))
//!     .wrap(actix_web::middleware::from_fn(auth::middleware::authenticate_request))
//! ```
//! Handlers then take `user: GatewayUser`.

use super::{Authenticator, GatewayUser};
use crate::error::ApiError;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{FromRequest, HttpMessage, HttpRequest, ResponseError, web};
use std::future::{Ready, ready};

/// Paths anyone may call: health probes and metrics scraping.
pub const UNAUTHENTICATED_PATHS: [&str; 3] =
    ["/monitoring/healthz", "/monitoring/ready", "/metrics"];

/// Authenticates every request except [`UNAUTHENTICATED_PATHS`] and stores
/// the caller in the request extensions. Needs `web::Data<Authenticator>`.
/// Failures become responses here (not errors), so outer middleware such as
/// logging and metrics sees an ordinary 401.
pub async fn authenticate_request<B: MessageBody>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    if !UNAUTHENTICATED_PATHS.contains(&req.path()) {
        let outcome = match req.app_data::<web::Data<Authenticator>>() {
            Some(authenticator) => authenticator
                .authenticate(req.headers())
                .await
                .map_err(ApiError::from),
            None => Err(ApiError::Internal(
                "no Authenticator registered as app data".into(),
            )),
        };
        match outcome {
            Ok(user) => {
                req.extensions_mut().insert(user);
            }
            Err(err) => {
                let response = err.error_response();
                return Ok(req.into_response(response).map_into_right_body());
            }
        }
    }
    Ok(next.call(req).await?.map_into_left_body())
}

impl FromRequest for GatewayUser {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<GatewayUser>()
                .cloned()
                // Fail closed: a route mounted without the middleware has no
                // authenticated caller, which is a 401, never a pass.
                .ok_or_else(|| ApiError::Unauthorized("No authorization header presented".into())),
        )
    }
}
