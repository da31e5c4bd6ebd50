//! The first check every request meets: no NUL characters anywhere a user can
//! put text (path, query string, JSON or form body). PostgreSQL cannot store a
//! NUL in text and refuses the query, so without this check a `%00` anywhere
//! would surface as a 500; GitLab answers such requests with 400 before any
//! handler runs, and so do we.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, ResponseError, web};

use super::ApiError;

/// Where a NUL was found, for the error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Path,
    Query,
    Body,
}

impl Place {
    fn describe(self) -> &'static str {
        match self {
            Place::Path => "path",
            Place::Query => "query string",
            Place::Body => "body",
        }
    }
}

/// Whether percent-encoded text (a path or a query string) decodes to a NUL.
pub fn encoded_has_nul(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.contains(&0)
        || bytes
            .windows(3)
            .any(|w| w[0] == b'%' && w[1] == b'0' && w[2] == b'0')
}

/// Whether a JSON document holds a NUL inside a string: the escape `\u0000`
/// that is not itself an escaped backslash followed by `u0000`, or a raw NUL.
pub fn json_text_has_nul(bytes: &[u8]) -> bool {
    if bytes.contains(&0) {
        return true;
    }
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            // An escape: look at what it escapes and skip it whole.
            if bytes[i + 1..].starts_with(b"u0000") {
                return true;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    false
}

/// Where, if anywhere, a request carries a NUL (the body only for the content
/// types we parse).
fn find_nul(path: &str, query: &str, content_type: &str, body: &[u8]) -> Option<Place> {
    if encoded_has_nul(path) {
        return Some(Place::Path);
    }
    if encoded_has_nul(query) {
        return Some(Place::Query);
    }
    let body_has_nul = if content_type.starts_with("application/x-www-form-urlencoded") {
        encoded_has_nul(std::str::from_utf8(body).unwrap_or(""))
            || std::str::from_utf8(body).is_err()
    } else if content_type.contains("json") {
        json_text_has_nul(body)
    } else {
        body.contains(&0)
    };
    body_has_nul.then_some(Place::Body)
}

/// Refuses requests that carry a NUL with 400
/// `{"error": "<place> contains a NUL character"}` (the REST API and the
/// pages' forms alike); GraphQL checks its own documents and variables and
/// answers in GraphQL's shape (see `graphql::limits`).
pub async fn reject_nul<B: MessageBody>(
    mut req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    // GraphQL checks its own documents; git's pack data is binary and streamed
    // to git (its path is still checked for NULs here).
    if req.path() == "/api/graphql" {
        return Ok(next.call(req).await?.map_into_left_body());
    }
    if crate::repositories::http_backend::is_smart_http_path(req.path()) {
        if encoded_has_nul(req.path()) || encoded_has_nul(req.query_string()) {
            let error = ApiError::BadRequest("path contains a NUL character".into());
            return Ok(req
                .into_response(error.error_response())
                .map_into_right_body());
        }
        return Ok(next.call(req).await?.map_into_left_body());
    }
    let has_body = matches!(
        *req.method(),
        actix_web::http::Method::POST
            | actix_web::http::Method::PUT
            | actix_web::http::Method::PATCH
    );
    let body = if has_body {
        // Read under the same size limit the handlers' extractors apply, then
        // put back for them.
        let bytes = req.extract::<web::Bytes>().await?;
        req.set_payload(actix_web::dev::Payload::from(bytes.clone()));
        bytes
    } else {
        web::Bytes::new()
    };
    let content_type = req.content_type().to_ascii_lowercase();
    let path = req.path().to_owned();
    let query = req.query_string().to_owned();
    if let Some(place) = find_nul(&path, &query, &content_type, &body) {
        let error = ApiError::BadRequest(format!("{} contains a NUL character", place.describe()));
        return Ok(req
            .into_response(error.error_response())
            .map_into_right_body());
    }
    Ok(next.call(req).await?.map_into_left_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoded_nuls_are_found() {
        assert!(encoded_has_nul("/api/v4/projects/acme%00"));
        assert!(encoded_has_nul("search=a%00b"));
        assert!(!encoded_has_nul("search=a%200b"));
        assert!(!encoded_has_nul("/api/v4/projects/acme%2Fsite"));
    }

    #[test]
    fn json_escapes_are_told_apart() {
        assert!(json_text_has_nul(br#"{"title":"a\u0000b"}"#));
        // An escaped backslash followed by the letters u0000 is not a NUL.
        assert!(!json_text_has_nul(br#"{"title":"a\\u0000b"}"#));
        assert!(json_text_has_nul(br#"{"title":"a\\\u0000b"}"#));
        assert!(!json_text_has_nul(br#"{"title":"\u00e9"}"#));
    }

    #[test]
    fn every_place_is_checked() {
        assert_eq!(find_nul("/a%00", "", "", b""), Some(Place::Path));
        assert_eq!(find_nul("/a", "x=%00", "", b""), Some(Place::Query));
        assert_eq!(
            find_nul("/a", "", "application/x-www-form-urlencoded", b"title=%00"),
            Some(Place::Body)
        );
        assert_eq!(
            find_nul("/a", "", "application/json", br#"{"a":"\u0000"}"#),
            Some(Place::Body)
        );
        assert_eq!(
            find_nul("/a", "x=1", "application/json", br#"{"a":"b"}"#),
            None
        );
    }
}
