//! OpenID discovery and the JWKS the AI gateway uses to verify our tokens.

use actix_web::{HttpResponse, web};

use super::ApiError;
use crate::app_state::AppState;

pub async fn openid_configuration(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(crate::identity::jwt::openid_configuration(
        state.config.external_url.as_str(),
    ))
}

pub async fn jwks(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let jwks = state
        .keys
        .jwks()
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(HttpResponse::Ok().json(jwks))
}
