//! OpenID discovery and the JWKS the AI gateway uses to verify our tokens.

use actix_web::{HttpResponse, web};

use super::ApiError;
use crate::web::AppState;

pub async fn openid_configuration(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(crate::jwt::openid_configuration(
        state.config.external_url.as_str(),
    ))
}

pub async fn jwks(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let keys = state
        .keys
        .read()
        .map_err(|_| ApiError::Internal("key ring lock poisoned".into()))?;
    Ok(HttpResponse::Ok().json(keys.jwks()))
}
